//! What a reader's snapshot says about a latch holder.
//!
//! A latch conflicts with a read only when its holder was *in flight* at the
//! read's snapshot: it had started (had its xid) but not committed, so the
//! snapshot cannot see its writes.  Writers that started after the snapshot
//! are simply ordered after the read and must not conflict.
//!
//! Postgres (14 and later) sets a snapshot's `xmax` to one past the latest
//! *completed* xid, and lists in `xip` only running xids below it.  So an
//! xid at or above `xmax` is invisible but may well have been running when
//! the snapshot was taken (it is just newer than every finished one).  The
//! snapshot alone cannot tell; the reader also records `after`, the next
//! xid to be assigned, read just after the snapshot was taken: xids at or
//! above it started later.  Xids in `[xmax, after)` count as in flight —
//! conservative for the few that started in between.  (The shortcut "xid at
//! or above xmax means started after" holds only where xmax is the next
//! xid, as before Postgres 14; README.md, "Conflicts".)

use super::xid::Xid;

#[derive(Clone, Copy, Debug)]
pub struct ReadSnapshot<'a> {
    pub xmin: Xid,
    pub xmax: Xid,
    /// Top-level xids in progress at the snapshot below `xmax`, sorted by raw value.
    pub xip: &'a [Xid],
    /// Xids at or above this were assigned after the snapshot was taken.
    pub after: Xid,
    /// The reader's own top-level xid, if it has one: its latches never conflict.
    pub own: Xid,
}

fn contains(sorted: &[Xid], x: Xid) -> bool {
    sorted.binary_search_by_key(&x.0, |v| v.0).is_ok()
}

impl<'a> ReadSnapshot<'a> {
    /// Sorts `xip` in place and builds a snapshot view over it.
    pub fn new(xmin: Xid, xmax: Xid, xip: &'a mut [Xid], after: Xid, own: Xid) -> ReadSnapshot<'a> {
        xip.sort_unstable_by_key(|x| x.0);
        ReadSnapshot { xmin, xmax, xip, after, own }
    }

    /// Not visible to the snapshot because it had not finished: listed in
    /// `xip`, or at or above `xmax` but assigned before the snapshot.
    fn unseen_running(&self, x: Xid) -> bool {
        contains(self.xip, x) || (x.follows_or_equals(self.xmax) && x.precedes(self.after))
    }

    /// Held by a transaction the reader cannot see and that was running when
    /// the snapshot was taken: the only kind of holder that conflicts.
    pub fn in_flight(&self, x: Xid) -> bool {
        x != self.own && self.unseen_running(x)
    }

    /// In-flight xids inside `[lo, hi]` (for coalesced tombstones, which
    /// only remember an xid interval).
    pub fn in_flight_between(&self, lo: Xid, hi: Xid) -> impl Iterator<Item = Xid> + '_ {
        let tail_from = self.xmax.max(lo);
        let tail_len = if hi.precedes(tail_from) || !tail_from.precedes(self.after) {
            0
        } else {
            hi.min(Xid(self.after.0.wrapping_sub(1))).0.wrapping_sub(tail_from.0).wrapping_add(1)
        };
        let tail = (0..tail_len).map(move |i| Xid(tail_from.0.wrapping_add(i)));
        self.xip
            .iter()
            .copied()
            .filter(move |&x| !x.precedes(lo) && !hi.precedes(x))
            .chain(tail)
            .filter(move |&x| x.is_valid() && self.in_flight(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_rule_table() {
        let mut xip = [Xid(120), Xid(105)];
        // xmax 130 (one past the latest completed), next xid 133 when taken
        let snap = ReadSnapshot::new(Xid(100), Xid(130), &mut xip, Xid(133), Xid(110));
        // (holder, in_flight)
        let cases = [
            (Xid(90), false),  // committed before the snapshot
            (Xid(105), true),  // listed in xip
            (Xid(120), true),  // listed in xip
            (Xid(125), false), // below xmax, not listed: finished
            (Xid(130), true),  // at xmax but assigned before: running, unseen
            (Xid(132), true),
            (Xid(133), false), // assigned after the snapshot
            (Xid(500), false),
            (Xid(110), false), // the reader itself
        ];
        for (x, inflight) in cases {
            assert_eq!(snap.in_flight(x), inflight, "{x:?}");
        }
        let between: Vec<_> = snap.in_flight_between(Xid(100), Xid(125)).collect();
        assert_eq!(between, vec![Xid(105), Xid(120)]);
        let between: Vec<_> = snap.in_flight_between(Xid(121), Xid(140)).collect();
        assert_eq!(between, vec![Xid(130), Xid(131), Xid(132)]);
    }
}
