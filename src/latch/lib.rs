#![doc = include_str!("README.md")]
//!
//! Files, one concept each: `xid` (modular xid order), `span` (bounded keys
//! and half-open spans), `snapshot` (the conflict rule), `tree` (per-range
//! interval B+tree), `region` (the fixed shared-memory layout), `locks` (the
//! lock abstraction), `table` (acquire and release), `validate` (the read
//! side), `protocol` (the reader's fenced/optimistic protocol), `maint` (reclaim, coalesce, split, merge, purge), `inspect`
//! (views), `stats` (counters), `rng` (the tests' and benchmarks' generator).

pub mod face;
pub mod holdings;
pub mod inspect;
pub mod locks;
pub mod maint;
pub mod protocol;
pub mod queue;
pub mod region;
pub mod rng;
pub mod snapshot;
pub mod span;
pub mod stats;
pub mod table;
pub mod tree;
pub mod validate;
pub mod xid;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub use face::{Inspector, Maintainer, Reader, Writer};
pub use holdings::{Holdings, Latched, Limits};
pub use inspect::{LatchInfo, RangeInfo, Usage};
pub use locks::{LockId, LockSet, Mode};
pub use protocol::{ReadMode, ReadOutcome, ReadParams, ReadReport};
pub use queue::{Action, QueueState};
pub use region::{Config, RelId, State};
pub use snapshot::ReadSnapshot;
pub use span::{KeyBuf, Span, KEY_MAX};
pub use stats::{Stat, NSTATS};
pub use table::{AcquireError, DrawLock, Holder, LatchTable, TxEnd};
pub use validate::{Check, Conflict, Footprint};
pub use xid::Xid;
