//! A VMA's first anon_vma (Linux's `anon_vma_prepare`): the first write
//! fault in a private VMA, and stack growth, give it one, reusing a
//! mergeable neighbour's so the two can still merge later.
//!
//! # Locking
//!
//! The caller holds the VMA (its read lock, or the mmap_lock). A fault on
//! the per-VMA path only try-locks the mmap_lock read side here (to see
//! the neighbours stay put; with range-locked writers, the range a writer
//! of the VMA would lock, `range_read::try_read_neighbours`), and retries
//! under the mmap_lock if it cannot;
//! a speculative fault try-locks it itself and validates its snapshot's
//! stamp under it before calling [`anon_vma_prepare_held`], which looks
//! the neighbours up under the fault's own tree pin
//! (`spec_fault::prepare_anon_vma`). The
//! install itself is a compare-exchange under the family's lock, so
//! concurrent prepares of one VMA link it once. Order: [`crate::mm`].

use crate::addr::pages;
use crate::mm::{next_id, AddressSpace};
use crate::reclaim::Guard;
use crate::stats::Event;
use crate::sync::Arc;
use crate::vma::{AnonVma, VmFlags, Vma};

/// Gives `vma` an anon_vma (Linux's `anon_vma_prepare`): reuse a
/// neighbour's where the two could merge but for their protection, else a
/// new one. Under the per-VMA lock this needs the mmap_lock read side for
/// the neighbours, and only try-locks it.
pub(crate) fn anon_vma_prepare<'v>(
    mm: &AddressSpace,
    vma: &'v Vma,
    vma_locked: bool,
) -> Result<&'v AnonVma, Event> {
    // SAFETY: the caller holds `vma` (its read lock, or the mmap_lock
    // read side) for the lifetime `'v` it lends.
    if let Some(a) = unsafe { vma.anon_vma() } {
        return Ok(a);
    }
    let _st = if vma_locked {
        match crate::mm::range_read::try_read_neighbours(mm, vma.range()) {
            Some(st) => Some(st),
            None => return Err(Event::retry_anon_vma),
        }
    } else {
        None
    };
    Ok(prepare_held(mm, vma, &mm.tree.pin()))
}

/// [`anon_vma_prepare`] for a caller that holds the mmap_lock (read side
/// at least: the neighbours stay put) and an epoch pin of the tree `g`
/// (the speculative fault's own, so the prepare pins nothing again).
pub(crate) fn anon_vma_prepare_held<'v>(mm: &AddressSpace, vma: &'v Vma, g: &Guard) -> &'v AnonVma {
    // SAFETY: the caller holds the mmap_lock for the lifetime `'v` it
    // lends, so the VMA keeps its anon_vma.
    if let Some(a) = unsafe { vma.anon_vma() } {
        return a;
    }
    prepare_held(mm, vma, g)
}

/// The neighbour check and the install, for a VMA that had no anon_vma
/// when looked at, under the caller's hold (the mmap_lock read side at
/// least) and tree pin.
fn prepare_held<'v>(mm: &AddressSpace, vma: &'v Vma, g: &Guard) -> &'v AnonVma {
    // Linux's `anon_vma_compatible`: adjacent, the same backing (private
    // mappings of one object share an anon_vma as those of one file do),
    // flags equal but for access, contiguous offsets.
    let compatible = |a: &Vma, b: &Vma| {
        a.end() == b.start()
            && a.same_backing(b)
            && (a.flags() ^ b.flags())
                .difference(VmFlags::ACCESS | VmFlags::SOFTDIRTY)
                .is_empty()
            && b.pgoff() == a.pgoff() + pages(a.end() - a.start())
    };
    // A neighbour's anon_vma is reusable only if its chain has a single
    // entry (Linux's `reusable_anon_vma`): one shared with fork relatives
    // would tie this VMA to their family.
    let singular = |a: Option<Arc<AnonVma>>| a.filter(|a| a.chain_len() == 1);
    // Only adjacent neighbours qualify, so each is the entry holding the
    // byte just past or just before the VMA. One descent to the VMA's own
    // leaf usually finds both there (Linux's `vma_next`/`vma_prev` of one
    // iterator); one outside that leaf is a point lookup. Under our hold
    // the tree is quiet, so the leaf's entries beside the VMA are its
    // neighbours in the tree.
    let around = mm
        .tree
        .find_around(vma.start(), g)
        .filter(|a| core::ptr::eq::<Vma>(&**a.entry().1, vma));
    let beside = |d: isize, addr: Option<u64>| {
        let addr = addr?;
        match around.as_ref().map(|a| a.nearby(d)) {
            Some(Some((r, v))) => r.contains(addr).then_some(v),
            _ => mm.tree.find(addr, g).map(|(_, v)| v),
        }
    };
    let mut found: Option<Arc<AnonVma>> = None;
    if let Some(next) = beside(1, Some(vma.end())) {
        if compatible(vma, next) {
            found = singular(next.anon_vma_arc());
        }
    }
    if found.is_none() {
        if let Some(prev) = beside(-1, vma.start().checked_sub(1)) {
            if compatible(prev, vma) {
                found = singular(prev.anon_vma_arc());
            }
        }
    }
    let a = found.unwrap_or_else(|| Arc::new(AnonVma::new(next_id())));
    vma.install_anon_vma(a, &mm.stats)
}
