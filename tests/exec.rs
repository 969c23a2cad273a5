//! exec against the kernel: a dynamically linked PIE (`/bin/true`, with
//! its interpreter) and a static executable made here by hand are started
//! by the kernel with ASLR off (`personality(ADDR_NO_RANDOMIZE)`) under
//! ptrace, and loaded by `aspace::exec::load_elf` with the same file name,
//! argv and envp. At the first stop after exec both must agree on:
//! - `/proc/PID/maps` (normalized by `exec_support::normalize`; the
//!   kernel's `[vsyscall]` line, above the task, is left out);
//! - the initial `rsp` and `rip`;
//! - the whole stack from `rsp` to its top, byte for byte (the auxiliary
//!   vector template, the random bytes and the platform string are taken
//!   from the child, so only the layout is compared).
//!
//! Then, aspace alone: the stack read back through `mm.read`, the heap
//! from the end of bss, the zeroed tail of the data page, and the errors.

mod exec_support;

use aspace::exec::{auxv::at, load_elf, ExecArgs, ExecError, Vdso};
use aspace::{AddressSpace, Config, MapFlags, Prot};
use exec_support::*;
use std::ffi::CString;
use std::path::Path;
use std::sync::Mutex;

/// One exec test at a time: a file being written while another test
/// forks would be held open by that child, and exec would fail ETXTBSY.
static FORKS: Mutex<()> = Mutex::new(());

const TOP: u64 = 0x7fff_ffff_f000;

fn cstrings(v: &[&str]) -> Vec<CString> {
    v.iter().map(|s| CString::new(*s).unwrap()).collect()
}

/// Loads `path` the way the kernel did: its auxv template, random bytes
/// and platform string, and this machine's vDSO layout.
fn aspace_exec(
    path: &Path,
    argv: &[&str],
    envp: &[&str],
    k: &Kernel,
) -> (AddressSpace, aspace::exec::ExecImage) {
    let mm = AddressSpace::new(Config::default());
    let mut args = ExecArgs::new(path, argv, envp);
    args.auxv = k.auxv.clone();
    let read_at = |a: u64, n: usize| {
        let o = (a - k.rsp) as usize;
        k.stack[o..(o + n).min(k.stack.len())].to_vec()
    };
    for &(key, v) in &k.auxv {
        match key {
            at::RANDOM => args.random = read_at(v, 16).try_into().unwrap(),
            at::PLATFORM => {
                let s = read_at(v, 64);
                let end = s.iter().position(|&b| b == 0).unwrap();
                args.platform = CString::new(&s[..end]).unwrap();
            }
            _ => {}
        }
    }
    let (data, image) = host_vdso();
    if k.auxv.iter().any(|&(key, _)| key == at::SYSINFO_EHDR) {
        args.vdso = Some(Vdso { data, image });
    }
    let img = load_elf(&mm, &args).unwrap_or_else(|e| panic!("load_elf {}: {e}", path.display()));
    (mm, img)
}

/// Runs `path` on both sides and compares them; returns the kernel
/// child's exit status when `finish` (None when the kernel side may not
/// run here).
fn compare(path: &Path, argv: &[&str], envp: &[&str], finish: bool) -> Option<Option<i32>> {
    let _one = FORKS.lock().unwrap_or_else(|e| e.into_inner());
    let (k, status) = match kernel_exec(path, &cstrings(argv), &cstrings(envp), TOP, finish) {
        Ok(r) => r,
        Err(Skip::NotPermitted(what)) => {
            eprintln!(
                "SKIPPED: {what} is not permitted here; exec is not compared with the kernel"
            );
            return None;
        }
    };
    let (mm, img) = aspace_exec(path, argv, envp, &k);
    let special: Vec<String> = host_vdso()
        .0
        .into_iter()
        .map(|d| d.0)
        .chain(["vdso".into()])
        .collect();
    let theirs: Vec<String> = k
        .maps
        .lines()
        .filter(|l| !l.ends_with("[vsyscall]"))
        .map(|l| normalize(l, &special))
        .collect();
    let ours: Vec<String> = mm.maps().lines().map(|l| normalize(l, &special)).collect();
    assert_eq!(
        ours,
        theirs,
        "maps of {}:\naspace:\n{}\nkernel:\n{}",
        path.display(),
        mm.maps(),
        k.maps
    );
    assert_eq!((img.rsp, img.entry), (k.rsp, k.rip), "rsp and rip");
    assert_eq!(img.auxv, k.auxv, "auxiliary vector");
    let mut stack = vec![0u8; (TOP - img.rsp) as usize];
    mm.read(img.rsp, &mut stack).unwrap();
    assert!(stack == k.stack, "the initial stacks differ");
    Some(status)
}

#[test]
fn pie_with_interpreter_matches_the_kernel() {
    let argv = ["/bin/true", "--version-not", "x y"];
    let envp = ["A=1", "PATH=/usr/bin:/bin", "EMPTY="];
    compare(Path::new("/bin/true"), &argv, &envp, false);
    // Strings over several pages: the stack VMA starts 128 KiB below the
    // lowest one's page.
    let big = format!("BIG={}", "b".repeat(9000));
    compare(Path::new("/bin/true"), &argv, &[big.as_str(), "A=1"], false);
}

#[test]
fn static_executable_matches_the_kernel_and_runs() {
    let exe = {
        let _one = FORKS.lock().unwrap_or_else(|e| e.into_inner());
        write_exe("static", &static_elf(false))
    };
    let path = &exe.0;
    let status = compare(path, &["static", "one"], &["K=V"], true);
    if let Some(status) = status {
        assert_eq!(
            status,
            Some(0),
            "the hand-made program exits 0 under the kernel"
        );
    }
    // An empty argv: the kernel puts "" in it (Linux 5.18+).
    compare(path, &[], &[], false);
    // Pointers over 128 KiB: writing them grows the stack below the VMA
    // exec made.
    let many = vec![""; 20_000];
    compare(path, &many, &["K=V"], false);
}

#[test]
fn static_pie_matches_the_kernel_and_runs() {
    let exe = {
        let _one = FORKS.lock().unwrap_or_else(|e| e.into_inner());
        write_exe("static-pie", &static_elf(true))
    };
    if let Some(status) = compare(&exe.0, &["pie"], &["K=V"], true) {
        assert_eq!(
            status,
            Some(0),
            "the hand-made PIE exits 0 under the kernel"
        );
    }
    // Its heap goes to ELF_ET_DYN_BASE, out of the mmap area it lies in.
    let mm = AddressSpace::new(Config::default());
    let img = load_elf(&mm, &ExecArgs::new(&exe.0, &["pie"], &[])).unwrap();
    assert_eq!(img.brk, 0x5555_5555_5000);
    assert_eq!(img.interp_base, None);
    assert_eq!(img.entry, img.load_bias + 0xb0);
}

/// Every byte of the headers, corrupted a few ways: each load succeeds or
/// fails with one of exec's errnos, and never panics.
#[test]
fn corrupt_headers_never_panic() {
    let good = static_elf(false);
    let mm = AddressSpace::new(Config::default());
    for at in 0..0xb0 {
        for v in [0u8, 0xff, 0x80, good[at].wrapping_add(1)] {
            let mut bad = good.clone();
            bad[at] = v;
            let exe = {
                let _one = FORKS.lock().unwrap_or_else(|e| e.into_inner());
                write_exe("corrupt", &bad)
            };
            if let Err(e) = load_elf(&mm, &ExecArgs::new(&exe.0, &["c"], &[])) {
                let ok = [
                    libc::ENOEXEC,
                    libc::EINVAL,
                    libc::ENOMEM,
                    libc::EEXIST,
                    libc::EPERM,
                    libc::EOVERFLOW,
                    libc::EFAULT,
                ];
                assert!(ok.contains(&e.errno()), "byte {at:#x} = {v:#x}: {e}");
            }
        }
    }
}

/// A NUL-terminated string at `a`.
fn string_at(mm: &AddressSpace, a: u64) -> String {
    let mut s = Vec::new();
    let mut b = [0u8; 1];
    for i in 0.. {
        mm.read(a + i, &mut b).unwrap();
        if b[0] == 0 {
            break;
        }
        s.push(b[0]);
    }
    String::from_utf8(s).unwrap()
}

fn word(mm: &AddressSpace, a: u64) -> u64 {
    let mut b = [0u8; 8];
    mm.read(a, &mut b).unwrap();
    u64::from_le_bytes(b)
}

#[test]
fn stack_layout_reads_back_through_the_space() {
    let exe = {
        let _one = FORKS.lock().unwrap_or_else(|e| e.into_inner());
        write_exe("layout", &static_elf(false))
    };
    let path = &exe.0;
    let mm = AddressSpace::new(Config::default());
    let mut args = ExecArgs::new(path, &["prog", "arg one"], &["HOME=/", "X="]);
    args.random = *b"0123456789abcdef";
    let img = load_elf(&mm, &args).unwrap();
    assert_eq!(img.rsp % 16, 0);
    assert_eq!(
        (img.entry, img.program_entry, img.load_bias),
        (ENTRY, ENTRY, 0)
    );
    assert_eq!(img.interp_base, None);
    let sp = img.rsp;
    assert_eq!(word(&mm, sp), 2, "argc");
    assert_eq!(string_at(&mm, word(&mm, sp + 8)), "prog");
    assert_eq!(string_at(&mm, word(&mm, sp + 16)), "arg one");
    assert_eq!(word(&mm, sp + 24), 0);
    assert_eq!(string_at(&mm, word(&mm, sp + 32)), "HOME=/");
    assert_eq!(string_at(&mm, word(&mm, sp + 40)), "X=");
    assert_eq!(word(&mm, sp + 48), 0);
    // The strings are at the top: argv, envp, the file name, 8 zeros.
    let name = path.to_str().unwrap();
    let execfn = TOP - 8 - name.len() as u64 - 1;
    assert_eq!(word(&mm, sp + 8), execfn - 3 - 7 - 8 - 5);
    assert_eq!(word(&mm, TOP - 8), 0);
    let mut aux = std::collections::HashMap::new();
    let mut a = sp + 56;
    loop {
        let (k, v) = (word(&mm, a), word(&mm, a + 8));
        if k == at::NULL {
            break;
        }
        aux.insert(k, v);
        a += 16;
    }
    assert_eq!(aux[&at::PHDR], TEXT + 64);
    assert_eq!((aux[&at::PHENT], aux[&at::PHNUM]), (56, 2));
    assert_eq!(
        (aux[&at::PAGESZ], aux[&at::BASE], aux[&at::ENTRY]),
        (4096, 0, ENTRY)
    );
    assert_eq!(aux[&at::EXECFN], execfn);
    assert_eq!(string_at(&mm, aux[&at::EXECFN]), name);
    assert_eq!(string_at(&mm, aux[&at::PLATFORM]), "x86_64");
    let mut rnd = [0u8; 16];
    mm.read(aux[&at::RANDOM], &mut rnd).unwrap();
    assert_eq!(&rnd, b"0123456789abcdef");
    assert!(
        !aux.contains_key(&at::SYSINFO_EHDR),
        "no vDSO, no AT_SYSINFO_EHDR"
    );
    // The stack: growsdown, 128 KiB below the strings' page, labelled.
    assert_eq!(img.stack.end, TOP);
    assert_eq!(img.stack.start, TOP - 4096 - (128 << 10));
    let v = mm.vma_at(sp).unwrap();
    assert!(v.growsdown && v.stack);
}

#[test]
fn segments_bss_and_heap_of_the_static_program() {
    let exe = {
        let _one = FORKS.lock().unwrap_or_else(|e| e.into_inner());
        write_exe("segments", &static_elf(false))
    };
    let mm = AddressSpace::new(Config::default());
    let img = load_elf(&mm, &ExecArgs::new(&exe.0, &["p"], &[])).unwrap();
    let mut b = [0u8; 32];
    mm.read(DATA, &mut b).unwrap();
    assert_eq!(&b, DATA_BYTES);
    // The rest of the data page is zero, though the file goes on with 0xaa.
    let mut rest = vec![0u8; (0x40_3000 - DATA - 32) as usize];
    mm.read(DATA + 32, &mut rest).unwrap();
    assert!(rest.iter().all(|&x| x == 0));
    let mut bss = vec![1u8; 0x1100];
    mm.read(0x40_3000, &mut bss).unwrap();
    assert!(bss.iter().all(|&x| x == 0));
    // The heap starts at the page after bss, and not below.
    assert_eq!(img.brk, 0x40_5000);
    assert_eq!(mm.brk(0).unwrap(), 0x40_5000);
    assert_eq!(mm.brk(0x40_4000).unwrap(), 0x40_5000);
    assert_eq!(mm.brk(0x40_7000).unwrap(), 0x40_7000);
    assert!(
        mm.maps()
            .contains("00405000-00407000 rw-p 00000000 00:00 0")
            && mm.maps().contains("[heap]")
    );
    // The text is read-execute: a user store there fails.
    assert!(mm.write(ENTRY, &[0]).is_err());
}

#[test]
fn errors_leave_the_space_as_it_was() {
    let mm = AddressSpace::new(Config::default());
    let a = mm
        .mmap(0, 4096, Prot::READ, MapFlags::PRIVATE | MapFlags::ANONYMOUS)
        .unwrap();
    let before = mm.maps();
    let missing = load_elf(&mm, &ExecArgs::new("/nonexistent/prog", &["x"], &[]));
    assert_eq!(missing.unwrap_err().errno(), libc::ENOENT);
    let exe = {
        let _one = FORKS.lock().unwrap_or_else(|e| e.into_inner());
        let mut bad = static_elf(false);
        bad[18] = 3; // EM_386
        write_exe("notx86", &bad)
    };
    let e = load_elf(&mm, &ExecArgs::new(&exe.0, &["x"], &[])).unwrap_err();
    assert!(
        matches!(e, ExecError::NoExec(_)) && e.errno() == libc::ENOEXEC,
        "{e}"
    );
    let huge = "x".repeat(200 << 10);
    let e = load_elf(&mm, &ExecArgs::new("/bin/true", &[huge.as_str()], &[])).unwrap_err();
    assert_eq!(e.errno(), libc::E2BIG);
    let mut top = ExecArgs::new("/bin/true", &["x"], &[]);
    top.stack_top = Some(u64::MAX);
    assert_eq!(load_elf(&mm, &top).unwrap_err().errno(), libc::ENOMEM);
    assert_eq!(mm.maps(), before);
    assert!(mm.vma_at(a).is_some());
}

/// A stack top in the first page, in a space whose first page is usable:
/// the stack VMA is clamped at 0, nothing wraps.
#[test]
fn stack_at_the_bottom_of_the_space() {
    let exe = {
        let _one = FORKS.lock().unwrap_or_else(|e| e.into_inner());
        write_exe("low", &static_elf(false))
    };
    let mm = AddressSpace::new(Config {
        mmap_min_addr: 0,
        ..Config::default()
    });
    let mut args = ExecArgs::new(&exe.0, &["low"], &[]);
    args.stack_top = Some(4096);
    let img = load_elf(&mm, &args).unwrap();
    assert_eq!((img.stack.start, img.stack.end), (0, 4096));
    assert_eq!(word(&mm, img.rsp), 1);
}

#[test]
fn exec_reset_and_start_brk() {
    let mm = AddressSpace::new(Config::default());
    let rw = Prot::READ | Prot::WRITE;
    let a = mm
        .mmap(0, 1 << 20, rw, MapFlags::PRIVATE | MapFlags::ANONYMOUS)
        .unwrap();
    mm.write(a, b"old").unwrap();
    let start = mm.brk(0).unwrap();
    mm.brk(start + 8192).unwrap();
    mm.set_start_stack(a);
    assert_eq!(mm.set_start_brk(0x60_0000), Err(aspace::Error::Busy));
    let mut cpu = mm.translator();
    assert_eq!(cpu.load::<u8>(a), Ok(b'o'));
    mm.exec_reset();
    // The reset's shootdown reached the translator: no stale translation.
    assert!(cpu.load::<u8>(a).is_err());
    drop(cpu);
    assert_eq!((mm.map_count(), mm.frames_used()), (0, 0));
    assert_eq!((mm.brk(0).unwrap(), mm.start_stack()), (start, 0));
    assert!(mm.read(a, &mut [0u8; 3]).is_err());
    assert_eq!(mm.set_start_brk(0x60_0001), Err(aspace::Error::Inval));
    assert_eq!(
        mm.set_start_brk(mm.config().task_size),
        Err(aspace::Error::Inval)
    );
    mm.set_start_brk(0x60_0000).unwrap();
    assert_eq!(mm.brk(0x60_1000).unwrap(), 0x60_1000);
    assert_eq!(mm.brk(0x5f_f000).unwrap(), 0x60_1000);
}
