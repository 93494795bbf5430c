//! The read side: which writers could a reader's snapshot have missed?
//!
//! A reader asks about a span (its declared span D before reading, or its
//! touched span T after).  A latch there conflicts when its holder was in
//! flight at the reader's snapshot — whether it is still held or already a
//! tombstone (a prerequisite released after the snapshot still conflicts).
//! What the reader does about them (wait, retry, cut its read short) is
//! protocol.rs's business.

use super::locks::LockSet;
use super::region::guard::{Directory, RangeAccess};
use super::region::{RelId, State};
use super::snapshot::ReadSnapshot;
use super::span::Span;
use super::table::LatchTable;
use super::xid::Xid;

/// A holder the reader's snapshot could have missed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub xid: Xid,
    /// Where: the table, and the checked span (the holder's latch may be
    /// wider).
    pub rel: RelId,
    pub span: Span,
    /// Where the holder's latch lies inside the checked span: a read that
    /// stops before it ([`super::protocol`]'s cut) no longer depends on it.
    pub at: Span,
    /// Still running (wait for it) or already committed (no wait needed).
    pub live: bool,
}

/// What a check found besides the conflicts it reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Check {
    /// Some conflict was reported.
    pub conflicted: bool,
}

impl Check {
    pub fn clean(&self) -> bool {
        !self.conflicted
    }
}

/// The parts of the key space a read depends on: spans of one or more
/// latched tables (a statement can read several, or one several times).
pub type Footprint = Vec<(RelId, Span)>;

impl<L: LockSet> LatchTable<'_, L> {
    /// Reports (through `on_conflict`, possibly more than once per xid) every
    /// holder of a latch overlapping `span` that `snap` saw in flight.
    ///
    /// `committed(x)` answers whether `x` has committed; it is asked only
    /// for xids folded into tombstone summaries, which remember xid intervals
    /// rather than xids.
    pub(crate) fn check(
        &self,
        rel: RelId,
        span: &Span,
        snap: &ReadSnapshot<'_>,
        committed: &dyn Fn(Xid) -> bool,
        on_conflict: &mut dyn FnMut(Conflict),
    ) -> Check {
        self.check_spans(rel, std::slice::from_ref(span), snap, committed, on_conflict)
    }

    /// [`Self::check`] over every span of a footprint, table by table.
    pub(crate) fn check_footprint(
        &self,
        fp: &[(RelId, Span)],
        snap: &ReadSnapshot<'_>,
        committed: &dyn Fn(Xid) -> bool,
        on_conflict: &mut dyn FnMut(Conflict),
    ) -> Check {
        // One guarded scan, one span: nearly every read.  Checked as is,
        // with no lists built for it.
        if let [(rel, span)] = fp {
            return self.check_spans(*rel, std::slice::from_ref(span), snap, committed, on_conflict);
        }
        let mut out = Check::default();
        let mut rels: Vec<RelId> = fp.iter().map(|(r, _)| *r).collect();
        rels.sort_unstable_by_key(|r| r.0);
        rels.dedup();
        let mut spans = Vec::new();
        for rel in rels {
            spans.clear();
            spans.extend(fp.iter().filter(|(r, _)| *r == rel).map(|(_, s)| *s));
            let c = self.check_spans(rel, &spans, snap, committed, on_conflict);
            out.conflicted |= c.conflicted;
        }
        out
    }

    fn check_spans(
        &self,
        rel: RelId,
        spans: &[Span],
        snap: &ReadSnapshot<'_>,
        committed: &dyn Fn(Xid) -> bool,
        on_conflict: &mut dyn FnMut(Conflict),
    ) -> Check {
        let mut out = Check::default();
        if spans.iter().all(Span::is_empty) {
            return out;
        }
        if let Some(fog) = self.fog() {
            for span in spans.iter().filter(|s| !s.is_empty()) {
                // No snapshot lists a writer below its own xmin.
                for xid in snap.in_flight_between(snap.xmin, Xid(fog.0.wrapping_sub(1))) {
                    out.conflicted = true;
                    on_conflict(Conflict { xid, rel, span: *span, at: *span, live: true });
                }
            }
        }
        let mut d = self.mem.dir_read();
        let Some(t) = d.find_table(rel) else {
            return out; // never latched
        };
        for span in spans.iter().filter(|s| !s.is_empty()) {
            for i in d.ranges_over(t, span) {
                let r = d.range_at(t, i);
                let g = d.range_read(r);
                let mut report = |c: Conflict| {
                    out.conflicted = true;
                    on_conflict(c);
                };
                self.check_latches(&*g, rel, span, snap, &mut report);
                check_summary(&*g, rel, span, snap, committed, &mut report);
            }
        }
        out
    }

    /// The latches of one range (held at least shared) that overlap `span`.
    fn check_latches(
        &self,
        g: &impl RangeAccess,
        rel: RelId,
        span: &Span,
        snap: &ReadSnapshot<'_>,
        report: &mut dyn FnMut(Conflict),
    ) {
        g.for_each_overlap(span, &mut |e| {
            let state = self.state(e);
            if state == State::Dead {
                return true; // aborted: its rows never existed
            }
            let data = g.data(e);
            if snap.in_flight(data.xid) {
                let at = data.span.intersect(span);
                report(Conflict { xid: data.xid, rel, span: *span, at, live: state == State::Live });
            }
            true
        });
    }
}

/// The tombstones folded into one range's summary: it remembers only an xid
/// interval, so every committed xid in it the snapshot saw in flight counts.
fn check_summary(
    g: &impl RangeAccess,
    rel: RelId,
    span: &Span,
    snap: &ReadSnapshot<'_>,
    committed: &dyn Fn(Xid) -> bool,
    report: &mut dyn FnMut(Conflict),
) {
    let s = &g.body().summary;
    if s.is_empty() || !s.span.overlaps(span) {
        return;
    }
    for x in snap.in_flight_between(s.xid_lo, s.xid_hi) {
        if committed(x) {
            report(Conflict { xid: x, rel, span: *span, at: s.span.intersect(span), live: false });
        }
    }
}
