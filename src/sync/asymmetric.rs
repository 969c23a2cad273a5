//! An asymmetric fence pair (Linux's `membarrier(2)`): a `light` fence on
//! the hot side that costs nothing at run time, paired with a `heavy`
//! fence on the rare side that makes every running thread of the process
//! execute a full barrier. Together they order like two `SeqCst` fences:
//! for a light fence L and a heavy fence H, either every access before L
//! is visible after H, or every access after L sees what preceded H.
//!
//! Where `membarrier`'s private expedited command is unavailable (other
//! systems, seccomp), [`expedited`] is false and both sides are `SeqCst`
//! fences. Under loom both sides are loom's `SeqCst` fence, which is the
//! ordering the pair promises.
//!
//! # When membarrier fails after registration
//!
//! Registered commands do not fail, but a seccomp filter installed later
//! (or a kernel allocation failure) can make one fail. Heavy fences then
//! switch the process for good to the fenced protocol: light fences read
//! the process-wide mode on every call and become `SeqCst` fences, heavy
//! fences plain `SeqCst` fences. The switch itself needs care: a light
//! fence that read the old mode just before it is only a compiler fence,
//! and on x86-64 the store before it may still sit in its CPU's store
//! buffer while the load after it runs. So the switch, after storing the
//! new mode, makes every CPU running a thread of the process serialize
//! once, by another route: changing the protection of a present page of
//! its own from read-write to read-only, whose TLB shootdown interrupts
//! every such CPU (the fallback folly's `asymmetricHeavyBarrier` and
//! .NET's `FlushProcessWriteBuffers` use; it relies on IPI-based
//! shootdowns, as x86-64 Linux does them). A light fence whose mode load
//! ran before that interrupt had its earlier stores drained by it, so
//! every heavy fence after the switch sees them; one whose mode load ran
//! after it sees the new mode. Every heavy fence waits for the switch to
//! end ([`std::sync::Once`]). If the process forbids that route too, the
//! switch retries both routes, sleeping between tries, until one works:
//! heavy fences (and the flushes that issue them) wait rather than go on
//! unordered, and nothing panics.
//!
//! # Watched light fences
//!
//! A hot path that already loads a word of its own after its light fence
//! and branches on it (a translator's generation) can skip the mode load
//! too: it registers a [`Watcher`] ([`watch`]) and then fences with
//! [`light_watched`], a compiler fence alone. The switch, after storing
//! the new mode and before serializing every CPU, tells each live watcher
//! ([`Watcher::switched`]), which changes that word, so the same two
//! cases hold with the word in the mode's place: a watched fence whose
//! word load ran before the switch's interrupt had its earlier stores
//! drained by it; one whose load ran after it sees the changed word,
//! takes its slow path, finds there what `switched` marked and from then
//! on issues full fences itself. A watcher registered after the switch
//! stored the mode is told so by [`watch`] (registration and the switch's
//! calls are serialized by one lock) and never uses the watched fence.

use super::{fence, Ordering};
use crossbeam_utils::CachePadded;

/// The process's fence mode, on a cache line of its own: light fences
/// load it, and nothing writes it after the first heavy fence.
static MODE: CachePadded<Mode> = CachePadded::new(Mode::new());

/// True if heavy fences are `membarrier` calls (registered on first use,
/// process-wide); the light side may then be a compiler fence.
pub fn expedited() -> bool {
    MODE.get(sys::register) == EXPEDITED
}

/// The hot side. `expedited` is [`expedited()`]'s value, which callers
/// cache off their hot path; the mode is read again here (one load of a
/// line no one writes), since a failing heavy fence can turn it off.
#[inline(always)]
pub fn light(expedited: bool) {
    if cfg!(not(aspace_loom)) && !MODE.light_is_full(expedited) {
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    } else {
        full_fence();
    }
}

/// The light side's full fence, out of line so that the expedited path
/// (a load and a not-taken branch) stays straight on the hot path.
#[cold]
#[inline(never)]
fn full_fence() {
    fence(Ordering::SeqCst);
}

/// What a hot path that fences with [`light_watched`] registers
/// ([`watch`]): told once, if the process switches to full fences, before
/// any CPU is serialized for the switch (see the [module docs](self)).
pub trait Watcher: Send + Sync {
    /// The process switched to full fences: make the hot path's next
    /// check of its own word fail, so that its slow path sees the mode.
    fn switched(&self);
}

/// Registers `w` for the switch; true if light fences are compiler fences
/// now, so that its hot path may use [`light_watched`] until
/// [`Watcher::switched`] runs. False (fenced, or already switched): the
/// hot path must issue full fences. Registers for membarrier first, as
/// [`expedited`] does. Not under loom, where [`light_watched`] is a full
/// fence and nothing switches.
#[cfg(not(aspace_loom))]
pub fn watch(w: std::sync::Weak<dyn Watcher>) -> bool {
    MODE.watch(sys::register, w)
}

/// The hot side of a path registered with [`watch`] while [`expedited`]:
/// a compiler fence, with no load of the mode (its own word's check
/// stands in for it, see the [module docs](self)). Under loom, loom's
/// `SeqCst` fence, like [`light`].
#[inline(always)]
pub fn light_watched() {
    if cfg!(aspace_loom) {
        fence(Ordering::SeqCst);
    } else {
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    }
}

/// The rare side: a full barrier on every running thread of the process
/// (a few microseconds: an IPI to each CPU running one). Never fails: see
/// the [module docs](self) for what happens when `membarrier` does.
pub fn heavy() {
    MODE.heavy(sys::register, sys::membarrier, || {
        sys::membarrier() || sys::protection_shootdown()
    });
}

/// Not yet known: registration is tried on first use.
const UNKNOWN: u8 = 0;
/// Heavy fences are membarrier calls; light fences compiler fences.
const EXPEDITED: u8 = 1;
/// Both sides are `SeqCst` fences (membarrier was never available).
const FENCED: u8 = 2;
/// Both sides are `SeqCst` fences since a registered membarrier failed.
const SWITCHED: u8 = 3;

/// The fence mode of a process (one static; tests make their own).
/// Plain `std` atomics even under loom, like [`super::once`]: under loom
/// both sides are fences whatever the mode.
struct Mode {
    state: std::sync::atomic::AtomicU8,
    /// Ends once every CPU serialized after the switch to `SWITCHED`.
    switch: std::sync::Once,
    /// The hot paths that fence with [`light_watched`] (pruned of dead
    /// ones as it grows); its lock orders a registration against the
    /// switch's calls.
    watchers: std::sync::Mutex<Vec<std::sync::Weak<dyn Watcher>>>,
}

impl Mode {
    const fn new() -> Self {
        Mode {
            state: std::sync::atomic::AtomicU8::new(UNKNOWN),
            switch: std::sync::Once::new(),
            watchers: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The mode, registering with `register` the first time.
    fn get(&self, register: impl FnOnce() -> bool) -> u8 {
        use std::sync::atomic::Ordering::Acquire;
        let m = self.state.load(Acquire);
        if m != UNKNOWN {
            return m;
        }
        let m = if register() { EXPEDITED } else { FENCED };
        // Racing first users register alike; a switch may already have
        // followed a registration: keep what is there.
        let _ =
            self.state
                .compare_exchange(UNKNOWN, m, std::sync::atomic::Ordering::AcqRel, Acquire);
        self.state.load(Acquire)
    }

    /// Registers `w` (see [`watch`]); true if the mode is expedited.
    #[cfg(not(aspace_loom))]
    fn watch(&self, register: impl FnOnce() -> bool, w: std::sync::Weak<dyn Watcher>) -> bool {
        // Registers first, so the mode is known (not `UNKNOWN`) below.
        self.get(register);
        let mut all = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() == all.capacity() {
            // Amortized: the list at most doubles between prunes.
            all.retain(|w| w.strong_count() > 0);
        }
        // Read under the lock: a switch stores the mode before taking it,
        // so either it calls `w` or this load sees its mode.
        let expedited = self.state.load(std::sync::atomic::Ordering::Acquire) == EXPEDITED;
        if expedited {
            all.push(w);
        }
        expedited
    }

    /// True if a light fence must be a full fence.
    #[inline(always)]
    fn light_is_full(&self, expedited: bool) -> bool {
        !expedited || self.state.load(std::sync::atomic::Ordering::Relaxed) != EXPEDITED
    }

    /// A heavy fence: `membarrier` while it works; on its first failure,
    /// the switch (`serialize_all` until it succeeds), then `SeqCst`
    /// fences.
    fn heavy(
        &self,
        register: impl FnOnce() -> bool,
        membarrier: impl FnOnce() -> bool,
        serialize_all: impl FnMut() -> bool,
    ) {
        match self.get(register) {
            EXPEDITED if membarrier() => return,
            EXPEDITED | SWITCHED => self
                .switch
                .call_once(|| self.switch_to_fences(serialize_all)),
            _ => {}
        }
        fence(Ordering::SeqCst);
    }

    /// Turns light fences into full ones, then waits until every CPU
    /// running the process has serialized once (see the module docs).
    fn switch_to_fences(&self, mut serialize_all: impl FnMut() -> bool) {
        self.state
            .store(SWITCHED, std::sync::atomic::Ordering::SeqCst);
        // Before the serialization below: a watched fence whose word load
        // runs after it must see its word changed (module docs).
        let watchers =
            std::mem::take(&mut *self.watchers.lock().unwrap_or_else(|e| e.into_inner()));
        for w in watchers.iter().filter_map(|w| w.upgrade()) {
            w.switched();
        }
        let mut pause = std::time::Duration::from_millis(1);
        while !serialize_all() {
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_secs(1));
        }
    }
}

/// The system calls behind the modes (Linux, outside loom).
#[cfg(all(target_os = "linux", not(aspace_loom)))]
mod sys {
    const CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
    const PAGE: usize = crate::addr::PAGE_SIZE as usize;

    /// Registers the process for private expedited membarriers.
    pub(super) fn register() -> bool {
        // SAFETY: membarrier takes no pointers; registering has no effect
        // beyond allowing PRIVATE_EXPEDITED later.
        unsafe { libc::syscall(libc::SYS_membarrier, CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 }
    }

    /// A private expedited membarrier; false if the kernel refused it.
    pub(super) fn membarrier() -> bool {
        // SAFETY: the call takes no pointers.
        unsafe { libc::syscall(libc::SYS_membarrier, CMD_PRIVATE_EXPEDITED, 0, 0) == 0 }
    }

    /// Makes every CPU running a thread of the process take an interrupt:
    /// a write to a page of our own, then its protection lowered to
    /// read-only, which shoots its TLB entry down on every CPU the process
    /// runs on. Called only by the switch (under its `Once`), so two calls
    /// never race on the page. False if a call was refused.
    pub(super) fn protection_shootdown() -> bool {
        static PAGE_ADDR: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let page = *PAGE_ADDR.get_or_init(|| {
            // SAFETY: a fresh private mapping that nothing else uses; it is
            // never unmapped.
            let p = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                0
            } else {
                p as usize
            }
        });
        if page == 0 {
            return false;
        }
        let p = page as *mut libc::c_void;
        // SAFETY: `page` is our own mapping of one page; the write below
        // is inside it while it is writable; only this function uses it.
        unsafe {
            if libc::mprotect(p, PAGE, libc::PROT_READ | libc::PROT_WRITE) != 0 {
                return false;
            }
            // Dirty and present: lowering the protection must flush it.
            core::ptr::write_volatile(page as *mut u8, 1);
            libc::mprotect(p, PAGE, libc::PROT_READ) == 0
        }
    }
}

/// No membarrier here: both sides are always `SeqCst` fences.
#[cfg(not(all(target_os = "linux", not(aspace_loom))))]
mod sys {
    pub(super) fn register() -> bool {
        false
    }
    pub(super) fn membarrier() -> bool {
        false
    }
    pub(super) fn protection_shootdown() -> bool {
        false
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A registered membarrier that fails (a seccomp filter installed
    /// after registration, say): the heavy fence must not panic; it
    /// switches to full fences on both sides, serializing every CPU once,
    /// retrying that until it works, and never calls membarrier again.
    /// (It panicked: "membarrier(PRIVATE_EXPEDITED) failed after
    /// registration".)
    #[test]
    fn a_failing_membarrier_switches_to_fences_without_panicking() {
        let m = Mode::new();
        assert_eq!(m.get(|| true), EXPEDITED);
        assert!(!m.light_is_full(true));
        m.heavy(|| unreachable!(), || true, || unreachable!());
        let tries = Cell::new(0);
        m.heavy(
            || unreachable!(),
            || false,
            || {
                tries.set(tries.get() + 1);
                tries.get() == 3
            },
        );
        assert_eq!(
            tries.get(),
            3,
            "the switch retries until every CPU serialized"
        );
        assert_eq!(m.get(|| unreachable!()), SWITCHED);
        assert!(m.light_is_full(true), "a light fence cached as expedited");
        assert!(m.light_is_full(false));
        m.heavy(
            || unreachable!(),
            || panic!("membarrier called again"),
            || unreachable!(),
        );
        assert_eq!(tries.get(), 3, "the switch runs once");
    }

    /// A watcher registered while expedited is told of the switch before
    /// any CPU is serialized for it; one registering after the switch is
    /// refused (it must fence itself); dead ones are pruned.
    #[test]
    fn the_switch_tells_watchers_before_serializing() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        struct Count(AtomicUsize);
        impl Watcher for Count {
            fn switched(&self) {
                self.0.fetch_add(1, SeqCst);
            }
        }
        let m = Mode::new();
        let live = std::sync::Arc::new(Count(AtomicUsize::new(0)));
        let weak = |c: &std::sync::Arc<Count>| {
            std::sync::Arc::downgrade(c) as std::sync::Weak<dyn Watcher>
        };
        assert!(m.watch(|| true, weak(&live)));
        for _ in 0..10 {
            let dead = std::sync::Arc::new(Count(AtomicUsize::new(0)));
            assert!(m.watch(|| unreachable!(), weak(&dead)));
        }
        assert!(m.watchers.lock().unwrap().len() < 11, "dead watchers kept");
        m.heavy(
            || unreachable!(),
            || false,
            || {
                assert_eq!(live.0.load(SeqCst), 1, "serialized before telling");
                true
            },
        );
        assert_eq!(live.0.load(SeqCst), 1);
        let late = std::sync::Arc::new(Count(AtomicUsize::new(0)));
        assert!(!m.watch(|| unreachable!(), weak(&late)));
        let fenced = Mode::new();
        assert!(!fenced.watch(|| false, weak(&late)));
    }

    /// Without membarrier from the start, nothing switches.
    #[test]
    fn without_membarrier_both_sides_are_fences() {
        let m = Mode::new();
        assert_eq!(m.get(|| false), FENCED);
        assert!(m.light_is_full(true));
        m.heavy(|| unreachable!(), || unreachable!(), || unreachable!());
        assert_eq!(m.get(|| unreachable!()), FENCED);
    }

    /// The fallback route works here (Linux): the page's protection
    /// changes are allowed, repeatedly.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_protection_shootdown_runs() {
        assert!(sys::protection_shootdown());
        assert!(sys::protection_shootdown());
    }
}
