//! Loom models of the per-VMA refcount lock and the sequence-counted
//! mmap_lock, running the real `VmaLock` and `MmapLock` through
//! src/sync.rs. `./loom.sh vma_lock` runs them.
#![cfg(aspace_loom)]

use aspace::mm::mmap_lock::MmapLock;
use aspace::vma::lock::{ReadLockError, VmaLock};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// Model 1: a reader's trylock against a writer's write-lock. The reader
/// never proceeds while the writer holds the VMA, and the writer never
/// proceeds while a reader holds it.
#[test]
fn reader_vs_writer_exclusion() {
    model(|| {
        let mm = Arc::new(MmapLock::new(()));
        let vma = Arc::new(VmaLock::new());
        vma.mark_attached();
        // 1 while the writer owns the VMA, 2 while the reader is inside.
        let owner = Arc::new(AtomicUsize::new(0));
        let r = {
            let (mm, vma, owner) = (mm.clone(), vma.clone(), owner.clone());
            thread::spawn(move || match vma.try_read(mm.seq()) {
                Ok(()) => {
                    assert_eq!(
                        owner.swap(2, Ordering::SeqCst),
                        0,
                        "reader entered a write-locked VMA"
                    );
                    owner.store(0, Ordering::SeqCst);
                    vma.read_unlock();
                    true
                }
                Err(e) => {
                    assert_eq!(e, ReadLockError::WriteLocked);
                    false
                }
            })
        };
        {
            let w = mm.write();
            vma.write_lock(w.seq());
            assert_eq!(
                owner.swap(1, Ordering::SeqCst),
                0,
                "writer proceeded while a reader was inside"
            );
            owner.store(0, Ordering::SeqCst);
        }
        r.join().unwrap();
        assert_eq!(vma.refcount(), 1);
    });
}

/// Model 2: bulk unlock. Two VMAs stamped in one write section become
/// readable together when the mmap_lock write side is dropped, and not
/// before.
#[test]
fn bulk_unlock_releases_every_stamped_vma() {
    model(|| {
        let mm = Arc::new(MmapLock::new(()));
        let a = Arc::new(VmaLock::new());
        let b = Arc::new(VmaLock::new());
        a.mark_attached();
        b.mark_attached();
        let w = mm.write();
        a.write_lock(w.seq());
        b.write_lock(w.seq());
        let released = Arc::new(AtomicUsize::new(0));
        let r = {
            let (mm, a, b, released) = (mm.clone(), a.clone(), b.clone(), released.clone());
            thread::spawn(move || {
                for v in [&a, &b] {
                    match v.try_read(mm.seq()) {
                        Ok(()) => {
                            assert_eq!(
                                released.load(Ordering::SeqCst),
                                1,
                                "readable before the unlock"
                            );
                            v.read_unlock();
                        }
                        Err(e) => assert_eq!(e, ReadLockError::WriteLocked),
                    }
                }
            })
        };
        released.store(1, Ordering::SeqCst);
        drop(w);
        r.join().unwrap();
        // After the write-unlock both are readable again.
        a.try_read(mm.seq()).unwrap();
        b.try_read(mm.seq()).unwrap();
        a.read_unlock();
        b.read_unlock();
    });
}

/// Detach against a racing reader: the reader either got in before (and
/// the detach waited for it) or sees the VMA detached or write-locked; the
/// count ends at 0.
#[test]
fn detach_vs_reader() {
    model(|| {
        let mm = Arc::new(MmapLock::new(()));
        let vma = Arc::new(VmaLock::new());
        vma.mark_attached();
        let detached = Arc::new(AtomicUsize::new(0));
        let r = {
            let (mm, vma, detached) = (mm.clone(), vma.clone(), detached.clone());
            thread::spawn(move || {
                if vma.try_read(mm.seq()).is_ok() {
                    assert_eq!(detached.load(Ordering::SeqCst), 0, "read a detached VMA");
                    vma.read_unlock();
                }
            })
        };
        {
            let w = mm.write();
            vma.write_lock(w.seq());
            vma.mark_detached();
            detached.store(1, Ordering::SeqCst);
        }
        r.join().unwrap();
        assert_eq!(vma.refcount(), 0);
        assert_eq!(vma.try_read(mm.seq()), Err(ReadLockError::Detached));
    });
}
