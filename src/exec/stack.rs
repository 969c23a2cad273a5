//! The initial stack, as Linux's exec builds it: the strings at the top
//! (the file name, then the environment, then the arguments, downwards,
//! below 8 zero bytes), the stack VMA sized from them, and below them the
//! platform string, the 16 `AT_RANDOM` bytes, then `argc`, the `argv` and
//! `envp` pointer arrays and the auxiliary vector, with `rsp` 16-byte
//! aligned (Linux's `copy_strings`, `setup_arg_pages` and
//! `create_elf_tables`, with no randomization).

use super::auxv::at;
use super::ExecError;
use crate::addr::{page_align_down, PAGE_SIZE};
use std::ffi::CString;

/// Longest single string (`MAX_ARG_STRLEN`, 32 pages).
pub const MAX_ARG_STRLEN: u64 = 32 * PAGE_SIZE;
/// The least room for strings and pointers (`ARG_MAX`, 32 pages).
const ARG_MAX: u64 = 32 * PAGE_SIZE;
/// Linux's `_STK_LIM`: 8 MiB.
const STK_LIM: u64 = 8 << 20;
/// How far below its strings exec extends the stack VMA.
pub const STACK_EXPAND: u64 = 128 << 10;

/// The strings copied to the top of the stack.
pub(crate) struct Strings {
    /// The stack top (exclusive).
    pub(crate) top: u64,
    /// Lowest string byte: `argv[0]`.
    pub(crate) low: u64,
    /// Address of the file name (`AT_EXECFN`).
    pub(crate) execfn: u64,
    /// Number of arguments (at least 1: an empty `argv` gets `""`).
    pub(crate) argc: u64,
    /// Number of environment strings.
    pub(crate) envc: u64,
    /// The bytes of `[low, top)`.
    pub(crate) bytes: Vec<u8>,
}

/// Lays the strings out below `top` within the argument limit for a
/// stack limit of `rlim` bytes (Linux's `bprm_stack_limits` then
/// `copy_strings`): E2BIG for a string over [`MAX_ARG_STRLEN`] or strings
/// and pointers over the limit.
pub(crate) fn copy_strings(
    top: u64,
    rlim: u64,
    filename: &CString,
    argv: &[CString],
    envp: &[CString],
) -> Result<Strings, ExecError> {
    let argc = argv.len() as u64;
    let envc = envp.len() as u64;
    let limit = (STK_LIM / 4 * 3).min(rlim / 4).max(ARG_MAX);
    let ptrs = argc
        .max(1)
        .checked_add(envc)
        .and_then(|n| n.checked_mul(8))
        .ok_or(ExecError::TooBig)?;
    if limit <= ptrs {
        return Err(ExecError::TooBig);
    }
    let mut p = top.checked_sub(8).ok_or(ExecError::TooBig)?;
    let argmin = p.saturating_sub(limit - ptrs);
    // Highest first: the file name, the environment from its last
    // string, the arguments from their last.
    let empty = CString::default();
    let mut order: Vec<&CString> = vec![filename];
    order.extend(envp.iter().rev());
    order.extend(argv.iter().rev());
    if argv.is_empty() {
        order.push(&empty); // Linux 5.18+: argv is never empty
    }
    let mut execfn = 0;
    for (i, s) in order.iter().enumerate() {
        let len = s.as_bytes_with_nul().len() as u64;
        if len > MAX_ARG_STRLEN || p < argmin.saturating_add(len) {
            return Err(ExecError::TooBig);
        }
        p -= len;
        if i == 0 {
            execfn = p;
        }
    }
    // Bounded by the limit above (at most 6 MiB).
    let mut bytes = Vec::with_capacity((top - p) as usize);
    for s in order.iter().rev() {
        bytes.extend_from_slice(s.as_bytes_with_nul());
    }
    bytes.extend_from_slice(&[0; 8]);
    Ok(Strings {
        top,
        low: p,
        execfn,
        argc: argc.max(1),
        envc,
        bytes,
    })
}

/// The stack VMA's start for strings down to `low` under a stack limit of
/// `rlim` bytes (Linux's `setup_arg_pages`): 128 KiB below the page of
/// the lowest string, or the limit below the top if that is less.
pub(crate) fn stack_start(s: &Strings, rlim: u64) -> u64 {
    let vm_start = page_align_down(s.low).min(s.top - PAGE_SIZE);
    let size = s.top - vm_start;
    let expand = (rlim & !(PAGE_SIZE - 1)).min(size.saturating_add(STACK_EXPAND));
    vm_start.min(s.top.saturating_sub(expand))
}

/// What goes below the strings.
pub(crate) struct Tables<'a> {
    /// The platform string, if `AT_PLATFORM` is in the vector.
    pub(crate) platform: Option<&'a CString>,
    /// The `AT_RANDOM` bytes.
    pub(crate) random: [u8; 16],
    /// The auxiliary vector without `AT_NULL`; `AT_RANDOM`, `AT_EXECFN`
    /// and `AT_PLATFORM` are filled in here.
    pub(crate) auxv: Vec<(u64, u64)>,
}

/// The finished stack: `rsp` and the bytes of `[rsp, top)`.
pub(crate) struct Stack {
    pub(crate) rsp: u64,
    pub(crate) bytes: Vec<u8>,
    /// The auxiliary vector as written (without `AT_NULL`).
    pub(crate) auxv: Vec<(u64, u64)>,
}

/// Puts the tables below the strings (Linux's `create_elf_tables`).
pub(crate) fn create_tables(s: &Strings, mut t: Tables<'_>) -> Result<Stack, ExecError> {
    let tb = |a: Option<u64>| a.ok_or(ExecError::TooBig);
    let mut p = s.low & !15;
    let platform = match t.platform {
        Some(name) => {
            p = tb(p.checked_sub(name.as_bytes_with_nul().len() as u64))?;
            Some((p, name.as_bytes_with_nul()))
        }
        None => None,
    };
    p = tb(p.checked_sub(16))?;
    let random = p;
    for (k, v) in &mut t.auxv {
        match *k {
            at::RANDOM => *v = random,
            at::EXECFN => *v = s.execfn,
            at::PLATFORM => *v = platform.map_or(0, |(a, _)| a),
            _ => {}
        }
    }
    let words = (t.auxv.len() as u64 + 1) * 2;
    let items = (s.argc + 1) + (s.envc + 1) + 1;
    let rsp = tb(p
        .checked_sub(words * 8)
        .and_then(|sp| sp.checked_sub(items * 8)))?
        & !15;
    let mut bytes = vec![0u8; (s.top - rsp) as usize];
    let put = |bytes: &mut Vec<u8>, at: u64, data: &[u8]| {
        let o = (at - rsp) as usize;
        bytes[o..o + data.len()].copy_from_slice(data);
    };
    put(&mut bytes, s.low, &s.bytes);
    if let Some((a, name)) = platform {
        put(&mut bytes, a, name);
    }
    put(&mut bytes, random, &t.random);
    let mut table: Vec<u64> = vec![s.argc];
    // argv then envp: pointers to consecutive strings from the lowest.
    let mut at = s.low;
    for n in [s.argc, s.envc] {
        for _ in 0..n {
            table.push(at);
            let o = (at - s.low) as usize;
            let len = s.bytes[o..].iter().position(|&b| b == 0).unwrap_or(0) + 1;
            at += len as u64;
        }
        table.push(0);
    }
    for &(k, v) in &t.auxv {
        table.extend([k, v]);
    }
    table.extend([at::NULL, 0]);
    let words: Vec<u8> = table.iter().flat_map(|w| w.to_le_bytes()).collect();
    put(&mut bytes, rsp, &words);
    Ok(Stack {
        rsp,
        bytes,
        auxv: t.auxv,
    })
}
