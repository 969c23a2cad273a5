//! Loom models of userfault handling (`src/uffd/`): a fault waiting for a
//! missing-page handler against munmap of its range, against two
//! handlers copying into its page at once, against the release of the
//! last handle and against unregister. The real fault path, the wait
//! queue, the copy and the registration edits run through src/sync.rs.
//!
//! `./loom.sh` runs them at its preemption bound (2), like every model.
#![cfg(aspace_loom)]

mod common;
use common::{cfg, fixed, model, rw};

use aspace::{Access, AddressSpace, Error, FaultError, Prot, Uffd, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;

const A: u64 = 0x4000_0000;

/// A registered page at A, with a read-only neighbour whose zero page
/// keeps A's page tables in place (no table is made or freed in the race).
fn space() -> Arc<AddressSpace> {
    let mm = Arc::new(AddressSpace::new(cfg()));
    mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
    mm.mmap(A + 2 * PAGE_SIZE, PAGE_SIZE, Prot::READ, fixed())
        .unwrap();
    mm.fault(A + 2 * PAGE_SIZE, Access::Read).unwrap();
    mm
}

/// Model 1: a read fault on a registered missing page, with no handler,
/// races munmap of the page. The fault either finds the page unmapped, or
/// queues, sleeps and is woken by the munmap, retries and finds it
/// unmapped: SIGSEGV, never a hang (loom reports a fault left asleep as
/// a deadlock) and never a lost wake.
///
/// Mutation caught: `Edit::unmap_into` (src/mm/munmap.rs) not waking the
/// removed VMAs' handlers (`ctx.wake(vr);` deleted): the fault sleeps
/// forever.
#[test]
fn missing_fault_vs_munmap() {
    model(|| {
        let mm = space();
        let uffd = mm.userfaultfd();
        uffd.register(A, PAGE_SIZE).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.fault(A, Access::Read));
        mm.munmap(A, PAGE_SIZE).unwrap();
        assert_eq!(t.join().unwrap(), Err(FaultError::NoMapping));
        drop(uffd);
    });
}

/// Model 2: a read fault on a registered missing page races two handlers
/// copying different bytes into it, each waking the page. Exactly one
/// copy wins, the other gets `EEXIST`; the fault completes (woken by the
/// winner, or finding the page present) and reads the winner's bytes.
///
/// Mutation caught: `Waiter::wait` (src/uffd/fault.rs) skipping its
/// re-check of the entry after queuing (`if !needed` replaced by
/// `if false`): a copy that installs and wakes between the fault's look
/// at the empty entry and its queuing wakes no one, and the loser's
/// `EEXIST` wakes no one either, so the fault sleeps forever.
#[test]
fn copy_vs_copy_vs_fault() {
    model(|| {
        let mm = space();
        // SAFETY: the handle borrows `*mm`, which this closure keeps alive
        // (through `mm`) until after both threads are joined and every
        // clone of the handle is dropped; loom's threads need `'static`.
        let uffd: Uffd<'static> = unsafe { std::mem::transmute(mm.userfaultfd()) };
        uffd.register(A, PAGE_SIZE).unwrap();
        let m2 = mm.clone();
        let fault = thread::spawn(move || {
            m2.fault(A, Access::Read).unwrap();
            let mut b = [0u8; 1];
            m2.read(A, &mut b).unwrap();
            b[0]
        });
        let u2 = uffd.clone();
        let other = thread::spawn(move || u2.copy(&[1; PAGE_SIZE as usize], A, true).is_ok());
        let mine = uffd.copy(&[2; PAGE_SIZE as usize], A, true);
        let theirs = other.join().unwrap();
        match mine {
            Ok(_) => assert!(!theirs, "both copies won"),
            Err(e) => {
                assert_eq!(e.error, Error::Exist);
                assert!(theirs, "neither copy won");
            }
        }
        let winner = if theirs { 1 } else { 2 };
        assert_eq!(fault.join().unwrap(), winner);
        drop(uffd);
    });
}

/// Model 3: a read fault on a registered missing page, with no handler
/// reading events, races the drop of the last handle. Whether the fault
/// queues before the release (and is woken by it) or runs after it (and
/// finds the VMA unregistered), it completes as an ordinary fault and
/// reads zeros: never SIGBUS (`HandlerGone`), never a hang.
///
/// Mutation caught: `release` (src/uffd/register.rs) marking the context
/// released before unregistering its VMAs (the line `ctx.release();`
/// moved above `let mut ed = Edit::begin(mm);`, the order the code had):
/// a fault that reaches the still registered VMA after the mark cannot
/// queue and fails with `HandlerGone`.
#[test]
fn missing_fault_vs_release() {
    model(|| assert_eq!(read_racing(|_| {}), Ok(0)));
}

/// Model 4: a read fault on a registered missing page races unregister of
/// the page. The fault completes as an ordinary fault and reads zeros,
/// whether unregister woke it or it came after.
///
/// Mutation caught: `Uffd::unregister` (src/uffd/register.rs) not waking
/// the part it unregistered (`ctx.wake(Range::new(r.start, done));`
/// deleted): the queued fault sleeps forever (loom reports a deadlock).
#[test]
fn missing_fault_vs_unregister() {
    model(|| assert_eq!(read_racing(|u| u.unregister(A, PAGE_SIZE).unwrap()), Ok(0)));
}

/// A registered page at A, read by another thread through a fault while
/// this one runs `then` on the handle and drops it: what the read got.
fn read_racing(then: impl FnOnce(&Uffd<'_>)) -> Result<u8, FaultError> {
    let mm = space();
    let uffd = mm.userfaultfd();
    uffd.register(A, PAGE_SIZE).unwrap();
    let m2 = mm.clone();
    let t = thread::spawn(move || {
        m2.fault(A, Access::Read)?;
        let mut b = [1u8; 1];
        m2.read(A, &mut b).map_err(|_| FaultError::Bus)?;
        Ok(b[0])
    });
    then(&uffd);
    drop(uffd);
    t.join().unwrap()
}
