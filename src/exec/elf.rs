//! ELF64 x86-64 headers, parsed by hand: the file header and the program
//! headers a loader needs, with the checks Linux's binfmt_elf makes before
//! it maps anything (ENOEXEC for a file it does not run).

use super::object::Object;
use super::ExecError;

/// `e_type` of a fixed-address executable.
pub const ET_EXEC: u16 = 2;
/// `e_type` of a position-independent executable or shared object.
pub const ET_DYN: u16 = 3;
/// A loadable segment.
pub const PT_LOAD: u32 = 1;
/// The segment naming the program interpreter.
pub const PT_INTERP: u32 = 3;
/// The segment whose flags say whether the stack is executable.
pub const PT_GNU_STACK: u32 = 0x6474_e551;
/// Segment flag: executable.
pub const PF_X: u32 = 1;
/// Segment flag: writable.
pub const PF_W: u32 = 2;
/// Segment flag: readable.
pub const PF_R: u32 = 4;

const EM_X86_64: u16 = 62;
/// Bytes of an ELF64 file header.
const EHDR_SIZE: usize = 64;
/// Bytes of an ELF64 program header (`sizeof(struct elf64_phdr)`).
pub(crate) const PHDR_SIZE: u64 = 56;
/// Linux reads at most 64 KiB of program headers.
const MAX_PHDRS_BYTES: u64 = 65536;
/// Longest interpreter path (`PATH_MAX`, with its NUL).
const PATH_MAX: u64 = 4096;

/// The fields of the ELF file header a loader uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElfHeader {
    /// [`ET_EXEC`] or [`ET_DYN`].
    pub e_type: u16,
    /// Entry point, before the load bias.
    pub e_entry: u64,
    /// File offset of the program headers.
    pub e_phoff: u64,
    /// Number of program headers.
    pub e_phnum: u16,
}

/// One program header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramHeader {
    /// Segment type (`PT_*`).
    pub p_type: u32,
    /// `PF_R | PF_W | PF_X`.
    pub p_flags: u32,
    /// File offset of the segment's bytes.
    pub p_offset: u64,
    /// Address, before the load bias.
    pub p_vaddr: u64,
    /// Bytes in the file.
    pub p_filesz: u64,
    /// Bytes in memory (the rest, past `p_filesz`, is zero: bss).
    pub p_memsz: u64,
    /// Alignment.
    pub p_align: u64,
}

/// A parsed executable or interpreter: its object, header and program
/// headers.
pub(crate) struct Elf {
    pub(crate) obj: Object,
    pub(crate) hdr: ElfHeader,
    pub(crate) phdrs: Vec<ProgramHeader>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

/// Reads exactly `buf.len()` bytes at `offset`, or ENOEXEC (`what` says
/// which part was cut short; Linux returns EIO for a short read).
fn read_exact(
    obj: &Object,
    offset: u64,
    buf: &mut [u8],
    what: &'static str,
) -> Result<(), ExecError> {
    match obj.read_at(buf, offset) {
        Ok(n) if n == buf.len() => Ok(()),
        Ok(_) => Err(ExecError::NoExec(what)),
        Err(e) => Err(ExecError::Mm(e)),
    }
}

/// Checks the file header: ELF magic, 64-bit little-endian, version 1,
/// x86-64, an executable or shared object, 56-byte program headers, and
/// at most 64 KiB of them.
pub fn parse_header(b: &[u8; EHDR_SIZE]) -> Result<ElfHeader, ExecError> {
    if &b[..4] != b"\x7fELF" {
        return Err(ExecError::NoExec("no ELF magic"));
    }
    if b[4] != 2 || b[5] != 1 || b[6] != 1 {
        return Err(ExecError::NoExec("not ELF64 little-endian version 1"));
    }
    let e_type = u16_at(b, 16);
    if e_type != ET_EXEC && e_type != ET_DYN {
        return Err(ExecError::NoExec("neither ET_EXEC nor ET_DYN"));
    }
    if u16_at(b, 18) != EM_X86_64 {
        return Err(ExecError::NoExec("not x86-64"));
    }
    let e_phnum = u16_at(b, 56);
    if u64::from(u16_at(b, 54)) != PHDR_SIZE {
        return Err(ExecError::NoExec("program header size is not 56"));
    }
    let size = u64::from(e_phnum) * PHDR_SIZE;
    if size == 0 || size > MAX_PHDRS_BYTES {
        return Err(ExecError::NoExec(
            "no program headers, or over 64 KiB of them",
        ));
    }
    Ok(ElfHeader {
        e_type,
        e_entry: u64_at(b, 24),
        e_phoff: u64_at(b, 32),
        e_phnum,
    })
}

/// One program header from its 56 bytes.
pub fn parse_phdr(b: &[u8]) -> ProgramHeader {
    ProgramHeader {
        p_type: u32_at(b, 0),
        p_flags: u32_at(b, 4),
        p_offset: u64_at(b, 8),
        p_vaddr: u64_at(b, 16),
        p_filesz: u64_at(b, 32),
        p_memsz: u64_at(b, 40),
        p_align: u64_at(b, 48),
    }
}

impl Elf {
    /// Reads and checks the headers of `obj`.
    pub(crate) fn parse(obj: Object) -> Result<Elf, ExecError> {
        let mut h = [0u8; EHDR_SIZE];
        read_exact(&obj, 0, &mut h, "file shorter than an ELF header")?;
        let hdr = parse_header(&h)?;
        // parse_header bounds the table to 64 KiB.
        let mut table = vec![0u8; usize::from(hdr.e_phnum) * PHDR_SIZE as usize];
        read_exact(
            &obj,
            hdr.e_phoff,
            &mut table,
            "program headers past the end of the file",
        )?;
        let phdrs = table
            .chunks_exact(PHDR_SIZE as usize)
            .map(parse_phdr)
            .collect();
        Ok(Elf { obj, hdr, phdrs })
    }

    /// The interpreter path of the first `PT_INTERP`, if any: between 2
    /// and `PATH_MAX` bytes, NUL-terminated (else ENOEXEC).
    pub(crate) fn interp(&self) -> Result<Option<Vec<u8>>, ExecError> {
        let Some(p) = self.phdrs.iter().find(|p| p.p_type == PT_INTERP) else {
            return Ok(None);
        };
        if p.p_filesz < 2 || p.p_filesz > PATH_MAX {
            return Err(ExecError::NoExec("interpreter path length out of range"));
        }
        let mut path = vec![0u8; p.p_filesz as usize];
        read_exact(
            &self.obj,
            p.p_offset,
            &mut path,
            "interpreter path past the end of the file",
        )?;
        if path.pop() != Some(0) {
            return Err(ExecError::NoExec("interpreter path not NUL-terminated"));
        }
        if path.contains(&0) {
            return Err(ExecError::NoExec("interpreter path holds a NUL"));
        }
        Ok(Some(path))
    }

    /// Whether `PT_GNU_STACK` asks for an executable stack (without one,
    /// x86-64's default is a non-executable stack).
    pub(crate) fn exec_stack(&self) -> bool {
        self.phdrs
            .iter()
            .find(|p| p.p_type == PT_GNU_STACK)
            .is_some_and(|p| p.p_flags & PF_X != 0)
    }

    /// The loadable segments, in file order.
    pub(crate) fn loads(&self) -> impl Iterator<Item = &ProgramHeader> {
        self.phdrs.iter().filter(|p| p.p_type == PT_LOAD)
    }
}
