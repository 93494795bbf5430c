//! The reader's protocol: how a fenced or optimistic scan turns latch checks
//! and waits into a result that never omits a row written by a transaction
//! that was in flight at its snapshot, read at a snapshot PostgreSQL itself
//! could have taken.
//!
//! Pure logic over an [`Env`] that reads, checks, waits and takes snapshots:
//! the Postgres statement guard is one Env, the simulated database in the
//! tests is another.
//!
//! - optimistic: read the declared span D at once with the snapshot, up to
//!   the limit; the touched span T is what the read looked at; check T.
//!   Clean → the buffered rows are the answer.  Conflict → wait for the
//!   conflicting holders, take a fresh snapshot, read again.  After
//!   `retries` conflicts, go fenced; where that read cannot probe its end
//!   but may stop short (a cut), it stops past the furthest key its
//!   attempts touched (`stop_past`) instead of fencing all of D: the
//!   attempts showed how far it reads, and a writer past that is no more
//!   its business than one past an optimistic read's T.  With `declared_first` (large
//!   limits), check D before reading: when nothing in D conflicts the scan
//!   streams and buffers nothing; otherwise it reads and checks T as above.
//! - fenced: check D before reading, wait and refresh until D is clean,
//!   then read and stream.  When D meets writers, the read first asks
//!   where it will end at the current snapshot (the probe: a LIMIT read
//!   returns the first rows of D, and a writer past the last of them can
//!   never be among them) and checks only up to there.  Writers that
//!   started after the first snapshot it never chases: where it cannot
//!   stop before them, those past the last row it will return (the later
//!   probe, even of a span bounded beyond it) are not waited for.
//! - REPEATABLE READ / SERIALIZABLE: the snapshot cannot change.  Waiting
//!   still helps when a holder aborts; a holder that committed is a conflict
//!   waiting cannot repair → serialization failure (40001).
//!
//! Why every retry reads at a fresh snapshot: a snapshot is a prefix of the
//! commit order, so a statement reading at one never shows a transaction
//! without those that committed before it (a watermark another process
//! wrote after reading the stream never shows without the stream's rows).
//!
//! Why waiting still ends: only writers in flight at the read's *first*
//! snapshot ("earlier" writers, xid below its `after`) are waited for; there
//! are finitely many, and each ends once.  A writer that started since and
//! is in flight at the fresh snapshot inside the span read is not waited
//! for: the read stops before its first key instead (the cut), when every
//! read of that table moves up the key from a bound left open in that
//! direction -- a tail, which reads the rest next time from its cursor.
//! Where a read cannot stop early without other rows of the statement (a
//! join, a watermark it reads) showing ahead of the stream, it waits for
//! such writers too, at most [`MAX_LATER_ROUNDS`] times; then a tail up
//! the key stops before them all the same (`last_resort_cut`: the answer
//! is the statement's own at one snapshot, over a narrower span, and the
//! consumer reads the rest next time), and any other read (a bounded
//! span, a scan in no key order) fails with 40001: never a wait without
//! end.

use super::region::RelId;
use super::span::Span;
use super::validate::{Check, Conflict, Footprint};
use super::xid::Xid;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    Optimistic,
    Fenced,
}

/// Rounds a read that cannot stop early waits for writers that started
/// after its first snapshot, before it gives up with 40001.
pub const MAX_LATER_ROUNDS: u32 = 4;

#[derive(Clone, Copy, Debug)]
pub struct ReadParams {
    pub mode: ReadMode,
    /// Conflicting optimistic attempts before falling back to fenced.
    pub retries: u32,
    /// REPEATABLE READ or SERIALIZABLE, once a statement has read at the
    /// transaction's snapshot (or SERIALIZABLE at all): it cannot change.
    /// The first reading statement of a REPEATABLE READ transaction may
    /// take a fresh snapshot: the transaction then reads at it.
    pub fixed_snapshot: bool,
    /// Optimistic: check D once before the first read and stream when it is
    /// clean.  Worth one wider check when buffering the result costs more
    /// (many rows).
    pub declared_first: bool,
}

/// What the protocol decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// The buffered optimistic result is valid: emit it.
    Emit,
    /// Fenced: D less `cut` is clean for the current snapshot; read it now
    /// and stream, leaving out the keys in `cut`.
    Stream { cut: Footprint },
    /// A conflict that waiting cannot repair (a fixed snapshot), or writers
    /// that kept entering a span the read could not stop short of.
    SerializationFailure { xid: Xid, rel: RelId, span: Span },
}

/// What happened on the way, for EXPLAIN ANALYZE and `pgkvx.stats()`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadReport {
    pub validations: u32,
    pub conflicts: u32,
    pub retries: u32,
    pub fresh_snapshots: u32,
    pub waits: u32,
    /// Times the read stopped before the keys of writers that started
    /// after its first snapshot.
    pub cuts: u32,
    /// Times a fenced read probed where it would end, because its declared
    /// span met writers.
    pub probes: u32,
    pub fell_back: bool,
    /// An optimistic read's result was too large to buffer: it went fenced.
    pub overflowed: bool,
    /// An optimistic scan found D clean before reading and streamed.
    pub streamed: bool,
    /// The last footprint checked: touched (optimistic) or declared
    /// (fenced, or streamed).
    pub checked: Option<Footprint>,
}

impl ReadReport {
    /// Adds another run's counts to these.
    pub fn add(&mut self, r: &ReadReport) {
        self.validations += r.validations;
        self.conflicts += r.conflicts;
        self.retries += r.retries;
        self.fresh_snapshots += r.fresh_snapshots;
        self.waits += r.waits;
        self.cuts += r.cuts;
        self.probes += r.probes;
        self.fell_back |= r.fell_back;
        self.overflowed |= r.overflowed;
        self.streamed |= r.streamed;
        if r.checked.is_some() {
            self.checked.clone_from(&r.checked);
        }
    }
}

/// The reader's side of the world.
pub trait Env {
    /// Xids at or above this were assigned after the read's first snapshot.
    fn first_after(&self) -> Xid;
    /// Reads with the current snapshot, leaving out the keys in `cut`,
    /// buffering the whole result; returns the footprint it touched, or
    /// None when the result is too large to buffer (the protocol then goes
    /// fenced).
    fn read_buffered(&mut self, cut: &Footprint) -> Option<Footprint>;
    /// Checks `fp` against the current snapshot.
    fn check(&mut self, fp: &Footprint, out: &mut Vec<Conflict>) -> Check;
    /// Fenced: the part of the declared footprint the read will return rows
    /// from at the current snapshot (the probe), or None when that cannot
    /// be known before reading.
    fn probe(&mut self) -> Option<Footprint> {
        None
    }
    /// Fenced, for writers that started after the first snapshot: the part
    /// of the declared footprint up to the last row the read will return
    /// at the current snapshot, even where the span is bounded past it
    /// (the later probe), or None when that cannot be known before reading.
    fn later_ends(&mut self) -> Option<Footprint> {
        None
    }
    /// Waits until transaction `xid` has ended.
    fn wait(&mut self, xid: Xid);
    /// Replaces the snapshot with a new one (never called when the
    /// snapshot is fixed).
    fn refresh_snapshot(&mut self);
    /// The keys to leave out so that every read stops before the latches
    /// `conflicts` met: for each table, from the first such key in the
    /// direction its reads move on.  None when some read of one of those
    /// tables cannot stop early without looking complete (its span is
    /// bounded in its direction, or it reads in no key order).
    fn cut(&mut self, conflicts: &[Conflict]) -> Option<Footprint>;
    /// After [`MAX_LATER_ROUNDS`] rounds of later writers a read could not
    /// stop before: the keys to leave out when every read of those tables
    /// is a tail up the key from a bound left open above, whatever else the
    /// statement reads (a join, a watermark) -- or None, and the read fails
    /// with 40001.
    fn last_resort_cut(&mut self, _conflicts: &[Conflict]) -> Option<Footprint> {
        None
    }
    /// An optimistic read gone fenced whose end cannot be probed: the keys
    /// to leave out so that every read stops past `touched`, the furthest
    /// its attempts looked (per table, from the end of its last touched
    /// span on), where [`Env::cut`] would allow a cut -- or None, and the
    /// fallback fences its declared span.
    fn stop_past(&mut self, _touched: &Footprint) -> Option<Footprint> {
        None
    }
}

/// Per table, the keys past the furthest `touched` reaches: from the end
/// of its last span on (nothing for a table touched to +∞).
pub fn past(touched: &Footprint) -> Footprint {
    let mut out: Footprint = Vec::new();
    for (rel, s) in touched {
        match out.iter_mut().find(|(r, _)| r == rel) {
            Some((_, c)) => c.start = c.start.max(s.end),
            None => out.push((*rel, Span { start: s.end, end: Span::ALL.end })),
        }
    }
    out.retain(|(_, c)| !c.is_empty());
    out
}

/// The part of `fp` outside `cut`, per table (a cut is a span from its
/// start key to +∞).
pub fn without(fp: &Footprint, cut: &Footprint) -> Footprint {
    if cut.is_empty() {
        return fp.clone();
    }
    fp.iter()
        .filter_map(|(rel, s)| {
            let mut s = *s;
            for (_, c) in cut.iter().filter(|(r, _)| r == rel) {
                s = s.intersect(&Span { start: Span::ALL.start, end: c.start });
            }
            (!s.is_empty()).then_some((*rel, s))
        })
        .collect()
}

/// Runs the protocol for a read whose declared footprint `declared`
/// computes at the read's snapshot of the moment.  It is asked for at most
/// once a snapshot, and only when needed: an optimistic read that validates
/// clean never is (for a short read, evaluating the bounds is a visible
/// part of its cost).  Once the read has moved to a fresh snapshot it is
/// asked again: a bound may read a table (a cursor kept in one), and the
/// read's rows then start where it says at that snapshot.
pub fn run<E: Env>(
    env: &mut E,
    declared: &mut dyn FnMut() -> Footprint,
    p: &ReadParams,
    report: &mut ReadReport,
) -> ReadOutcome {
    let moved = std::cell::Cell::new(false);
    let mut declared = once_a_snapshot(declared, &moved);
    let mut mode = p.mode;
    let mut cut: Footprint = Vec::new();
    let mut conflicts: Vec<Conflict> = Vec::new();
    let mut failures = 0u32;
    let mut later_rounds = 0u32;
    // What the optimistic attempts touched, and where a fenced fallback
    // that cannot probe its end stops instead (kept across its rounds).
    let mut touched: Footprint = Vec::new();
    let mut stop: Footprint = Vec::new();
    let first_after = env.first_after();
    if mode == ReadMode::Optimistic && p.declared_first && declared_is_clean(env, declared(), &mut conflicts, report) {
        return ReadOutcome::Stream { cut };
    }
    loop {
        let Some(fp) = round_footprint(env, mode, &cut, &mut touched, &mut declared) else {
            report.overflowed = true;
            report.fell_back = true;
            mode = ReadMode::Fenced;
            continue;
        };
        conflicts.clear();
        let mut c = env.check(&fp, &mut conflicts);
        report.validations += 1;
        let mut fp = fp;
        if !c.clean() && mode == ReadMode::Fenced {
            if let Some(narrow) = narrow_fenced(env, &mut cut, &mut stop, &touched, &mut declared, report) {
                fp = narrow;
                conflicts.clear();
                c = env.check(&fp, &mut conflicts);
                report.validations += 1;
            }
        }
        if c.clean() {
            report.checked = Some(fp);
            return clean_outcome(mode, cut);
        }
        // Every latch met, for the cut; then one entry per holder.
        let met = conflicts.clone();
        dedup(&mut conflicts);
        report.conflicts += conflicts.len() as u32;
        if p.fixed_snapshot {
            return settle_fixed(env, fp, mode, cut, &mut conflicts, report);
        }
        let earlier = conflicts.iter().any(|c| c.xid.precedes(first_after));
        if !earlier {
            // Only writers that started after the first snapshot: stop
            // before them when every read can, else wait for them, a few
            // times at most.
            if let Some(more) = env.cut(&met) {
                cut.extend(more);
                report.cuts += 1;
                continue;
            }
            // A reader never chases writers that started after it.  A read
            // bounded past its last row cannot stop before them (it would
            // look complete), but those whose keys lie past every row it
            // returns are no more its business than writers yet to start:
            // a range read that reaches past the head gets their rows no
            // more than those of writers that start after it.
            if clean_up_to_last_row(env, &cut, &mut conflicts, report) {
                return clean_outcome(mode, cut);
            }
            later_rounds += 1;
            if later_rounds > MAX_LATER_ROUNDS {
                // Stopping short still beats failing a read the snapshot
                // may move for: the answer is the statement's own at one
                // snapshot, over a narrower span.
                if let Some(more) = env.last_resort_cut(&met) {
                    cut.extend(more);
                    report.cuts += 1;
                    continue;
                }
                return serialization_failure(&conflicts);
            }
        }
        wait_and_refresh(env, &conflicts, earlier, first_after, report);
        moved.set(true);
        cut.clone_from(&stop);
        if mode == ReadMode::Optimistic {
            failures += 1;
            report.retries += 1;
            if failures > p.retries {
                mode = ReadMode::Fenced;
                report.fell_back = true;
            }
        }
    }
}

/// `declared`, computed once for each snapshot the read is at: `moved`
/// says the read has moved to another since.
fn once_a_snapshot<'a>(
    declared: &'a mut dyn FnMut() -> Footprint,
    moved: &'a std::cell::Cell<bool>,
) -> impl FnMut() -> Footprint + 'a {
    let mut fp: Option<Footprint> = None;
    move || {
        if moved.replace(false) {
            fp = None;
        }
        fp.get_or_insert_with(&mut *declared).clone()
    }
}

/// What a round of the read checks: optimistic, what its attempt touched
/// (added to `touched`); fenced, the declared footprint; both less `cut`.
/// None when the attempt's result outgrew the buffer.
fn round_footprint<E: Env>(
    env: &mut E,
    mode: ReadMode,
    cut: &Footprint,
    touched: &mut Footprint,
    declared: &mut dyn FnMut() -> Footprint,
) -> Option<Footprint> {
    Some(match mode {
        ReadMode::Optimistic => {
            let fp = without(&env.read_buffered(cut)?, cut);
            touched.extend(fp.iter().copied());
            fp
        }
        ReadMode::Fenced => without(&declared(), cut),
    })
}

/// A fenced read whose declared footprint met writers: what it need check
/// instead, or None.  Perhaps only up to where its rows end (the probe).
/// Where that cannot be told but optimistic attempts ran, it stops past
/// what they `touched` (adding that to `cut`, and keeping it in `stop`
/// for the rounds to come) rather than wait for writers anywhere in D: a
/// consumer at the head would wait for every writer past its rows, idle
/// ones too.
fn narrow_fenced<E: Env>(
    env: &mut E,
    cut: &mut Footprint,
    stop: &mut Footprint,
    touched: &Footprint,
    declared: &mut dyn FnMut() -> Footprint,
    report: &mut ReadReport,
) -> Option<Footprint> {
    if let Some(ends) = env.probe() {
        report.probes += 1;
        return Some(without(&ends, cut));
    }
    if !stop.is_empty() || touched.is_empty() {
        return None;
    }
    *stop = env.stop_past(touched).filter(|s| !s.is_empty())?;
    report.cuts += 1;
    cut.extend(stop.iter().copied());
    Some(without(&declared(), cut))
}

/// Later writers only: whether the read is clean up to the last row it
/// will return (the later probe); if not, `conflicts` are those met there.
fn clean_up_to_last_row<E: Env>(
    env: &mut E,
    cut: &Footprint,
    conflicts: &mut Vec<Conflict>,
    report: &mut ReadReport,
) -> bool {
    let Some(ends) = env.later_ends() else { return false };
    report.probes += 1;
    let narrowed = without(&ends, cut);
    conflicts.clear();
    report.validations += 1;
    if env.check(&narrowed, conflicts).clean() {
        report.checked = Some(narrowed);
        return true;
    }
    dedup(conflicts);
    false
}

/// Optimistic with `declared_first`: checks the declared footprint `d`
/// before reading, as a fenced read's first check would.  Only a clean
/// answer is used (a conflict in D says nothing about T): then the scan
/// streams.
fn declared_is_clean<E: Env>(
    env: &mut E,
    d: Footprint,
    conflicts: &mut Vec<Conflict>,
    report: &mut ReadReport,
) -> bool {
    let c = env.check(&d, conflicts);
    report.validations += 1;
    if c.clean() {
        report.checked = Some(d);
        report.streamed = true;
    }
    c.clean()
}

/// What a clean check of the current footprint means in `mode`.
fn clean_outcome(mode: ReadMode, cut: Footprint) -> ReadOutcome {
    match mode {
        ReadMode::Optimistic => ReadOutcome::Emit,
        ReadMode::Fenced => ReadOutcome::Stream { cut },
    }
}

/// A fixed snapshot met `conflicts` in `fp`: waiting helps only when a
/// holder aborts.  Waits for the live holders and checks once more; a
/// holder that committed stays a conflict, which is a serialization
/// failure.
fn settle_fixed<E: Env>(
    env: &mut E,
    fp: Footprint,
    mode: ReadMode,
    cut: Footprint,
    conflicts: &mut Vec<Conflict>,
    report: &mut ReadReport,
) -> ReadOutcome {
    for x in conflicts.iter().filter(|c| c.live) {
        env.wait(x.xid);
        report.waits += 1;
    }
    // Aborted holders are gone now; committed ones stay conflicts.
    conflicts.clear();
    let again = env.check(&fp, conflicts);
    report.validations += 1;
    report.checked = Some(fp);
    if again.clean() {
        return clean_outcome(mode, cut);
    }
    serialization_failure(conflicts)
}

/// Waits for the live holders among `conflicts` -- only the earlier
/// writers (xid before `first_after`) when there are any -- then takes a
/// fresh snapshot.
fn wait_and_refresh<E: Env>(
    env: &mut E,
    conflicts: &[Conflict],
    earlier: bool,
    first_after: Xid,
    report: &mut ReadReport,
) {
    for x in conflicts.iter().filter(|c| c.live && (!earlier || c.xid.precedes(first_after))) {
        env.wait(x.xid);
        report.waits += 1;
    }
    env.refresh_snapshot();
    report.fresh_snapshots += 1;
}

/// A conflict waiting cannot repair: named by the first of `conflicts`.
fn serialization_failure(conflicts: &[Conflict]) -> ReadOutcome {
    let c = conflicts.first().copied();
    ReadOutcome::SerializationFailure {
        xid: c.map_or(Xid::INVALID, |c| c.xid),
        rel: c.map_or(RelId::EMPTY, |c| c.rel),
        span: c.map_or(Span::EMPTY, |c| c.span),
    }
}

fn dedup(c: &mut Vec<Conflict>) {
    c.sort_by_key(|c| (c.xid.0, !c.live));
    c.dedup_by_key(|c| c.xid);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An environment whose first `conflicted` checks find writer `holder`
    /// (gone by the time it is waited for) at key 5, and whose reads touch
    /// `[1, 9)` less what they are told to leave out.
    struct Scripted {
        conflicted: u32,
        checks: u32,
        holder: Xid,
        first_after: Xid,
        can_cut: bool,
        last_resort: bool,
        refreshed: u32,
        waited: Vec<Xid>,
        /// What a fenced read's probe finds (None: it cannot probe).
        probe: Option<Footprint>,
        probed: u32,
        /// What its later probe finds.
        later: Option<Footprint>,
        /// A writer idle at `[20, 21)` until it is waited for, met
        /// wherever a check reaches it.
        idle: Option<Xid>,
        /// Whether a fallback may stop past what the attempts touched.
        stops: bool,
    }

    fn span(a: u8, b: u8) -> Span {
        Span::new(&[a], Some(&[b]))
    }

    impl Env for Scripted {
        fn first_after(&self) -> Xid {
            self.first_after
        }
        fn read_buffered(&mut self, cut: &Footprint) -> Option<Footprint> {
            Some(without(&vec![(RelId::new(1, 1), span(1, 9))], cut))
        }
        fn check(&mut self, fp: &Footprint, out: &mut Vec<Conflict>) -> Check {
            self.checks += 1;
            let idle = span(20, 21);
            let ended = |x: &Xid| self.waited.contains(x);
            if let Some(x) = self.idle.filter(|x| !ended(x) && fp.iter().any(|(_, s)| s.overlaps(&idle))) {
                out.push(Conflict { xid: x, rel: fp[0].0, span: fp[0].1, at: idle, live: true });
            }
            let at = span(5, 6);
            if self.checks > self.conflicted || !fp.iter().any(|(_, s)| s.overlaps(&at)) {
                return Check { conflicted: !out.is_empty() };
            }
            out.push(Conflict { xid: self.holder, rel: fp[0].0, span: fp[0].1, at, live: true });
            Check { conflicted: true }
        }
        fn wait(&mut self, x: Xid) {
            self.waited.push(x);
        }
        fn refresh_snapshot(&mut self) {
            self.refreshed += 1;
        }
        fn cut(&mut self, conflicts: &[Conflict]) -> Option<Footprint> {
            self.can_cut.then(|| upward(conflicts))
        }
        fn last_resort_cut(&mut self, conflicts: &[Conflict]) -> Option<Footprint> {
            self.last_resort.then(|| upward(conflicts))
        }
        fn probe(&mut self) -> Option<Footprint> {
            self.probed += 1;
            self.probe.clone()
        }
        fn later_ends(&mut self) -> Option<Footprint> {
            self.later.clone()
        }
        fn stop_past(&mut self, touched: &Footprint) -> Option<Footprint> {
            self.stops.then(|| past(touched))
        }
    }

    fn upward(conflicts: &[Conflict]) -> Footprint {
        conflicts.iter().map(|c| (c.rel, Span { start: c.at.start, end: Span::ALL.end })).collect()
    }

    fn scripted(conflicted: u32, holder: u32, can_cut: bool) -> Scripted {
        Scripted {
            conflicted,
            checks: 0,
            holder: Xid(holder),
            first_after: Xid(100),
            can_cut,
            last_resort: false,
            refreshed: 0,
            waited: Vec::new(),
            probe: None,
            probed: 0,
            later: None,
            idle: None,
            stops: false,
        }
    }

    fn params(mode: ReadMode, fixed: bool) -> ReadParams {
        ReadParams { mode, retries: 1, fixed_snapshot: fixed, declared_first: false }
    }

    #[test]
    fn the_declared_footprint_is_computed_only_when_needed_and_once_a_snapshot() {
        // (mode, conflicting checks, times the declared footprint is asked
        // for: once at each snapshot a fenced round checks it at)
        let cases = [
            ("optimistic, clean at once", ReadMode::Optimistic, 0, 0),
            ("optimistic, clean after a wait", ReadMode::Optimistic, 1, 0),
            ("optimistic, falls back to fenced, clean at its second snapshot", ReadMode::Optimistic, 3, 2),
            ("fenced, clean at once", ReadMode::Fenced, 0, 1),
            ("fenced, after a wait", ReadMode::Fenced, 1, 2),
        ];
        for (name, mode, conflicted, asked) in cases {
            let mut env = scripted(conflicted, 9, false);
            let mut calls = 0;
            let mut declared = || {
                calls += 1;
                vec![(RelId::new(1, 1), Span::ALL)]
            };
            let mut report = ReadReport::default();
            run(&mut env, &mut declared, &params(mode, false), &mut report);
            assert_eq!(calls, asked, "{name}");
        }
    }

    #[test]
    fn earlier_writers_are_waited_for_and_the_read_retries_at_a_fresh_snapshot() {
        for mode in [ReadMode::Optimistic, ReadMode::Fenced] {
            let mut env = scripted(1, 9, true);
            let out = run(
                &mut env,
                &mut || vec![(RelId::new(1, 1), span(1, 9))],
                &params(mode, false),
                &mut ReadReport::default(),
            );
            assert!(matches!(out, ReadOutcome::Emit | ReadOutcome::Stream { .. }), "{mode:?}: {out:?}");
            if let ReadOutcome::Stream { cut } = &out {
                assert!(cut.is_empty(), "nothing is left out after waiting for an earlier writer");
            }
            assert_eq!((env.waited.as_slice(), env.refreshed), (&[Xid(9)][..], 1), "{mode:?}");
        }
    }

    #[test]
    fn later_writers_are_cut_off_not_waited_for() {
        for mode in [ReadMode::Optimistic, ReadMode::Fenced] {
            // Writer 150 started after the first snapshot (first_after 100).
            let mut env = scripted(u32::MAX, 150, true);
            let mut report = ReadReport::default();
            let out = run(&mut env, &mut || vec![(RelId::new(1, 1), span(1, 9))], &params(mode, false), &mut report);
            assert!(env.waited.is_empty() && env.refreshed == 0, "{mode:?}: {:?}", env.waited);
            assert_eq!(report.cuts, 1, "{mode:?}");
            let checked = report.checked.expect("checked");
            assert_eq!(checked, vec![(RelId::new(1, 1), span(1, 5))], "{mode:?}: the read stops before key 5");
            if let ReadOutcome::Stream { cut } = out {
                assert_eq!(cut, vec![(RelId::new(1, 1), Span { start: span(5, 6).start, end: Span::ALL.end })]);
            }
        }
    }

    #[test]
    fn later_writers_a_read_cannot_stop_before_are_waited_for_a_few_rounds_then_40001() {
        for mode in [ReadMode::Optimistic, ReadMode::Fenced] {
            // Always a later writer in the span: bounded, then a failure.
            let mut env = scripted(u32::MAX, 150, false);
            let out = run(
                &mut env,
                &mut || vec![(RelId::new(1, 1), span(1, 9))],
                &params(mode, false),
                &mut ReadReport::default(),
            );
            assert!(matches!(out, ReadOutcome::SerializationFailure { .. }), "{mode:?}: {out:?}");
            assert_eq!(env.refreshed, MAX_LATER_ROUNDS, "{mode:?}");
            // Gone after two rounds: a clean read.
            let mut env = scripted(2, 150, false);
            let out = run(
                &mut env,
                &mut || vec![(RelId::new(1, 1), span(1, 9))],
                &params(mode, false),
                &mut ReadReport::default(),
            );
            assert!(!matches!(out, ReadOutcome::SerializationFailure { .. }), "{mode:?}: {out:?}");
        }
    }

    #[test]
    fn a_bounded_read_does_not_chase_later_writers_past_its_last_row() {
        for mode in [ReadMode::Optimistic, ReadMode::Fenced] {
            // A later writer at key 5 of a read bounded at 9.
            // (case, what the later probe finds, fails, rounds waited)
            let cases = [
                ("its last row is before the writer: not waited for", Some(span(1, 5)), false, 0),
                ("its last row is past the writer: waited for, then 40001", Some(span(1, 7)), true, MAX_LATER_ROUNDS),
                ("the end cannot be probed: waited for, then 40001", None, true, MAX_LATER_ROUNDS),
            ];
            for (case, later, fails, rounds) in cases {
                let mut env = scripted(u32::MAX, 150, false);
                env.later = later.map(|s| vec![(RelId::new(1, 1), s)]);
                let mut report = ReadReport::default();
                let out =
                    run(&mut env, &mut || vec![(RelId::new(1, 1), span(1, 9))], &params(mode, false), &mut report);
                assert_eq!(matches!(out, ReadOutcome::SerializationFailure { .. }), fails, "{mode:?}, {case}: {out:?}");
                assert_eq!(env.refreshed, rounds, "{mode:?}, {case}");
                if !fails {
                    assert_eq!(report.checked, Some(vec![(RelId::new(1, 1), span(1, 5))]), "{mode:?}, {case}");
                }
            }
        }
        // Writers in flight at the first snapshot are waited for across the
        // whole bounded span: no later probe for them.
        let mut env = scripted(1, 50, false);
        env.later = Some(vec![(RelId::new(1, 1), span(1, 5))]);
        let out = run(
            &mut env,
            &mut || vec![(RelId::new(1, 1), span(1, 9))],
            &params(ReadMode::Fenced, false),
            &mut ReadReport::default(),
        );
        assert!(matches!(out, ReadOutcome::Stream { .. }), "{out:?}");
        assert_eq!(env.waited, vec![Xid(50)]);
    }

    #[test]
    fn a_tail_that_may_stop_only_as_a_last_resort_does_so_after_the_rounds_instead_of_failing() {
        for mode in [ReadMode::Optimistic, ReadMode::Fenced] {
            let mut env = scripted(u32::MAX, 150, false);
            env.last_resort = true;
            let mut report = ReadReport::default();
            let out = run(&mut env, &mut || vec![(RelId::new(1, 1), span(1, 9))], &params(mode, false), &mut report);
            assert!(!matches!(out, ReadOutcome::SerializationFailure { .. }), "{mode:?}: {out:?}");
            assert_eq!((env.refreshed, report.cuts), (MAX_LATER_ROUNDS, 1), "{mode:?}");
            let checked = report.checked.expect("checked");
            assert_eq!(checked, vec![(RelId::new(1, 1), span(1, 5))], "{mode:?}: the read stops before key 5");
        }
    }

    #[test]
    fn a_fenced_read_waits_only_for_writers_behind_where_its_probe_ends() {
        let d = || vec![(RelId::new(1, 1), Span::ALL)];
        // (case, what the probe finds, waits, probes); the writer is met
        // by the first two checks it overlaps.
        let cases = [
            ("the writer is past the last row: not waited for", Some(vec![(RelId::new(1, 1), span(1, 5))]), 0, 1),
            ("the writer is behind the last row: waited for", Some(vec![(RelId::new(1, 1), span(1, 9))]), 1, 1),
            ("no rows at all: nobody to wait for", Some(Vec::new()), 0, 1),
            ("the end cannot be probed: the declared span", None, 1, 1),
        ];
        for (name, probe, waits, probes) in cases {
            for fixed in [false, true] {
                let mut env = scripted(if probe.is_some() { 2 } else { 1 }, 9, false);
                env.probe = probe.clone();
                let mut report = ReadReport::default();
                let out = run(&mut env, &mut d.clone(), &params(ReadMode::Fenced, fixed), &mut report);
                assert_eq!(out, ReadOutcome::Stream { cut: Vec::new() }, "{name}, fixed {fixed}");
                assert_eq!(env.waited.len(), waits, "{name}, fixed {fixed}");
                assert_eq!(env.probed, probes, "{name}, fixed {fixed}");
                assert_eq!(report.probes, u32::from(probe.is_some()), "{name}");
            }
        }
        // Optimistic reads never probe: they validate what they touched.
        let mut env = scripted(1, 9, false);
        env.probe = Some(Vec::new());
        let mut report = ReadReport::default();
        run(&mut env, &mut d.clone(), &params(ReadMode::Optimistic, false), &mut report);
        assert_eq!(env.probed, 0);
    }

    #[test]
    fn a_fallback_that_cannot_probe_stops_past_what_its_attempts_touched() {
        // The attempts touch [1, 9) and keep meeting writers at 5 until
        // they go fenced; a writer sits idle at 20, past every row.  The
        // fenced fallback cannot probe its end: where it may stop past
        // what the attempts touched it does, and never waits for the idle
        // writer; where it may not, it fences the declared span and does.
        let d = || vec![(RelId::new(1, 1), Span::ALL)];
        let stop = vec![(RelId::new(1, 1), Span { start: span(1, 9).end, end: Span::ALL.end })];
        for (stops, waits_for_idle, cut) in [(true, false, stop), (false, true, Vec::new())] {
            let mut env = scripted(3, 9, false);
            env.idle = Some(Xid(10));
            env.stops = stops;
            let mut report = ReadReport::default();
            let out = run(&mut env, &mut d.clone(), &params(ReadMode::Optimistic, false), &mut report);
            assert!(report.fell_back, "stops {stops}");
            assert_eq!(out, ReadOutcome::Stream { cut }, "stops {stops}");
            assert_eq!(env.waited.contains(&Xid(10)), waits_for_idle, "stops {stops}: {:?}", env.waited);
        }
    }

    #[test]
    fn past_starts_where_the_furthest_touched_span_ends() {
        let (a, b) = (RelId::new(1, 1), RelId::new(1, 2));
        let t = vec![
            (a, span(1, 3)),
            (a, span(5, 9)),
            (b, span(2, 4)),
            (b, Span { start: span(7, 8).start, end: Span::ALL.end }),
        ];
        assert_eq!(past(&t), vec![(a, Span { start: span(5, 9).end, end: Span::ALL.end })]);
        assert!(past(&Vec::new()).is_empty());
    }

    #[test]
    fn a_fixed_snapshot_fails_on_a_committed_holder() {
        for mode in [ReadMode::Optimistic, ReadMode::Fenced] {
            let mut env = scripted(2, 9, true);
            let out = run(
                &mut env,
                &mut || vec![(RelId::new(1, 1), Span::ALL)],
                &params(mode, true),
                &mut ReadReport::default(),
            );
            assert!(matches!(out, ReadOutcome::SerializationFailure { .. }), "{mode:?}: {out:?}");
            assert_eq!(env.refreshed, 0);
        }
    }
}
