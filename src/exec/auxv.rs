//! The auxiliary vector: its entry types and the template a loader fills.
//!
//! The template is the vector in Linux x86-64's order with the values a
//! kernel knows and the loader does not (hardware capabilities, ids, the
//! clock tick); [`load_elf`](super::load_elf) replaces the values it
//! computes ([`COMPUTED`]) and writes the rest as given, so a caller that
//! copies a real process's `/proc/PID/auxv` gets its stack byte for byte.

/// Entry types (`AT_*` of `<linux/auxvec.h>` and x86's `<asm/auxvec.h>`).
pub mod at {
    /// End of the vector.
    pub const NULL: u64 = 0;
    /// Address of the program headers.
    pub const PHDR: u64 = 3;
    /// Size of one program header.
    pub const PHENT: u64 = 4;
    /// Number of program headers.
    pub const PHNUM: u64 = 5;
    /// Page size.
    pub const PAGESZ: u64 = 6;
    /// Load address of the interpreter (0 without one).
    pub const BASE: u64 = 7;
    /// Flags (0).
    pub const FLAGS: u64 = 8;
    /// The program's entry point.
    pub const ENTRY: u64 = 9;
    /// Real user id.
    pub const UID: u64 = 11;
    /// Effective user id.
    pub const EUID: u64 = 12;
    /// Real group id.
    pub const GID: u64 = 13;
    /// Effective group id.
    pub const EGID: u64 = 14;
    /// Address of the platform string.
    pub const PLATFORM: u64 = 15;
    /// CPU capabilities (CPUID 1 EDX on x86).
    pub const HWCAP: u64 = 16;
    /// Clock ticks per second (`times(2)`).
    pub const CLKTCK: u64 = 17;
    /// Secure mode (setuid exec).
    pub const SECURE: u64 = 23;
    /// Address of 16 random bytes.
    pub const RANDOM: u64 = 25;
    /// More CPU capabilities (x86: ring-3 MONITOR/MWAIT, FSGSBASE).
    pub const HWCAP2: u64 = 26;
    /// Size of the rseq area the kernel supports.
    pub const RSEQ_FEATURE_SIZE: u64 = 27;
    /// Alignment of the rseq area.
    pub const RSEQ_ALIGN: u64 = 28;
    /// Address of the file name exec was given.
    pub const EXECFN: u64 = 31;
    /// Address of the vDSO's ELF header.
    pub const SYSINFO_EHDR: u64 = 33;
    /// Least signal stack size the kernel needs.
    pub const MINSIGSTKSZ: u64 = 51;
}

/// The entry types whose values the loader computes: the program's
/// headers and entry, the interpreter's base, the page size, and the
/// addresses of what it puts on the stack or maps (`AT_SYSINFO_EHDR` is
/// dropped when no vDSO is mapped).
pub const COMPUTED: [u64; 10] = [
    at::PHDR,
    at::PHENT,
    at::PHNUM,
    at::PAGESZ,
    at::BASE,
    at::ENTRY,
    at::RANDOM,
    at::EXECFN,
    at::PLATFORM,
    at::SYSINFO_EHDR,
];

/// Linux 6.x x86-64's vector, in its order, with the values of a typical
/// machine for the entries the loader does not compute (root ids, 100
/// ticks per second, baseline x86-64 capabilities, the rseq entries).
/// Replace them with the guest CPU's and user's.
pub fn linux_x86_64() -> Vec<(u64, u64)> {
    vec![
        (at::SYSINFO_EHDR, 0),
        (at::MINSIGSTKSZ, 2048),
        (at::HWCAP, 0x178b_fbff),
        (at::PAGESZ, 0),
        (at::CLKTCK, 100),
        (at::PHDR, 0),
        (at::PHENT, 0),
        (at::PHNUM, 0),
        (at::BASE, 0),
        (at::FLAGS, 0),
        (at::ENTRY, 0),
        (at::UID, 0),
        (at::EUID, 0),
        (at::GID, 0),
        (at::EGID, 0),
        (at::SECURE, 0),
        (at::RANDOM, 0),
        (at::HWCAP2, 2),
        (at::EXECFN, 0),
        (at::PLATFORM, 0),
        (at::RSEQ_FEATURE_SIZE, 32),
        (at::RSEQ_ALIGN, 32),
    ]
}
