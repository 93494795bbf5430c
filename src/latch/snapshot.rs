//! What a reader's snapshot says about a latch holder.
//!
//! A latch conflicts with a read only when its holder was *in progress* at the
//! read's snapshot: listed in the snapshot's in-progress set (`xip`), hence
//! below `xmax`.  Postgres's own "xid in snapshot" test also answers true for
//! xids at or above `xmax`; those writers started after the snapshot and are
//! simply ordered after the read, so they must not conflict.
//!
//! `pulled` lists holders whose outcome the reader has since waited for and
//! folded into its snapshot (see validate.rs): they no longer conflict, and
//! may include writers that started after the snapshot when the reader must
//! show them to stay consistent.

use super::xid::Xid;

#[derive(Clone, Copy, Debug)]
pub struct ReadSnapshot<'a> {
    pub xmin: Xid,
    pub xmax: Xid,
    /// Top-level xids in progress at the snapshot, sorted by raw value.
    pub xip: &'a [Xid],
    /// Holders the reader has waited for and now sees, in `xip` or at or
    /// above `xmax` (sorted by raw value).
    pub pulled: &'a [Xid],
    /// The reader's own top-level xid, if it has one: its latches never conflict.
    pub own: Xid,
}

fn contains(sorted: &[Xid], x: Xid) -> bool {
    sorted.binary_search_by_key(&x.0, |v| v.0).is_ok()
}

impl<'a> ReadSnapshot<'a> {
    /// Sorts `xip` in place and builds a snapshot view over it.
    pub fn new(xmin: Xid, xmax: Xid, xip: &'a mut [Xid], own: Xid) -> ReadSnapshot<'a> {
        xip.sort_unstable_by_key(|x| x.0);
        ReadSnapshot {
            xmin,
            xmax,
            xip,
            pulled: &[],
            own,
        }
    }

    /// Held by a transaction the reader cannot see and that was running when
    /// the snapshot was taken: the only kind of holder that conflicts.
    pub fn in_flight(&self, x: Xid) -> bool {
        x != self.own && contains(self.xip, x) && !contains(self.pulled, x)
    }

    /// Started after the snapshot and not pulled in: ordered after the read.
    pub fn is_after(&self, x: Xid) -> bool {
        x != self.own && x.follows_or_equals(self.xmax) && !contains(self.pulled, x)
    }

    pub fn is_pulled(&self, x: Xid) -> bool {
        contains(self.pulled, x)
    }

    /// In-flight xids inside `[lo, hi]` (for coalesced tombstones, which
    /// only remember an xid interval).
    pub fn in_flight_between(&self, lo: Xid, hi: Xid) -> impl Iterator<Item = Xid> + '_ {
        self.xip
            .iter()
            .copied()
            .filter(move |&x| !x.precedes(lo) && !hi.precedes(x) && self.in_flight(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_rule_table() {
        let mut xip = [Xid(120), Xid(105)];
        let mut snap = ReadSnapshot::new(Xid(100), Xid(130), &mut xip, Xid(110));
        let pulled = [Xid(105)];
        // (holder, in_flight, after)
        let cases = [
            (Xid(90), false, false),  // committed before the snapshot
            (Xid(120), true, false),  // listed in xip
            (Xid(125), false, false), // below xmax, not listed: finished
            (Xid(130), false, true),  // at xmax: started after the snapshot
            (Xid(500), false, true),
            (Xid(110), false, false), // the reader itself
        ];
        for (x, inflight, after) in cases {
            assert_eq!(snap.in_flight(x), inflight, "{x:?}");
            assert_eq!(snap.is_after(x), after, "{x:?}");
        }
        assert!(snap.in_flight(Xid(105)));
        snap.pulled = &pulled;
        assert!(!snap.in_flight(Xid(105)));
        assert!(snap.is_pulled(Xid(105)));
        let between: Vec<_> = snap.in_flight_between(Xid(100), Xid(125)).collect();
        assert_eq!(between, vec![Xid(120)]);
    }
}
