//! The one pseudo-random generator of the tests, benches and examples
//! (xorshift64, Marsaglia's 13/7/17 triple): fast, no dependency, and the
//! same sequence for the same seed everywhere, so a seeded run replays.
//! Files outside tests/common include it with
//! `#[path = ".../tests/common/rng.rs"] mod rng;`.

/// A xorshift64 generator. Zero is its fixed point: seeds must be nonzero.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator whose first output is the step after `seed`.
    pub fn new(seed: u64) -> Self {
        XorShift(seed)
    }

    /// The next value of the sequence.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
