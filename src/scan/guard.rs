//! Running the read protocol (latch/protocol.rs) for one scan of a latched
//! table: shared by the `PgkvxLimitScan` node and `pgkvx.arrow_scan`.
//!
//! Both readers pick the mode the same way, check and wait through the same
//! latch table and lock manager, count the same statistics and raise the
//! same 40001 when a fixed snapshot meets a conflict waiting cannot repair.
//! What differs is only how they read: each implements [`Reader`].

use super::snapshot::{self, Base};
use crate::errors;
use crate::guc::{self, ScanMode};
use crate::keys::KeyDesc;
use crate::latch::protocol::{self, Env, Outcome, Params, ReadMode, Report};
use crate::latch::{Check, Conflict, RelId, Span, Stat, Xid};
use crate::shmem::{backend, table};
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;

/// How a scan reads its declared span for an optimistic attempt.
pub trait Reader {
    /// Reads with `base` and the `pulled` holders folded in
    /// ([`Base::spliced_in`]), buffering everything it would return, and
    /// returns the touched span.  Each call replaces the previous attempt.
    fn read_buffered(&mut self, base: &Base, pulled: &[Xid]) -> Span;
}

/// The mode a scan of a latched table reads in, from `pgkvx.scan_mode` and
/// the most rows it can return (`want`, None = unbounded): optimistic only
/// when its result is small enough to buffer, otherwise fenced; None for
/// `off` (plain Postgres).  Counts the scan in `pgkvx.stats()`.
pub fn choose_mode(want: Option<u64>) -> Option<Choice> {
    let mode = guc::SCAN_MODE.get();
    if mode == ScanMode::Off {
        backend::count(Stat::ScansOff, 1);
        return None;
    }
    let small = want.is_some_and(|w| w <= guc::MAX_OPTIMISTIC_ROWS.get() as u64);
    let read_mode = if mode == ScanMode::Optimistic && small { ReadMode::Optimistic } else { ReadMode::Fenced };
    backend::count(if read_mode == ReadMode::Optimistic { Stat::ScansOptimistic } else { Stat::ScansFenced }, 1);
    let declared_first = read_mode == ReadMode::Optimistic && want.is_none_or(|w| w > STREAM_ABOVE_ROWS);
    Some(Choice { mode: read_mode, declared_first })
}

/// How a latched scan reads: the mode, and for optimistic scans whether
/// to check the declared span first.
#[derive(Clone, Copy, Debug)]
pub struct Choice {
    pub mode: ReadMode,
    pub declared_first: bool,
}

/// What the scan does once the protocol has decided.
#[derive(Debug)]
pub enum Then {
    /// The optimistic attempt the reader buffered last is valid: emit it.
    Emit,
    /// Fenced: read the declared span now with `base.spliced_in(.., pulled)`
    /// and stream; nothing in it can be missed.
    Stream { pulled: Vec<Xid> },
}

/// The protocol's result.
pub struct Run {
    pub then: Then,
    pub report: Report,
    /// Microseconds spent waiting for writers.
    pub wait_us: i64,
    /// The base snapshot the result was read (or is to be read) at: the one
    /// given, or a fresh one the protocol took (release it when done).
    pub base: Base,
}

/// The protocol's view of one scan: the reader's reads, our checks and waits.
struct ScanEnv<'a, R> {
    reader: &'a mut R,
    rel: RelId,
    heap: pg_sys::Relation,
    base: Base,
    wait_us: i64,
}

impl<R: Reader> Env for ScanEnv<'_, R> {
    fn read_buffered(&mut self, pulled: &[Xid]) -> Span {
        self.reader.read_buffered(&self.base, pulled)
    }

    fn check(&mut self, span: &Span, pulled: &[Xid], out: &mut Vec<Conflict>) -> Check {
        let view = self.base.view(pulled);
        table().check(self.rel, span, &view, &snapshot::committed, &mut |c| out.push(c))
    }

    fn wait(&mut self, xid: Xid) {
        // SAFETY: `heap` is open for the whole run (contract of `run`).
        self.wait_us += unsafe { snapshot::wait_for(xid, self.heap) };
    }

    fn refresh_snapshot(&mut self) {
        self.base.release();
        self.base = Base::fresh();
    }
}

/// Optimistic scans wanting more rows than this check the declared span
/// first and stream when it is clean (protocol.rs, `declared_first`):
/// copying a few rows into the buffer costs less than checking the wider
/// declared span, copying many costs far more.
const STREAM_ABOVE_ROWS: u64 = 64;

/// Runs the protocol for a scan of `heap` (key `key`) over `declared`,
/// starting from `base`, and counts what happened in `pgkvx.stats()`.  A
/// conflict that waiting cannot repair under REPEATABLE READ or SERIALIZABLE
/// raises 40001 naming the table and span; `what` names the scan in its
/// detail ("LIMIT scan", "arrow_scan").
///
/// # Safety
/// `heap` is the open relation `key` describes, open until this returns.
pub unsafe fn run<R: Reader>(
    reader: &mut R,
    key: &KeyDesc,
    heap: pg_sys::Relation,
    base: Base,
    declared: &Span,
    choice: Choice,
    what: &str,
) -> Run {
    let params = Params {
        mode: choice.mode,
        declared_first: choice.declared_first,
        retries: guc::OPTIMISTIC_RETRIES.get() as u32,
        // SAFETY: plain read of a backend global.
        fixed_snapshot: unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32,
    };
    let mut report = Report::default();
    let mut env = ScanEnv { reader, rel: backend::rel_id(key.relid), heap, base, wait_us: 0 };
    let outcome = protocol::run(&mut env, declared, &params, &mut report);
    let (base, wait_us) = (env.base, env.wait_us);
    count(&report);
    let then = match outcome {
        Outcome::Emit => Then::Emit,
        Outcome::Stream { pulled } => Then::Stream { pulled },
        Outcome::SerializationFailure { xid, span } => {
            backend::count(Stat::SerializationFailures, 1);
            errors::raise_full(
                PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
                format!(
                    "could not serialize access due to a concurrent write to \"{}\" in {}",
                    key.relname,
                    key.format_span(&span)
                ),
                Some(format!(
                    "Transaction {} was in flight at this transaction's snapshot and wrote inside the span this {what} read; a fixed snapshot (REPEATABLE READ or SERIALIZABLE) cannot see it.",
                    xid.0
                )),
                Some("The transaction might succeed if retried."),
            );
        }
    };
    Run { then, report, wait_us, base }
}

fn count(r: &Report) {
    backend::count(Stat::Validations, u64::from(r.validations));
    backend::count(Stat::Conflicts, u64::from(r.conflicts));
    backend::count(Stat::Retries, u64::from(r.retries));
    backend::count(Stat::FreshSnapshots, u64::from(r.fresh_snapshots));
    if r.fell_back {
        backend::count(Stat::Fallbacks, 1);
    }
}
