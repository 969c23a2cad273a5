//! host_file: map a real file into guest address spaces, as a loader maps
//! a library, and write to one through a shared mapping.
//!
//! ```text
//! cargo run --release --example host_file -- [PATH]
//! ```
//!
//! PATH (default: this program's own executable) is opened read-only and
//! made a file object ([`Memfd::from_file`]): its pages are read from the
//! host on first use into a page cache every mapping shares. Ten address
//! spaces made independently ([`AddressSpace::new`]) map it privately and
//! read its first bytes through a translator; the host reads and the
//! frames in use show one copy for all ten. A `MAP_SHARED` store is not
//! allowed on the read-only handle (EACCES, as Linux), while a private
//! store copies the page. Then a scratch file opened read-write is mapped
//! shared, written through a translator and synced (`msync(MS_SYNC)`),
//! and the host file is read back with `std::fs` to show the write.

use aspace::{AddressSpace, Config, Error, MapFlags, Memfd, MsyncFlags, Prot, PAGE_SIZE};
use std::fs::OpenOptions;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = match std::env::args().nth(1) {
        Some(p) => std::path::PathBuf::from(p),
        None => std::env::current_exe()?,
    };
    let file = std::fs::File::open(&path)?;
    let lib = Memfd::from_file(&file, &path.to_string_lossy())?;
    let len = lib.len().max(1);
    println!("{}: {} bytes", path.display(), lib.len());

    // Ten spaces map the file privately and read its head through a
    // translator (a soft TLB, as an emulator's CPU loop would).
    let spaces: Vec<AddressSpace> = (0..10)
        .map(|_| AddressSpace::new(Config::default()))
        .collect();
    let mut heads = Vec::new();
    for mm in &spaces {
        let a = mm.mmap_fd(0, len, Prot::READ, MapFlags::PRIVATE, &lib, 0)?;
        let mut tr = mm.translator();
        let mut head = [0u8; 16];
        tr.read(a, &mut head)?;
        heads.push(head);
        // A store to a read-only handle's shared mapping is refused at
        // mmap time; a private mapping may be made writable (COW).
        let shared = mm.mmap_fd(0, len, Prot::READ | Prot::WRITE, MapFlags::SHARED, &lib, 0);
        assert_eq!(shared, Err(Error::AccessDenied));
    }
    assert!(heads.windows(2).all(|w| w[0] == w[1]));
    println!("first bytes, as every space reads them: {:02x?}", heads[0]);
    let st = lib.file_stats();
    println!(
        "host pages read: {} for {} spaces; frames in the page cache: {}; frames charged to the spaces: {}",
        st.pages_read,
        spaces.len(),
        lib.frame_pool().used(),
        spaces.iter().map(|s| s.frames_used()).sum::<u64>()
    );

    // A shared, writable mapping of a scratch file: a store through a
    // translator, then msync(MS_SYNC) writes the page back.
    let scratch = std::env::temp_dir().join(format!("aspace-host-file-{}", std::process::id()));
    std::fs::write(&scratch, vec![b'.'; 2 * PAGE_SIZE as usize])?;
    let rw = OpenOptions::new().read(true).write(true).open(&scratch)?;
    let obj = Memfd::from_file(&rw, "scratch")?;
    let mm = &spaces[0];
    let rwp = Prot::READ | Prot::WRITE;
    let a = mm.mmap_fd(0, 2 * PAGE_SIZE, rwp, MapFlags::SHARED, &obj, 0)?;
    mm.translator()
        .write(a + PAGE_SIZE, b"written through a mapping")?;
    mm.msync(a, 2 * PAGE_SIZE, MsyncFlags::SYNC)?;
    let host = std::fs::read(&scratch)?;
    let at = PAGE_SIZE as usize;
    println!(
        "after msync(MS_SYNC) the host file holds {:?} (pages written back: {})",
        String::from_utf8_lossy(&host[at..at + 25]),
        obj.file_stats().pages_written
    );
    std::fs::remove_file(&scratch)?;
    Ok(())
}
