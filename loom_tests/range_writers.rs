//! Range-locked writers (`WriterLocking::Range`, `mm/range_lock.rs`):
//! two writers at once on disjoint ranges, on ranges whose neighbourhoods
//! touch (mprotect against mprotect, `set_anon_name` and an mremap grow
//! in place; a writer passed over by the other's next ones until it
//! turns urgent), two brks from one break, two placements racing for one gap,
//! and a range writer against the speculative fault and a translator
//! access; and the range lock's bias (`mm/range_bias.rs`): its owner's
//! writer against a writer that revokes it, a placement that looked
//! while the owner placed, and the split of the tree the owner kept
//! unified (and the raise of the sequence its shared sections moved)
//! against a speculative fault; and the slots' biases that follow it: a
//! placement that looked while a slot's owner placed, a request
//! across two slots that ends the bias of one whose owner is inside its
//! call, and a whole-space writer (an mlock, which then populates)
//! against an owner's mprotect; and a `MAP_POPULATE`'s populate against an
//! mprotect of half its range. The real AddressSpace runs through src/sync.rs (deferred
//! reclamation, as the other models). Each names the one-line mutation it catches (checked by breaking that
//! line, running the model and restoring it).
//!
//! `./loom.sh --test loom_range_writers` runs them.
#![cfg(aspace_loom)]

mod common;
use common::{cfg, fixed, model, rw, store_vs_munmap_reuse};

use aspace::{
    loom_door, Access, AddressSpace, Advice, Config, FaultLocking, MapFlags, MremapFlags, Prot,
    VmFlags, WriterLocking, PAGE_SIZE,
};
use loom::sync::Arc;
use loom::thread;

const A: u64 = 0x4000_0000;
const B: u64 = 0x5000_0000;
const C: u64 = 0x8000_0000;

/// A range-mode space without the bias (`mm/range_bias.rs`): these
/// models check the range protocol itself, and the bias would grant the
/// setup's thread everything. The bias has models of its own below.
fn space(fault_locking: FaultLocking) -> Arc<AddressSpace> {
    Arc::new(AddressSpace::new(Config {
        writer_locking: WriterLocking::Range,
        range_bias: false,
        fault_locking,
        ..cfg()
    }))
}

/// A range-mode space with the bias on, passed up to `handovers` times.
fn biased_space(fault_locking: FaultLocking, handovers: u32) -> Arc<AddressSpace> {
    Arc::new(AddressSpace::new(Config {
        writer_locking: WriterLocking::Range,
        range_bias: true,
        range_bias_handovers: handovers,
        fault_locking,
        ..cfg()
    }))
}

/// `(start, end, prot)` of every VMA.
fn spans(mm: &AddressSpace) -> Vec<(u64, u64, Prot)> {
    mm.vmas().iter().map(|v| (v.start, v.end, v.prot)).collect()
}

/// Two munmaps, each of the only page mapped in its own 512 GiB slot, run
/// at once: their holes (clamped to a root entry's span) do not meet, so
/// neither waits, and together they free every table below the root, as
/// one after the other under the mmap_lock would.
///
/// Catches: the hole clamped to less than a root entry's span
/// (`ROOT_ENTRY_SPAN` made `crate::pt::HUGE_SIZE` in `neighbourhood`,
/// src/mm/edit/range.rs): the PUD and PMD tables of each slot stay linked.
#[test]
fn range_munmaps_in_different_slots_free_their_tables() {
    const S1: u64 = 0x100_0000_0000;
    const S2: u64 = 0x180_0000_0000;
    model(|| {
        let mm = space(FaultLocking::PerVma);
        for s in [S1, S2] {
            mm.mmap(s, PAGE_SIZE, rw(), fixed()).unwrap();
            mm.write(s, &[1]).unwrap();
        }
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.munmap(S2, PAGE_SIZE).unwrap());
        mm.munmap(S1, PAGE_SIZE).unwrap();
        t.join().unwrap();
        assert!(spans(&mm).is_empty());
        assert_eq!(mm.page_table_bytes(), PAGE_SIZE, "only the root is left");
    });
}

/// mprotect of a VMA at `A` and munmap of one at `C` run at once (their
/// neighbourhoods are disjoint): both take effect, the written page at
/// `A` keeps its byte and refuses writes, and no entry outlives its VMA.
///
/// Catches: a writer's own section not unlocking the VMAs it stamped
/// (`v.lock.unlock_own(*token);` deleted from `MmapWriteGuard`'s drop,
/// src/mm/mmap_lock.rs): the VMA at `A` stays write-locked to readers,
/// and the per-VMA fault at `A` after both writers falls back to the
/// mmap_lock.
#[test]
fn range_writers_on_disjoint_ranges() {
    model(|| {
        let mm = space(FaultLocking::PerVma);
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(A, &[1]).unwrap();
        mm.mmap(C, PAGE_SIZE, rw(), fixed()).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.mprotect(A, PAGE_SIZE, Prot::READ).unwrap());
        mm.munmap(C, PAGE_SIZE).unwrap();
        t.join().unwrap();
        assert_eq!(spans(&mm), vec![(A, A + PAGE_SIZE, Prot::READ)]);
        let mut b = [0u8; 1];
        mm.read(A, &mut b).unwrap();
        assert_eq!(b, [1]);
        assert!(mm.write(A, &[2]).is_err());
        let before = mm.stats().fault_mmap_lock;
        mm.fault(A, Access::Read).unwrap();
        assert_eq!(
            mm.stats().fault_mmap_lock,
            before,
            "a VMA stayed write-locked after every writer left"
        );
        loom_door::check_ptes(&mm).unwrap();
    });
}

/// Two mprotects on VMAs that touch at `A + PAGE_SIZE`, from the
/// setup's thread and another: each merges its page into the other's VMA,
/// and in either order `[A, A+P)` ends read-only and `[A+P, A+2P)`
/// read-write, as two VMAs.
fn touching_mprotects(mm: Arc<AddressSpace>) {
    mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
    mm.mmap(A + PAGE_SIZE, PAGE_SIZE, Prot::READ, fixed())
        .unwrap();
    let m2 = mm.clone();
    let t = thread::spawn(move || m2.mprotect(A, PAGE_SIZE, Prot::READ).unwrap());
    mm.mprotect(A + PAGE_SIZE, PAGE_SIZE, rw()).unwrap();
    t.join().unwrap();
    assert_eq!(
        spans(&mm),
        vec![
            (A, A + PAGE_SIZE, Prot::READ),
            (A + PAGE_SIZE, A + 2 * PAGE_SIZE, rw())
        ]
    );
}

/// Two mprotects on VMAs that touch at `A + PAGE_SIZE`: the first merges
/// its page into the second VMA, the second merges its page into the
/// first. One after the other (either order) leaves `[A, A+P)` read-only
/// and `[A+P, A+2P)` read-write as two VMAs; so must any interleaving.
///
/// Catches: the one-page widening of a neighbourhood made zero
/// (`const MARGIN: u64 = PAGE_SIZE;` made `0`, src/mm/edit/range.rs): each
/// writer then locks only its own VMA and both rewrite the neighbour the
/// other holds.
#[test]
fn range_writers_whose_neighbourhoods_touch() {
    model(|| {
        touching_mprotects(space(FaultLocking::PerVma));
    });
}

/// Two fixed mmaps beside a VMA `X = [S-P, S+P)` that crosses a 512 GiB
/// boundary `S`, where the range lock's shards meet: one maps
/// `[S+P, S+2P)`, growing `X`, whose neighbourhood (it holds `X` whole)
/// has a piece in each shard; the other maps `[S+2P, S+3P)`, whose
/// neighbourhood lies above `S` alone and meets the first one's upper
/// piece. In either order the three pages end as one VMA; so must any
/// interleaving.
///
/// Catches: a request holding only its first shard (`for k in first..first
/// + n {` made `for k in first..first + 1 {` in `RangeLock::acquire`,
/// src/mm/range_lock.rs):
/// the two then both read the page between them as a hole and the new
/// VMAs do not merge.
#[test]
fn range_mmaps_beside_a_vma_across_shards() {
    const S: u64 = 0x80_0000_0000;
    model(|| {
        let mm = space(FaultLocking::PerVma);
        mm.mmap(S - PAGE_SIZE, 2 * PAGE_SIZE, rw(), fixed())
            .unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            m2.mmap(S + PAGE_SIZE, PAGE_SIZE, rw(), fixed()).unwrap();
        });
        mm.mmap(S + 2 * PAGE_SIZE, PAGE_SIZE, rw(), fixed())
            .unwrap();
        t.join().unwrap();
        assert_eq!(spans(&mm), vec![(S - PAGE_SIZE, S + 3 * PAGE_SIZE, rw())]);
    });
}

/// A range writer (an mmap at `C`, which reads the space's default flags
/// behind the mmap_lock) races `mlockall(MCL_FUTURE)`, a whole-space
/// writer that changes them. The gate keeps them apart: either the mmap
/// comes first and its VMA is not locked, or it sees the new default and
/// maps locked. loom reports the mmap's read of the state as a data race
/// if the two overlap (the state is read through a tracked cell).
///
/// Catches: a range request passing a closed gate (`if
/// !self.closed.load(Ordering::Acquire) {` made `if true {` in
/// `Gate::enter`, src/mm/range_lock.rs), and a closer that does not wait
/// for the requests inside (`while self.inside() != 0 {` made `while
/// false {` in `Gate::close`).
#[test]
fn range_writer_vs_whole_space_writer() {
    model(|| {
        let mm = space(FaultLocking::PerVma);
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.mmap(C, PAGE_SIZE, rw(), fixed()).unwrap());
        mm.mlockall(aspace::MlockAllFlags::FUTURE).unwrap();
        assert_eq!(t.join().unwrap(), C);
        let v = mm.vmas();
        assert_eq!(v.len(), 1);
    });
}

/// A per-VMA write fault at `A` races a range-locked mprotect(PROT_READ)
/// of the VMA (its anon_vma made, its page emptied again). A fault whose
/// read-trylock finds the writer's token (its own section ended) must
/// see the read-only flags: no writable entry in the read-only VMA
/// (`check_ptes`), and the fault fails with `AccessDenied` unless it
/// came first.
///
/// Catches: the own section's unlock without `Release` (`Ordering::Release`
/// made `Ordering::Relaxed` in `VmaLock::unlock_own`, src/vma/lock.rs):
/// the fault then reads the token but the old flags.
#[test]
fn per_vma_fault_vs_range_mprotect() {
    model(|| {
        let mm = space(FaultLocking::PerVma);
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(A, &[1]).unwrap();
        mm.madvise(A, PAGE_SIZE, Advice::DontNeed).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.fault(A, Access::Write));
        mm.mprotect(A, PAGE_SIZE, Prot::READ).unwrap();
        let r = t.join().unwrap();
        loom_door::check_ptes(&mm).unwrap();
        assert!(
            r.is_ok() || r == Err(aspace::FaultError::AccessDenied),
            "{r:?}"
        );
    });
}

/// `set_anon_name` of the VMA at `A` races an mprotect of the VMA that
/// touches it at `A + PAGE_SIZE`, already named so. Named first, `A`
/// merges into its neighbour and mprotect splits the page back off; the
/// other way round, the neighbour is read-only before the name lands and
/// nothing merges. Either order leaves `[A, A+P)` read-write and
/// `[A+P, A+2P)` read-only, both named: so must any interleaving of the
/// two range writers (`name::modify_each` locks as mprotect does).
///
/// Catches: the one-page widening of a neighbourhood made zero (`const
/// MARGIN: u64 = PAGE_SIZE;` made `0`, src/mm/edit/range.rs): the name's
/// writer then holds only `A`'s VMA and merges it into the neighbour the
/// mprotect holds.
#[test]
fn range_set_anon_name_vs_mprotect_of_its_neighbour() {
    model(|| {
        let mm = space(FaultLocking::PerVma);
        mm.mmap(A, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
        mm.set_anon_name(A + PAGE_SIZE, PAGE_SIZE, Some("n"))
            .unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.set_anon_name(A, PAGE_SIZE, Some("n")).unwrap());
        mm.mprotect(A + PAGE_SIZE, PAGE_SIZE, Prot::READ).unwrap();
        t.join().unwrap();
        let named: Vec<_> = mm
            .vmas()
            .iter()
            .map(|v| (v.start, v.end, v.prot, v.name.clone()))
            .collect();
        let n = Some("n".to_string());
        assert_eq!(
            named,
            vec![
                (A, A + PAGE_SIZE, rw(), n.clone()),
                (A + PAGE_SIZE, A + 2 * PAGE_SIZE, Prot::READ, n)
            ]
        );
    });
}

/// An mremap growing the VMA at `A` in place to four pages races an
/// mprotect making the VMA at `A + 4P` read-write, so that the grown VMA
/// merges with it. Grown first, the mprotect merges the two; protected
/// first, the grow merges into it: either order leaves one VMA `[A, A+5P)`
/// read-write, and so must any interleaving.
///
/// Catches: the range-locked mremap holding only its old range
/// (`old_len.max(new_len)` made `old_len` in `range_edit`,
/// src/mm/mremap.rs): the grow then decides on the neighbour without
/// holding it, and the mprotect changes it meanwhile, which leaves two
/// VMAs that should be one.
#[test]
fn range_mremap_grow_vs_mprotect_of_the_vma_it_meets() {
    model(|| {
        let mm = space(FaultLocking::PerVma);
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.mmap(A + 4 * PAGE_SIZE, PAGE_SIZE, Prot::READ, fixed())
            .unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            let grown = m2.mremap(A, PAGE_SIZE, 4 * PAGE_SIZE, MremapFlags::empty(), 0);
            assert_eq!(grown, Ok(A));
        });
        mm.mprotect(A + 4 * PAGE_SIZE, PAGE_SIZE, rw()).unwrap();
        t.join().unwrap();
        assert_eq!(spans(&mm), vec![(A, A + 5 * PAGE_SIZE, rw())]);
    });
}

/// Two brks race on a two-page heap: one shrinks it to a page, the other
/// grows it to four. Either order is a serial one: shrunk first, the
/// growth starts from the one page left (one VMA of four pages, the
/// break at four); grown first, the shrink leaves one page. No other
/// outcome, and no brk acts outside what it holds.
///
/// Catches: the break read before the hold trusted without the check
/// under it (`if now == want` made `if true` in `brk_edit`,
/// src/mm/brk.rs): a growth that read the break before the shrink and
/// computed its neighbourhood after it holds only the pages above the old
/// break, then grows the heap VMA below them from the break it finds,
/// and `Edit::lock` stops it ("a range writer locked a VMA outside its
/// range"). Also catches a waiter that sleeps without looking at the
/// release count again once it holds the mutex (`if !moved && st.releases
/// == seen` made `if !moved` in src/mm/range_lock.rs
/// `Shard::wait_release`): a release between its spin's last look and its
/// relock is missed, and loom reports the deadlock.
#[test]
fn range_brks_race() {
    model(|| {
        let mm = space(FaultLocking::PerVma);
        let h = mm.brk(0).unwrap();
        assert_eq!(mm.brk(h + 2 * PAGE_SIZE), Ok(h + 2 * PAGE_SIZE));
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            assert_eq!(m2.brk(h + 4 * PAGE_SIZE), Ok(h + 4 * PAGE_SIZE));
        });
        assert_eq!(mm.brk(h + PAGE_SIZE), Ok(h + PAGE_SIZE));
        t.join().unwrap();
        let brk = mm.brk(0).unwrap();
        assert!(brk == h + PAGE_SIZE || brk == h + 4 * PAGE_SIZE);
        assert_eq!(spans(&mm), vec![(h, brk, rw())]);
    });
}

/// A writer passed over turns urgent, and then goes first. The setup's
/// thread mprotects `[A, A+P)` three times, another thread `[A+P, A+2P)`
/// once; their neighbourhoods meet. The other's request may wait while
/// the setup thread's next one barges past it (`range_lock`'s
/// "Barging"); under loom a waiter's patience runs out at its first
/// failed try, so it turns urgent there and the setup thread's last
/// request waits behind it (the setup thread makes the three calls so
/// that this takes two preemptions, loom's bound). Every order ends as
/// one read-only VMA of both pages.
///
/// Catches: a granted waiter left in the queue (`st.waiting.remove(i);`
/// deleted in src/mm/range_lock.rs `State::wait_grant`): its urgent entry
/// then blocks every later request that meets it, and loom reports the
/// deadlock; and an urgent waiter that waits behind itself (`w.ticket <
/// me.ticket` made `w.ticket <= me.ticket` in `State::grantable`).
#[test]
fn range_writer_passed_over_turns_urgent() {
    model(|| {
        let mm = space(FaultLocking::PerVma);
        mm.mmap(A, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.mprotect(A + PAGE_SIZE, PAGE_SIZE, Prot::READ).unwrap());
        for prot in [Prot::READ, rw(), Prot::READ] {
            mm.mprotect(A, PAGE_SIZE, prot).unwrap();
        }
        t.join().unwrap();
        assert_eq!(spans(&mm), vec![(A, A + 2 * PAGE_SIZE, Prot::READ)]);
    });
}

/// Two mmaps without a hint race for the top of the space, where one
/// gap is first choice for both: they get different pages, both mapped,
/// and each keeps its own protection.
///
/// Catches: the re-check under the lock skipped (`let usable =
/// mm.range_usable(&view, r);` made `let usable = true;`, src/mm/edit/range.rs
/// `begin_placed`): a placement that searched before the other mapped
/// and locked after it released maps over it. Also catches the
/// re-check skipped for a grant that a writer preceded (`self.writes +=
/// u64::from(me.exclusive);` deleted in src/mm/range_lock.rs
/// `State::grant`: a shard's count of exclusive grants never moves, so
/// every grant looks undisturbed since `RangeLock::mark`), a mark that
/// reads a shard as quiet while a range is held exclusive there
/// (`self.quiet.store(st.quiet_word(), ..)` made `st.writes` in
/// `Shard::publish`), and a mark that reads that word `Relaxed` instead
/// of `Acquire` (`RangeLock::mark`: it then need not see the last
/// holder's changes). All three were seen failing.
#[test]
fn range_placements_race_for_one_gap() {
    model(|| racing_placements(space(FaultLocking::PerVma), &[]));
}

/// Two one-page mmaps without a hint, from the setup's thread and
/// another, at once: they must land in different gaps, and the space must
/// then hold exactly them beside `also` (what the setup mapped).
fn racing_placements(mm: Arc<AddressSpace>, also: &[(u64, u64, Prot)]) {
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    let m2 = mm.clone();
    let t = thread::spawn(move || m2.mmap(0, PAGE_SIZE, Prot::READ, anon).unwrap());
    let a = mm.mmap(0, PAGE_SIZE, rw(), anon).unwrap();
    let b = t.join().unwrap();
    assert_ne!(a, b, "two placements took one gap");
    let mut s = spans(&mm);
    s.sort_by_key(|x| x.0);
    let mut want = vec![(a, a + PAGE_SIZE, rw()), (b, b + PAGE_SIZE, Prot::READ)];
    want.extend_from_slice(also);
    want.sort_by_key(|x| x.0);
    assert_eq!(s, want);
}

/// A range-locked mprotect(PROT_READ) of `[A, A+2P)` races a speculative
/// write fault at `A`, in a PTE table shared with the VMA at `A + 3P`:
/// once mprotect has returned, no writable entry maps the read-only VMA
/// (`check_ptes`).
///
/// Catches: the fault's re-read of the stamp under the PTE lock made
/// `true` (`v.lock.stamp() == stamp` in `spec_fault::handle`,
/// src/mm/spec_fault.rs): the fault installs a writable entry after the
/// range writer stamped the VMA and rewrote its entries. (Deleting the
/// sweep in `Edit::lock` or the stamp store in `VmaLock::write_lock` is
/// not caught here: mprotect's own pass takes this table's lock, and the
/// uffd-register model catches the sweep.)
#[test]
fn spec_fault_vs_range_mprotect() {
    model(|| {
        // `common::shared_table_space` with range writers: `[A, A+2P)`
        // with its anon_vma and an emptied PTE table, which a VMA at
        // `A + 3P` shares.
        let mm = space(FaultLocking::Speculative);
        mm.mmap(A, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(A + PAGE_SIZE, &[1]).unwrap();
        mm.madvise(A + PAGE_SIZE, PAGE_SIZE, Advice::DontNeed)
            .unwrap();
        mm.mmap(A + 3 * PAGE_SIZE, PAGE_SIZE, rw(), fixed())
            .unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || loom_door::speculative_fault(&m2, A, Access::Write));
        mm.mprotect(A, 2 * PAGE_SIZE, Prot::READ).unwrap();
        loom_door::check_ptes(&mm).unwrap();
        t.join().unwrap();
        loom_door::check_ptes(&mm).unwrap();
    });
}

/// A translator's store through a cached writable entry of `A` races a
/// range-locked munmap of `A`: a store that begins after munmap returned
/// fails, and no store lands in the frame once it is reused at `B`.
///
/// Catches: replacing `hot.gen.fetch_add` in `tlb::shoot_translators`
/// by a load (`slot.hot.gen.load(Ordering::Relaxed) + 1`, src/tlb/mod.rs): no
/// translator drops its entries, and a store after munmap returned goes
/// through the stale one. (Deleting the wait there, `wait_until(done)`,
/// is caught neither here nor by `translator.rs`'s
/// `translator_store_vs_munmap`, whose comment claims it.)
#[test]
fn translator_store_vs_range_munmap() {
    store_vs_munmap_reuse(
        || Config {
            writer_locking: WriterLocking::Range,
            ..cfg()
        },
        A,
        B,
    );
}

/// The setup of the two models below: `[A-2P, A)` read-only with an
/// anon_vma, `[A, A+2P)` read-write without one, and a thread that
/// mprotects the first page of the former `PROT_NONE` (splitting it).
fn neighbour_split(fault_locking: FaultLocking) -> (Arc<AddressSpace>, thread::JoinHandle<()>) {
    let mm = space(fault_locking);
    let lo = A - 2 * PAGE_SIZE;
    mm.mmap(lo, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
    mm.write(lo, &[1]).unwrap();
    mm.mprotect(lo, 2 * PAGE_SIZE, Prot::READ).unwrap();
    mm.mmap(A, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
    let m2 = mm.clone();
    let t = thread::spawn(move || m2.mprotect(lo, PAGE_SIZE, Prot::NONE).unwrap());
    (mm, t)
}

/// After [`neighbour_split`] and a write fault at `A`: the neighbour's
/// upper half made read-write merges with the faulted VMA (they share
/// the neighbour's anon_vma).
fn check_merged_after_split(mm: &AddressSpace) {
    let lo = A - 2 * PAGE_SIZE;
    mm.mprotect(A - PAGE_SIZE, PAGE_SIZE, rw()).unwrap();
    assert_eq!(
        spans(mm),
        vec![
            (lo, A - PAGE_SIZE, Prot::NONE),
            (A - PAGE_SIZE, A + 2 * PAGE_SIZE, rw())
        ]
    );
}

/// A range-locked fault fallback (`FaultLocking::MmapLock`: every fault
/// takes it) at `A`, the first write to a VMA `[A, A+2P)` with no
/// anon_vma, races a range mprotect(PROT_NONE) of the first page of its
/// lower neighbour `[A-2P, A)` (read-only, with an anon_vma): a split of
/// the neighbour, outside the fault's VMA. In either order the fault
/// finds the neighbour (whole or its upper half) adjacent and compatible
/// and reuses its anon_vma (`mm::anon_vma`), so once the upper half is
/// made read-write it merges with the faulted VMA.
///
/// Catches: the fallback's lock not reaching the VMAs beside its own
/// (`neighbourhood(mm, vr, Reach::Vmas, pin)` made `vma_hull(mm, vr, pin)`
/// in `fault_range`, src/mm/range_read.rs): the fault reads the
/// neighbour mid-split (its end already moved), takes a fresh anon_vma,
/// and the two halves never merge.
#[test]
fn range_fault_fallback_vs_mprotect_splitting_its_neighbour() {
    model(|| {
        let (mm, t) = neighbour_split(FaultLocking::MmapLock);
        mm.fault(A, Access::Write).unwrap();
        t.join().unwrap();
        check_merged_after_split(&mm);
    });
}

/// The speculative fault's first write of `[A, A+2P)` (no anon_vma yet:
/// it prepares one, `spec_fault::prepare_anon_vma`) races the same range
/// mprotect(PROT_NONE) splitting its lower neighbour `[A-2P, A)`. The
/// prepare try-locks its VMA's neighbourhood shared
/// (`range_read::try_read_neighbours`), so in either order it finds the
/// neighbour (whole or its upper half) adjacent and compatible, or fails
/// the try-lock and changes nothing; the fault then completes on the
/// locked fallback. Once the upper half is made read-write it merges with
/// the faulted VMA.
///
/// Catches: the prepare's lock not reaching the VMAs beside its own (both
/// `neighbourhood(mm, vr, Reach::Vmas, &mm.tree.pin())` made
/// `vma_hull(mm, vr, &mm.tree.pin())` in `try_read_neighbours`,
/// src/mm/range_read.rs): the prepare reads the neighbour mid-split,
/// takes a fresh anon_vma, and the two halves never merge.
#[test]
fn range_spec_first_write_vs_mprotect_splitting_its_neighbour() {
    model(|| {
        let (mm, t) = neighbour_split(FaultLocking::Speculative);
        loom_door::speculative_fault(&mm, A, Access::Write);
        t.join().unwrap();
        mm.fault(A, Access::Write).unwrap();
        check_merged_after_split(&mm);
    });
}

/// MADV_DONTNEED of `[A, A+2P)` (range-locked shared: that VMA) and a
/// range munmap of `[A+4P, A+5P)` run at once in one PTE table: their
/// holds are disjoint (the munmap's hole stops at the VMA the zap holds).
/// The zap's pages read zero, the unmapped page is gone, and the table,
/// empty once both are done, stays linked while `[A, A+2P)` covers it
/// (the munmap frees no table a VMA still covers) and goes with it.
///
/// Catches: the zap's PTE-table lock dropped (`let _l = t.lock.lock();`
/// removed in `rewrite_table`, src/pt/range.rs): the two zaps' updates
/// of the table's count of used entries race, one is lost, and the table
/// is left linked after everything is unmapped.
#[test]
fn range_dontneed_vs_munmap_in_one_pte_table() {
    model(|| {
        let mm = space(FaultLocking::PerVma);
        mm.mmap(A, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(A, &[1]).unwrap();
        mm.write(A + PAGE_SIZE, &[2]).unwrap();
        let w = A + 4 * PAGE_SIZE;
        mm.mmap(w, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(w, &[3]).unwrap();
        let tables = mm.page_table_bytes();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.munmap(w, PAGE_SIZE).unwrap());
        mm.madvise(A, 2 * PAGE_SIZE, Advice::DontNeed).unwrap();
        t.join().unwrap();
        loom_door::check_ptes(&mm).unwrap();
        assert_eq!(spans(&mm), vec![(A, A + 2 * PAGE_SIZE, rw())]);
        assert_eq!(mm.page_table_bytes(), tables, "the table V covers stays");
        let mut b = [9u8; 1];
        mm.read(A + PAGE_SIZE, &mut b).unwrap();
        assert_eq!(b, [0]);
        mm.munmap(A, 2 * PAGE_SIZE).unwrap();
        assert_eq!(mm.page_table_bytes(), PAGE_SIZE, "only the root is left");
    });
}

/// The bias: the setup's thread claims it (its mmaps are its first
/// requests), then writes on as the bias's owner (a whole-space edit
/// granted by the bias) while another thread's mprotect revokes it and
/// takes it over; the two VMAs touch, so each writer's change is the
/// other's neighbour. In either order the result is `[A, A+P)` read-only
/// and `[A+P, A+2P)` read-write as two VMAs; so must any interleaving,
/// and the owner's edit and the revoker's must not overlap (loom reports
/// the revoker's read of the state behind the lock against the owner's
/// write side as a data race).
///
/// Catches: the owner's entry without its re-check after the fence (`if
/// h.word.load(Ordering::Relaxed) == me {` made `if true {` in
/// `Bias::count_in`, src/mm/range_bias.rs): the revoker then reads the
/// count before the owner's store and takes the bias while the owner
/// edits; and a revoker that does not wait for the count (`REVOKING if
/// h.depth.load(Ordering::Acquire) == 0 => Found::OwnerOut,` made
/// `REVOKING => Found::OwnerOut,` in `Bias::revoke`).
#[test]
fn range_bias_owner_vs_revoking_writer() {
    model(|| {
        touching_mprotects(biased_space(
            FaultLocking::PerVma,
            Config::default().range_bias_handovers,
        ));
    });
}

/// The bias, with no handover (the first revocation ends it): the
/// setup's thread owns it and places a mapping with no hint, while
/// another thread's placement searches the same gap, then try-locks its
/// choice and so revokes the bias (waiting, if the owner is inside its
/// call, for it to end). Its search may have read the tree before the
/// owner's mapping: the choice must be checked again under its grant,
/// never taken as undisturbed since a mark read while the bias was on.
/// The two mappings must not share the gap.
///
/// Catches: a mark that ignores the bias (`if !self.bias.is_off() {`
/// made `if false {` in `RangeLock::mark`, src/mm/range_lock.rs): the
/// shards' counts never moved while the owner placed, so the grant after
/// the bias ended looks undisturbed and both take one gap.
#[test]
fn range_bias_placement_vs_owner_placing() {
    model(|| {
        let mm = biased_space(FaultLocking::PerVma, 0);
        mm.mmap(C, PAGE_SIZE, rw(), fixed()).unwrap();
        racing_placements(mm, &[(C, C + PAGE_SIZE, rw())]);
    });
}

/// The bias, with no handover: a setup thread owns it, so the tree is
/// unified (`RangeForest::sliced_unified`) and its writers run shared
/// sections of the space's sequence; the model's thread then mprotects,
/// which revokes the bias, raises the sequence to `LOCKED` for good
/// (`MmLockSeq::own_sections_from_now`), splits the tree and changes the
/// VMA beside the one a speculative fault of another thread looks up
/// (the speculative fault first, the locked paths if it gives up). The
/// fault reads the one tree or the slots, and either way finds `A`'s VMA,
/// writable before and after the mprotect; the page tables stay
/// consistent; and once the mprotect's own section has ended, `A`'s VMA
/// (which it locked) reads unlocked again, so a speculative fault there
/// completes.
///
/// Catches:
/// - the one tree unlinked before the slots are built (the
///   `self.unified.store(core::ptr::null_mut(), Ordering::Release);` line
///   of `RangeForest::split_now`, src/tree/forest/unified.rs, moved above
///   its `replace_all`): the fault then finds no VMA at `A` and fails
///   with `SEGV_MAPERR`;
/// - the raise removed (the `self.seq.store(LOCKED, Ordering::Release);`
///   line of `MmLockSeq::own_sections_from_now`, src/vma/seq.rs): the
///   sequence stays where the owner's last section left it, below the
///   token the own section stamps back, and `A`'s VMA reads write-locked
///   for good.
#[test]
fn range_bias_split_vs_spec_fault() {
    model(|| {
        let mm = biased_space(FaultLocking::Speculative, 0);
        let m1 = mm.clone();
        thread::spawn(move || {
            m1.mmap(A, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
            m1.write(A + PAGE_SIZE, &[1]).unwrap();
            // The CPU's VMA hint (`vma_hint`) moves to `B`: the fault at
            // `A` walks the tree.
            m1.mmap(B, PAGE_SIZE, rw(), fixed()).unwrap();
            m1.write(B, &[2]).unwrap();
        })
        .join()
        .unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            m2.fault(A, Access::Write)
                .expect("A is mapped writable throughout")
        });
        mm.mprotect(A + PAGE_SIZE, PAGE_SIZE, Prot::READ).unwrap();
        t.join().unwrap();
        loom_door::check_ptes(&mm).unwrap();
        assert_eq!(
            spans(&mm),
            vec![
                (A, A + PAGE_SIZE, rw()),
                (A + PAGE_SIZE, A + 2 * PAGE_SIZE, Prot::READ),
                (B, B + PAGE_SIZE, rw())
            ]
        );
        let mut b = [9u8; 1];
        mm.read(A + PAGE_SIZE, &mut b).unwrap();
        assert_eq!(b, [1]);
        assert!(
            loom_door::speculative_fault(&mm, A, Access::Read),
            "A's VMA stayed write-locked after the own section"
        );
    });
}

/// Where [`slot_biased_space`]'s setup maps its two pages.
const FAR: u64 = 0x100_0000_0000;
/// The VMA they make.
const FAR_SPAN: (u64, u64, Prot) = (FAR, FAR + 2 * PAGE_SIZE, Prot::READ.union(Prot::WRITE));

/// A range-mode space whose own bias is already off, so that requests
/// meet the slots' biases ("Slot biases" in `mm/range_bias.rs`), with no
/// handover (the setting is the space's bias's too, and a handover would
/// keep it on): a setup thread claimed the space's bias (a page mapped at
/// `FAR`) and another's request ended it (one page above). That second
/// thread then claimed the bias of `FAR`'s slot; the slots the models use
/// are unclaimed. The two pages stay mapped: [`FAR_SPAN`].
fn slot_biased_space() -> Arc<AddressSpace> {
    let mm = biased_space(FaultLocking::PerVma, 0);
    for at in [FAR, FAR + PAGE_SIZE] {
        let m = mm.clone();
        thread::spawn(move || m.mmap(at, PAGE_SIZE, rw(), fixed()).unwrap())
            .join()
            .unwrap();
    }
    mm
}

/// A slot's bias, with no handover: the setup's thread claims the bias
/// of `C`'s slot (its mapping there) and places a mapping with no hint
/// (claiming the bias of that slot, holding the whole slot while it
/// searches), while another thread's placement searches the same gap,
/// then try-locks its choice and so revokes that slot's bias (waiting,
/// if the owner is inside its call, for it to end). Its search may have
/// read the tree before the owner's mapping: the choice must be checked
/// again under its grant, never taken as undisturbed since a mark read
/// while the slot's bias was on. The two mappings must not share the
/// gap.
///
/// Catches:
/// - a mark that ignores the slot's bias (`if
///   !self.shards[shard].bias.is_off() {` made `if false {` in
///   `RangeLock::mark`, src/mm/range_lock.rs): the shard's count never
///   moved while the owner placed, so the grant after the bias ended
///   looks undisturbed and both take one gap;
/// - a grant of a slot's bias that does not leave the gate when released
///   (a `return;` after `.owner_release(self.exclusive);` in
///   `RangeGuard::release`): the final walk of the space (a whole-space
///   request) waits for it for ever, a deadlock.
#[test]
fn range_slot_bias_placement_vs_owner_placing() {
    model(|| {
        let mm = slot_biased_space();
        mm.mmap(C, PAGE_SIZE, rw(), fixed()).unwrap();
        racing_placements(mm, &[(C, C + PAGE_SIZE, rw()), FAR_SPAN]);
    });
}

/// A slot's bias against a request across two slots, with no handover:
/// the setup's thread owns the bias of the slot below the 512 GiB
/// boundary `S` (it mapped `Y = [S-2P, S-P)` there) and makes `Y`
/// read-only, holding that whole slot through the bias; another thread
/// maps `[S-P, S+P)` across `S`, whose neighbourhood holds `Y` (which it
/// may merge with) in both slots, so it ends both slots' biases first,
/// waiting for the owner's call. In either order the space ends with
/// `Y` read-only and the new mapping read-write beside it.
///
/// Catches: ending a slot's bias without waiting for its owner's call
/// (`REVOKING if h.depth.load(Ordering::Acquire) == 0 => Found::OwnerOut,`
/// made `REVOKING => Found::OwnerOut,` in `Bias::revoke`,
/// src/mm/range_bias.rs, the revoker's side `Bias::end` shares with a
/// request's): the mapping then merges with `Y` while the owner changes
/// it.
#[test]
fn range_slot_bias_owner_vs_request_across_slots() {
    const S: u64 = 0x80_0000_0000;
    const P: u64 = PAGE_SIZE;
    model(|| {
        let mm = slot_biased_space();
        mm.mmap(S - 2 * P, P, rw(), fixed()).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            m2.mmap(S - P, 2 * P, rw(), fixed()).unwrap();
        });
        mm.mprotect(S - 2 * P, P, Prot::READ).unwrap();
        t.join().unwrap();
        let mine: Vec<_> = spans(&mm).into_iter().filter(|v| v.0 < S + P).collect();
        assert_eq!(
            mine,
            vec![(S - 2 * P, S - P, Prot::READ), (S - P, S + P, rw())]
        );
        loom_door::check_ptes(&mm).unwrap();
    });
}

/// A slot's owner against a whole-space writer, with no handover: the
/// setup's thread claims the bias of `C`'s slot (mapping `[C, C+2P)`),
/// then makes `[C, C+P)` read-only through that bias (counted in at the
/// bias alone, not at the gate), while another thread mlocks `[C, C+2P)`,
/// a whole-space writer that closes the gate and waits for the owner's
/// call, then populates the range (its faults may revoke the slot's
/// bias, ending it). In either order both VMAs end locked, the first
/// read-only.
///
/// Catches:
/// - a closer that does not wait for the slot owner counted in at its
///   bias (`|| owners_inside()` deleted from `Gate::close`'s loop,
///   src/mm/range_lock.rs), or does not know that the slot's bias was
///   granted (`self.note_granted(first);` deleted in
///   `RangeLock::acquire_shards`): the mlock and the split then change
///   the VMA at once;
/// - an owner that enters past a closed gate (`&& !closed.load(..)`
///   deleted in `Bias::enter_ungated`, src/mm/range_bias.rs): likewise;
/// - an owner's last count-out that does not wake the closer (the
///   `closed` check in `Gate`'s `Watcher::counted_out` never true): loom
///   reports the closer's deadlock;
/// - an mlock whose populate counts a write fault refused after the
///   mprotect as a failure (the arm `Err(FaultError::NoMapping |
///   FaultError::AccessDenied) => continue 'vmas` deleted in
///   `AddressSpace::populate_with`, src/mm/populate.rs, so the refusal
///   reaches the policy's `failed`): the mlock fails
///   with `ENOMEM`, where Linux looks the VMA up again (this model found
///   that, in every writer locking: `tests/range_writers.rs`'s
///   `mlock_succeeds_while_its_range_is_mprotected`).
#[test]
fn range_slot_bias_owner_vs_whole_space_writer() {
    const P: u64 = PAGE_SIZE;
    model(|| {
        let mm = slot_biased_space();
        mm.mmap(C, 2 * P, rw(), fixed()).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.mlock(C, 2 * P).unwrap());
        mm.mprotect(C, P, Prot::READ).unwrap();
        t.join().unwrap();
        let mine: Vec<_> = mm
            .vmas()
            .iter()
            .filter(|v| v.start < C + 2 * P && v.end > C)
            .map(|v| (v.start, v.end, v.prot, v.flags.contains(VmFlags::LOCKED)))
            .collect();
        assert_eq!(
            mine,
            vec![(C, C + P, Prot::READ, true), (C + P, C + 2 * P, rw(), true)]
        );
        loom_door::check_ptes(&mm).unwrap();
    });
}

/// `MAP_POPULATE` against an mprotect of half its range: a fixed mmap of
/// `[C, C+2P)` read-write with `MAP_POPULATE` (replacing the mapping
/// there) races an mprotect of `[C, C+P)` to read-only, two range
/// writers on one neighbourhood. The populate runs after the mmap's
/// writer has ended, with no lock: where the mprotect comes between, its
/// write fault at `C` is refused. Linux's populate looks the VMA up again
/// and faults a read-only one for reading, so in every order both pages
/// are resident when the mmap returns.
///
/// Catches: a populate that gives up on the refused fault (the arm
/// `Err(FaultError::NoMapping | FaultError::AccessDenied) => continue
/// 'vmas` deleted in `AddressSpace::populate_with`, src/mm/populate.rs:
/// `MAP_POPULATE`'s policy skips the rest of the VMA): `C + P` stays
/// unpopulated
/// (`tests/range_writers.rs`'s
/// `map_populate_populates_every_page_while_its_range_is_mprotected`
/// catches it too, in both writer lockings).
#[test]
fn range_map_populate_vs_mprotect_of_half_its_range() {
    const P: u64 = PAGE_SIZE;
    model(|| {
        let mm = space(FaultLocking::PerVma);
        mm.mmap(C, 2 * P, rw(), fixed()).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            let populate = fixed() | MapFlags::POPULATE;
            assert_eq!(m2.mmap(C, 2 * P, rw(), populate), Ok(C));
            m2.mincore(C, 2 * P).unwrap()
        });
        mm.mprotect(C, P, Prot::READ).unwrap();
        assert_eq!(t.join().unwrap(), vec![true, true], "pages not populated");
        loom_door::check_ptes(&mm).unwrap();
    });
}
