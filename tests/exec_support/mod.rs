//! Helpers of `tests/exec.rs`: a static ELF made by hand, the kernel's view
//! of a program stopped right after exec, and the maps normalization.

use std::ffi::CString;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Where the hand-made static program's pieces go (`ET_EXEC`; a PIE has
/// them at the same offsets from 0).
pub const TEXT: u64 = 0x40_0000;
/// Entry: right after the headers.
pub const ENTRY: u64 = TEXT + 0xb0;
/// The data segment: file offset 0x1100 at 0x40_2100, 0x20 bytes in the
/// file, 0x2000 in memory (bss up to 0x40_4100).
pub const DATA: u64 = 0x40_2100;
/// The data bytes.
pub const DATA_BYTES: &[u8; 32] = b"aspace static data, 32 bytes...\0";

/// A static ELF64 x86-64 executable with two `PT_LOAD` segments: text
/// (r-x, the headers and the code) and data (rw-, 32 file bytes, then bss
/// over two more pages), at [`TEXT`] (`ET_EXEC`) or as a static PIE
/// (`ET_DYN` from 0, no interpreter). The file goes on past the data with
/// 0xaa bytes, which the loader must not show in the zeroed rest of the
/// data page. The code stores 1 into the bss (RIP-relative, so it runs
/// at either place) and exits with status 0.
pub fn static_elf(pie: bool) -> Vec<u8> {
    let base = if pie { 0 } else { TEXT };
    let mut f = vec![0u8; 0x1200];
    // mov byte [rip + rel32], 1: the next instruction is at 0xb7.
    let rel = 0x4000i32 - 0xb7;
    let code: Vec<u8> = [
        &[0xc6, 0x05][..],
        &rel.to_le_bytes()[..],
        &[0x01],
        &[0xb8, 60, 0, 0, 0], // mov eax, 60 (exit)
        &[0x31, 0xff],        // xor edi, edi
        &[0x0f, 0x05],        // syscall
    ]
    .concat();
    let put = |f: &mut Vec<u8>, at: usize, b: &[u8]| f[at..at + b.len()].copy_from_slice(b);
    put(&mut f, 0, b"\x7fELF\x02\x01\x01");
    put(&mut f, 16, &(if pie { 3u16 } else { 2 }).to_le_bytes()); // ET_DYN, ET_EXEC
    put(&mut f, 18, &62u16.to_le_bytes()); // EM_X86_64
    put(&mut f, 20, &1u32.to_le_bytes());
    put(&mut f, 24, &(base + 0xb0).to_le_bytes());
    put(&mut f, 32, &64u64.to_le_bytes()); // e_phoff
    put(&mut f, 52, &64u16.to_le_bytes()); // e_ehsize
    put(&mut f, 54, &56u16.to_le_bytes());
    put(&mut f, 56, &2u16.to_le_bytes());
    let text_len = 0xb0 + code.len() as u64;
    let phdr = |ty: u32, fl: u32, off: u64, va: u64, fsz: u64, msz: u64| {
        [
            &ty.to_le_bytes()[..],
            &fl.to_le_bytes(),
            &off.to_le_bytes(),
            &va.to_le_bytes(),
            &va.to_le_bytes(),
            &fsz.to_le_bytes(),
            &msz.to_le_bytes(),
            &0x1000u64.to_le_bytes(),
        ]
        .concat()
    };
    put(&mut f, 64, &phdr(1, 5, 0, base, text_len, text_len));
    let data = base + (DATA - TEXT);
    put(&mut f, 120, &phdr(1, 6, 0x1100, data, 0x20, 0x2000));
    put(&mut f, 0xb0, &code);
    put(&mut f, 0x1100, DATA_BYTES);
    f[0x1120..].fill(0xaa);
    f
}

/// An executable file in the temporary directory, removed on drop.
pub struct TempExe(pub PathBuf);

impl Drop for TempExe {
    fn drop(&mut self) {
        std::fs::remove_file(&self.0).ok();
    }
}

/// Writes `bytes` to a new executable file in the temporary directory.
pub fn write_exe(name: &str, bytes: &[u8]) -> TempExe {
    let p = std::env::temp_dir().join(format!("aspace-exec-{}-{name}", std::process::id()));
    std::fs::write(&p, bytes).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    TempExe(p)
}

/// What the kernel made of an exec, read at the first stop after it.
pub struct Kernel {
    /// `/proc/PID/maps`.
    pub maps: String,
    /// The registers at the stop.
    pub rsp: u64,
    /// The instruction pointer at the stop.
    pub rip: u64,
    /// `/proc/PID/auxv`, without `AT_NULL`.
    pub auxv: Vec<(u64, u64)>,
    /// The stack from `rsp` to its top.
    pub stack: Vec<u8>,
}

/// Why the kernel side could not run.
pub enum Skip {
    /// `personality(ADDR_NO_RANDOMIZE)`, `PTRACE_TRACEME` or the stack
    /// limit refused.
    NotPermitted(&'static str),
}

/// Runs `path` in a child with ASLR off under ptrace, stops it right after
/// exec, reads what the kernel laid out, and kills it (or, with `finish`,
/// lets it run and returns its exit status too).
pub fn kernel_exec(
    path: &Path,
    argv: &[CString],
    envp: &[CString],
    top: u64,
    finish: bool,
) -> Result<(Kernel, Option<i32>), Skip> {
    use std::os::unix::ffi::OsStrExt;
    let cpath = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut av: Vec<*const libc::c_char> = argv.iter().map(|s| s.as_ptr()).collect();
    av.push(std::ptr::null());
    let mut ev: Vec<*const libc::c_char> = envp.iter().map(|s| s.as_ptr()).collect();
    ev.push(std::ptr::null());
    // SAFETY: fork in a threaded process; the child calls only
    // async-signal-safe functions (personality, ptrace, execve, _exit) on
    // memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: as above; each call's arguments are valid.
        unsafe {
            if libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong) < 0 {
                libc::_exit(125);
            }
            // The layout depends on the stack limit (the mmap base, the
            // argument limit): the default space's 8 MiB.
            let lim = libc::rlimit {
                rlim_cur: 8 << 20,
                rlim_max: libc::RLIM_INFINITY,
            };
            let mut cur: libc::rlimit = std::mem::zeroed();
            libc::getrlimit(libc::RLIMIT_STACK, &mut cur);
            let lim = libc::rlimit {
                rlim_max: cur.rlim_max,
                ..lim
            };
            if libc::setrlimit(libc::RLIMIT_STACK, &lim) < 0 {
                libc::_exit(124);
            }
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) < 0 {
                libc::_exit(126);
            }
            libc::execve(cpath.as_ptr(), av.as_ptr(), ev.as_ptr());
            libc::_exit(127);
        }
    }
    let mut st = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    if libc::WIFEXITED(st) {
        return match libc::WEXITSTATUS(st) {
            124 => Err(Skip::NotPermitted("an 8 MiB RLIMIT_STACK")),
            125 => Err(Skip::NotPermitted("personality(ADDR_NO_RANDOMIZE)")),
            126 => Err(Skip::NotPermitted("ptrace(PTRACE_TRACEME)")),
            s => panic!("the child exited with {s} before the exec stop"),
        };
    }
    assert!(libc::WIFSTOPPED(st) && libc::WSTOPSIG(st) == libc::SIGTRAP);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    // SAFETY: user_regs_struct is plain integers.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: our traced child is stopped; `regs` is the size GETREGS writes.
    let r = unsafe { libc::ptrace(libc::PTRACE_GETREGS, pid, 0, &mut regs as *mut _) };
    assert_eq!(r, 0, "PTRACE_GETREGS");
    let raw = std::fs::read(format!("/proc/{pid}/auxv")).unwrap();
    let auxv = raw
        .chunks_exact(16)
        .map(|c| {
            let w = |i: usize| u64::from_le_bytes(c[i..i + 8].try_into().unwrap());
            (w(0), w(8))
        })
        .take_while(|&(k, _)| k != 0)
        .collect();
    let mut stack = vec![0u8; (top - regs.rsp) as usize];
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    mem.seek(SeekFrom::Start(regs.rsp)).unwrap();
    mem.read_exact(&mut stack).unwrap();
    let k = Kernel {
        maps,
        rsp: regs.rsp,
        rip: regs.rip,
        auxv,
        stack,
    };
    let mut status = None;
    // SAFETY: signalling and continuing our own traced child.
    unsafe {
        if finish {
            libc::ptrace(libc::PTRACE_CONT, pid, 0, 0);
        } else {
            libc::kill(pid, libc::SIGKILL);
        }
        libc::waitpid(pid, &mut st, 0);
    }
    if finish && libc::WIFEXITED(st) {
        status = Some(libc::WEXITSTATUS(st));
    }
    Ok((k, status))
}

/// A maps line with its columns single-spaced: range, perms, offset,
/// device, inode and name must all agree (file objects show the host
/// file's device and inode, as the kernel does); `[anon:vvar]`-style names
/// of the vDSO areas read as the kernel's `[vvar]`. Anonymous lines must
/// show `00:00 0` on both.
pub fn normalize(line: &str, special: &[String]) -> String {
    let f: Vec<&str> = line.split_whitespace().collect();
    let name = f.get(5..).map(|n| n.join(" ")).unwrap_or_default();
    let name = match name
        .strip_prefix("[anon:")
        .and_then(|n| n.strip_suffix(']'))
    {
        Some(n) if special.iter().any(|s| s == n) => format!("[{n}]"),
        _ => name,
    };
    let file = name.starts_with('/');
    assert!(
        file || (f[3] == "00:00" && f[4] == "0"),
        "anonymous line: {line}"
    );
    format!("{} {} {} {} {} {}", f[0], f[1], f[2], f[3], f[4], name)
}

/// The vDSO areas of this process, lowest first: their names (without
/// brackets) and sizes, and the bytes of `[vdso]` itself.
pub fn host_vdso() -> (Vec<(String, u64)>, Vec<u8>) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mut data = Vec::new();
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let Some(name) = f
            .get(5)
            .and_then(|n| n.strip_prefix('[')?.strip_suffix(']'))
        else {
            data.clear();
            continue;
        };
        let (a, b) = f[0].split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        if name == "vdso" {
            let mut img = vec![0u8; (b - a) as usize];
            let mut mem = std::fs::File::open("/proc/self/mem").unwrap();
            mem.seek(SeekFrom::Start(a)).unwrap();
            if mem.read_exact(&mut img).is_err() {
                img.fill(0);
            }
            return (data, img);
        }
        if name.starts_with("vvar") {
            data.push((name.to_string(), b - a));
        } else {
            data.clear();
        }
    }
    (Vec::new(), Vec::new())
}
