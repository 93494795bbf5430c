#![doc = include_str!("README.md")]
//!
//! Files, one concept each: `xid` (modular xid order), `span` (bounded keys
//! and half-open spans), `snapshot` (what a snapshot says about a holder),
//! `tree` (the per-range interval B+tree), `region` (the fixed shared-memory
//! layout) and its child `region/guard` (the only code that turns the
//! region's cells into references, under the lock that protects them),
//! `locks` (the lock abstraction), `table` (the table handle: acquire and
//! release), `holdings` (one transaction's latches, escalation and limits),
//! `face` (the four faces callers take), `validate` (conflict checks),
//! `protocol` (the reader's fenced/optimistic protocol), `queue` (the
//! maintenance queue and what a worker does with a range), `maint` (reclaim,
//! coalesce, split, merge, purge), `rest` (a maintainer
//! sleeping until a writer makes work), `inspect` (views), `stats` (counters),
//! `rng` (the tests' and benchmarks' generator); `tests` (unit and property
//! tests) and `sim` (a simulated database running the read protocol under a
//! seeded scheduler) are test-only.

mod draw_order;
mod face;
pub mod holdings;
mod inspect;
pub mod locks;
mod maint;
pub mod protocol;
mod queue;
mod region;
mod rest;
pub mod rng;
mod snapshot;
mod span;
mod stats;
mod table;
mod tree;
mod validate;
mod xid;

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
pub use rest::Rest;
pub use snapshot::ReadSnapshot;
pub use span::{KeyBuf, Span, KEY_MAX};
pub use stats::{Stat, NSTATS};
pub use table::{AcquireError, DrawLock, Holder, LatchTable, TxEnd};
pub use validate::{Check, Conflict, Footprint};
pub use xid::Xid;
