//! xorshift64: the one pseudo-random generator of the latch core's tests,
//! simulation and benchmarks.  Deterministic from its seed (a failing seed
//! replays), no dependency, and a few cycles per draw so it never shows in a
//! benchmark's profile.  Not for anything that must be unpredictable.

/// A xorshift64 generator; the seed must not be 0.
#[derive(Clone, Debug)]
pub struct XorShift64(pub u64);

impl XorShift64 {
    #[allow(clippy::should_implement_trait)] // an endless stream, not an Iterator
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A draw below `n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
