//! The loom matrix: every lock-free or lock-light reader against every
//! writer that can change what it reads, as one table. A cell is a loom
//! model (file and test name), a model of the same code run by another
//! writer (`Shares`), or a one-line reason the two cannot meet or cannot
//! harm each other (`Apart`). There is no fourth kind: a new pair gets a
//! model or a reason before it lands.
//!
//! This file is not a loom model: its test runs in every build
//! (`cargo test`) and fails if a reader or writer lacks a cell, if a cell
//! appears twice, or if a named model is not a `#[test]` in its file. A
//! new writer gains a row here, a new reader a column.

/// The readers: paths that read page-table entries or VMA fields without
/// the mmap_lock, each safe only if every writer follows its rules; a
/// forced access, which writes pages no writable entry maps; and a file
/// object's writeback, which reads the object's pages without its size
/// lock.
const READERS: [&str; 14] = [
    "speculative fault",
    "speculative fault via VMA hint",
    "speculative first write (anon_vma prepare)",
    "per-VMA fault",
    "translator access",
    "translator access, flush on its home thread",
    // A `Block` (translate/block.rs): one access section around many
    // translator hits.
    "translator block",
    "instruction fetch",
    "device slice",
    "userfault waiter",
    "forced access",
    "file writeback",
    // `WriterLocking::Range`: the locked fault fallback holds only its
    // VMA's neighbourhood, shared (mm/range_read.rs), so range writers
    // elsewhere run beside it.
    "range-locked fault fallback",
    // The VMA lookup every lock-free reader above starts with, in range
    // mode a walk of the forest (tree/forest.rs): one slot per address, an
    // entry crossing a slot boundary read whole from its pieces.
    "VMA lookup in the forest",
];

/// The writers: every change of a VMA's range, flags, backing or
/// registration (all through `Edit::lock`, which stamps and sweeps), and
/// the calls that change entries under the mmap_lock read side.
const WRITERS: [&str; 29] = [
    "munmap",
    "mprotect",
    "mremap move",
    "mremap grow",
    "mremap shrink",
    "mremap DONTUNMAP",
    "madvise DONTNEED",
    "madvise REMOVE",
    "madvise FREE",
    "brk",
    "mlock",
    "set_anon_name",
    "uffd register",
    "uffd unregister",
    "uffd write-protect",
    "memfd shrink",
    "fork",
    "THP split",
    "THP fault",
    "THP collapse",
    // `WriterLocking::Range` (mm/range_lock.rs): the same edits under a
    // range lock, each in a write section of its own.
    "range munmap",
    "range mprotect",
    "range mmap",
    // madvise that sets VMA flags and set_anon_name: mprotect's
    // neighbourhood and its `Edit::modify` walk (name::modify_each).
    "range madvise flags, set_anon_name",
    // mremap in place (mremap.rs range_edit): a shrink with munmap's
    // neighbourhood and unmap edit, a grow with mprotect's neighbourhood.
    "range mremap shrink",
    "range mremap grow",
    // brk (brk.rs brk_edit): a shrink with munmap's neighbourhood, a
    // growth with mprotect's, the break checked again under the hold.
    "range brk",
    // madvise's zaps holding only their VMAs, shared (mm/range_read.rs).
    "range madvise DONTNEED",
    // The range lock's bias (mm/range_bias.rs): the owner's writers and
    // readers take the whole space, granted by the bias, until another
    // thread's request revokes the bias.
    "range writer holding the bias",
];

enum Cell {
    /// `(file in loom_tests/, test name)`.
    Model(&'static str, &'static str),
    /// The writer runs the code of another writer's model: `(file, test,
    /// why the code is the same)`.
    Shares(&'static str, &'static str, &'static str),
    /// Why the two cannot meet.
    Apart(&'static str),
}
use Cell::*;

/// Serialized: the writer write-locks the VMA (`Edit::lock`), which waits
/// out the fault's VMA read lock and refuses new ones until its write
/// section ends (`vma_lock.rs`: `reader_vs_writer_exclusion`).
const LOCKED_OUT: Cell = Apart("serialized by the VMA lock: the writer drains the fault's read lock and refuses new ones until its section ends (vma_lock::reader_vs_writer_exclusion)");
/// Serialized: the writer holds the mmap_lock write side, a forced access
/// its read side from the VMA lookup to the end of its copy.
const MMAP_LOCKED_OUT: Cell = Apart("serialized by the mmap_lock: the writer holds its write side, the forced access its read side from the VMA lookup to the end of the copy (mm/forced.rs)");
/// A writer that changes no entry and no access right of a present page.
const NO_ENTRY_CHANGE: Cell =
    Apart("changes no entry and no access right: a cached translation stays right");
/// Why a flush on a translator's home thread shares the moved
/// translator's model.
const OWN_FLUSH: &str = "the writer's flush runs the same shoot_translators, which skips the heavy fence and the wait for a slot by its summary and home alone, whatever changed the entries; a translator moved off that thread rehomes before it loads its generation (translator_moved_vs_own_flush), and another thread's translator reached by the same flush is still fenced and waited for (translator_elsewhere_vs_own_flush, also with mprotect)";
/// Why a change that flushes nothing never reaches the home check.
const NO_FLUSH: Cell = Apart("this writer issues no translator flush for it (no translation goes stale): the home check in shoot_translators is never reached, and the translator access cell covers the access");

/// Why a translator block shares a translator access's model.
const BLOCK: &str = "a block is translator accesses whose section spans several hits: the writer's flush meets the same summary, generation and busy word (tlb/mod.rs, Blocks), waits for the block's end where it waits for an access's, and a miss inside the block ends the section and re-enters with the generation check, as an access's start does (block_vs_munmap, block_vs_mprotect_read); a flush on the block's own thread while it is open is ruled out by the API's rule (checked in debug builds), and one after it is the home-thread cell";

/// Why an instruction fetch shares a translator access's model.
const FETCH: &str = "a fetch is a translator access (the same enter, tag check, walk and leave, with the exec bit): the writer's flush drops its entries alike";
/// The speculative fault never installs in a VMA with an object.
const SPEC_NO_OBJECT: Cell = Apart("acts on shared objects' pages only, and the speculative fault bails out of any VMA with an object (spec_fault.rs step 4)");

/// A split replaces a PMD leaf by a table of the same translations.
const SAME_TRANSLATIONS: &str = "a split stores, in one Release under the PMD lock, a filled table translating every page as the leaf did: the reader's walk reads the leaf or the table and gets the same page and rights (pt/huge.rs)";
/// A huge fault fills an empty PMD slot.
const NEW_LEAF: Cell = Apart("a huge fault only fills an empty PMD slot (under the PMD lock, the VMA held): no translation existed there to go stale, and a walker sees the slot empty or the whole leaf");
/// Why a translator's refill (and a fetch's) shares the lock-free read's
/// model of a huge fault.
const NEW_LEAF_READ: &str = "a translator's refill walks the table lock-free as read does (the same Acquire load of the PMD slot, then the frame): it sees the slot empty and faults, or the whole leaf ordered after its frame's allocation";
/// Why a writer's stores meet a forest lookup as a range writer's do.
const FOREST_STORES: &str = "with range writers every writer stores through the forest (ForestWriter), slot by slot under each slot's mutex, as a range writer does (the owner of a slot's bias, holding the whole slot, stores a range strictly inside it through that slot's tree: the same store, under its hold of the slot instead of the slot's mutex, which loom's tracked cell over the tree's spare memory checks in the range_slot_bias_* models, tree::InnerSlot): a lookup sees each address by the old entry or the new, a crossing entry whole or as correct pieces";

/// Why the speculative fault through a CPU's VMA hint shares the
/// speculative fault's models.
const HINT: &str = "a hinted VMA is validated as a tree result is (stamp below the sequence, space, range, attachment, then the stamp re-read under the PTE lock): the writer's stamp and sweep order it alike";

/// A speculative first write prepares the anon_vma under the mmap_lock
/// read side, stamp re-read under it.
const PREPARE_LOCKED_OUT: Cell = Apart("serialized by the mmap_lock: the prepare holds its read side (try-locked) with the stamp re-read under it, the writer its write side from its anon_vma reads to its end; its install afterwards is the speculative fault's cell");
/// With range writers the prepare's try-read is the whole space shared.
const PREPARE_RANGE_LOCKED_OUT: Cell = Apart("serialized by the range lock where they meet: the prepare's mmap_lock try-read is, with range writers, a try-lock of its VMA's neighbourhood shared, validated under it (range_read::try_read_neighbours), which any range writer of that VMA or of a neighbour it reads overlaps (range_writers.rs: range_spec_first_write_vs_mprotect_splitting_its_neighbour), and a range writer holds its range from its neighbours' anon_vma reads to its end; its install afterwards is the speculative fault's cell");
/// Why a first write's install shares the speculative fault's models.
const PREPARE_THEN_INSTALL: &str = "runs under the mmap_lock read side beside the prepare but reads and changes no anon_vma; the install after the prepare is the speculative fault's, ordered by the same stamp and PTE lock";

/// File writeback reads the object's own pages, never entries or VMA fields.
const WB_OWN_PAGES: Cell = Apart("writeback holds the object (its Arc) and reads the object's pages through its tree, each under a frame reference taken while the frame lives; this writer changes entries or VMAs, never the object's slots");

/// Why a range writer shares the mmap_lock writer's model.
const RANGE_SAME: &str = "a range writer runs the mmap_lock writer's edit (Edit::lock stamps and sweeps each VMA, the same zap, free and flush), only under its range lock; a VMA it stamped, in a write section of its own, reads write-locked until that writer stores its token back with Release (range_writers.rs: range_writers_on_disjoint_ranges, per_vma_fault_vs_range_mprotect)";
/// A range mmap changes no existing VMA's entries.
const RANGE_MMAP_NEW: Cell = Apart("a new VMA is attached write-locked in the writer's section, a merge stamps and sweeps the neighbour it grows as mprotect's merge does, and an mmap over mapped pages unmaps them with munmap's code (the range munmap row): no entry a reader uses changes otherwise");
/// Range writers and the forced access exclude each other.
const RANGE_LOCKED_OUT: Cell = Apart("serialized by the range lock where they meet: a forced access holds its page's VMA's neighbourhood shared (mm/range_read.rs) from the VMA lookup to the end of the copy, and a range writer that changes, splits, merges or replaces that VMA holds it whole; one elsewhere changes nothing the access reads");

/// Why the bias's owner's writers share the range writers' models.
const BIAS_SAME: &str = "the owner's writers run the whole-space edit of range mode (Edit::begin: the mmap_lock writer's stamps, sweeps, zaps, frees and flushes, in a write section of its own as every range-mode writer), granted by the bias instead of the gate; a reader meets the same code as the range writer's model shows, and another thread's request waits for the owner's call to end (range_writers.rs: range_bias_owner_vs_revoking_writer)";

/// Why a range-locked zap shares the mmap_lock zap's models.
const RANGE_ZAP_SAME: &str = "the same zap_range and gather as DONTNEED under the mmap_lock read side, only under a shared hold of its VMAs: a reader meets it at the PTE lock and the flush exactly as before";
/// Why the range-locked fault fallback shares the per-VMA fault's models.
const FALLBACK_SAME: &str = "the fallback runs the per-VMA path's do_fault on the VMA it looked up, held by the range lock (its neighbourhood, shared) instead of its read lock: it meets this writer, which holds the mmap_lock read side or the whole space shared, at the same PTE and PMD locks";
/// Writers that take the whole space exclude the range-locked fallback.
const FALLBACK_LOCKED_OUT: Cell = Apart("serialized: the writer holds the mmap_lock write side (with range writers, the whole space exclusive), the fallback its read side (its VMA's neighbourhood, shared) from the VMA lookup to the end of the fault");

#[rustfmt::skip]
const MATRIX: &[(&str, &str, Cell)] = &[
    // The speculative fault: stamp validated under the PTE lock (and under
    // the slot lock where it links a table); models in tables shared with
    // other VMAs where the setup allows it (the 2 MiB-VMA models remain).
    ("speculative fault", "munmap", Model("spec_fault.rs", "spec_fault_without_table_vs_munmap")),
    ("speculative fault", "mprotect", Model("spec_writers.rs", "spec_fault_in_shared_table_vs_mprotect")),
    ("speculative fault", "mremap move", Model("spec_writers.rs", "spec_fault_in_shared_table_vs_mremap")),
    ("speculative fault", "mremap grow", Model("spec_writers.rs", "spec_fault_vs_mremap_grow")),
    ("speculative fault", "mremap shrink", Model("spec_writers.rs", "spec_fault_vs_mremap_shrink")),
    ("speculative fault", "mremap DONTUNMAP", Model("spec_writers.rs", "spec_fault_vs_mremap_dontunmap_over_empty_table")),
    ("speculative fault", "madvise DONTNEED", Model("spec_writers.rs", "spec_fault_vs_dontneed")),
    ("speculative fault", "madvise REMOVE", SPEC_NO_OBJECT),
    ("speculative fault", "madvise FREE", Model("spec_writers.rs", "spec_fault_vs_madv_free")),
    ("speculative fault", "brk", Model("spec_writers.rs", "spec_fault_vs_brk_shrink")),
    ("speculative fault", "mlock", Model("spec_writers.rs", "spec_fault_vs_mlock")),
    ("speculative fault", "set_anon_name", Model("spec_writers.rs", "spec_fault_vs_set_anon_name")),
    ("speculative fault", "uffd register", Model("spec_fault.rs", "spec_fault_in_shared_table_vs_uffd_register")),
    ("speculative fault", "uffd unregister", Apart("a speculative fault in a MISSING-registered VMA stops at its flag check (step 4) with no snapshot to carry across; WP or MINOR registrations change flags as mlock does (its model)")),
    ("speculative fault", "uffd write-protect", Apart("write-protect rewrites present entries under the PTE lock; the speculative fault installs only into an empty entry under the same lock, so each sees the other's result")),
    ("speculative fault", "memfd shrink", SPEC_NO_OBJECT),
    ("speculative fault", "fork", Model("spec_writers.rs", "spec_fault_vs_fork")),
    // The same fault with its VMA from the CPU's hint (mm/vma_hint.rs): a
    // hinted object is validated as a tree result is, so every writer's
    // stamp and sweep order it alike; munmap with the object taken back
    // for another range is the one case only a hint reaches (through the
    // hint's look-ahead too: `spec_fault_through_hint_look_ahead_vs_vma_reuse_elsewhere`,
    // in the same file, the same race and checks).
    ("speculative fault via VMA hint", "munmap", Model("spec_fault.rs", "spec_fault_through_hint_vs_vma_reuse_elsewhere")),
    ("speculative fault via VMA hint", "mprotect", Shares("spec_writers.rs", "spec_fault_in_shared_table_vs_mprotect", HINT)),
    ("speculative fault via VMA hint", "mremap move", Shares("spec_writers.rs", "spec_fault_in_shared_table_vs_mremap", HINT)),
    ("speculative fault via VMA hint", "mremap grow", Shares("spec_writers.rs", "spec_fault_vs_mremap_grow", HINT)),
    ("speculative fault via VMA hint", "mremap shrink", Shares("spec_writers.rs", "spec_fault_vs_mremap_shrink", HINT)),
    ("speculative fault via VMA hint", "mremap DONTUNMAP", Shares("spec_writers.rs", "spec_fault_vs_mremap_dontunmap_over_empty_table", HINT)),
    ("speculative fault via VMA hint", "madvise DONTNEED", Shares("spec_writers.rs", "spec_fault_vs_dontneed", HINT)),
    ("speculative fault via VMA hint", "madvise REMOVE", SPEC_NO_OBJECT),
    ("speculative fault via VMA hint", "madvise FREE", Shares("spec_writers.rs", "spec_fault_vs_madv_free", HINT)),
    ("speculative fault via VMA hint", "brk", Shares("spec_writers.rs", "spec_fault_vs_brk_shrink", HINT)),
    ("speculative fault via VMA hint", "mlock", Shares("spec_writers.rs", "spec_fault_vs_mlock", HINT)),
    ("speculative fault via VMA hint", "set_anon_name", Shares("spec_writers.rs", "spec_fault_vs_set_anon_name", HINT)),
    ("speculative fault via VMA hint", "uffd register", Shares("spec_fault.rs", "spec_fault_in_shared_table_vs_uffd_register", HINT)),
    ("speculative fault via VMA hint", "uffd unregister", Apart("a speculative fault in a MISSING-registered VMA stops at its flag check (step 4) with no snapshot to carry across; WP or MINOR registrations change flags as mlock does (its model)")),
    ("speculative fault via VMA hint", "uffd write-protect", Apart("write-protect rewrites present entries under the PTE lock; the speculative fault installs only into an empty entry under the same lock, so each sees the other's result")),
    ("speculative fault via VMA hint", "memfd shrink", SPEC_NO_OBJECT),
    ("speculative fault via VMA hint", "fork", Shares("spec_writers.rs", "spec_fault_vs_fork", HINT)),
    // The speculative fault's first write in a VMA: its anon_vma prepared
    // under the mmap_lock read side (try-locked), the stamp re-read under
    // it (mm/spec_fault.rs, "The first write"), then the install above.
    ("speculative first write (anon_vma prepare)", "munmap", Model("spec_writers.rs", "spec_first_write_vs_munmap_reuse")),
    ("speculative first write (anon_vma prepare)", "mprotect", Model("spec_writers.rs", "spec_first_write_vs_neighbour_merge")),
    ("speculative first write (anon_vma prepare)", "mremap move", PREPARE_LOCKED_OUT),
    ("speculative first write (anon_vma prepare)", "mremap grow", PREPARE_LOCKED_OUT),
    ("speculative first write (anon_vma prepare)", "mremap shrink", PREPARE_LOCKED_OUT),
    ("speculative first write (anon_vma prepare)", "mremap DONTUNMAP", PREPARE_LOCKED_OUT),
    ("speculative first write (anon_vma prepare)", "madvise DONTNEED", Shares("spec_writers.rs", "spec_fault_vs_dontneed", PREPARE_THEN_INSTALL)),
    ("speculative first write (anon_vma prepare)", "madvise REMOVE", SPEC_NO_OBJECT),
    ("speculative first write (anon_vma prepare)", "madvise FREE", Shares("spec_writers.rs", "spec_fault_vs_madv_free", PREPARE_THEN_INSTALL)),
    ("speculative first write (anon_vma prepare)", "brk", PREPARE_LOCKED_OUT),
    ("speculative first write (anon_vma prepare)", "mlock", PREPARE_LOCKED_OUT),
    ("speculative first write (anon_vma prepare)", "set_anon_name", PREPARE_LOCKED_OUT),
    ("speculative first write (anon_vma prepare)", "uffd register", PREPARE_LOCKED_OUT),
    ("speculative first write (anon_vma prepare)", "uffd unregister", PREPARE_LOCKED_OUT),
    ("speculative first write (anon_vma prepare)", "uffd write-protect", Apart("write-protect rewrites present entries (under the mmap_lock read side and the PTE lock) and reads no anon_vma; the install after the prepare fills only an empty entry under the same lock")),
    ("speculative first write (anon_vma prepare)", "memfd shrink", SPEC_NO_OBJECT),
    ("speculative first write (anon_vma prepare)", "fork", Model("spec_writers.rs", "spec_first_write_vs_fork")),
    ("speculative first write (anon_vma prepare)", "THP split", Shares("thp.rs", "lookup_vs_split", "a split rewrites a leaf's entries under the PMD lock and reads no anon_vma, so it cannot meet the prepare; the install after it is the speculative fault's against a split")),
    ("speculative first write (anon_vma prepare)", "THP fault", Apart("a huge fault prepares the anon_vma the same way (mmap_lock read side, compare-exchange under the family's lock): one links it, the other adopts it")),
    ("speculative first write (anon_vma prepare)", "THP collapse", PREPARE_LOCKED_OUT),
    ("speculative first write (anon_vma prepare)", "range munmap", PREPARE_RANGE_LOCKED_OUT),
    ("speculative first write (anon_vma prepare)", "range mprotect", Model("range_writers.rs", "range_spec_first_write_vs_mprotect_splitting_its_neighbour")),
    ("speculative first write (anon_vma prepare)", "range mmap", PREPARE_RANGE_LOCKED_OUT),
    // The per-VMA fault: holds the VMA's read lock.
    ("per-VMA fault", "munmap", Model("fault.rs", "fault_vs_munmap_same_page")),
    ("per-VMA fault", "mprotect", Model("fault.rs", "write_vs_mprotect_read")),
    ("per-VMA fault", "mremap move", LOCKED_OUT),
    ("per-VMA fault", "mremap grow", LOCKED_OUT),
    ("per-VMA fault", "mremap shrink", LOCKED_OUT),
    ("per-VMA fault", "mremap DONTUNMAP", LOCKED_OUT),
    ("per-VMA fault", "madvise DONTNEED", Model("fault.rs", "fault_vs_dontneed_same_page")),
    ("per-VMA fault", "madvise REMOVE", Shares("fault.rs", "fault_vs_dontneed_same_page", "REMOVE zaps with DONTNEED's zap_range, and its hole punch zeroes the object's frames in place under a reference of its own (memfd.rs remove_vs_shrink_and_reuse)")),
    ("per-VMA fault", "madvise FREE", Shares("fault.rs", "fault_vs_dontneed_same_page", "MADV_FREE runs DONTNEED's zap (one arm in madvise.rs)")),
    ("per-VMA fault", "brk", LOCKED_OUT),
    ("per-VMA fault", "mlock", LOCKED_OUT),
    ("per-VMA fault", "set_anon_name", LOCKED_OUT),
    ("per-VMA fault", "uffd register", LOCKED_OUT),
    ("per-VMA fault", "uffd unregister", LOCKED_OUT),
    ("per-VMA fault", "uffd write-protect", Model("uffd_wp.rs", "write_fault_vs_write_protect")),
    ("per-VMA fault", "memfd shrink", Model("memfd.rs", "store_vs_shrink_with_tables")),
    ("per-VMA fault", "fork", Model("fault.rs", "fork_vs_write_fault")),
    // Translator (and user-mode) accesses: soft-TLB entries, invalidated
    // by the writers' flushes.
    ("translator access", "munmap", Model("translator.rs", "translator_store_vs_munmap")),
    ("translator access", "mprotect", Model("translator.rs", "translator_store_vs_mprotect_read")),
    ("translator access", "mremap move", Model("translator_writers.rs", "translator_store_vs_mremap_move")),
    ("translator access", "mremap grow", NO_ENTRY_CHANGE),
    ("translator access", "mremap shrink", Model("translator_writers.rs", "translator_store_vs_mremap_shrink")),
    ("translator access", "mremap DONTUNMAP", Model("translator_writers.rs", "translator_store_vs_mremap_dontunmap")),
    ("translator access", "madvise DONTNEED", Model("translator_writers.rs", "translator_store_vs_dontneed")),
    ("translator access", "madvise REMOVE", Apart("the hole punch keeps the object's frames: a store through the old translation reaches the very page a fresh one would, so no stale target exists")),
    ("translator access", "madvise FREE", Model("translator_writers.rs", "translator_store_vs_madv_free")),
    ("translator access", "brk", Shares("translator.rs", "translator_store_vs_munmap", "brk shrinks through munmap's unmap edit")),
    ("translator access", "mlock", NO_ENTRY_CHANGE),
    ("translator access", "set_anon_name", NO_ENTRY_CHANGE),
    ("translator access", "uffd register", NO_ENTRY_CHANGE),
    ("translator access", "uffd unregister", NO_ENTRY_CHANGE),
    ("translator access", "uffd write-protect", Model("uffd_wp.rs", "translator_store_vs_write_protect")),
    ("translator access", "memfd shrink", Model("translator_writers.rs", "translator_store_vs_memfd_shrink")),
    ("translator access", "fork", Model("translator_writers.rs", "translator_store_vs_fork")),
    // A flush on the thread a translator last accessed on (its home) skips
    // the heavy fence and the wait for it (tlb/mod.rs); one that moved off
    // it rehomes first.
    ("translator access, flush on its home thread", "munmap", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator access, flush on its home thread", "mprotect", Model("translator.rs", "translator_moved_vs_own_flush")),
    ("translator access, flush on its home thread", "mremap move", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator access, flush on its home thread", "mremap grow", NO_ENTRY_CHANGE),
    ("translator access, flush on its home thread", "mremap shrink", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator access, flush on its home thread", "mremap DONTUNMAP", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator access, flush on its home thread", "madvise DONTNEED", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator access, flush on its home thread", "madvise REMOVE", Apart("the hole punch keeps the object's frames: a store through the old translation reaches the very page a fresh one would, so no stale target exists")),
    ("translator access, flush on its home thread", "madvise FREE", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator access, flush on its home thread", "brk", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator access, flush on its home thread", "mlock", NO_ENTRY_CHANGE),
    ("translator access, flush on its home thread", "set_anon_name", NO_ENTRY_CHANGE),
    ("translator access, flush on its home thread", "uffd register", NO_ENTRY_CHANGE),
    ("translator access, flush on its home thread", "uffd unregister", NO_ENTRY_CHANGE),
    ("translator access, flush on its home thread", "uffd write-protect", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator access, flush on its home thread", "memfd shrink", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator access, flush on its home thread", "fork", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator access, flush on its home thread", "THP split", NO_FLUSH),
    ("translator access, flush on its home thread", "THP fault", NO_FLUSH),
    ("translator access, flush on its home thread", "THP collapse", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator access, flush on its home thread", "range munmap", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator access, flush on its home thread", "range mprotect", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator access, flush on its home thread", "range mmap", RANGE_MMAP_NEW),
    // Instruction fetches: translator accesses with the exec bit.
    ("instruction fetch", "munmap", Shares("translator.rs", "translator_store_vs_munmap", FETCH)),
    ("instruction fetch", "mprotect", Model("translator.rs", "translator_fetch_vs_mprotect_noexec")),
    ("instruction fetch", "mremap move", Shares("translator_writers.rs", "translator_store_vs_mremap_move", FETCH)),
    ("instruction fetch", "mremap grow", NO_ENTRY_CHANGE),
    ("instruction fetch", "mremap shrink", Shares("translator_writers.rs", "translator_store_vs_mremap_shrink", FETCH)),
    ("instruction fetch", "mremap DONTUNMAP", Shares("translator_writers.rs", "translator_store_vs_mremap_dontunmap", FETCH)),
    ("instruction fetch", "madvise DONTNEED", Shares("translator_writers.rs", "translator_store_vs_dontneed", FETCH)),
    ("instruction fetch", "madvise REMOVE", Apart("the hole punch keeps the object's frames: a fetch through the old translation reads the very page a fresh one would")),
    ("instruction fetch", "madvise FREE", Shares("translator_writers.rs", "translator_store_vs_madv_free", FETCH)),
    ("instruction fetch", "brk", Shares("translator.rs", "translator_store_vs_munmap", "brk shrinks through munmap's unmap edit; a fetch is a translator access")),
    ("instruction fetch", "mlock", NO_ENTRY_CHANGE),
    ("instruction fetch", "set_anon_name", NO_ENTRY_CHANGE),
    ("instruction fetch", "uffd register", NO_ENTRY_CHANGE),
    ("instruction fetch", "uffd unregister", NO_ENTRY_CHANGE),
    ("instruction fetch", "uffd write-protect", Apart("write-protect removes write permission only (NX kept with the entry's other bits); a fetch needs exec, which it leaves")),
    ("instruction fetch", "memfd shrink", Shares("translator_writers.rs", "translator_store_vs_memfd_shrink", FETCH)),
    ("instruction fetch", "fork", Shares("translator_writers.rs", "translator_store_vs_fork", "fork write-protects the parent's entries and flushes; a fetch is a translator access dropped alike, and needs no write")),
    // Device slices (vm-memory): pinned frames.
    ("device slice", "munmap", Apart("the slice's frame holds a pin taken under its PTE lock, and no writer frees a pinned frame (phys/chunk.rs): the slice reaches the page it named, orphaned, never another (tests/device_slices.rs)")),
    ("device slice", "mprotect", Apart("changes no frame: the pinned page stays the one the slice named")),
    ("device slice", "mremap move", Apart("the slice's frame holds a pin taken under its PTE lock, and no writer frees a pinned frame (phys/chunk.rs): the slice reaches the page it named, orphaned, never another (tests/device_slices.rs)")),
    ("device slice", "mremap grow", Apart("changes no frame: the pinned page stays the one the slice named")),
    ("device slice", "mremap shrink", Apart("the slice's frame holds a pin taken under its PTE lock, and no writer frees a pinned frame (phys/chunk.rs): the slice reaches the page it named, orphaned, never another (tests/device_slices.rs)")),
    ("device slice", "mremap DONTUNMAP", Apart("the slice's frame holds a pin taken under its PTE lock, and no writer frees a pinned frame (phys/chunk.rs): the slice reaches the page it named, orphaned, never another (tests/device_slices.rs)")),
    ("device slice", "madvise DONTNEED", Apart("the slice's frame holds a pin taken under its PTE lock, and no writer frees a pinned frame (phys/chunk.rs): the slice reaches the page it named, orphaned, never another (tests/device_slices.rs)")),
    ("device slice", "madvise REMOVE", Apart("the hole punch zeroes the object's frame in place: the slice names that very page")),
    ("device slice", "madvise FREE", Apart("the slice's frame holds a pin taken under its PTE lock, and no writer frees a pinned frame (phys/chunk.rs): the slice reaches the page it named, orphaned, never another (tests/device_slices.rs)")),
    ("device slice", "brk", Apart("the slice's frame holds a pin taken under its PTE lock, and no writer frees a pinned frame (phys/chunk.rs): the slice reaches the page it named, orphaned, never another (tests/device_slices.rs)")),
    ("device slice", "mlock", Apart("changes no frame: the pinned page stays the one the slice named")),
    ("device slice", "set_anon_name", Apart("changes no frame: the pinned page stays the one the slice named")),
    ("device slice", "uffd register", Apart("changes no frame: the pinned page stays the one the slice named")),
    ("device slice", "uffd unregister", Apart("changes no frame: the pinned page stays the one the slice named")),
    ("device slice", "uffd write-protect", Apart("a pinned page is reported written and left unprotected while pinned (uffd/scan.rs), so a device write is never lost to a reset")),
    ("device slice", "memfd shrink", Model("device.rs", "unshare_copy_vs_shrink")),
    ("device slice", "fork", Model("device.rs", "pin_vs_fork")),
    // A fault asleep waiting for a userfault handler: holds no lock and no
    // snapshot; it retries the whole fault when woken.
    ("userfault waiter", "munmap", Model("uffd.rs", "missing_fault_vs_munmap")),
    ("userfault waiter", "mprotect", Apart("asleep it holds no lock or snapshot, and mprotect leaves the registration: it sleeps on until a fill or wake, then faults afresh")),
    ("userfault waiter", "mremap move", Shares("uffd.rs", "missing_fault_vs_munmap", "the move ends with munmap's unmap edit of the old range (unmap_into), which wakes its waiters")),
    ("userfault waiter", "mremap grow", Apart("the waiter's page stays registered where it was; nothing it waits on changes")),
    ("userfault waiter", "mremap shrink", Shares("uffd.rs", "missing_fault_vs_munmap", "the cut tail goes through munmap's unmap edit, which wakes its waiters")),
    ("userfault waiter", "mremap DONTUNMAP", Apart("the old VMA stays, registered, with the page missing: the waiter waits on for the handler, as in Linux")),
    ("userfault waiter", "madvise DONTNEED", Apart("the waiter's page is missing already; zapping other pages leaves it waiting for the handler, as Linux does")),
    ("userfault waiter", "madvise REMOVE", Apart("as DONTNEED: the page it waits for is missing already")),
    ("userfault waiter", "madvise FREE", Apart("as DONTNEED: the page it waits for is missing already")),
    ("userfault waiter", "brk", Shares("uffd.rs", "missing_fault_vs_munmap", "brk shrinks through munmap's unmap edit, which wakes the removed range's waiters")),
    ("userfault waiter", "mlock", Apart("mlock's populate faults the registered pages as any fault would; the sleeping one holds nothing mlock waits on")),
    ("userfault waiter", "set_anon_name", Apart("a name changes no registration: it sleeps on until a fill or wake")),
    ("userfault waiter", "uffd register", Apart("a waiter exists only in a registered VMA; registering it again changes nothing it waits on")),
    ("userfault waiter", "uffd unregister", Model("uffd.rs", "missing_fault_vs_unregister")),
    ("userfault waiter", "uffd write-protect", Model("thp.rs", "wp_fault_on_a_leaf_vs_unprotect")),
    ("userfault waiter", "memfd shrink", Apart("asleep it holds no lock or snapshot, and the shrink leaves it waiting for the handler, as Linux does; woken, it is an ordinary fault racing the shrink (memfd.rs store_vs_shrink_*: the end re-checked under the PTE lock)")),
    ("userfault waiter", "fork", Apart("fork copies the registered VMA and leaves the parent's page missing: the waiter holds nothing fork waits on, and waits on for the handler")),
    // A forced access (`write_forced`/`read_forced`): looks up, checks and
    // copies under the mmap_lock read side, inside a counted access.
    ("forced access", "munmap", MMAP_LOCKED_OUT),
    ("forced access", "mprotect", MMAP_LOCKED_OUT),
    ("forced access", "mremap move", MMAP_LOCKED_OUT),
    ("forced access", "mremap grow", MMAP_LOCKED_OUT),
    ("forced access", "mremap shrink", MMAP_LOCKED_OUT),
    ("forced access", "mremap DONTUNMAP", MMAP_LOCKED_OUT),
    ("forced access", "madvise DONTNEED", Model("forced.rs", "forced_write_vs_dontneed")),
    ("forced access", "madvise REMOVE", Shares("forced.rs", "forced_write_vs_dontneed", "REMOVE zaps with DONTNEED's zap_range and one flush, which waits for the forced copy's counted access; the punched object's frames are zeroed in place, not freed")),
    ("forced access", "madvise FREE", Shares("forced.rs", "forced_write_vs_dontneed", "MADV_FREE runs DONTNEED's zap (one arm in madvise.rs)")),
    ("forced access", "brk", MMAP_LOCKED_OUT),
    ("forced access", "mlock", MMAP_LOCKED_OUT),
    ("forced access", "set_anon_name", MMAP_LOCKED_OUT),
    ("forced access", "uffd register", MMAP_LOCKED_OUT),
    ("forced access", "uffd unregister", MMAP_LOCKED_OUT),
    ("forced access", "uffd write-protect", Shares("forced.rs", "forced_write_vs_dontneed", "write-protect sets the bit under the PTE lock and ends with a flush as DONTNEED's zap does, which waits for the forced copy's counted access; a forced write that finds the bit goes through the fault (the handler)")),
    ("forced access", "memfd shrink", Shares("forced.rs", "forced_write_vs_dontneed", "the shrink zaps every mapping under PTE locks and frees after one flush, DONTNEED's order, which waits for the forced copy's counted access; a forced copy in a private mapping is anonymous and stays")),
    ("forced access", "fork", Model("forced.rs", "forced_write_vs_fork")),
    // A file object's writeback (msync, munmap, sync_all, drop): reads
    // the object's pages without its size lock, under the io lock.
    ("file writeback", "munmap", Apart("munmap's own writeback runs in the writer, after it unregistered the VMA; a concurrent msync holds the object and reads its pages, not the entries munmap zaps (and a private copy is never written back)")),
    ("file writeback", "mprotect", WB_OWN_PAGES),
    ("file writeback", "mremap move", WB_OWN_PAGES),
    ("file writeback", "mremap grow", WB_OWN_PAGES),
    ("file writeback", "mremap shrink", WB_OWN_PAGES),
    ("file writeback", "mremap DONTUNMAP", WB_OWN_PAGES),
    ("file writeback", "madvise DONTNEED", WB_OWN_PAGES),
    ("file writeback", "madvise REMOVE", Apart("the hole punch zeroes the object's frames in place and frees none: writeback copies a page under a reference as it would copy one a store is writing, and the page stays dirty for the next sync")),
    ("file writeback", "madvise FREE", WB_OWN_PAGES),
    ("file writeback", "brk", WB_OWN_PAGES),
    ("file writeback", "mlock", WB_OWN_PAGES),
    ("file writeback", "set_anon_name", WB_OWN_PAGES),
    ("file writeback", "uffd register", WB_OWN_PAGES),
    ("file writeback", "uffd unregister", WB_OWN_PAGES),
    ("file writeback", "uffd write-protect", WB_OWN_PAGES),
    ("file writeback", "memfd shrink", Model("memfd.rs", "writeback_vs_shrink")),
    ("file writeback", "fork", WB_OWN_PAGES),
    // A PMD leaf split into 512 PTEs (a 4 KiB change of a huge page: a
    // write fault on a read-only one, a range pass over part of it, a VMA
    // boundary inside it, `update`), and a leaf installed by a huge fault.
    ("speculative fault", "THP split", Shares("thp.rs", "lookup_vs_split", SAME_TRANSLATIONS)),
    ("speculative fault via VMA hint", "THP split", Shares("thp.rs", "lookup_vs_split", SAME_TRANSLATIONS)),
    ("per-VMA fault", "THP split", Model("thp.rs", "two_write_faults_split_one_leaf")),
    ("translator access", "THP split", Model("thp.rs", "translator_load_vs_split")),
    ("instruction fetch", "THP split", Shares("thp.rs", "translator_load_vs_split", FETCH)),
    ("device slice", "THP split", Apart("a pin inside a leaf takes the subframe's pin under the PMD lock, which a split takes too, with the leaf re-checked (translate/guest/pin.rs pin_in_leaf); a split changes no frame or reference: the pinned page stays the one the slice named")),
    ("userfault waiter", "THP split", Apart("a missing or minor waiter's page is missing (no leaf maps it); a write-protect waiter's leaf is split only by another writer of its VMA, and a split keeps every page's flags (UFFD_WP included): the waiter's second look sees the bit either way (pt/huge.rs)")),
    ("forced access", "THP split", Shares("thp.rs", "split_vs_zap_of_the_leaf", "a forced write splits a read-only leaf as a write fault does, under the mmap_lock read side, meeting DONTNEED's zap of the leaf under the same PMD lock")),
    ("file writeback", "THP split", WB_OWN_PAGES),
    ("speculative fault", "THP fault", Apart("the speculative fault never installs a leaf and falls back where one could be installed (eligible span, empty PMD slot); a table it links and a leaf are both made only into an empty slot under the PMD lock, so one of them finds the other")),
    ("speculative fault via VMA hint", "THP fault", Apart("a hinted VMA takes the speculative fault's walk, which never installs a leaf and falls back where one could be installed")),
    ("per-VMA fault", "THP fault", Model("thp.rs", "huge_fault_vs_fault_in_span")),
    ("translator access", "THP fault", Shares("thp.rs", "read_vs_huge_fault", NEW_LEAF_READ)),
    ("instruction fetch", "THP fault", Shares("thp.rs", "read_vs_huge_fault", NEW_LEAF_READ)),
    ("device slice", "THP fault", NEW_LEAF),
    ("userfault waiter", "THP fault", Apart("a VMA registered for userfaults gets no huge page (mm/thp.rs eligible)")),
    ("forced access", "THP fault", NEW_LEAF),
    ("file writeback", "THP fault", Apart("huge pages are anonymous: an object's pages are never mapped by a leaf")),
    // MADV_COLLAPSE and khugepaged: under the mmap_lock write side, the
    // VMA claimed by Edit::lock; the table unlinked, the span flushed,
    // the pages copied, the leaf installed (mm/thp.rs).
    ("speculative fault", "THP collapse", Model("thp.rs", "spec_write_vs_collapse")),
    ("speculative fault via VMA hint", "THP collapse", Shares("thp.rs", "spec_write_vs_collapse", HINT)),
    ("per-VMA fault", "THP collapse", LOCKED_OUT),
    ("translator access", "THP collapse", Model("thp.rs", "translator_store_vs_collapse")),
    ("instruction fetch", "THP collapse", Shares("thp.rs", "translator_store_vs_collapse", FETCH)),
    ("device slice", "THP collapse", Apart("a span with a pinned page is not collapsed: the slice's frame stays mapped")),
    ("userfault waiter", "THP collapse", Apart("a VMA registered for userfaults is not collapsed (mm/thp.rs vma_allows)")),
    ("forced access", "THP collapse", MMAP_LOCKED_OUT),
    ("file writeback", "THP collapse", Apart("only anonymous memory is collapsed: an object's pages are never touched")),
    // Range-locked writers (mm/range_lock.rs).
    ("speculative fault", "range munmap", Shares("spec_fault.rs", "spec_fault_without_table_vs_munmap", RANGE_SAME)),
    ("speculative fault", "range mprotect", Model("range_writers.rs", "spec_fault_vs_range_mprotect")),
    ("speculative fault", "range mmap", RANGE_MMAP_NEW),
    ("speculative fault via VMA hint", "range munmap", Shares("spec_fault.rs", "spec_fault_through_hint_vs_vma_reuse_elsewhere", RANGE_SAME)),
    ("speculative fault via VMA hint", "range mprotect", Shares("range_writers.rs", "spec_fault_vs_range_mprotect", HINT)),
    ("speculative fault via VMA hint", "range mmap", RANGE_MMAP_NEW),
    ("per-VMA fault", "range munmap", Shares("fault.rs", "fault_vs_munmap_same_page", RANGE_SAME)),
    ("per-VMA fault", "range mprotect", Model("range_writers.rs", "per_vma_fault_vs_range_mprotect")),
    ("per-VMA fault", "range mmap", RANGE_MMAP_NEW),
    ("translator access", "range munmap", Model("range_writers.rs", "translator_store_vs_range_munmap")),
    ("translator access", "range mprotect", Shares("translator.rs", "translator_store_vs_mprotect_read", RANGE_SAME)),
    ("translator access", "range mmap", RANGE_MMAP_NEW),
    ("instruction fetch", "range munmap", Shares("range_writers.rs", "translator_store_vs_range_munmap", FETCH)),
    ("instruction fetch", "range mprotect", Shares("translator.rs", "translator_fetch_vs_mprotect_noexec", RANGE_SAME)),
    ("instruction fetch", "range mmap", RANGE_MMAP_NEW),
    ("device slice", "range munmap", Apart("the slice's frame holds a pin taken under its PTE lock, and no writer frees a pinned frame (phys/chunk.rs): the slice reaches the page it named, orphaned, never another (tests/device_slices.rs)")),
    ("device slice", "range mprotect", Apart("changes no frame: the pinned page stays the one the slice named")),
    ("device slice", "range mmap", RANGE_MMAP_NEW),
    ("userfault waiter", "range munmap", Shares("uffd.rs", "missing_fault_vs_munmap", RANGE_SAME)),
    ("userfault waiter", "range mprotect", Apart("asleep it holds no lock or snapshot, and mprotect leaves the registration: it sleeps on until a fill or wake, then faults afresh")),
    ("userfault waiter", "range mmap", RANGE_MMAP_NEW),
    ("forced access", "range munmap", RANGE_LOCKED_OUT),
    ("forced access", "range mprotect", RANGE_LOCKED_OUT),
    ("forced access", "range mmap", RANGE_LOCKED_OUT),
    ("file writeback", "range munmap", Apart("munmap's own writeback runs in the writer (under its range lock as under the mmap_lock), after it unregistered the VMA; a concurrent msync holds the object and reads its pages, not the entries munmap zaps")),
    ("file writeback", "range mprotect", WB_OWN_PAGES),
    ("file writeback", "range mmap", Apart("a range mmap maps anonymous memory only (an object's mmap takes the whole space)")),
    // The range-locked fault fallback and zaps (mm/range_read.rs).
    ("range-locked fault fallback", "munmap", FALLBACK_LOCKED_OUT),
    ("range-locked fault fallback", "mprotect", FALLBACK_LOCKED_OUT),
    ("range-locked fault fallback", "mremap move", FALLBACK_LOCKED_OUT),
    ("range-locked fault fallback", "mremap grow", FALLBACK_LOCKED_OUT),
    ("range-locked fault fallback", "mremap shrink", FALLBACK_LOCKED_OUT),
    ("range-locked fault fallback", "mremap DONTUNMAP", FALLBACK_LOCKED_OUT),
    ("range-locked fault fallback", "brk", FALLBACK_LOCKED_OUT),
    ("range-locked fault fallback", "mlock", FALLBACK_LOCKED_OUT),
    ("range-locked fault fallback", "set_anon_name", FALLBACK_LOCKED_OUT),
    ("range-locked fault fallback", "uffd register", FALLBACK_LOCKED_OUT),
    ("range-locked fault fallback", "uffd unregister", FALLBACK_LOCKED_OUT),
    ("range-locked fault fallback", "fork", FALLBACK_LOCKED_OUT),
    ("range-locked fault fallback", "THP collapse", FALLBACK_LOCKED_OUT),
    ("range-locked fault fallback", "madvise DONTNEED", Shares("fault.rs", "fault_vs_dontneed_same_page", FALLBACK_SAME)),
    ("range-locked fault fallback", "madvise REMOVE", Shares("fault.rs", "fault_vs_dontneed_same_page", FALLBACK_SAME)),
    ("range-locked fault fallback", "madvise FREE", Shares("fault.rs", "fault_vs_dontneed_same_page", FALLBACK_SAME)),
    ("range-locked fault fallback", "range madvise DONTNEED", Shares("fault.rs", "fault_vs_dontneed_same_page", FALLBACK_SAME)),
    ("range-locked fault fallback", "uffd write-protect", Shares("uffd_wp.rs", "write_fault_vs_write_protect", FALLBACK_SAME)),
    ("range-locked fault fallback", "memfd shrink", Shares("memfd.rs", "store_vs_shrink_with_tables", FALLBACK_SAME)),
    ("range-locked fault fallback", "THP split", Shares("thp.rs", "two_write_faults_split_one_leaf", FALLBACK_SAME)),
    ("range-locked fault fallback", "THP fault", Shares("thp.rs", "huge_fault_vs_fault_in_span", FALLBACK_SAME)),
    ("range-locked fault fallback", "range munmap", Apart("serialized by the range lock: the munmap holds every VMA it removes or splits whole (and the margin page beside its range), the fallback the VMA it faults in whole: they overlap whenever the munmap touches that VMA")),
    ("range-locked fault fallback", "range mprotect", Model("range_writers.rs", "range_fault_fallback_vs_mprotect_splitting_its_neighbour")),
    ("range-locked fault fallback", "range mmap", Apart("serialized by the range lock where they meet: an mmap that merges with or replaces the fallback's VMA or a neighbour holds that VMA whole, and one into the fallback's hole (a stack growth check) overlaps the gap the fallback holds; elsewhere a new VMA changes nothing the fallback reads")),
    ("speculative fault", "range madvise DONTNEED", Shares("spec_writers.rs", "spec_fault_vs_dontneed", RANGE_ZAP_SAME)),
    ("speculative fault via VMA hint", "range madvise DONTNEED", Shares("spec_writers.rs", "spec_fault_vs_dontneed", RANGE_ZAP_SAME)),
    ("speculative first write (anon_vma prepare)", "range madvise DONTNEED", Shares("spec_writers.rs", "spec_fault_vs_dontneed", RANGE_ZAP_SAME)),
    ("per-VMA fault", "range madvise DONTNEED", Shares("fault.rs", "fault_vs_dontneed_same_page", RANGE_ZAP_SAME)),
    ("translator access", "range madvise DONTNEED", Shares("translator_writers.rs", "translator_store_vs_dontneed", RANGE_ZAP_SAME)),
    ("translator access, flush on its home thread", "range madvise DONTNEED", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("instruction fetch", "range madvise DONTNEED", Shares("translator_writers.rs", "translator_store_vs_dontneed", RANGE_ZAP_SAME)),
    ("device slice", "range madvise DONTNEED", Apart("the slice's frame holds a pin taken under its PTE lock, and no writer frees a pinned frame (phys/chunk.rs): the slice reaches the page it named, orphaned, never another (tests/device_slices.rs)")),
    ("userfault waiter", "range madvise DONTNEED", Apart("the waiter's page is missing already; zapping other pages leaves it waiting for the handler, as Linux does")),
    ("forced access", "range madvise DONTNEED", Shares("forced.rs", "forced_write_vs_dontneed", RANGE_ZAP_SAME)),
    ("file writeback", "range madvise DONTNEED", WB_OWN_PAGES),
    // The forest lookup (tree/forest.rs) against every writer's stores.
    ("VMA lookup in the forest", "munmap", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("VMA lookup in the forest", "mprotect", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("VMA lookup in the forest", "mremap move", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("VMA lookup in the forest", "mremap grow", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("VMA lookup in the forest", "mremap shrink", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("VMA lookup in the forest", "mremap DONTUNMAP", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("VMA lookup in the forest", "madvise DONTNEED", Apart("stores nothing in the VMA tree: it changes page-table entries or frames of VMAs it leaves in place")),
    ("VMA lookup in the forest", "madvise REMOVE", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("VMA lookup in the forest", "madvise FREE", Apart("stores nothing in the VMA tree: it changes page-table entries or frames of VMAs it leaves in place")),
    ("VMA lookup in the forest", "brk", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("VMA lookup in the forest", "mlock", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("VMA lookup in the forest", "set_anon_name", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("VMA lookup in the forest", "uffd register", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("VMA lookup in the forest", "uffd unregister", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("VMA lookup in the forest", "uffd write-protect", Apart("stores nothing in the VMA tree: it changes page-table entries or frames of VMAs it leaves in place")),
    ("VMA lookup in the forest", "memfd shrink", Apart("stores nothing in the VMA tree: it changes page-table entries or frames of VMAs it leaves in place")),
    ("VMA lookup in the forest", "fork", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("VMA lookup in the forest", "THP split", Apart("stores nothing in the VMA tree: it changes page-table entries or frames of VMAs it leaves in place")),
    ("VMA lookup in the forest", "THP fault", Apart("stores nothing in the VMA tree: it changes page-table entries or frames of VMAs it leaves in place")),
    ("VMA lookup in the forest", "THP collapse", Apart("stores nothing in the VMA tree: it changes page-table entries or frames of VMAs it leaves in place")),
    ("VMA lookup in the forest", "range madvise DONTNEED", Apart("stores nothing in the VMA tree: it changes page-table entries or frames of VMAs it leaves in place")),
    ("VMA lookup in the forest", "range munmap", Model("tree.rs", "forest_crossing_store_vs_reader")),
    ("VMA lookup in the forest", "range mprotect", Model("tree.rs", "forest_writers_in_two_slots_vs_crossing_reader")),
    ("VMA lookup in the forest", "range mmap", Model("tree.rs", "forest_writers_in_one_slot")),
    // madvise flags and set_anon_name under a range lock (name::modify_each).
    ("speculative fault", "range madvise flags, set_anon_name", Shares("spec_writers.rs", "spec_fault_vs_set_anon_name", RANGE_SAME)),
    ("speculative fault via VMA hint", "range madvise flags, set_anon_name", Shares("spec_writers.rs", "spec_fault_vs_set_anon_name", HINT)),
    ("speculative first write (anon_vma prepare)", "range madvise flags, set_anon_name", PREPARE_RANGE_LOCKED_OUT),
    ("per-VMA fault", "range madvise flags, set_anon_name", LOCKED_OUT),
    ("translator access", "range madvise flags, set_anon_name", NO_ENTRY_CHANGE),
    ("translator access, flush on its home thread", "range madvise flags, set_anon_name", NO_ENTRY_CHANGE),
    ("instruction fetch", "range madvise flags, set_anon_name", NO_ENTRY_CHANGE),
    ("device slice", "range madvise flags, set_anon_name", Apart("changes no frame: the pinned page stays the one the slice named")),
    ("userfault waiter", "range madvise flags, set_anon_name", Apart("a name or an advice flag changes no registration: it sleeps on until a fill or wake")),
    ("forced access", "range madvise flags, set_anon_name", RANGE_LOCKED_OUT),
    ("file writeback", "range madvise flags, set_anon_name", WB_OWN_PAGES),
    ("range-locked fault fallback", "range madvise flags, set_anon_name", Shares("range_writers.rs", "range_fault_fallback_vs_mprotect_splitting_its_neighbour", "it splits and merges with mprotect's Edit::modify under the same neighbourhood (Reach::Vmas), so it meets the fallback's hold exactly where mprotect does")),
    ("VMA lookup in the forest", "range madvise flags, set_anon_name", Shares("tree.rs", "forest_writers_in_two_slots_vs_crossing_reader", FOREST_STORES)),
    // mremap in place under a range lock (mremap.rs range_edit): a shrink as
    // munmap, a grow as mprotect; a move takes the whole space.
    ("speculative fault", "range mremap shrink", Shares("spec_writers.rs", "spec_fault_vs_mremap_shrink", RANGE_SAME)),
    ("speculative fault via VMA hint", "range mremap shrink", Shares("spec_writers.rs", "spec_fault_vs_mremap_shrink", HINT)),
    ("speculative first write (anon_vma prepare)", "range mremap shrink", PREPARE_RANGE_LOCKED_OUT),
    ("per-VMA fault", "range mremap shrink", LOCKED_OUT),
    ("translator access", "range mremap shrink", Shares("translator_writers.rs", "translator_store_vs_mremap_shrink", RANGE_SAME)),
    ("translator access, flush on its home thread", "range mremap shrink", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("instruction fetch", "range mremap shrink", Shares("translator_writers.rs", "translator_store_vs_mremap_shrink", FETCH)),
    ("device slice", "range mremap shrink", Apart("the slice's frame holds a pin taken under its PTE lock, and no writer frees a pinned frame (phys/chunk.rs): the slice reaches the page it named, orphaned, never another (tests/device_slices.rs)")),
    ("userfault waiter", "range mremap shrink", Shares("uffd.rs", "missing_fault_vs_munmap", "the cut tail goes through munmap's unmap edit, which wakes its waiters")),
    ("forced access", "range mremap shrink", RANGE_LOCKED_OUT),
    ("file writeback", "range mremap shrink", Apart("the tail's writeback runs in the writer with munmap's unmap edit (under its range lock as under the mmap_lock), after it unregistered the VMA; a concurrent msync holds the object and reads its pages, not the entries the shrink zaps")),
    ("range-locked fault fallback", "range mremap shrink", Apart("serialized by the range lock: the shrink holds the VMAs whose tail it unmaps whole (and the margin page and hole beside it, as munmap), the fallback the VMA it faults in whole: they overlap whenever the shrink touches that VMA")),
    ("VMA lookup in the forest", "range mremap shrink", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    ("speculative fault", "range mremap grow", Shares("spec_writers.rs", "spec_fault_vs_mremap_grow", RANGE_SAME)),
    ("speculative fault via VMA hint", "range mremap grow", Shares("spec_writers.rs", "spec_fault_vs_mremap_grow", HINT)),
    ("speculative first write (anon_vma prepare)", "range mremap grow", PREPARE_RANGE_LOCKED_OUT),
    ("per-VMA fault", "range mremap grow", LOCKED_OUT),
    ("translator access", "range mremap grow", NO_ENTRY_CHANGE),
    ("translator access, flush on its home thread", "range mremap grow", NO_ENTRY_CHANGE),
    ("instruction fetch", "range mremap grow", NO_ENTRY_CHANGE),
    ("device slice", "range mremap grow", Apart("changes no frame: the pinned page stays the one the slice named")),
    ("userfault waiter", "range mremap grow", Apart("the waiter's page stays registered where it was; nothing it waits on changes")),
    ("forced access", "range mremap grow", RANGE_LOCKED_OUT),
    ("file writeback", "range mremap grow", WB_OWN_PAGES),
    ("range-locked fault fallback", "range mremap grow", Apart("serialized by the range lock where they meet: the grow holds the VMA it grows whole, the pages it maps, and the margin page beyond with the VMA there (which it may merge with); a fallback in the grown VMA, in that neighbour or in the hole the grow fills holds a range that overlaps it, and one elsewhere reads nothing the grow changes")),
    ("VMA lookup in the forest", "range mremap grow", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    // brk under a range lock (brk.rs brk_edit): the whole-space brk's edit
    // (a shrink of the heap VMA's end with its zap and table freeing, or
    // munmap's unmap edit; a growth of the heap VMA or a new one) under
    // the hold of the old and new break's pages and the VMAs there.
    ("speculative fault", "range brk", Shares("spec_writers.rs", "spec_fault_vs_brk_shrink", RANGE_SAME)),
    ("speculative fault via VMA hint", "range brk", Shares("spec_writers.rs", "spec_fault_vs_brk_shrink", HINT)),
    ("speculative first write (anon_vma prepare)", "range brk", PREPARE_RANGE_LOCKED_OUT),
    ("per-VMA fault", "range brk", LOCKED_OUT),
    ("translator access", "range brk", Shares("translator.rs", "translator_store_vs_munmap", "brk shrinks through munmap's unmap edit or the heap VMA's end with the same zap and flush, under its range lock as under the mmap_lock")),
    ("translator access, flush on its home thread", "range brk", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("instruction fetch", "range brk", Shares("translator.rs", "translator_store_vs_munmap", "brk shrinks with munmap's zap and flush; a fetch is a translator access")),
    ("device slice", "range brk", Apart("the slice's frame holds a pin taken under its PTE lock, and no writer frees a pinned frame (phys/chunk.rs): the slice reaches the page it named, orphaned, never another (tests/device_slices.rs)")),
    ("userfault waiter", "range brk", Shares("uffd.rs", "missing_fault_vs_munmap", "a shrink goes through munmap's unmap edit, which wakes the removed range's waiters")),
    ("forced access", "range brk", RANGE_LOCKED_OUT),
    ("file writeback", "range brk", WB_OWN_PAGES),
    ("range-locked fault fallback", "range brk", Apart("serialized by the range lock where they meet: brk holds the heap VMA whole, the pages between the old and new break, and the margin page on each side with the VMAs there (a shrink also the hole above); a fallback in the heap, in the pages it grows over or in a VMA it may merge with holds a range that overlaps it, and one elsewhere reads nothing brk changes")),
    ("VMA lookup in the forest", "range brk", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
    // Translator blocks: a translator access section held across hits.
    ("translator block", "munmap", Model("translator.rs", "block_vs_munmap")),
    ("translator block", "mprotect", Model("translator.rs", "block_vs_mprotect_read")),
    ("translator block", "mremap move", Shares("translator_writers.rs", "translator_store_vs_mremap_move", BLOCK)),
    ("translator block", "mremap grow", NO_ENTRY_CHANGE),
    ("translator block", "mremap shrink", Shares("translator_writers.rs", "translator_store_vs_mremap_shrink", BLOCK)),
    ("translator block", "mremap DONTUNMAP", Shares("translator_writers.rs", "translator_store_vs_mremap_dontunmap", BLOCK)),
    ("translator block", "madvise DONTNEED", Shares("translator_writers.rs", "translator_store_vs_dontneed", BLOCK)),
    ("translator block", "madvise REMOVE", Apart("the hole punch keeps the object's frames: a store through the old translation reaches the very page a fresh one would, so no stale target exists")),
    ("translator block", "madvise FREE", Shares("translator_writers.rs", "translator_store_vs_madv_free", BLOCK)),
    ("translator block", "brk", Shares("translator.rs", "translator_store_vs_munmap", BLOCK)),
    ("translator block", "mlock", NO_ENTRY_CHANGE),
    ("translator block", "set_anon_name", NO_ENTRY_CHANGE),
    ("translator block", "uffd register", NO_ENTRY_CHANGE),
    ("translator block", "uffd unregister", NO_ENTRY_CHANGE),
    ("translator block", "uffd write-protect", Shares("uffd_wp.rs", "translator_store_vs_write_protect", BLOCK)),
    ("translator block", "memfd shrink", Shares("translator_writers.rs", "translator_store_vs_memfd_shrink", BLOCK)),
    ("translator block", "fork", Shares("translator_writers.rs", "translator_store_vs_fork", BLOCK)),
    ("translator block", "THP split", Shares("thp.rs", "translator_load_vs_split", BLOCK)),
    ("translator block", "THP fault", Shares("thp.rs", "read_vs_huge_fault", BLOCK)),
    ("translator block", "THP collapse", Shares("thp.rs", "translator_store_vs_collapse", BLOCK)),
    ("translator block", "range munmap", Shares("range_writers.rs", "translator_store_vs_range_munmap", BLOCK)),
    ("translator block", "range mprotect", Shares("translator.rs", "translator_store_vs_mprotect_read", BLOCK)),
    ("translator block", "range mmap", RANGE_MMAP_NEW),
    ("translator block", "range madvise DONTNEED", Shares("translator_writers.rs", "translator_store_vs_dontneed", BLOCK)),
    ("translator block", "range madvise flags, set_anon_name", NO_ENTRY_CHANGE),
    ("translator block", "range mremap shrink", Shares("translator_writers.rs", "translator_store_vs_mremap_shrink", BLOCK)),
    ("translator block", "range mremap grow", NO_ENTRY_CHANGE),
    ("translator block", "range brk", Shares("translator.rs", "translator_store_vs_munmap", BLOCK)),
    ("speculative fault", "range writer holding the bias", Shares("range_writers.rs", "spec_fault_vs_range_mprotect", BIAS_SAME)),
    ("speculative fault via VMA hint", "range writer holding the bias", Shares("range_writers.rs", "spec_fault_vs_range_mprotect", BIAS_SAME)),
    ("speculative first write (anon_vma prepare)", "range writer holding the bias", Shares("range_writers.rs", "range_spec_first_write_vs_mprotect_splitting_its_neighbour", "the prepare's try-read of the neighbourhood is a try-lock of the range lock: from another thread it revokes the bias and fails while the owner is inside its call (falling back as when a writer holds the range), from the owner's thread it is granted by the bias; either way the owner's whole-space edit and the prepare do not overlap")),
    ("per-VMA fault", "range writer holding the bias", Shares("range_writers.rs", "per_vma_fault_vs_range_mprotect", BIAS_SAME)),
    ("translator access", "range writer holding the bias", Shares("range_writers.rs", "translator_store_vs_range_munmap", BIAS_SAME)),
    ("translator access, flush on its home thread", "range writer holding the bias", Shares("translator.rs", "translator_moved_vs_own_flush", OWN_FLUSH)),
    ("translator block", "range writer holding the bias", Shares("range_writers.rs", "translator_store_vs_range_munmap", BLOCK)),
    ("instruction fetch", "range writer holding the bias", Shares("range_writers.rs", "translator_store_vs_range_munmap", FETCH)),
    ("device slice", "range writer holding the bias", Apart("the slice's frame holds a pin taken under its PTE lock, and no writer frees a pinned frame (phys/chunk.rs): the slice reaches the page it named, orphaned, never another (tests/device_slices.rs)")),
    ("userfault waiter", "range writer holding the bias", Shares("uffd.rs", "missing_fault_vs_munmap", BIAS_SAME)),
    ("forced access", "range writer holding the bias", Apart("serialized by the bias: a forced access from another thread requests its neighbourhood of the range lock, which revokes the bias and waits for the owner's call to end; one from the owner's thread runs between its calls")),
    ("file writeback", "range writer holding the bias", WB_OWN_PAGES),
    ("range-locked fault fallback", "range writer holding the bias", Shares("range_writers.rs", "range_bias_owner_vs_revoking_writer", "the fallback's read_range is a request of the range lock as the revoking mprotect's lock is: from another thread it revokes the bias and waits for the owner's call to end; from the owner's thread it is the whole space, granted by the bias")),
    ("VMA lookup in the forest", "range writer holding the bias", Shares("tree.rs", "forest_crossing_store_vs_reader", FOREST_STORES)),
];

fn source(file: &str) -> &'static str {
    match file {
        "device.rs" => include_str!("device.rs"),
        "fault.rs" => include_str!("fault.rs"),
        "forced.rs" => include_str!("forced.rs"),
        "memfd.rs" => include_str!("memfd.rs"),
        "range_writers.rs" => include_str!("range_writers.rs"),
        "spec_fault.rs" => include_str!("spec_fault.rs"),
        "spec_writers.rs" => include_str!("spec_writers.rs"),
        "thp.rs" => include_str!("thp.rs"),
        "translator.rs" => include_str!("translator.rs"),
        "translator_writers.rs" => include_str!("translator_writers.rs"),
        "tree.rs" => include_str!("tree.rs"),
        "uffd.rs" => include_str!("uffd.rs"),
        "uffd_wp.rs" => include_str!("uffd_wp.rs"),
        other => panic!("loom_tests/{other} is not listed in `source`"),
    }
}

fn is_test(file: &str, name: &str) -> bool {
    let src = source(file);
    let decl = format!("#[test]\nfn {name}()");
    src.contains(&decl)
}

/// Every reader x writer pair has exactly one cell, and every model a cell
/// names is a test in its file.
#[test]
fn every_reader_meets_every_writer_in_one_cell() {
    for (r, w, _) in MATRIX {
        assert!(READERS.contains(r), "unknown reader {r}");
        assert!(WRITERS.contains(w), "unknown writer {w}");
    }
    for r in READERS {
        for w in WRITERS {
            let cells: Vec<&Cell> = MATRIX
                .iter()
                .filter(|(cr, cw, _)| *cr == r && *cw == w)
                .map(|(_, _, c)| c)
                .collect();
            assert_eq!(cells.len(), 1, "({r}, {w}) has {} cells", cells.len());
            match cells[0] {
                Model(f, t) => assert!(is_test(f, t), "({r}, {w}): no #[test] fn {t} in {f}"),
                Shares(f, t, why) => {
                    assert!(is_test(f, t), "({r}, {w}): no #[test] fn {t} in {f}");
                    assert!(!why.is_empty());
                }
                Apart(why) => assert!(!why.is_empty()),
            }
        }
    }
}
