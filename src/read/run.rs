//! Running the read protocol (the latch core's `protocol`) for one read of
//! latched tables: shared by statements with `PgkvxLimitScan` nodes and by
//! `pgkvx.arrow_scan`.
//!
//! Both readers pick the mode the same way, check and wait through the same
//! latch table and lock manager, count the same statistics and raise the
//! same 40001 when a fixed snapshot meets a conflict waiting cannot repair.
//! What differs is only how they read: each implements [`Reader`].

use super::snapshot::{self, BaseSnapshot};
use crate::errors;
use crate::guc::{self, ScanMode};
use crate::latch::protocol::{self, Env, ReadMode, ReadOutcome, ReadParams, ReadReport};
use crate::latch::{Check, Conflict, Footprint, RelId, Span, Stat, Xid};
use crate::pg::rel_name;
use crate::shmem::{backend, table};
use pgrx::PgSqlErrorCode;

/// How a read runs an optimistic attempt.
pub trait Reader {
    /// Reads with `base` and the `pulled` holders folded in
    /// ([`BaseSnapshot::spliced`]), buffering everything it would return, and
    /// returns the footprint it touched; None when the result outgrew the
    /// buffer (the read then goes fenced).  Each call replaces the previous
    /// attempt.
    fn read_buffered(&mut self, base: &BaseSnapshot, pulled: &[Xid]) -> Option<Footprint>;
}

/// The mode a read of latched tables runs in, from `pgkvx.scan_mode` and
/// the most rows it can return (`want`, None = unknown): optimistic only
/// when its result is small enough to buffer, otherwise fenced; None for
/// `off` (plain Postgres).  Counts the read in `pgkvx.stats()`.
pub fn choose_mode(want: Option<u64>) -> Option<ReadStrategy> {
    let mode = super::admit::effective_mode();
    if mode == ScanMode::Off {
        backend::count(Stat::ScansOff, 1);
        return None;
    }
    let small = want.is_some_and(|w| w <= guc::MAX_OPTIMISTIC_ROWS.get() as u64);
    let read_mode = if mode == ScanMode::Optimistic && small { ReadMode::Optimistic } else { ReadMode::Fenced };
    backend::count(if read_mode == ReadMode::Optimistic { Stat::ScansOptimistic } else { Stat::ScansFenced }, 1);
    let declared_first = read_mode == ReadMode::Optimistic && want.is_none_or(|w| w > STREAM_ABOVE_ROWS);
    Some(ReadStrategy { mode: read_mode, declared_first, first_fixed_read: false })
}

/// How a read of latched tables runs: the mode, and for optimistic reads
/// whether to check the declared footprint first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadStrategy {
    pub mode: ReadMode,
    pub declared_first: bool,
    /// The first statement of a REPEATABLE READ transaction to read at its
    /// snapshot (see [`snapshot::mark_fixed_read`]): it may pull holders in,
    /// and the transaction then reads at the result.
    pub first_fixed_read: bool,
}

/// What the read does once the protocol has decided.
#[derive(Debug)]
pub enum ReadDecision {
    /// The optimistic attempt the reader buffered last is valid: emit it.
    Emit,
    /// Fenced: read the declared footprint now with
    /// `base.spliced(pulled)` and stream; nothing in it can be missed.
    Stream { pulled: Vec<Xid> },
}

/// The protocol's result.
pub struct ProtocolResult {
    pub decision: ReadDecision,
    pub report: ReadReport,
    /// Microseconds spent waiting for writers.
    pub wait_us: i64,
    /// The base snapshot the result was read (or is to be read) at: the one
    /// given, or a fresh one the protocol took (release it when done).
    pub base: BaseSnapshot,
    /// The writers it waited for (the first [`MAX_WAITED`]).
    pub waited: Vec<Waited>,
}

/// A writer a read waited for, for EXPLAIN ANALYZE: the holder's xid, the
/// table, and the span the read checked when it met the holder's latch
/// (EXPLAIN looks the latch itself up: the holder's tombstone outlives the
/// statement's snapshot).
#[derive(Clone, Copy, Debug)]
pub struct Waited {
    pub xid: Xid,
    pub rel: RelId,
    pub checked: Span,
    pub wait_us: i64,
}

/// Writers a read remembers having waited for; the count of waits goes on.
pub const MAX_WAITED: usize = 16;

/// The protocol's view of one read: the reader's reads, our checks and waits.
struct ReadEnv<'a, R> {
    reader: &'a mut R,
    base: BaseSnapshot,
    wait_us: i64,
    /// The conflicts of the last check that found any: where the holders
    /// the protocol then waits for were met.
    met: Vec<Conflict>,
    waited: Vec<Waited>,
}

impl<R: Reader> Env for ReadEnv<'_, R> {
    fn read_buffered(&mut self, pulled: &[Xid]) -> Option<Footprint> {
        self.reader.read_buffered(&self.base, pulled)
    }

    fn check(&mut self, fp: &Footprint, pulled: &[Xid], out: &mut Vec<Conflict>) -> Check {
        self.base.reading(fp.iter().map(|(r, _)| *r));
        let view = self.base.view(pulled);
        let before = out.len();
        let c = table().check_footprint(fp, &view, &snapshot::committed, &mut |c| out.push(c));
        if out.len() > before {
            self.met.clear();
            self.met.extend_from_slice(&out[before..]);
        }
        c
    }

    fn wait(&mut self, xid: Xid) {
        let us = snapshot::wait_for(xid);
        self.wait_us += us;
        // Counted against the table where the holder was met, for the
        // per-table wait statistics; named in EXPLAIN ANALYZE.
        let Some(c) = self.met.iter().find(|c| c.xid == xid) else { return };
        crate::shmem::wakeups::count_read_wait(c.rel, u64::try_from(us).unwrap_or(0));
        if self.waited.len() < MAX_WAITED {
            self.waited.push(Waited { xid, rel: c.rel, checked: c.span, wait_us: us });
        }
    }

    fn can_pull(&mut self, pulled: &[Xid]) -> bool {
        self.base.can_pull(pulled)
    }

    fn refresh_snapshot(&mut self) {
        let rels = self.base.rels().to_vec();
        self.base.release();
        self.base = BaseSnapshot::fresh();
        self.base.reading(rels);
    }
}

/// The reader of fenced reads, which never buffer.
pub struct NeverBuffers;
impl Reader for NeverBuffers {
    fn read_buffered(&mut self, _base: &BaseSnapshot, _pulled: &[Xid]) -> Option<Footprint> {
        unreachable!("fenced reads never buffer")
    }
}

/// Optimistic reads wanting more rows than this check the declared
/// footprint first and stream when it is clean (`declared_first`): copying
/// a few rows into the buffer costs less than checking the wider declared
/// spans, copying many costs far more.
pub const STREAM_ABOVE_ROWS: u64 = 64;

/// Runs the protocol for a read over what `declared` computes (asked for
/// only when the protocol needs it), starting from `base`, and
/// counts what happened in `pgkvx.stats()`.  A conflict that waiting cannot
/// repair under REPEATABLE READ or SERIALIZABLE raises 40001 naming the
/// table and span; `what` names the read in its detail ("LIMIT scan",
/// "arrow_scan").
pub fn run_protocol<R: Reader>(
    reader: &mut R,
    base: BaseSnapshot,
    declared: &mut dyn FnMut() -> Footprint,
    strategy: ReadStrategy,
    what: &str,
) -> ProtocolResult {
    let params = ReadParams {
        mode: strategy.mode,
        declared_first: strategy.declared_first,
        retries: guc::OPTIMISTIC_RETRIES.get() as u32,
        fixed_snapshot: snapshot::fixed_snapshot() && !strategy.first_fixed_read,
        may_refresh: !snapshot::fixed_snapshot(),
    };
    let mut report = ReadReport::default();
    let mut env = ReadEnv { reader, base, wait_us: 0, met: Vec::new(), waited: Vec::new() };
    let outcome = protocol::run(&mut env, declared, &params, &mut report);
    let (base, wait_us, waited) = (env.base, env.wait_us, env.waited);
    count(&report);
    let decision = match outcome {
        ReadOutcome::Emit => ReadDecision::Emit,
        ReadOutcome::Stream { pulled } => ReadDecision::Stream { pulled },
        ReadOutcome::SerializationFailure { xid, rel, .. } => serialization_failure(xid, rel, what),
    };
    ProtocolResult { decision, report, wait_us, base, waited }
}

/// Raises 40001 for a write by `xid` to `rel` that a fixed
/// snapshot cannot see.  The message is PostgreSQL's own for a serialization
/// failure under REPEATABLE READ, so that clients' retry logic recognises
/// it; the detail names the table but no key (keys are table data).
pub fn serialization_failure(xid: Xid, rel: RelId, what: &str) -> ! {
    backend::count(Stat::SerializationFailures, 1);
    let relid = pgrx::pg_sys::Oid::from(rel.rel());
    errors::raise_full(
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        "could not serialize access due to concurrent update",
        Some(format!(
            "Transaction {} was in flight at this transaction's snapshot and wrote to \"{}\" inside the span this {what} read; a snapshot that earlier statements of the transaction already read at cannot see it.",
            xid.0,
            rel_name(relid)
        )),
        Some("The transaction might succeed if retried."),
    )
}

/// Counts one protocol run in `pgkvx.stats()`.
pub fn count(r: &ReadReport) {
    // Most reads validate once and meet nothing: counters that did not
    // move are not touched (each is a shared-memory write).
    for (stat, n) in [
        (Stat::Validations, r.validations),
        (Stat::Conflicts, r.conflicts),
        (Stat::Retries, r.retries),
        (Stat::FreshSnapshots, r.fresh_snapshots),
    ] {
        if n > 0 {
            backend::count(stat, u64::from(n));
        }
    }
    if r.fell_back {
        backend::count(Stat::Fallbacks, 1);
    }
}
