//! What one transaction holds, kept by its own backend (process-local): the
//! span latches that cover later writes, and the point latches taken since
//! the last escalation.  The latch table consults it so that a write inside
//! a span the transaction already latched takes no new latch, and so that
//! many point latches in one table collapse into one span (escalation, as a
//! lock manager does).
//!
//! Every latch it records carries the subtransaction it was published in
//! (PostgreSQL's SubTransactionId; 0 and 1 mean the top level): when a
//! subtransaction rolls back, the latches published inside it — or inside
//! its children — stand for writes that never happened and go
//! ([`crate::Writer::release_subxact`]).  An escalated span is tagged with the
//! outermost subtransaction among what it replaced, so a span that also
//! stands for its parent's writes stays.

use super::region::RelId;
use super::span::Span;

/// When a transaction's latches get replaced by span latches.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Point latches on one table before they become one span latch; also
    /// the span latch entries on one table before those become one.
    pub escalate_points: u32,
    /// Latch entries one transaction may hold (a span latch takes one per
    /// latch range it crosses); over it, every table escalates, and if that
    /// is not enough the write fails.
    pub per_transaction: u32,
    /// Latch entries all transactions of one role may hold together (0: no
    /// limit), checked every [`ROLE_CHECK_EVERY`] entries a transaction
    /// publishes (escalation's included, whatever escalation withdrew in
    /// between); over it, the transaction escalates, then fails.
    pub per_role: u32,
}

impl Limits {
    pub const DEFAULT: Limits = Limits { escalate_points: 1024, per_transaction: 8192, per_role: 0 };
    /// No limit at all (inside a key draw, which must not fail late).
    pub const NONE: Limits = Limits { escalate_points: u32::MAX, per_transaction: u32::MAX, per_role: 0 };
}

/// How many entries a transaction publishes between looks at its role's
/// total: one role can overshoot its budget by about this much per session
/// (plus the pieces of one multi-range publication).
pub const ROLE_CHECK_EVERY: u32 = 64;

/// The subtransaction tag of latches that only the end of the top-level
/// transaction releases (PostgreSQL's TopSubTransactionId).
pub const TOP_SUBXACT: u32 = 1;

/// What [`crate::Writer::latch`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Latched {
    /// A span latch the transaction holds already covers the write.
    Covered,
    /// A new latch; `max_load`, the load of the most crowded range it went into.
    Published { max_load: u32 },
}

/// A span latch and its entries (one per latch range it was entered in).
#[derive(Clone, Debug)]
pub(crate) struct Cover {
    pub span: Span,
    pub entries: Vec<u32>,
    /// The earliest publication number among them.
    pub seq_lo: u64,
    /// The outermost subtransaction it stands for a write of.
    pub sub: u32,
}

#[derive(Clone, Debug)]
pub(crate) struct TableHold {
    pub rel: RelId,
    pub covers: Vec<Cover>,
    /// Point latches since the last escalation, their hull and the
    /// earliest publication among them.
    pub points: Vec<u32>,
    /// The subtransaction each of `points` was published in.
    pub point_subs: Vec<u32>,
    pub points_hull: Span,
    pub points_seq_lo: u64,
    /// Entries of the span latches at which they are folded into one
    /// again: twice what the last such fold published, so a load whose
    /// span crosses many ranges refolds them geometrically rarely rather
    /// than on every escalation of its points.
    pub refold_at: usize,
}

impl TableHold {
    fn new(rel: RelId) -> TableHold {
        TableHold {
            rel,
            covers: Vec::new(),
            points: Vec::new(),
            point_subs: Vec::new(),
            points_hull: Span::EMPTY,
            points_seq_lo: u64::MAX,
            refold_at: 0,
        }
    }

    /// Records a point latch just published as `entries` in subtransaction
    /// `sub`; `first_seq` is the publication number of `entries[0]`.
    pub(crate) fn add_point(&mut self, span: &Span, entries: &[u32], sub: u32, first_seq: u64) {
        if entries.is_empty() {
            return;
        }
        self.points.extend_from_slice(entries);
        self.point_subs.extend(entries.iter().map(|_| sub));
        self.points_hull = self.points_hull.hull(span);
        // Publication numbers only grow: the first point is the earliest.
        if self.points_seq_lo == u64::MAX {
            self.points_seq_lo = first_seq;
        }
    }
}

/// One transaction's latches, as its backend knows them.  Cleared when the
/// transaction's latches are released.
#[derive(Default, Debug)]
pub struct Holdings {
    pub(crate) tables: Vec<TableHold>,
    /// Latch entries held.
    pub(crate) live: u32,
    /// Reused buffer for the entries of one publication.
    pub(crate) scratch: Vec<u32>,
    /// Entries published since the role's total was last looked at
    /// (escalation withdraws entries but never lowers this).
    pub(crate) unchecked: u32,
    /// The subtransaction new latches are published in.
    pub(crate) sub: u32,
    /// No latch recorded here is tagged with a later subtransaction.
    pub(crate) max_sub: u32,
    /// Escalation withdrew latches since [`Holdings::take_withdrawn`] was
    /// last asked: work for the maintainer (their ranges thin out).
    pub(crate) withdrawn: bool,
    /// Whether to keep [`Self::journal`].
    pub(crate) journaling: bool,
    /// Every latch published since the journal was last drained -- new
    /// latches and the spans escalation folded them into -- for a caller
    /// that tells standbys (a span already covered is not published).
    pub(crate) journal: Vec<(RelId, Span)>,
}

impl Holdings {
    pub fn new() -> Holdings {
        Holdings::default()
    }

    /// Whether escalation withdrew latches since the last call: the
    /// caller wakes a resting maintainer (rest.rs).
    pub fn take_withdrawn(&mut self) -> bool {
        std::mem::take(&mut self.withdrawn)
    }

    /// Latch entries the transaction holds.
    pub fn live(&self) -> u32 {
        self.live
    }

    /// Point latches the transaction holds on `rel` since its last
    /// escalation: load a range carries because of this writer alone.
    pub fn points_on(&self, rel: RelId) -> u32 {
        self.tables.iter().find(|t| t.rel == rel).map_or(0, |t| t.points.len() as u32)
    }

    /// Keeps a journal of the latches published from now on (or stops).
    pub fn set_journaling(&mut self, on: bool) {
        self.journaling = on;
        if !on {
            self.journal.clear();
        }
    }

    /// The latches published since the last drain, in publication order.
    pub fn drain_journal(&mut self) -> std::vec::Drain<'_, (RelId, Span)> {
        self.journal.drain(..)
    }

    pub(crate) fn note_published(&mut self, rel: RelId, span: &Span) {
        if self.journaling {
            self.journal.push((rel, *span));
        }
    }

    /// Forgets everything (the transaction's latches were released).
    pub fn clear(&mut self) {
        self.journal.clear();
        self.tables.clear();
        self.live = 0;
        self.unchecked = 0;
        self.max_sub = 0;
    }

    /// Sets the subtransaction the next latches are published in
    /// (PostgreSQL's current SubTransactionId; [`TOP_SUBXACT`] for latches
    /// that must last to the end of the top-level transaction).
    pub fn set_subxact(&mut self, sub: u32) {
        self.sub = sub;
    }

    /// Whether a rollback of subtransaction `sub` may have latches to
    /// release (cheap; may answer true when there are none).
    pub fn may_hold_from(&self, sub: u32) -> bool {
        self.live > 0 && sub > TOP_SUBXACT && self.max_sub >= sub
    }

    /// Latch entries the transaction holds on `rel` that escalation would
    /// fold: its point latches and the entries of its span latches.
    pub(crate) fn foldable(&mut self, rel: RelId) -> usize {
        let t = self.table(rel);
        t.points.len() + t.covers.iter().map(|c| c.entries.len()).sum::<usize>()
    }

    /// Latch entries of the transaction's span latches on `rel`.
    pub(crate) fn cover_entries(&mut self, rel: RelId) -> usize {
        self.table(rel).covers.iter().map(|c| c.entries.len()).sum()
    }

    pub(crate) fn table(&mut self, rel: RelId) -> &mut TableHold {
        match self.tables.iter().position(|t| t.rel == rel) {
            Some(i) => &mut self.tables[i],
            None => {
                self.tables.push(TableHold::new(rel));
                self.tables.last_mut().expect("just pushed")
            }
        }
    }
}
