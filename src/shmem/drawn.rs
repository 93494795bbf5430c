//! Keys this transaction drew with `pgkvx.next_key` and has not written
//! yet.  A gapless table accepts a new key only from here: a key drawn any
//! other way (a client's own `nextval`, an explicit id, `COPY` with ids)
//! would be latched only when its row is written, after the id exists —
//! exactly the window gapless keys close.
//!
//! A key written inside a subtransaction that rolls back may be written
//! again: its latch, published when it was drawn, lasts to the end of the
//! top-level transaction.

use pgrx::pg_sys::{self, Oid, SubTransactionId};
use std::cell::RefCell;
use std::collections::BTreeMap;

/// The top-level transaction's subtransaction id (xact.h).
const TOP_SUBXACT: SubTransactionId = 1;

#[derive(Default)]
struct Drawn {
    /// Drawn and not yet written, per table, as disjoint inclusive
    /// intervals (a transaction drawing many keys mostly draws runs).
    free: crate::fast_hash::Map<Oid, BTreeMap<i64, i64>>,
    /// Written inside a subtransaction that is still open: given back if
    /// it rolls back.
    used: Vec<(SubTransactionId, Oid, i64)>,
}

impl Drawn {
    fn insert(&mut self, rel: Oid, k: i64) {
        let m = self.free.entry(rel).or_default();
        let below = m.range(..=k).next_back().map(|(&lo, &hi)| (lo, hi));
        let above = k.checked_add(1).and_then(|n| m.get(&n).map(|&hi| (n, hi)));
        match (below, above) {
            (Some((_, hi)), _) if hi >= k => {} // already there
            (Some((lo, hi)), Some((alo, ahi))) if hi.checked_add(1) == Some(k) => {
                m.remove(&alo);
                m.insert(lo, ahi);
            }
            (Some((lo, hi)), None) if hi.checked_add(1) == Some(k) => {
                m.insert(lo, k);
            }
            (_, Some((alo, ahi))) => {
                m.remove(&alo);
                m.insert(k, ahi);
            }
            _ => {
                m.insert(k, k);
            }
        }
    }

    fn remove(&mut self, rel: Oid, k: i64) -> bool {
        let Some(m) = self.free.get_mut(&rel) else { return false };
        let Some((lo, hi)) = m.range(..=k).next_back().map(|(&lo, &hi)| (lo, hi)) else { return false };
        if hi < k {
            return false;
        }
        m.remove(&lo);
        if lo < k {
            m.insert(lo, k - 1);
        }
        if k < hi {
            m.insert(k + 1, hi);
        }
        if m.is_empty() {
            self.free.remove(&rel);
        }
        true
    }
}

thread_local! {
    static DRAWN: RefCell<Drawn> = RefCell::new(Drawn::default());
}

/// Records a key this transaction drew (and latched) for `rel`.
pub fn record(rel: Oid, key: i64) {
    DRAWN.with(|d| d.borrow_mut().insert(rel, key));
}

/// Takes `key` for a row of `rel` being written: true when this
/// transaction drew it and has not written it yet.
pub fn take(rel: Oid, key: i64) -> bool {
    DRAWN.with(|d| {
        let mut d = d.borrow_mut();
        if !d.remove(rel, key) {
            return false;
        }
        // SAFETY: reads the current subtransaction's id.
        let sub = unsafe { pg_sys::GetCurrentSubTransactionId() };
        if sub != TOP_SUBXACT {
            d.used.push((sub, rel, key));
        }
        true
    })
}

/// Whether anything is recorded (the transaction callbacks then have work).
/// Panic-free.
pub fn pending() -> bool {
    DRAWN.try_with(|d| d.try_borrow().map_or(true, |d| !d.free.is_empty() || !d.used.is_empty())).unwrap_or(false)
}

/// A subtransaction ended: a rolled-back one's written keys may be written
/// again; a committed one's belong to its parent.
pub fn subxact_end(my: SubTransactionId, parent: SubTransactionId, aborted: bool) {
    DRAWN.with(|d| {
        let mut d = d.borrow_mut();
        let used = std::mem::take(&mut d.used);
        for (sub, rel, key) in used {
            if sub != my {
                d.used.push((sub, rel, key));
            } else if aborted {
                d.insert(rel, key);
            } else if parent != TOP_SUBXACT {
                d.used.push((parent, rel, key));
            }
        }
    });
}

/// The transaction ended.  Panic-free.
pub fn forget() {
    let _ = DRAWN.try_with(|d| {
        if let Ok(mut d) = d.try_borrow_mut() {
            *d = Drawn::default();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_merge_and_split() {
        let r = Oid::from(1);
        let mut d = Drawn::default();
        for k in [5, 7, 6, 10, 4] {
            d.insert(r, k);
        }
        assert_eq!(d.free[&r].iter().map(|(a, b)| (*a, *b)).collect::<Vec<_>>(), vec![(4, 7), (10, 10)]);
        assert!(d.remove(r, 6));
        assert!(!d.remove(r, 6), "taken once");
        assert!(!d.remove(r, 8), "never drawn");
        assert_eq!(d.free[&r].iter().map(|(a, b)| (*a, *b)).collect::<Vec<_>>(), vec![(4, 5), (7, 7), (10, 10)]);
        for k in [4, 5, 7, 10] {
            assert!(d.remove(r, k));
        }
        assert!(d.free.is_empty());
        d.insert(r, i64::MAX);
        d.insert(r, i64::MAX - 1);
        assert!(d.remove(r, i64::MAX) && d.remove(r, i64::MAX - 1));
    }
}
