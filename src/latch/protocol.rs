//! The reader's protocol: how a fenced or optimistic scan turns latch checks
//! and waits into a result that never omits a row written by a transaction
//! that was in flight at its snapshot.
//!
//! Pure logic over an [`Env`] that reads, checks, waits and takes snapshots:
//! the Postgres scan node is one Env, the simulated database in the tests is
//! another.
//!
//! - optimistic: read the declared span D at once with the snapshot, up to
//!   the limit; the touched span T is what the read looked at; check T.
//!   Clean → the buffered rows are the answer.  Conflict → wait for the
//!   conflicting holders that still run, fold them into the snapshot ("pull
//!   them in"), read again.  After `retries` conflicts, go fenced.
//!   With `declared_first` (large limits), check D before reading: when
//!   nothing in D conflicts the scan streams like a fenced scan that had
//!   nothing to wait for, and buffers nothing; otherwise it reads and
//!   checks T as above (the conflicts in D may all lie beyond T).
//! - fenced: check D before reading, wait and pull in until D is clean, then
//!   read and stream: nothing in D can be missed, so nothing is buffered.
//! - REPEATABLE READ / SERIALIZABLE: the snapshot cannot change.  Waiting
//!   still helps when a holder aborts; a holder that committed is a conflict
//!   waiting cannot repair → serialization failure (40001).
//!
//! Why pull in instead of a fresh snapshot: on a table written continuously
//! (the tail of an event stream), every fresh snapshot has new writers in
//! flight and a reader that insists on a snapshot without any would chase
//! them for ever.  Pulling in shrinks the in-flight set of one snapshot, so
//! it ends.  To keep rows in latch-publication order the reader may have to
//! pull in writers that started after its snapshot too (validate.rs); only
//! when it cannot name them (`Check::must_refresh`) does it take a fresh
//! snapshot.

use super::region::RelId;
use super::span::Span;
use super::validate::{Check, Conflict, Footprint};
use super::xid::Xid;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    Optimistic,
    Fenced,
}

#[derive(Clone, Copy, Debug)]
pub struct ReadParams {
    pub mode: ReadMode,
    /// Conflicting optimistic attempts before falling back to fenced.
    pub retries: u32,
    /// REPEATABLE READ or SERIALIZABLE, once a statement has read at the
    /// transaction's snapshot: it cannot change.
    pub fixed_snapshot: bool,
    /// A fresh snapshot may replace the base (READ COMMITTED).  The first
    /// reading statement of a REPEATABLE READ transaction may pull holders
    /// into its snapshot (the transaction then keeps the result) but not
    /// take a fresh one: a conflict that needs one is a serialization
    /// failure.
    pub may_refresh: bool,
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
    /// Fenced: D is clean for the snapshot with `pulled` folded in; read it
    /// now and stream.
    Stream { pulled: Vec<Xid> },
    /// A conflict that waiting cannot repair under a fixed snapshot.
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
    /// Writers that started after the snapshot, pulled in to keep latch order.
    pub pulled_after: u32,
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
        self.pulled_after += r.pulled_after;
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
    /// Reads with the base snapshot, `pulled` folded in, buffering the whole
    /// result; returns the footprint it touched, or None when the result is
    /// too large to buffer (the protocol then goes fenced).
    fn read_buffered(&mut self, pulled: &[Xid]) -> Option<Footprint>;
    /// Checks `fp` against the base snapshot with `pulled` folded in.
    fn check(&mut self, fp: &Footprint, pulled: &[Xid], out: &mut Vec<Conflict>) -> Check;
    /// Waits until transaction `xid` has ended.
    fn wait(&mut self, xid: Xid);
    /// Whether a snapshot with `pulled` folded in can be built at a bounded
    /// cost; when not, the protocol takes a fresh snapshot instead.
    fn can_pull(&mut self, pulled: &[Xid]) -> bool;
    /// Replaces the base snapshot with a new one (never called when the
    /// snapshot is fixed).
    fn refresh_snapshot(&mut self);
}

/// Runs the protocol for a read whose declared footprint `declared`
/// computes.  It is asked for at most once, and only when needed: an
/// optimistic read that validates clean never is (for a short read,
/// evaluating the bounds is a visible part of its cost).
pub fn run<E: Env>(
    env: &mut E,
    declared: &mut dyn FnMut() -> Footprint,
    p: &ReadParams,
    report: &mut ReadReport,
) -> ReadOutcome {
    let mut declared_fp: Option<Footprint> = None;
    let mut declared = move || -> Footprint { declared_fp.get_or_insert_with(&mut *declared).clone() };
    let mut mode = p.mode;
    let mut pulled: Vec<Xid> = Vec::new();
    let mut conflicts: Vec<Conflict> = Vec::new();
    let mut failures = 0u32;
    if mode == ReadMode::Optimistic && p.declared_first {
        // What a fenced read's first check is; only a clean answer is used
        // (a conflict in D says nothing about T).
        let d = declared();
        let c = env.check(&d, &pulled, &mut conflicts);
        report.validations += 1;
        if c.clean() {
            report.checked = Some(d);
            report.streamed = true;
            return ReadOutcome::Stream { pulled };
        }
    }
    loop {
        let fp = match mode {
            ReadMode::Optimistic => match env.read_buffered(&pulled) {
                Some(fp) => fp,
                None => {
                    report.overflowed = true;
                    report.fell_back = true;
                    mode = ReadMode::Fenced;
                    continue;
                }
            },
            ReadMode::Fenced => declared(),
        };
        conflicts.clear();
        let c = env.check(&fp, &pulled, &mut conflicts);
        report.validations += 1;
        if c.clean() {
            report.checked = Some(fp);
            return match mode {
                ReadMode::Optimistic => ReadOutcome::Emit,
                ReadMode::Fenced => ReadOutcome::Stream { pulled },
            };
        }
        dedup(&mut conflicts);
        report.conflicts += conflicts.len() as u32;
        report.pulled_after += conflicts.iter().filter(|c| c.after).count() as u32;
        for x in conflicts.iter().filter(|c| c.live) {
            env.wait(x.xid);
            report.waits += 1;
        }
        if p.fixed_snapshot {
            // Aborted holders are gone now; committed ones stay conflicts.
            conflicts.clear();
            let again = env.check(&fp, &pulled, &mut conflicts);
            report.validations += 1;
            report.checked = Some(fp.clone());
            if again.clean() {
                return match mode {
                    ReadMode::Optimistic => ReadOutcome::Emit,
                    ReadMode::Fenced => ReadOutcome::Stream { pulled },
                };
            }
            return serialization_failure(&conflicts);
        }
        let mut next = pulled.clone();
        for x in &conflicts {
            if let Err(at) = next.binary_search_by_key(&x.xid.0, |p| p.0) {
                next.insert(at, x.xid);
            }
        }
        if (c.must_refresh || !env.can_pull(&next)) && !p.may_refresh {
            return serialization_failure(&conflicts);
        }
        if c.must_refresh || !env.can_pull(&next) {
            env.refresh_snapshot();
            pulled.clear();
            report.fresh_snapshots += 1;
        } else {
            pulled = next;
        }
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

    /// An environment whose first `conflicted` checks find writer 9 (gone
    /// by the time it is waited for) and whose reads touch `[1, 2)`.
    struct Scripted {
        conflicted: u32,
        checks: u32,
        /// Folding holders in stays cheap enough.
        pullable: bool,
        refreshed: u32,
    }

    impl Env for Scripted {
        fn read_buffered(&mut self, _: &[Xid]) -> Option<Footprint> {
            Some(vec![(RelId::new(1, 1), Span::point(&[1]))])
        }
        fn check(&mut self, fp: &Footprint, _: &[Xid], out: &mut Vec<Conflict>) -> Check {
            self.checks += 1;
            if self.checks > self.conflicted {
                return Check::default();
            }
            out.push(Conflict { xid: Xid(9), rel: fp[0].0, span: fp[0].1, live: false, after: false });
            Check { conflicted: true, must_refresh: false }
        }
        fn wait(&mut self, _: Xid) {}
        fn can_pull(&mut self, _: &[Xid]) -> bool {
            self.pullable
        }
        fn refresh_snapshot(&mut self) {
            self.refreshed += 1;
        }
    }

    #[test]
    fn the_declared_footprint_is_computed_only_when_needed_and_once() {
        let params =
            |mode| ReadParams { mode, retries: 1, fixed_snapshot: false, may_refresh: true, declared_first: false };
        // (mode, conflicting checks, times the declared footprint is asked for)
        let cases = [
            ("optimistic, clean at once", ReadMode::Optimistic, 0, 0),
            ("optimistic, clean after a pull-in", ReadMode::Optimistic, 1, 0),
            ("optimistic, falls back to fenced", ReadMode::Optimistic, 3, 1),
            ("fenced, clean at once", ReadMode::Fenced, 0, 1),
            ("fenced, after a pull-in", ReadMode::Fenced, 1, 1),
        ];
        for (name, mode, conflicted, asked) in cases {
            let mut env = Scripted { conflicted, checks: 0, pullable: true, refreshed: 0 };
            let mut calls = 0;
            let mut declared = || {
                calls += 1;
                vec![(RelId::new(1, 1), Span::ALL)]
            };
            let mut report = ReadReport::default();
            run(&mut env, &mut declared, &params(mode), &mut report);
            assert_eq!(calls, asked, "{name}");
        }
    }

    #[test]
    fn a_snapshot_that_may_not_be_refreshed_pulls_in_or_fails() {
        // (case, fixed, may refresh, pulling in stays cheap, expected outcome is a failure, refreshes)
        let cases = [
            ("READ COMMITTED pulls in", false, true, true, false, 0),
            ("READ COMMITTED refreshes when pulling in is too costly", false, true, false, false, 2),
            ("first REPEATABLE READ read pulls in", false, false, true, false, 0),
            ("first REPEATABLE READ read cannot refresh", false, false, false, true, 0),
            ("later REPEATABLE READ read fails on a committed holder", true, false, true, true, 0),
        ];
        for mode in [ReadMode::Optimistic, ReadMode::Fenced] {
            for (name, fixed, may_refresh, pullable, fails, refreshes) in cases {
                let mut env = Scripted { conflicted: 2, checks: 0, pullable, refreshed: 0 };
                let params = ReadParams { mode, retries: 1, fixed_snapshot: fixed, may_refresh, declared_first: false };
                let out =
                    run(&mut env, &mut || vec![(RelId::new(1, 1), Span::ALL)], &params, &mut ReadReport::default());
                assert_eq!(
                    matches!(out, ReadOutcome::SerializationFailure { .. }),
                    fails,
                    "{name} ({mode:?}): {out:?}"
                );
                assert_eq!(env.refreshed, refreshes, "{name} ({mode:?})");
            }
        }
    }
}
