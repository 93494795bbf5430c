//! The read side: which writers could a reader's snapshot have missed?
//!
//! A reader asks about a span (its declared span D before reading, or its
//! touched span T after).  A latch there conflicts when its holder was in
//! flight at the reader's snapshot — whether it is still held or already a
//! tombstone (a prerequisite released after the snapshot still conflicts).
//!
//! A reader that waits for its conflicting holders may fold their outcome
//! into its snapshot ("pull them in") instead of taking a fresh snapshot,
//! which would bring in new in-flight writers and could chase a busy table
//! for ever.  Pulling in must keep what the reader shows a prefix of the
//! latch publication order inside the span: when a writer that started after
//! the snapshot published a latch there *before* a pulled-in holder's latch,
//! that writer must be shown too.  With `next_key`, publication order is
//! key-draw order, and this is exactly "never show key 11 while hiding key
//! 10".  `check` reports such writers as conflicts with `after: true`; the
//! reader waits for them and pulls them in like the others.

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
    /// Started after the snapshot, but published before a pulled-in holder
    /// (so it must be pulled in too).
    pub after: bool,
}

/// What a check found besides the conflicts it reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Check {
    /// Some conflict was reported.
    pub conflicted: bool,
    /// Pulled-in holders would show a non-prefix of the latch order and the
    /// writers to add cannot be named (a huge coalesced xid interval): the
    /// reader must take a fresh snapshot.
    pub must_refresh: bool,
}

impl Check {
    pub fn clean(&self) -> bool {
        !self.conflicted && !self.must_refresh
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

    /// [`Self::check`] over every span of a footprint.  The publication-order
    /// rule applies per table across all of its spans: a writer that started
    /// after the snapshot and published anywhere in the table's spans before
    /// a pulled-in holder must be shown too, whichever span it is in.
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
            out.must_refresh |= c.must_refresh;
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
        let pulling = !snap.pulled.is_empty();
        // Latest publication by a pulled-in holder; latches of writers that
        // started after the snapshot (only collected when pulling in).
        let mut pulled_seq = 0u64;
        let mut after: Vec<(Xid, u64, bool, Span, Span)> = Vec::new();
        let mut after_ranges: Vec<(Xid, Xid, u64, Span)> = Vec::new();
        {
            let mut d = self.mem.dir_read();
            let Some(t) = d.find_table(rel) else {
                return out; // never latched
            };
            for span in spans.iter().filter(|s| !s.is_empty()) {
                for i in d.ranges_over(t, span) {
                    let r = d.range_at(t, i);
                    let g = d.range_read(r);
                    g.for_each_overlap(span, &mut |e| {
                        let state = self.state(e);
                        if state == State::Dead {
                            return true; // aborted: its rows never existed
                        }
                        let data = g.data(e);
                        let live = state == State::Live;
                        if snap.in_flight(data.xid) {
                            out.conflicted = true;
                            on_conflict(Conflict {
                                xid: data.xid,
                                rel,
                                span: *span,
                                at: data.span.intersect(span),
                                live,
                                after: false,
                            });
                        } else if snap.is_pulled(data.xid) {
                            pulled_seq = pulled_seq.max(self.seq_hi(e));
                        } else if pulling && snap.is_after(data.xid) {
                            after.push((data.xid, data.seq, live, *span, data.span.intersect(span)));
                        }
                        true
                    });
                    let s = &g.body().summary;
                    if !s.is_empty() && s.span.overlaps(span) {
                        for x in snap.in_flight_between(s.xid_lo, s.xid_hi) {
                            if committed(x) {
                                out.conflicted = true;
                                on_conflict(Conflict {
                                    xid: x,
                                    rel,
                                    span: *span,
                                    at: s.span.intersect(span),
                                    live: false,
                                    after: false,
                                });
                            }
                        }
                        if pulling {
                            if snap.pulled.iter().any(|&p| !p.precedes(s.xid_lo) && !s.xid_hi.precedes(p)) {
                                pulled_seq = pulled_seq.max(s.seq_hi);
                            }
                            if s.xid_hi.follows_or_equals(snap.xmax) {
                                after_ranges.push((s.xid_lo.max(snap.xmax), s.xid_hi, s.seq_lo, *span));
                            }
                        }
                    }
                }
            }
        }
        // Writers after the snapshot that published before something we
        // now show must be shown as well.
        for (xid, seq, live, span, at) in after {
            if seq < pulled_seq {
                out.conflicted = true;
                on_conflict(Conflict { xid, rel, span, at, live, after: true });
            }
        }
        for (lo, hi, seq_lo, span) in after_ranges {
            if seq_lo >= pulled_seq {
                continue;
            }
            let n = hi.0.wrapping_sub(lo.0);
            if n > 1 << 16 {
                out.must_refresh = true;
                continue;
            }
            for i in 0..=n {
                let x = Xid(lo.0.wrapping_add(i));
                if x.is_valid() && !snap.is_pulled(x) && x != snap.own && committed(x) {
                    out.conflicted = true;
                    on_conflict(Conflict { xid: x, rel, span, at: span, live: false, after: true });
                }
            }
        }
        out
    }
}
