//! Loom models of the per-VMA refcount lock and the sequence-counted
//! mmap_lock, running the real `VmaLock` and `MmapLock` through
//! src/sync.rs. `./loom.sh --test loom_vma_lock` runs them.
#![cfg(aspace_loom)]

mod common;
use common::model;

use aspace::loom_door::{MmapLock, ReadLockError, VmaLock};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

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
            vma.write_lock(w.stamp());
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
        a.write_lock(w.stamp());
        b.write_lock(w.stamp());
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
            vma.write_lock(w.stamp());
            vma.mark_detached();
            detached.store(1, Ordering::SeqCst);
        }
        r.join().unwrap();
        assert_eq!(vma.refcount(), 0);
        assert_eq!(vma.try_read(mm.seq()), Err(ReadLockError::Detached));
    });
}

/// Model: two successive write sections against a lock-free reader. The
/// first section write-locks the VMA and changes it (a loom cell stands
/// for its fields); the second leaves it alone. A reader whose trylock
/// succeeds, having read the second section's odd sequence, must see the
/// first section's change: `write_begin` continues the release sequence
/// of the previous `write_end`, so the reader's `Acquire` read of the
/// sequence synchronizes with it. loom reports the reader's access to the
/// cell as a race otherwise.
///
/// Mutation caught: `MmLockSeq::write_begin` as a plain `Relaxed` store
/// (`self.seq.store(prev + 1, Ordering::Relaxed)` after a load) instead of
/// the `fetch_add`.
#[test]
fn two_write_sections_vs_reader() {
    model(|| {
        let mm = Arc::new(MmapLock::new(()));
        let vma = Arc::new(VmaLock::new());
        let fields = Arc::new(loom::cell::UnsafeCell::new(0u64));
        vma.mark_attached();
        let w = {
            let (mm, vma, fields) = (mm.clone(), vma.clone(), fields.clone());
            thread::spawn(move || {
                {
                    let g = mm.write();
                    vma.write_lock(g.stamp());
                    fields.with_mut(|p| unsafe_write(p, 1));
                }
                drop(mm.write());
            })
        };
        if vma.try_read(mm.seq()).is_ok() {
            let v = fields.with(|p| unsafe_read(p));
            assert!(v == 0 || v == 1);
            vma.read_unlock();
        }
        w.join().unwrap();
    });
}

fn unsafe_write(p: *mut u64, v: u64) {
    // SAFETY: loom's cell hands out a valid pointer; loom itself checks
    // that this access is exclusive.
    unsafe { *p = v }
}

fn unsafe_read(p: *const u64) -> u64 {
    // SAFETY: as in `unsafe_write`; loom checks the access is ordered
    // after every exclusive one.
    unsafe { *p }
}
