//! exec: loading an ELF64 x86-64 program into an address space as Linux's
//! binfmt_elf lays it out with ASLR off (`personality(ADDR_NO_RANDOMIZE)`),
//! so that the space's [`maps`](crate::AddressSpace::maps) match the
//! kernel's `/proc/PID/maps` at the first stop after exec
//! (`tests/exec.rs` compares them, and the whole initial stack).
//!
//! [`load_elf`] empties the space ([`AddressSpace::exec_reset`]), then:
//! 1. the stack VMA below [`ExecArgs::stack_top`], growsdown, 128 KiB
//!    below the strings (or the stack limit, if less);
//! 2. the program's `PT_LOAD` segments (see `load`): an `ET_EXEC` at its
//!    addresses, a PIE with an interpreter at `ELF_ET_DYN_BASE`
//!    (0x5555_5555_4000 for 4 KiB alignment), a PIE without one where
//!    mmap's top-down placement puts it;
//! 3. the `PT_INTERP` interpreter, whole, top-down from the mmap base;
//! 4. the vDSO if given ([`Vdso`]), top-down below that;
//! 5. argv, envp and the auxiliary vector on the stack, and the heap
//!    start ([`AddressSpace::set_start_brk`]) at the page after the
//!    program's bss (at `ELF_ET_DYN_BASE` for a static PIE, as Linux).
//!
//! Files are read from the host (see `object`). Errors before step 1 (no
//! such file, not an ELF, E2BIG) leave the space untouched; an error
//! after it leaves it partly laid out, as a failed exec past Linux's point
//! of no return kills the process: the caller should do the same.
//!
//! Not modelled: `[vsyscall]` (it lies above the task), randomization,
//! the alignment above a page that Linux gives a static PIE, binfmt_misc
//! and `#!` scripts, setuid.
//!
//! # Locking
//!
//! Each step is one or more ordinary calls on the space (mmap, write,
//! mprotect), each taking the mmap_lock as it does; nothing else may map
//! into the space during exec (Linux's exec owns its new mm alone).

pub mod auxv;
pub mod elf;
mod load;
mod object;
pub mod stack;

use crate::{AddressSpace, Error, MapFlags, Prot, Range};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Why a program could not be loaded.
#[derive(Debug)]
#[non_exhaustive]
pub enum ExecError {
    /// Opening or reading a host file failed (`ENOENT`, `EACCES` for a
    /// file that is not a regular file with an execute bit, ...).
    Io(std::io::Error),
    /// `ENOEXEC`: not an ELF64 x86-64 executable; the reason.
    NoExec(&'static str),
    /// `E2BIG`: the arguments and environment do not fit the stack limit.
    TooBig,
    /// A call on the address space failed (`ENOMEM`, `EINVAL` for a
    /// segment outside the task, `EEXIST` for overlapping segments).
    Mm(Error),
}

impl ExecError {
    /// The errno Linux's execve returns for it.
    pub fn errno(&self) -> i32 {
        match self {
            ExecError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            ExecError::NoExec(_) => libc::ENOEXEC,
            ExecError::TooBig => libc::E2BIG,
            ExecError::Mm(e) => e.errno(),
        }
    }
}

impl core::fmt::Display for ExecError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ExecError::Io(e) => write!(f, "exec: {e}"),
            ExecError::NoExec(why) => write!(f, "exec: ENOEXEC: {why}"),
            ExecError::TooBig => write!(f, "exec: E2BIG: arguments too long"),
            ExecError::Mm(e) => write!(f, "exec: {e}"),
        }
    }
}

impl std::error::Error for ExecError {}

impl From<Error> for ExecError {
    fn from(e: Error) -> Self {
        ExecError::Mm(e)
    }
}

impl From<std::io::Error> for ExecError {
    fn from(e: std::io::Error) -> Self {
        ExecError::Io(e)
    }
}

/// A vDSO to map as Linux maps `[vvar]` and `[vdso]` after the program:
/// one block placed top-down below the interpreter, its data areas first.
/// They show as `[anon:NAME]` in maps (Linux's special mappings show as
/// `[NAME]`).
#[derive(Clone, Debug, Default)]
pub struct Vdso {
    /// Data areas below the code, lowest first, with their sizes in bytes
    /// (Linux 6.18: `vvar`, 4 pages, and `vvar_vclock`, 2): read-only,
    /// zero-filled, each named.
    pub data: Vec<(String, u64)>,
    /// The vDSO's ELF image, mapped read-execute and named `vdso`;
    /// `AT_SYSINFO_EHDR` points at it.
    pub image: Vec<u8>,
}

/// What to exec: the file, its arguments and environment, and what the
/// kernel would add.
#[derive(Clone, Debug)]
pub struct ExecArgs {
    /// The program: a host path, read from the host, and the file name
    /// copied to the top of the stack (`AT_EXECFN`) as given.
    pub path: PathBuf,
    /// Arguments (an empty list gets one empty string, as Linux 5.18+).
    pub argv: Vec<CString>,
    /// Environment.
    pub envp: Vec<CString>,
    /// The `AT_RANDOM` bytes.
    pub random: [u8; 16],
    /// The `AT_PLATFORM` string (`x86_64`).
    pub platform: CString,
    /// The auxiliary vector template ([`auxv`]); defaults to
    /// [`auxv::linux_x86_64`].
    pub auxv: Vec<(u64, u64)>,
    /// The vDSO to map, if any (none by default, and then no
    /// `AT_SYSINFO_EHDR`).
    pub vdso: Option<Vdso>,
    /// Top of the stack (default: the task size, as Linux's `STACK_TOP`),
    /// aligned down to 16 bytes then up to a page; ENOMEM outside
    /// `(mmap_min_addr, task_size]`.
    pub stack_top: Option<u64>,
    /// A directory the interpreter path is looked up under (a guest
    /// root), instead of the host's `/`.
    pub interp_root: Option<PathBuf>,
}

impl ExecArgs {
    /// `execve(path, argv, envp)` with the defaults: random bytes from the
    /// standard library's hasher seed, platform `x86_64`, Linux's
    /// auxiliary vector, no vDSO, the stack at the task's top. Arguments
    /// holding a NUL byte are cut there, as C would read them.
    pub fn new<S: AsRef<[u8]>>(path: impl Into<PathBuf>, argv: &[S], envp: &[S]) -> ExecArgs {
        let c = |s: &S| {
            let b = s.as_ref();
            let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
            CString::new(&b[..end]).unwrap_or_default()
        };
        ExecArgs {
            path: path.into(),
            argv: argv.iter().map(c).collect(),
            envp: envp.iter().map(c).collect(),
            random: seed(),
            platform: c"x86_64".to_owned(),
            auxv: auxv::linux_x86_64(),
            vdso: None,
            stack_top: None,
            interp_root: None,
        }
    }
}

/// 16 bytes from `RandomState`'s per-process random keys.
fn seed() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; 16];
    for (i, half) in out.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

/// Where a program was loaded and how to start it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecImage {
    /// Where to start: the interpreter's entry, or the program's.
    pub entry: u64,
    /// The initial stack pointer (16-byte aligned, at `argc`).
    pub rsp: u64,
    /// The program's entry (`AT_ENTRY`).
    pub program_entry: u64,
    /// Added to the program's addresses (0 for `ET_EXEC`).
    pub load_bias: u64,
    /// The interpreter's load address (`AT_BASE`), if there is one.
    pub interp_base: Option<u64>,
    /// The program headers in memory (`AT_PHDR`).
    pub phdr: u64,
    /// The heap's start (the break).
    pub brk: u64,
    /// The stack VMA.
    pub stack: Range,
    /// The vDSO's address, if one was mapped.
    pub vdso: Option<u64>,
    /// The auxiliary vector as written (without `AT_NULL`).
    pub auxv: Vec<(u64, u64)>,
}

/// Loads the program `args.path` into `mm` as exec (see the module
/// docs): returns where to start it.
pub fn load_elf(mm: &AddressSpace, args: &ExecArgs) -> Result<ExecImage, ExecError> {
    let prog = elf::Elf::parse(object::open_object(mm, &args.path)?)?;
    let interp = match prog.interp()? {
        Some(p) => {
            let p = Path::new(std::ffi::OsStr::from_bytes(&p));
            let host = match &args.interp_root {
                Some(root) => root.join(p.strip_prefix("/").unwrap_or(p)),
                None => p.to_path_buf(),
            };
            Some(elf::Elf::parse(object::open_object(mm, &host)?)?)
        }
        None => None,
    };
    let filename = CString::new(args.path.as_os_str().as_bytes()).map_err(|_| Error::Inval)?;
    // Linux aligns the top to 16 bytes, then up to a page.
    let task = mm.config().task_size;
    let top = crate::addr::page_align_up(args.stack_top.unwrap_or(task) & !15)
        .filter(|&t| t <= task && t > mm.config().mmap_min_addr)
        .ok_or(Error::NoMem)?;
    let rlim = mm.stack_limit();
    let strings = stack::copy_strings(top, rlim, &filename, &args.argv, &args.envp)?;

    // The point of no return.
    mm.exec_reset();
    let stack_lo = stack::stack_start(&strings, rlim);
    let mut sprot = Prot::READ | Prot::WRITE;
    if prog.exec_stack() {
        sprot |= Prot::EXEC;
    }
    let sflags = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED | MapFlags::GROWSDOWN;
    mm.mmap(stack_lo, top - stack_lo, sprot, sflags)?;

    let main = load::load_program(mm, &prog, interp.is_some())?;
    let program_entry = prog.hdr.e_entry.wrapping_add(main.bias);
    let (entry, interp_base) = match &interp {
        Some(i) => {
            let base = load::load_interp(mm, i, main.bias)?;
            (base.wrapping_add(i.hdr.e_entry), Some(base))
        }
        None => (program_entry, None),
    };
    let vdso = args.vdso.as_ref().map(|v| map_vdso(mm, v)).transpose()?;

    let mut auxv = Vec::with_capacity(args.auxv.len());
    for &(k, v) in &args.auxv {
        let v = match k {
            auxv::at::NULL => break,
            auxv::at::PHDR => main.phdr,
            auxv::at::PHENT => elf::PHDR_SIZE,
            auxv::at::PHNUM => u64::from(prog.hdr.e_phnum),
            auxv::at::PAGESZ => crate::PAGE_SIZE,
            auxv::at::BASE => interp_base.unwrap_or(0),
            auxv::at::ENTRY => program_entry,
            auxv::at::SYSINFO_EHDR => match vdso {
                Some(a) => a,
                None => continue,
            },
            _ => v,
        };
        auxv.push((k, v));
    }
    let has_platform = auxv.iter().any(|&(k, _)| k == auxv::at::PLATFORM);
    let tables = stack::Tables {
        platform: has_platform.then_some(&args.platform),
        random: args.random,
        auxv,
    };
    let st = stack::create_tables(&strings, tables)?;
    mm.write(st.rsp, &st.bytes)?;
    mm.set_start_stack(st.rsp);

    // A static PIE's heap goes to ELF_ET_DYN_BASE, out of the way of the
    // mmap area it was placed in (Linux does this with ASLR off too).
    let brk_end = if prog.hdr.e_type == elf::ET_DYN && interp.is_none() {
        load::et_dyn_base(mm.config().task_size)
    } else {
        main.end
    };
    let brk = crate::addr::page_align_up(brk_end).ok_or(Error::NoMem)?;
    mm.set_start_brk(brk)?;
    Ok(ExecImage {
        entry,
        rsp: st.rsp,
        program_entry,
        load_bias: main.bias,
        interp_base,
        phdr: main.phdr,
        brk,
        stack: Range::new(mm.vma_at(top - 1).map_or(stack_lo, |v| v.start), top),
        vdso,
        auxv: st.auxv,
    })
}

/// Maps `v` top-down (Linux's `map_vdso`): its data areas read-only,
/// then its image read-execute. Returns the image's address.
fn map_vdso(mm: &AddressSpace, v: &Vdso) -> Result<u64, ExecError> {
    let image_len = crate::addr::page_align_up(v.image.len() as u64).ok_or(Error::NoMem)?;
    let mut total = image_len;
    for &(_, len) in &v.data {
        let len = crate::addr::page_align_up(len).ok_or(Error::NoMem)?;
        total = total.checked_add(len).ok_or(Error::NoMem)?;
    }
    let rw = Prot::READ | Prot::WRITE;
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    let base = mm.mmap(0, total, rw, anon)?;
    let mut at = base;
    for (name, len) in &v.data {
        let len = crate::addr::page_align_up(*len).ok_or(Error::NoMem)?;
        if len != 0 {
            mm.mprotect(at, len, Prot::READ)?;
            mm.set_anon_name(at, len, Some(name))?;
        }
        at += len;
    }
    if image_len != 0 {
        mm.write(at, &v.image)?;
        mm.mprotect(at, image_len, Prot::READ | Prot::EXEC)?;
        mm.set_anon_name(at, image_len, Some("vdso"))?;
    }
    Ok(at)
}
