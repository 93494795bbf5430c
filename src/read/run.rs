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
use crate::pg::rel_name;
use crate::shmem::{backend, table};
use pgkvx_latch::protocol::{self, Env, ReadMode, ReadOutcome, ReadParams, ReadReport};
use pgkvx_latch::{Check, Conflict, Footprint, RelId, Span, Stat, Xid};
use pgrx::PgSqlErrorCode;

/// How a read runs an optimistic attempt.
pub trait Reader {
    /// Reads at `base`, leaving out the keys in `cut`, buffering everything
    /// it would return, and returns the footprint it touched; None when the
    /// result outgrew the buffer (the read then goes fenced).  Each call
    /// replaces the previous attempt.
    fn read_buffered(&mut self, base: &BaseSnapshot, cut: &Footprint) -> Option<Footprint>;
    /// Where its reads of the tables of `conflicts` would stop to leave out
    /// every latch they met (see the latch core's `protocol`), or None when
    /// one of them cannot stop early without looking complete.
    fn cut(&mut self, conflicts: &[Conflict]) -> Option<Footprint>;
    /// Where its reads would stop when waiting has not settled them (the
    /// protocol's `last_resort_cut`): [`CutRule::LastResort`]; None when
    /// one of them is no tail up the key.
    fn last_resort_cut(&mut self, _conflicts: &[Conflict]) -> Option<Footprint> {
        None
    }
    /// Where its reads would stop to go no further than `touched`, the
    /// furthest its optimistic attempts looked (the protocol's
    /// `stop_past`), by [`CutRule::Strict`]; None when the statement may
    /// not stop short so.
    fn stop_past(&mut self, _touched: &Footprint) -> Option<Footprint> {
        None
    }
    /// Fenced: the spans it will return rows from at `base` (see the latch
    /// core's `protocol`, the probe); None when it cannot tell before
    /// reading.
    fn probe(&mut self, _base: &BaseSnapshot) -> Option<Footprint> {
        None
    }
    /// Fenced: the spans it will return rows from at `base` for writers
    /// that started after its first snapshot, up to its last row even
    /// where its span is bounded further (the protocol's `later_ends`).
    fn later_ends(&mut self, _base: &BaseSnapshot) -> Option<Footprint> {
        None
    }
    /// The snapshot moved: what it knew of the last attempt is stale.
    fn snapshot_moved(&mut self) {}
}

/// When a read may stop before a later writer's first key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutRule {
    /// Its rows come up the key as a prefix to the client, and the
    /// statement reads nothing that could show ahead of them.
    Strict,
    /// It is a tail up the key from a bound left open above, and the
    /// statement's guards read one latched table (or tree): stopping short
    /// is the statement's own answer at one snapshot over a narrower key
    /// range.  (Two latched tables would each be cut at their own keys, and
    /// a cursor shared between them could move past one's cut.)  Taken only
    /// once waiting has not settled the read, in place of a 40001.
    LastResort,
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
    let declared_first = read_mode == ReadMode::Optimistic
        && (want.is_none_or(|w| w > STREAM_ABOVE_ROWS) || DECLARED_CHECKS.with(DeclaredChecks::due));
    Some(ReadStrategy { mode: read_mode, declared_first, first_fixed_read: false })
}

/// When a small optimistic read checks its declared spans first.  A clean
/// check lets it stream like a fenced read that met nobody, which costs a
/// fraction of the buffered attempt and the validation of T (the node's
/// executor state, the buffer, T's arithmetic: `bench/instructions`
/// counts both).  Where D keeps meeting writers -- a tail at the head of
/// a busy stream, where some producer is always in flight past the
/// cursor -- each check is wasted, so after a check that met writers the
/// backend skips the next 1, 3, 7 ... up to 63 reads' checks, and checks
/// every read again after one comes out clean.  Only cost depends on it:
/// both ways read at the same snapshot and return the same rows.
#[derive(Clone, Copy, Default)]
struct DeclaredChecks {
    /// Reads still to go without the check (small optimistic reads' check
    /// of D; large ones' probe).
    skip: u8,
    /// Checks in a row that met writers (at most 6).
    dirty_streak: u8,
}

thread_local! {
    static DECLARED_CHECKS: std::cell::Cell<DeclaredChecks> = const {
        std::cell::Cell::new(DeclaredChecks { skip: 0, dirty_streak: 0 })
    };
    /// The same for the probe an optimistic read of more than
    /// STREAM_ABOVE_ROWS rows makes when D met writers
    /// (`clean_before_reading`).
    static PROBES: std::cell::Cell<DeclaredChecks> = const {
        std::cell::Cell::new(DeclaredChecks { skip: 0, dirty_streak: 0 })
    };
}

impl DeclaredChecks {
    /// Whether this small read checks D first (and counts one skipped).
    fn due(c: &std::cell::Cell<DeclaredChecks>) -> bool {
        let mut s = c.get();
        if s.skip == 0 {
            return true;
        }
        s.skip -= 1;
        c.set(s);
        false
    }

    /// A check of D came out `clean`, or met writers.
    fn note(c: &std::cell::Cell<DeclaredChecks>, clean: bool) {
        let mut s = c.get();
        if clean {
            s = DeclaredChecks::default();
        } else {
            s.dirty_streak = (s.dirty_streak + 1).min(6);
            s.skip = (1u8 << s.dirty_streak) - 1;
        }
        c.set(s);
    }
}

/// A read with `declared_first` checked its declared spans: `clean`, or
/// not.  Small optimistic reads check them again according to this.
pub fn note_declared_check(clean: bool) {
    DECLARED_CHECKS.with(|c| DeclaredChecks::note(c, clean));
}

/// How a read of latched tables runs: the mode, and for optimistic reads
/// whether to check the declared footprint first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadStrategy {
    pub mode: ReadMode,
    pub declared_first: bool,
    /// The first statement of a REPEATABLE READ transaction to read at its
    /// snapshot (see [`snapshot::mark_fixed_read`]): it may read again at a
    /// fresh snapshot, and the transaction then reads at that.
    pub first_fixed_read: bool,
}

/// What the read does once the protocol has decided.
#[derive(Debug)]
pub enum ReadDecision {
    /// The optimistic attempt the reader buffered last is valid: emit it.
    Emit,
    /// Fenced: read the declared footprint now at `base`, leaving out the
    /// keys in `cut`, and stream; nothing else in it can be missed.
    Stream { cut: Footprint },
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

/// Waits for the holder of conflict `c` to end; counts the wait against the
/// table where it was met (the per-table wait statistics) and remembers it
/// in `waited` for EXPLAIN ANALYZE while there is room.  Returns the
/// microseconds waited.
pub fn wait_for_holder(c: &Conflict, waited: &mut Vec<Waited>) -> i64 {
    let us = snapshot::wait_for(c.xid);
    crate::shmem::wakeups::count_read_wait(c.rel, u64::try_from(us).unwrap_or(0));
    if waited.len() < MAX_WAITED {
        waited.push(Waited { xid: c.xid, rel: c.rel, checked: c.span, wait_us: us });
    }
    us
}

/// The protocol's view of one read: the reader's reads, our checks and waits.
struct ReadEnv<'a, R> {
    reader: &'a mut R,
    base: BaseSnapshot,
    /// The `after` of the read's first snapshot.
    first_after: Xid,
    wait_us: i64,
    /// The conflicts of the last check that found any: where the holders
    /// the protocol then waits for were met.
    met: Vec<Conflict>,
    waited: Vec<Waited>,
    /// The snapshot is this statement's to choose: READ COMMITTED, or the
    /// first read of a REPEATABLE READ transaction.
    may_cut_last: bool,
    /// `base`'s snapshot, for the declared spans to be evaluated at.
    current: &'a std::cell::Cell<pgrx::pg_sys::Snapshot>,
    /// The read's first snapshot: the statement's, active while it runs.
    first: pgrx::pg_sys::Snapshot,
}

/// Runs `f` with `snap` the active snapshot, where it is not `first` (the
/// statement's, active already): what the read evaluates of its bounds --
/// its declared spans, where its probe starts -- must be taken at the
/// snapshot it reads at, for a bound may read a table (a cursor kept in
/// one, through a STABLE function) and say another key at a fresh one.
fn at_snapshot<T>(snap: pgrx::pg_sys::Snapshot, first: pgrx::pg_sys::Snapshot, f: impl FnOnce() -> T) -> T {
    if snap == first {
        return f();
    }
    // SAFETY: a registered snapshot of the protocol's, live while it runs;
    // pushed for `f` only (an error pops it with the (sub)transaction it
    // aborts).
    unsafe { pgrx::pg_sys::PushActiveSnapshot(snap) };
    let r = f();
    // SAFETY: pops the snapshot pushed above.
    unsafe { pgrx::pg_sys::PopActiveSnapshot() };
    r
}

impl<R: Reader> Env for ReadEnv<'_, R> {
    fn first_after(&self) -> Xid {
        self.first_after
    }

    fn read_buffered(&mut self, cut: &Footprint) -> Option<Footprint> {
        self.reader.read_buffered(&self.base, cut)
    }

    fn cut(&mut self, conflicts: &[Conflict]) -> Option<Footprint> {
        // Under REPEATABLE READ the transaction's later statements read at
        // this snapshot, and would show what a cut left out: the first
        // statement waits and moves the snapshot instead.
        if snapshot::fixed_snapshot() {
            return None;
        }
        at_snapshot(self.base.snap, self.first, || self.reader.cut(conflicts))
    }

    fn last_resort_cut(&mut self, conflicts: &[Conflict]) -> Option<Footprint> {
        // Once waiting has not settled it, the statement that chooses the
        // snapshot (READ COMMITTED, or the poll that opens a REPEATABLE
        // READ transaction) stops short rather than fail.
        if !self.may_cut_last {
            return None;
        }
        at_snapshot(self.base.snap, self.first, || self.reader.last_resort_cut(conflicts))
    }

    fn stop_past(&mut self, touched: &Footprint) -> Option<Footprint> {
        // As a strict cut: not where later statements read at this snapshot.
        if snapshot::fixed_snapshot() {
            return None;
        }
        at_snapshot(self.base.snap, self.first, || self.reader.stop_past(touched))
    }

    fn check(&mut self, fp: &Footprint, out: &mut Vec<Conflict>) -> Check {
        let view = self.base.view();
        let before = out.len();
        let c = table().reader().check_footprint(fp, &view, &snapshot::committed, &mut |c| out.push(c));
        if out.len() > before {
            self.met.clear();
            self.met.extend_from_slice(&out[before..]);
        }
        c
    }

    fn wait(&mut self, xid: Xid) {
        self.wait_us += match self.met.iter().find(|c| c.xid == xid) {
            Some(c) => wait_for_holder(c, &mut self.waited),
            None => snapshot::wait_for(xid),
        };
    }

    fn refresh_snapshot(&mut self) {
        self.base.release();
        self.base = BaseSnapshot::fresh();
        self.current.set(self.base.snap);
        self.reader.snapshot_moved();
    }

    fn probe(&mut self) -> Option<Footprint> {
        at_snapshot(self.base.snap, self.first, || self.reader.probe(&self.base))
    }

    fn later_ends(&mut self) -> Option<Footprint> {
        at_snapshot(self.base.snap, self.first, || self.reader.later_ends(&self.base))
    }
}

/// A fenced read that may stop before the first latch met in each table
/// when `may_cut` (asked only then) says its scans allow the rule; `rule`
/// is the widest rule a cut of it has used, for applying the cut.  `probe`
/// finds the spans it will return rows from at a snapshot (None: it cannot
/// tell); asked with `later`, up to its last row even where its span is
/// bounded further.
pub struct Fenced<F: FnMut(CutRule) -> bool, P: FnMut(&BaseSnapshot, Later) -> Option<Footprint>> {
    pub may_cut: F,
    pub rule: Option<CutRule>,
    pub probe: P,
}
/// Which probe a fenced read asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Later {
    /// Against every writer: a bounded span stays whole.
    No,
    /// Against writers that started after the first snapshot.
    Yes,
}

impl<F: FnMut(CutRule) -> bool, P: FnMut(&BaseSnapshot, Later) -> Option<Footprint>> Reader for Fenced<F, P> {
    fn read_buffered(&mut self, _base: &BaseSnapshot, _cut: &Footprint) -> Option<Footprint> {
        unreachable!("fenced reads never buffer")
    }
    fn cut(&mut self, conflicts: &[Conflict]) -> Option<Footprint> {
        self.cut_by(CutRule::Strict, conflicts)
    }
    fn last_resort_cut(&mut self, conflicts: &[Conflict]) -> Option<Footprint> {
        self.cut_by(CutRule::LastResort, conflicts)
    }
    fn probe(&mut self, base: &BaseSnapshot) -> Option<Footprint> {
        (self.probe)(base, Later::No)
    }
    fn later_ends(&mut self, base: &BaseSnapshot) -> Option<Footprint> {
        (self.probe)(base, Later::Yes)
    }
}
impl<F: FnMut(CutRule) -> bool, P: FnMut(&BaseSnapshot, Later) -> Option<Footprint>> Fenced<F, P> {
    fn cut_by(&mut self, rule: CutRule, conflicts: &[Conflict]) -> Option<Footprint> {
        if !(self.may_cut)(rule) {
            return None;
        }
        self.rule = Some(widest(self.rule, rule));
        Some(cut_upward(conflicts))
    }
}

/// The wider of a read's cut rule so far and `rule`.
pub fn widest(so_far: Option<CutRule>, rule: CutRule) -> CutRule {
    if so_far == Some(CutRule::LastResort) {
        CutRule::LastResort
    } else {
        rule
    }
}

/// For reads moving up the key: per table, from the first key any of
/// `conflicts` latched in the span checked.
pub fn cut_upward(conflicts: &[Conflict]) -> Footprint {
    let mut out: Footprint = Vec::new();
    for c in conflicts {
        match out.iter_mut().find(|(r, _)| *r == c.rel) {
            Some((_, s)) => s.start = s.start.min(c.at.start),
            None => out.push((c.rel, Span { start: c.at.start, end: Span::ALL.end })),
        }
    }
    out
}

/// Optimistic reads wanting more rows than this always check the declared
/// footprint first and stream when it is clean (`declared_first`): copying
/// many rows into the buffer costs far more than a check that meets
/// writers.  Smaller ones check it while it has lately been clean
/// ([`DeclaredChecks`]).
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
        // The first statement to read at a REPEATABLE READ transaction's
        // snapshot may move it (the transaction then reads at the result);
        // SERIALIZABLE ties its predicate locks to the snapshot it took.
        fixed_snapshot: snapshot::fixed_snapshot()
            && !(strategy.first_fixed_read && snapshot::may_move_transaction_snapshot()),
    };
    let mut report = ReadReport::default();
    let first_after = base.after();
    let may_cut_last = !params.fixed_snapshot;
    let first = base.snap;
    let current = std::cell::Cell::new(first);
    let mut declared_now = || at_snapshot(current.get(), first, &mut *declared);
    let mut env = ReadEnv {
        reader,
        base,
        first_after,
        wait_us: 0,
        met: Vec::new(),
        waited: Vec::new(),
        may_cut_last,
        current: &current,
        first,
    };
    let outcome = protocol::run(&mut env, &mut declared_now, &params, &mut report);
    let (base, wait_us, waited) = (env.base, env.wait_us, env.waited);
    if params.mode == ReadMode::Optimistic && params.declared_first {
        note_declared_check(report.streamed);
    }
    count(&report);
    let decision = match outcome {
        ReadOutcome::Emit => ReadDecision::Emit,
        ReadOutcome::Stream { cut } => ReadDecision::Stream { cut },
        ReadOutcome::SerializationFailure { rel, .. } if !params.fixed_snapshot => writers_kept_coming(rel, what),
        ReadOutcome::SerializationFailure { xid, rel, .. } => serialization_failure(xid, rel, what),
    };
    ProtocolResult { decision, report, wait_us, base, waited }
}

/// Raises 40001 with PostgreSQL's own message for a serialization failure,
/// so that clients' retry logic recognises it, and `detail` (which names
/// tables, never keys: keys are table data); counts it.
pub fn serialization_error(detail: String, hint: &str) -> ! {
    backend::count(Stat::SerializationFailures, 1);
    errors::raise_full(
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        "could not serialize access due to concurrent update",
        Some(detail),
        Some(hint),
    )
}

/// Raises 40001 for a write by `xid` to `rel` that a fixed snapshot cannot
/// see.
pub fn serialization_failure(xid: Xid, rel: RelId, what: &str) -> ! {
    serialization_error(
        format!(
            "Transaction {} was in flight at this transaction's snapshot and wrote to \"{}\" inside the span this {what} read; a snapshot that earlier statements of the transaction already read at cannot see it.",
            xid.0,
            rel_name(pgrx::pg_sys::Oid::from(rel.rel()))
        ),
        "The transaction might succeed if retried.",
    )
}

/// How an optimistic read's check before reading came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BeforeReading {
    /// No writer in flight in its declared spans.
    DeclaredClean,
    /// Writers in flight in its declared spans, none where its rows end at
    /// its snapshot or behind (the fenced read's probe).
    ProbedClean,
    /// Writers where it will read: it reads buffered, then validates.
    Dirty,
}

/// An optimistic read's check before reading: whether no writer in flight
/// at `base` holds a latch in its declared spans `fp`, or, where some do
/// and it `may_probe`, in the spans `probe` says its rows end in (None: it
/// cannot tell).
/// Either way clean, it streams at once, as a fenced read that checked
/// the same spans would; otherwise it reads buffered and validates what it
/// touched.  Each check counts as a validation.
pub fn clean_before_reading(
    fp: &Footprint,
    base: &BaseSnapshot,
    may_probe: bool,
    probe: impl FnOnce() -> Option<Footprint>,
) -> BeforeReading {
    let view = base.view();
    let t = table().reader();
    let check = |fp: &Footprint| t.check_footprint(fp, &view, &snapshot::committed, &mut |_| {}).clean();
    let mut validations = 1;
    let outcome = if check(fp) {
        BeforeReading::DeclaredClean
    } else if may_probe && PROBES.with(DeclaredChecks::due) && {
        // A probe reads keys up to where the rows end: backed off as the
        // check of D is, where it keeps meeting writers (a consumer at a
        // busy head) or cannot tell.
        let clean = probe().is_some_and(|ends| {
            validations += 1;
            check(&ends)
        });
        PROBES.with(|c| DeclaredChecks::note(c, clean));
        clean
    } {
        BeforeReading::ProbedClean
    } else {
        BeforeReading::Dirty
    };
    backend::count(Stat::Validations, validations);
    note_declared_check(outcome != BeforeReading::Dirty);
    outcome
}

/// What fencing a scan when it started found ([`fence_at_scan`]).
pub struct ScanFence {
    pub report: ReadReport,
    pub wait_us: i64,
    pub waited: Vec<Waited>,
    /// Keys the scan must stop before: writers in flight at the snapshot
    /// that it leaves out instead of waiting for them, and by which rule.
    pub cut: Option<(Footprint, CutRule)>,
}

/// Fences a scan when it starts, at the statement's snapshot `base`, which
/// cannot move any more (other scans of the statement may have read at
/// it): checks the scan's declared footprint `fp`; writers in flight there
/// are either left out (`may_cut()` names the rule: the scan stops before
/// the first key of theirs -- their rows stay invisible even after a wait,
/// so a tail does not wait for them) or waited
/// for and checked again, and one that committed fails the statement
/// with 40001.  The caller applies the cut and records the report.
pub fn fence_at_scan(
    fp: Footprint,
    base: &BaseSnapshot,
    probe: impl FnOnce() -> Option<Footprint>,
    may_cut: impl FnOnce() -> Option<CutRule>,
) -> ScanFence {
    let t = table().reader();
    // Each check is one validation of the report, counted with it.
    let check = |fp: &Footprint, out: &mut Vec<Conflict>| {
        let view = base.view();
        t.check_footprint(fp, &view, &snapshot::committed, &mut |c| out.push(c));
    };
    let mut met = Vec::new();
    check(&fp, &mut met);
    let mut fence = ScanFence {
        report: ReadReport { validations: 1, ..Default::default() },
        wait_us: 0,
        waited: Vec::new(),
        cut: None,
    };
    // Writers in D: perhaps only past the rows the scan returns (the
    // probe, as a fenced statement's: the latch core's `protocol`).
    let probed = if met.is_empty() { None } else { probe() };
    let fp = match probed {
        Some(ends) => {
            fence.report.probes = 1;
            fence.report.validations += 1;
            met.clear();
            check(&ends, &mut met);
            ends
        }
        None => fp,
    };
    if met.is_empty() {
        fence.report.checked = Some(fp);
        count(&fence.report);
        return fence;
    }
    let mut xids: Vec<_> = met.iter().map(|c| c.xid).collect();
    xids.sort_unstable_by_key(|x| x.0);
    xids.dedup();
    fence.report.conflicts = xids.len() as u32;
    if let Some(rule) = may_cut() {
        fence.report.cuts = 1;
        fence.cut = Some((cut_upward(&met), rule));
    } else {
        // A writer that aborts leaves nothing to hide.
        let mut live: Vec<_> = met.iter().filter(|c| c.live).copied().collect();
        live.sort_unstable_by_key(|c| c.xid.0);
        live.dedup_by_key(|c| c.xid);
        for c in &live {
            fence.wait_us += wait_for_holder(c, &mut fence.waited);
            fence.report.waits += 1;
        }
        met.clear();
        check(&fp, &mut met);
        fence.report.validations += 1;
        if let Some(c) = met.first() {
            count(&fence.report);
            fenced_at_scan_failure(c.xid, c.rel);
        }
    }
    fence.report.checked = Some(fp);
    count(&fence.report);
    fence
}

/// Raises 40001 for a scan fenced when it started whose statement had read
/// at its snapshot already (its bound came from a CTE or a subquery): a
/// writer in flight at that snapshot committed inside the span, and the
/// scan can neither move the snapshot to show it nor stop before it.
pub fn fenced_at_scan_failure(xid: Xid, rel: RelId) -> ! {
    serialization_error(
        format!(
            "Transaction {} was in flight at this statement's snapshot and wrote to \"{}\" inside the span a LIMIT scan read; the statement had read at that snapshot before the scan started (its bound came from a CTE or a subquery), and the scan could not stop before the write.",
            xid.0,
            rel_name(pgrx::pg_sys::Oid::from(rel.rel()))
        ),
        "The statement might succeed if retried.",
    )
}

/// Raises 40001 for a read that waited [`protocol::MAX_LATER_ROUNDS`]
/// times for writers that started after it and kept entering a span it
/// cannot stop short of: a bounded wait, and never an inconsistent answer.
fn writers_kept_coming(rel: RelId, what: &str) -> ! {
    serialization_error(
        format!(
            "Transactions kept writing to \"{}\" inside the span this {what} read after it had waited {} times; stopping before their keys would change the statement's answer (it is not a tail read up the key that reads no other table), so it cannot.",
            rel_name(pgrx::pg_sys::Oid::from(rel.rel())),
            protocol::MAX_LATER_ROUNDS
        ),
        "The statement might succeed if retried.",
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
