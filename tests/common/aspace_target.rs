//! aspace as a [`Target`].

use super::{normalize, Region, Res, Target, Vma, GUARD_FLAGS, GUARD_PROT, PAGE};
use aspace::{AddressSpace, Advice, Config, MapFlags, Memfd, MremapFlags, Prot, VmFlags};
use std::sync::Arc;

/// Where aspace-only tests put their region (the kernel harness picks its
/// own address; a paired aspace target uses the same one).
pub const DEFAULT_REGION_START: u64 = 0x2000_0000_0000;

/// An [`AddressSpace`] with Linux x86-64's default layout and the region's
/// guard pages mapped like on the kernel side.
pub struct AspaceTarget {
    /// The space: its own, or one several targets share
    /// ([`in_space`](Self::in_space)).
    pub mm: Arc<AddressSpace>,
    region: Region,
    /// Memory objects, made on first use.
    objs: Vec<Option<Memfd>>,
}

impl AspaceTarget {
    /// Default configuration, with this test process's locked-memory
    /// limit (unlimited when it runs with `CAP_IPC_LOCK`, as root does),
    /// so that locks compare with the kernel side's, and execute-only
    /// memory as this kernel makes it (protection keys or not).
    pub fn new(region: Region) -> AspaceTarget {
        Self::with_config(region, Self::kernel_like())
    }

    /// The default configuration with this process's limits (see
    /// [`new`](Self::new)).
    fn kernel_like() -> Config {
        Config {
            memlock_limit: super::kernel::process_memlock_limit(),
            exec_only_pkey: super::kernel::kernel_exec_only(),
            ..Config::default()
        }
    }

    /// [`new`](Self::new) with the mmap area ending at the region's end
    /// (`mmap_base`), so that placements go where a kernel target's go
    /// once it [confines](super::KernelTarget::confine_placements) them:
    /// the region's interior first, then the free space below it. The
    /// heap's start moves below the region (the configuration wants it
    /// under `mmap_base`; nothing here uses brk).
    pub fn confined(region: Region) -> AspaceTarget {
        let cfg = Config {
            mmap_base: region.end,
            brk_start: 0x1000_0000,
            ..Self::kernel_like()
        };
        Self::with_config(region, cfg)
    }

    /// A given configuration; the guard pages are mapped as on the kernel.
    pub fn with_config(region: Region, cfg: Config) -> AspaceTarget {
        Self::in_space(Arc::new(AddressSpace::new(cfg)), region)
    }

    /// A target on `region` of a space other targets may share (each on
    /// a region of its own); the guard pages are mapped as on the kernel.
    pub fn in_space(mm: Arc<AddressSpace>, region: Region) -> AspaceTarget {
        for g in [region.start, region.hi] {
            let got = mm.mmap(
                g,
                PAGE,
                Prot::from_bits_retain(GUARD_PROT),
                MapFlags::from_bits_retain(GUARD_FLAGS),
            );
            assert_eq!(got, Ok(g), "aspace guard page");
        }
        AspaceTarget {
            mm,
            region,
            objs: (0..super::OBJECTS).map(|_| None).collect(),
        }
    }

    /// `mmap` of `obj` with the arguments of `m` (its object number aside).
    fn map_object(&self, m: super::ops::ObjMapping, obj: &Memfd) -> Res<u64> {
        errno(self.mm.mmap_fd(
            m.addr,
            m.len,
            Prot::from_bits_retain(m.prot),
            MapFlags::from_bits_retain(m.flags),
            obj,
            m.off,
        ))
    }

    /// Memory object `obj`, made (empty) on first use.
    fn obj(&mut self, obj: u32) -> &Memfd {
        let pool = self.mm.frame_pool().clone();
        self.objs[obj as usize].get_or_insert_with(|| {
            Memfd::new_in(&pool, &super::obj_name(obj), 0).expect("a valid name")
        })
    }
}

fn errno<T>(r: aspace::Result<T>) -> Res<T> {
    r.map_err(|e| e.errno())
}

/// aspace's flags as the `/proc/pid/smaps` mnemonics the harness
/// compares ([`super::MODELLED_FLAGS`]), sorted.
pub fn mnemonics(f: VmFlags) -> Vec<String> {
    super::comparable_flags(f.mnemonics().into_iter().map(String::from).collect())
}

impl Target for AspaceTarget {
    fn name(&self) -> &'static str {
        "aspace"
    }

    fn region(&self) -> Region {
        self.region
    }

    fn mmap(&mut self, addr: u64, len: u64, prot: u32, flags: u32) -> Res<u64> {
        errno(self.mm.mmap(
            addr,
            len,
            Prot::from_bits_retain(prot),
            MapFlags::from_bits_retain(flags),
        ))
    }

    fn munmap(&mut self, addr: u64, len: u64) -> Res<()> {
        errno(self.mm.munmap(addr, len))
    }

    fn mprotect(&mut self, addr: u64, len: u64, prot: u32) -> Res<()> {
        errno(self.mm.mprotect(addr, len, Prot::from_bits_retain(prot)))
    }

    fn mremap(
        &mut self,
        old: u64,
        old_len: u64,
        new_len: u64,
        flags: u32,
        new_addr: u64,
    ) -> Res<u64> {
        errno(self.mm.mremap(
            old,
            old_len,
            new_len,
            MremapFlags::from_bits_retain(flags),
            new_addr,
        ))
    }

    fn madvise(&mut self, addr: u64, len: u64, advice: i32) -> Res<()> {
        let advice = Advice::from_raw(advice)
            .unwrap_or_else(|| panic!("madvise advice {advice} is not part of aspace's API"));
        errno(self.mm.madvise(addr, len, advice))
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Res<()> {
        errno(self.mm.write(addr, data))
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Res<()> {
        errno(self.mm.read(addr, buf))
    }

    fn unmap_outside(&mut self, addr: u64, len: u64) -> Res<()> {
        errno(self.mm.munmap(addr, len))
    }

    fn layout(&mut self) -> Vec<Vma> {
        let r = self.region;
        normalize(
            self.mm
                .vmas()
                .into_iter()
                .filter(|v| v.start >= r.start && v.end <= r.end)
                .map(|v| {
                    let line = v.maps_line();
                    let mut parsed = super::kernel::parse_maps_line(&line)
                        .unwrap_or_else(|| panic!("aspace maps line does not parse: {line:?}"));
                    // Compare the object identity aspace reports, whatever
                    // it prints as the inode.
                    parsed.obj = v.shmem_id;
                    assert_eq!(
                        (parsed.start, parsed.end),
                        (v.start, v.end),
                        "maps line {line:?}"
                    );
                    parsed
                })
                .collect(),
        )
    }

    fn mlock2(&mut self, addr: u64, len: u64, flags: u32) -> Res<()> {
        errno(
            self.mm
                .mlock2(addr, len, aspace::MlockFlags::from_bits_retain(flags)),
        )
    }

    fn munlock(&mut self, addr: u64, len: u64) -> Res<()> {
        errno(self.mm.munlock(addr, len))
    }

    fn msync(&mut self, addr: u64, len: u64, flags: u32) -> Res<()> {
        errno(
            self.mm
                .msync(addr, len, aspace::MsyncFlags::from_bits_retain(flags)),
        )
    }

    fn mincore(&mut self, addr: u64, len: u64) -> Res<Vec<bool>> {
        errno(self.mm.mincore(addr, len))
    }

    fn resident(&mut self, _addr: u64, _pages: u64) -> Option<Vec<bool>> {
        None
    }

    fn aspace(&self) -> Option<&AddressSpace> {
        Some(&self.mm)
    }

    fn obj_truncate(&mut self, obj: u32, len: u64) -> Res<()> {
        errno(self.obj(obj).set_len(len))
    }

    fn mmap_obj(&mut self, m: super::ops::ObjMapping) -> Res<u64> {
        let obj = self.obj(m.obj).clone();
        self.map_object(m, &obj)
    }

    fn mmap_file(
        &mut self,
        m: super::ops::ObjMapping,
        file: &std::fs::File,
        name: &str,
    ) -> Res<u64> {
        let obj = Memfd::from_file_in(self.mm.frame_pool(), file, name).map_err(|e| e.errno())?;
        self.map_object(m, &obj)
    }

    fn obj_write(&mut self, obj: u32, off: u64, data: &[u8]) -> Res<usize> {
        errno(self.obj(obj).write_at(data, off))
    }

    fn obj_read(&mut self, obj: u32, off: u64, buf: &mut [u8]) -> Res<usize> {
        errno(self.obj(obj).read_at(buf, off))
    }

    fn vm_flags(&mut self) -> Option<Vec<(u64, u64, Vec<String>)>> {
        let r = self.region;
        Some(
            self.mm
                .vmas()
                .into_iter()
                .filter(|v| v.start >= r.start && v.end <= r.end)
                .map(|v| (v.start, v.end, mnemonics(v.flags)))
                .collect(),
        )
    }
}
