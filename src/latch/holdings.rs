//! What one transaction holds, kept by its own backend (process-local): the
//! span latches that cover later writes, and the point latches taken since
//! the last escalation.  The latch table consults it so that a write inside
//! a span the transaction already latched takes no new latch, and so that
//! many point latches in one table collapse into one span (escalation, as a
//! lock manager does).

use super::locks::LockSet;
use super::region::RelId;
use super::span::Span;
use super::table::LatchTable;

/// When a transaction's latches get replaced by span latches.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Point latches on one table before they become one span latch.
    pub escalate_points: u32,
    /// Latch entries one transaction may hold (a span latch takes one per
    /// latch range it crosses); over it, every table escalates, and if that
    /// is not enough the write fails.
    pub per_transaction: u32,
}

impl Limits {
    pub const DEFAULT: Limits = Limits { escalate_points: 1024, per_transaction: 8192 };
}

/// What [`LatchTable::latch`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Latched {
    /// A span latch the transaction holds already covers the write.
    Covered,
    /// A new latch; `max_load` as [`LatchTable::acquire`] returns it.
    Published { max_load: u32 },
}

/// A span latch and its entries (one per latch range it was entered in).
#[derive(Clone, Debug)]
pub(crate) struct Cover {
    pub span: Span,
    pub entries: Vec<u32>,
    /// The earliest publication number among them.
    pub seq_lo: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct TableHold {
    pub rel: RelId,
    pub covers: Vec<Cover>,
    /// Point latches since the last escalation, their hull and the
    /// earliest publication among them.
    pub points: Vec<u32>,
    pub points_hull: Span,
    pub points_seq_lo: u64,
}

impl TableHold {
    fn new(rel: RelId) -> TableHold {
        TableHold { rel, covers: Vec::new(), points: Vec::new(), points_hull: Span::EMPTY, points_seq_lo: u64::MAX }
    }

    /// Records a point latch just published as `entries`.
    pub(crate) fn add_point<L: LockSet>(&mut self, span: &Span, entries: &[u32], t: &LatchTable<'_, L>) {
        if entries.is_empty() {
            return;
        }
        self.points.extend_from_slice(entries);
        self.points_hull = self.points_hull.hull(span);
        // Publication numbers only grow: the first point is the earliest.
        if self.points_seq_lo == u64::MAX {
            self.points_seq_lo = t.seq_hi(entries[0]);
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
}

impl Holdings {
    pub fn new() -> Holdings {
        Holdings::default()
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

    /// Forgets everything (the transaction's latches were released).
    pub fn clear(&mut self) {
        self.tables.clear();
        self.live = 0;
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
