//! Latch table tests: table-driven cases (each run in both orders where order
//! matters), a property test against a naive model, and a multi-threaded
//! stress test of the one invariant that matters.

use super::locks::std_locks::StdLocks;
use super::region::{Config, RelId};
use super::snapshot::ReadSnapshot;
use super::span::Span;
use super::table::{AcquireError, Holder, LatchTable, TxEnd};
use super::validate::Conflict;
use super::xid::Xid;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

pub(crate) fn table(cfg: Config) -> &'static LatchTable<'static, StdLocks> {
    super::locks::heap_table(cfg)
}

fn small() -> &'static LatchTable<'static, StdLocks> {
    table(Config { max_entries: 256, max_ranges: 16, max_tables: 8, max_backends: 8 })
}

const REL: RelId = RelId(0x0000_0001_0000_4000);
const OTHER_REL: RelId = RelId(0x0000_0001_0000_4001);

fn k(v: u16) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}
fn pt(v: u16) -> Span {
    Span::point(&k(v))
}
fn sp(a: u16, b: u16) -> Span {
    Span::new(&k(a), Some(&k(b)))
}
fn holder(x: u32) -> Holder {
    Holder { xid: Xid(x), pid: x as i32, now_us: 0, owner: 0, role: 0 }
}

/// Conflicting xids of `span` for a snapshot listing `xip` in progress.
fn conflicts_of(t: &LatchTable<'_, StdLocks>, rel: RelId, span: &Span, xip: &[u32], xmax: u32) -> BTreeSet<u32> {
    let mut xs: Vec<Xid> = xip.iter().map(|&x| Xid(x)).collect();
    let snap = ReadSnapshot::new(Xid(3), Xid(xmax), &mut xs, Xid(xmax), Xid::INVALID);
    let mut out = BTreeSet::new();
    t.check(rel, span, &snap, &|_| true, &mut |c: Conflict| {
        out.insert(c.xid.0);
    });
    out
}

fn set(xs: &[u32]) -> BTreeSet<u32> {
    xs.iter().copied().collect()
}

#[test]
fn overlap_cases_in_both_orders() {
    // (name, latch span, query span, conflicts)
    let cases: &[(&str, Span, Span, bool)] = &[
        ("same point", pt(10), pt(10), true),
        ("different points", pt(10), pt(11), false),
        ("spans that overlap", sp(10, 20), sp(19, 30), true),
        ("span ending where the query starts", sp(10, 20), sp(20, 30), false),
        ("span starting where the query ends", sp(20, 30), sp(10, 20), false),
        ("point inside a span", sp(10, 20), pt(15), true),
        ("everything latched", Span::ALL, pt(7), true),
        ("everything read", pt(7), Span::ALL, true),
        ("span unbounded above", Span::new(&k(100), None), pt(60000), true),
        ("span below, unbounded under", Span::new(&[], Some(&k(5))), pt(5), false),
        ("composite prefix covers its rows", Span::prefix(&[0, 1]), Span::point(&[0, 1, 0, 2]), true),
        ("composite prefix misses other prefixes", Span::prefix(&[0, 1]), Span::point(&[0, 2, 0, 1]), false),
        ("row inside a read prefix", Span::point(&[0, 1, 0, 2]), Span::prefix(&[0, 1]), true),
    ];
    for (name, latch, query, want) in cases {
        for reversed in [false, true] {
            let t = small();
            // A second, unrelated latch, published before or after the one
            // under test: the order must not matter.
            let other = Span::point(&k(50_000));
            let first = if reversed { (&other, 8) } else { (latch, 7) };
            let second = if reversed { (latch, 7) } else { (&other, 8) };
            t.acquire(first.1 - 7, REL, first.0, &holder(first.1)).unwrap();
            t.acquire(second.1 - 7, REL, second.0, &holder(second.1)).unwrap();
            let got = conflicts_of(t, REL, query, &[7, 8], 100).contains(&7);
            assert_eq!(got, *want, "{name} (other latch first: {reversed}): {latch:?} vs {query:?}");
        }
    }
}

#[test]
fn other_relations_never_conflict() {
    let t = small();
    t.acquire(0, REL, &Span::ALL, &holder(7)).unwrap();
    assert!(conflicts_of(t, OTHER_REL, &Span::ALL, &[7], 100).is_empty());
    assert_eq!(conflicts_of(t, REL, &Span::ALL, &[7], 100), set(&[7]));
}

#[test]
fn snapshot_rule_cases() {
    // (name, holder xid, snapshot xip, snapshot xmax, conflicts)
    let cases: &[(&str, u32, &[u32], u32, bool)] = &[
        ("in progress at the snapshot", 50, &[50], 60, true),
        ("committed before the snapshot", 50, &[], 60, false),
        ("at xmax: started after, ordered after", 60, &[], 60, false),
        ("above xmax", 70, &[50], 60, false),
        ("one of several in progress", 50, &[40, 50, 55], 60, true),
    ];
    for &(name, x, xip, xmax, want) in cases {
        let t = small();
        t.acquire(0, REL, &pt(1), &holder(x)).unwrap();
        assert_eq!(conflicts_of(t, REL, &pt(1), xip, xmax).contains(&x), want, "{name}");
    }
}

#[test]
fn running_writers_at_or_above_xmax_conflict_until_the_snapshot_was_taken() {
    // Postgres 14+: xmax is one past the latest completed xid, so a writer
    // newer than every finished transaction is running yet not in xip.
    let t = small();
    t.acquire(0, REL, &pt(1), &holder(60)).unwrap(); // running when the snapshot was taken
    t.acquire(1, REL, &pt(1), &holder(66)).unwrap(); // started afterwards
    let mut xs: [Xid; 0] = [];
    let snap = ReadSnapshot::new(Xid(40), Xid(60), &mut xs, Xid(65), Xid::INVALID);
    let mut seen = Vec::new();
    t.check(REL, &pt(1), &snap, &|_| true, &mut |c| seen.push(c.xid));
    assert_eq!(seen, vec![Xid(60)]);
}

#[test]
fn own_latches_never_conflict() {
    let t = small();
    t.acquire(0, REL, &pt(1), &holder(50)).unwrap();
    let mut xip = [Xid(50)];
    let snap = ReadSnapshot::new(Xid(40), Xid(60), &mut xip, Xid(60), Xid(50));
    let mut n = 0;
    t.check(REL, &pt(1), &snap, &|_| true, &mut |_| n += 1);
    assert_eq!(n, 0);
}

#[test]
fn released_after_snapshot_still_conflicts_then_reclaims() {
    for outcome in [TxEnd::Committed, TxEnd::Aborted] {
        let t = small();
        t.acquire(1, REL, &pt(5), &holder(50)).unwrap();
        // Reader's snapshot saw 50 in progress; 50 then ends.
        let before = t.free_entries();
        t.release_all(1, outcome);
        t.drain_released(1);
        let got = conflicts_of(t, REL, &pt(5), &[50], 60);
        match outcome {
            // A committed prerequisite released after the snapshot still conflicts...
            TxEnd::Committed => {
                assert_eq!(got, set(&[50]));
                let mut live = None;
                let mut xs = [Xid(50)];
                let snap = ReadSnapshot::new(Xid(3), Xid(60), &mut xs, Xid(60), Xid::INVALID);
                t.check(REL, &pt(5), &snap, &|_| true, &mut |c| live = Some(c.live));
                assert_eq!(live, Some(false), "a tombstone needs no wait");
                // ...until the horizon passes its holder: then it is reclaimed.
                t.set_horizon(Xid(50));
                t.reclaim_all(0);
                assert_eq!(t.free_entries(), before, "not before the horizon passes");
                t.set_horizon(Xid(51));
                t.reclaim_all(0);
                assert_eq!(t.free_entries(), before + 1);
            }
            // ...while an aborted one is gone at once.
            TxEnd::Aborted => {
                assert!(got.is_empty());
                assert_eq!(t.free_entries(), before + 1);
            }
        }
    }
}

#[test]
fn release_settles_at_once_unless_the_range_lock_is_busy() {
    use super::locks::{LockId, Mode};
    for outcome in [TxEnd::Committed, TxEnd::Aborted] {
        let t = small();
        let before = t.free_entries();
        // Free range lock: settled by the releaser, nothing left to drain.
        t.acquire(0, REL, &pt(1), &holder(50)).unwrap();
        t.release_all(0, outcome);
        assert_eq!(t.released_pending(), 0, "{outcome:?}");
        let freed = if outcome == TxEnd::Aborted { 1 } else { 0 };
        assert_eq!(t.free_entries(), before - 1 + freed, "{outcome:?}");
        // Busy range lock (a reader holds it): the release does not wait,
        // it leaves the entry for the next drain, and readers see the same
        // outcome before and after.
        t.acquire(0, REL, &pt(2), &holder(51)).unwrap();
        let r = t.ranges_of(REL)[0];
        {
            let _reader = crate::locks::Held::new(&t.mem.locks, LockId::Range(r), Mode::Shared);
            t.release_all(0, outcome);
        }
        assert_eq!(t.released_pending(), 1, "{outcome:?}");
        let seen = conflicts_of(t, REL, &pt(2), &[51], 60);
        t.drain_released(0);
        assert_eq!(t.released_pending(), 0, "{outcome:?}");
        assert_eq!(conflicts_of(t, REL, &pt(2), &[51], 60), seen, "{outcome:?}");
        assert_eq!(seen.is_empty(), outcome == TxEnd::Aborted, "{outcome:?}");
        assert_eq!(t.free_entries(), before - 2 + 2 * freed, "{outcome:?}");
    }
}

/// A table whose one range holds twenty latches (keys 1..=20, holder 60,
/// slot 1) and one more far right of them (key 100, holder 50, slot 0), so
/// a split moves that one; returns the table and that entry.
fn twenty_and_one_to_the_right() -> (&'static LatchTable<'static, StdLocks>, u32) {
    let t = small();
    for k in 1..=20 {
        t.acquire(1, REL, &pt(k), &holder(60)).unwrap();
    }
    t.acquire(0, REL, &pt(100), &holder(50)).unwrap();
    (t, t.backend(0).chain.load(Ordering::Relaxed))
}

#[test]
fn a_release_that_read_its_range_before_a_split_does_not_settle_there() {
    let (t, e) = twenty_and_one_to_the_right();
    let stale = t.entry(e).range.load(Ordering::Relaxed);
    let moved_to = t.split(0, stale).expect("split");
    assert_eq!(t.entry(e).range.load(Ordering::Relaxed), moved_to, "key 100 lies right of the split");
    // The settler's view from before the split: the lock is free, but the
    // entry is no longer in that range's tree.
    assert!(t.mem.try_lock_range_if_in(stale, e).is_none(), "stale range handed out");
    assert!(t.mem.try_lock_range_if_in(moved_to, e).is_some(), "current range refused");
    t.release_all(0, TxEnd::Committed);
    assert_eq!(t.released_pending(), 0, "settled in its current range");
    assert_eq!(conflicts_of(t, REL, &pt(100), &[50], 70), set(&[50]));
    assert_eq!(t.check_structure(REL), 21, "every latch in exactly one tree");
}

#[test]
fn a_split_waits_for_a_release_settling_in_the_range() {
    use std::sync::atomic::AtomicBool;
    let (t, e) = twenty_and_one_to_the_right();
    let r = t.entry(e).range.load(Ordering::Relaxed);
    let settling = t.mem.try_lock_range_of(e).expect("range lock free");
    static DONE: AtomicBool = AtomicBool::new(false);
    let splitter = std::thread::spawn(move || {
        let r2 = t.split(2, r);
        DONE.store(true, Ordering::SeqCst);
        r2
    });
    // Never a false failure: a split that waits is still waiting however
    // slow the machine; one that does not wait is done long before.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!DONE.load(Ordering::SeqCst), "split moved entries of a range a settler holds");
    drop(settling);
    assert!(splitter.join().unwrap().is_some(), "split after the settler let go");
    assert_eq!(t.check_structure(REL), 21);
}

#[test]
fn released_latches_drain_and_reclaim_as_the_horizon_passes() {
    // Releasing takes no lock; draining (the workers' job) moves tombstones
    // to their range, where expired ones are reclaimed on the way.
    let t = small();
    for x in 10..60u32 {
        t.acquire(0, REL, &pt(x as u16), &holder(x)).unwrap();
        t.release_all(0, TxEnd::Committed);
        t.set_horizon(Xid(x)); // everything before x is gone from all snapshots
        t.drain_released(1);
    }
    let used = t.usage().entries_used;
    assert!(used < 10, "tombstones piled up: {used}");
}

#[test]
fn capacity_exhaustion_and_recovery() {
    let t = table(Config { max_entries: 8, max_ranges: 4, max_tables: 4, max_backends: 4 });
    for i in 0..8u16 {
        t.acquire(0, REL, &pt(i), &holder(100)).unwrap();
    }
    assert_eq!(t.acquire(1, REL, &pt(100), &holder(101)), Err(AcquireError::Full));
    assert_eq!(t.stats()[super::stats::Stat::LatchTableFull as usize], 1);
    // The full transaction aborts; its holder's latches all go.
    assert_eq!(t.release_all(0, TxEnd::Aborted), 8);
    t.drain_released(0);
    assert_eq!(t.free_entries(), 8);
    t.acquire(1, REL, &pt(100), &holder(101)).unwrap();
    // Committed tombstones pinned by an old snapshot fill the table...
    t.release_all(1, TxEnd::Committed);
    for x in 0..7u32 {
        t.acquire(2, REL, &pt(x as u16), &holder(200 + x)).unwrap();
        t.release_all(2, TxEnd::Committed);
    }
    assert_eq!(t.acquire(3, REL, &pt(9), &holder(300)), Err(AcquireError::Full));
    // ...until pressure relief coalesces them: space comes back, and a reader
    // whose snapshot saw one of them in flight still conflicts.
    assert!(t.relieve_pressure(3) > 0);
    t.acquire(3, REL, &pt(9), &holder(300)).unwrap();
    assert_eq!(conflicts_of(t, REL, &pt(3), &[203], 400), set(&[203]));
    assert!(conflicts_of(t, REL, &pt(3), &[], 400).is_empty());
    // Coalescing widens, it never narrows: a neighbour now conflicts too.
    assert_eq!(conflicts_of(t, REL, &pt(2), &[203], 400), set(&[203]));
}

/// The tree-node pool is sized by a bound (tree::pool_size), not grown: a
/// full table split into as many ranges as it can take must fit, and every
/// node must come back once the latches go.
#[test]
fn tree_node_pool_holds_a_full_table_in_any_split() {
    let cfg = Config { max_entries: 4000, max_ranges: 128, max_tables: 2, max_backends: 2 };
    let t = table(cfg);
    let pool = t.free_tree_nodes();
    assert_eq!(pool, cfg.tree_nodes());
    // Ascending keys leave every split leaf as empty as the tree allows.
    let mut n = 0;
    while t.acquire(0, REL, &pt(n as u16), &holder(100)).is_ok() {
        n += 1;
        if n % 64 == 0 {
            for r in t.ranges_of(REL) {
                t.split(0, r);
            }
        }
    }
    assert_eq!(n, cfg.max_entries, "the entries ran out first, not the nodes");
    assert!(t.ranges_of(REL).len() > 64, "split into many small ranges");
    assert_eq!(t.check_structure(REL), n as usize);
    assert_eq!(t.release_all(0, TxEnd::Aborted), n);
    t.drain_released(0);
    assert_eq!(t.check_structure(REL), 0);
    assert_eq!(t.free_tree_nodes(), pool, "every tree node back in the pool");
}

#[test]
fn coalesced_summary_asks_whether_the_holder_committed() {
    let t = small();
    t.acquire(0, REL, &pt(1), &holder(50)).unwrap();
    t.release_all(0, TxEnd::Committed);
    t.coalesce(0, t.ranges_of(REL)[0]); // drains first
    let mut xs = [Xid(50), Xid(52)];
    let snap = ReadSnapshot::new(Xid(40), Xid(60), &mut xs, Xid(60), Xid::INVALID);
    let mut seen = Vec::new();
    // 52 lies in no tombstone's interval; 50 did not commit per the oracle.
    t.check(REL, &pt(1), &snap, &|x| x == Xid(52), &mut |c| seen.push(c.xid));
    assert!(seen.is_empty());
    t.check(REL, &pt(1), &snap, &|x| x == Xid(50), &mut |c| seen.push(c.xid));
    assert_eq!(seen, vec![Xid(50)]);
}

#[test]
fn wide_latches_span_every_range_they_cross() {
    let t = table(Config { max_entries: 512, max_ranges: 16, max_tables: 4, max_backends: 4 });
    for i in 0..200u16 {
        t.acquire(0, REL, &pt(i * 10), &holder(100)).unwrap();
    }
    let r = t.ranges_of(REL)[0];
    let r2 = t.split(0, r).expect("split");
    assert_eq!(t.ranges_of(REL), vec![r, r2]);
    t.split(0, r2).expect("split again");
    assert_eq!(t.ranges_of(REL).len(), 3);
    // A span across every range conflicts with a point in each of them.
    t.acquire(1, REL, &Span::ALL, &holder(101)).unwrap();
    for i in [0u16, 700, 1500, 1990] {
        assert_eq!(conflicts_of(t, REL, &pt(i), &[100, 101], 200), set(&[100, 101]), "key {i}");
        assert_eq!(conflicts_of(t, REL, &pt(i + 1), &[100, 101], 200), set(&[101]), "key {}", i + 1);
    }
    // Releasing works whatever range each piece ended up in.
    t.release_all(1, TxEnd::Aborted);
    t.release_all(0, TxEnd::Aborted);
    t.drain_released(0);
    assert_eq!(t.free_entries(), 512);
}

#[test]
fn split_and_merge_preserve_every_conflict() {
    let t = table(Config { max_entries: 1024, max_ranges: 16, max_tables: 4, max_backends: 4 });
    // Live latches, tombstones and a wide latch, from several holders.
    for i in 0..300u16 {
        let x = 100 + u32::from(i % 5);
        t.acquire(i as u32 % 4, REL, &pt(i * 3), &holder(x)).unwrap_or_else(|e| panic!("{e:?}"));
        if i % 7 == 0 {
            t.release_all(i as u32 % 4, TxEnd::Committed);
        }
    }
    let snapshot_of = |t: &LatchTable<'_, StdLocks>| {
        (0..900u16).map(|i| conflicts_of(t, REL, &pt(i), &[100, 101, 102, 103, 104], 200)).collect::<Vec<_>>()
    };
    let before = snapshot_of(t);
    let r = t.ranges_of(REL)[0];
    let r2 = t.split(0, r).unwrap();
    let _r3 = t.split(0, r2).unwrap();
    assert_eq!(snapshot_of(t), before, "after splits");
    let rs = t.ranges_of(REL);
    assert!(t.merge(0, rs[0], rs[1]));
    assert!(!t.merge(0, rs[0], rs[2]) || t.ranges_of(REL).len() == 1);
    assert_eq!(snapshot_of(t), before, "after merges");
    for slot in 0..4 {
        t.release_all(slot, TxEnd::Aborted);
    }
}

#[test]
fn purge_waits_for_live_latches_and_keeps_what_snapshots_need() {
    let t = small();
    let nodes = t.free_tree_nodes();
    // An unrelated latch first, so entry and node ids differ; then enough
    // tombstones for a tree of several nodes.
    t.acquire(1, OTHER_REL, &pt(1), &holder(49)).unwrap();
    for v in 0..40 {
        t.acquire(0, REL, &pt(v * 7 % 40), &holder(50)).unwrap();
    }
    assert!(!t.purge_table(0, REL), "a live latch blocks the purge");
    t.release_all(0, TxEnd::Committed);
    // A snapshot taken while 50 ran may still be reading: its tombstones
    // outlive the purge (the table may be latched again under it).
    t.set_horizon(Xid(45));
    assert!(t.purge_table(0, REL));
    assert_eq!(conflicts_of(t, REL, &pt(1), &[50], 60), set(&[50]));
    assert_eq!(t.usage().tables_used, 2);
    // Once no snapshot can see 50 in flight, the purge frees everything.
    t.set_horizon(Xid(51));
    assert!(t.purge_table(0, REL));
    assert_eq!(t.usage().tables_used, 1);
    assert_eq!(t.free_entries(), 255);
    t.release_all(1, TxEnd::Aborted);
    t.drain_released(1);
    assert_eq!(t.free_tree_nodes(), nodes, "the purged trees' nodes are back in the pool");
    assert!(conflicts_of(t, REL, &pt(1), &[50], 60).is_empty());
}

#[test]
fn too_many_tables_is_reported() {
    let t = table(Config { max_entries: 64, max_ranges: 16, max_tables: 2, max_backends: 2 });
    t.acquire(0, RelId::new(1, 1), &pt(1), &holder(10)).unwrap();
    t.acquire(0, RelId::new(1, 2), &pt(1), &holder(10)).unwrap();
    assert_eq!(t.acquire(0, RelId::new(1, 3), &pt(1), &holder(10)), Err(AcquireError::TooManyTables));
}

#[test]
fn a_table_slot_freed_as_idle_while_it_is_created_still_gets_the_latch() {
    // One thread latches tables that have no slot yet (so every acquire
    // creates one); another frees idle, empty slots as fast as it can.  An
    // acquire that used a slot the collector freed between creating it and
    // publishing would return Ok with nothing published.
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let t = table(Config { max_entries: 64, max_ranges: 256, max_tables: 64, max_backends: 2 });
    let done = Arc::new(AtomicBool::new(false));
    let collector = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut freed = 0u64;
            while !done.load(Ordering::Relaxed) {
                freed += u64::from(t.gc_idle_tables());
            }
            freed
        })
    };
    for i in 0..5_000u32 {
        let rel = RelId::new(9, 1000 + i);
        // Slots free up only as fast as the collector finds them idle.
        while let Err(e) = t.acquire(0, rel, &pt(1), &holder(10)) {
            assert_eq!(e, AcquireError::TooManyTables);
            std::thread::yield_now();
        }
        let found = conflicts_of(t, rel, &pt(1), &[10], 100);
        assert_eq!(found, set(&[10]), "round {i}: the latch was not published");
        t.release_all(0, TxEnd::Aborted);
        t.drain_released(0);
    }
    done.store(true, Ordering::Relaxed);
    assert!(collector.join().unwrap() > 0, "the collector never freed a slot: the race was not exercised");
}

#[test]
fn splits_leave_a_range_for_every_table_slot_still_free() {
    let t = table(Config { max_entries: 256, max_ranges: 8, max_tables: 4, max_backends: 2 });
    for i in 0..100u16 {
        t.acquire(0, REL, &pt(i * 10), &holder(7)).unwrap();
    }
    for _ in 0..10 {
        for r in t.ranges_of(REL) {
            t.split(0, r);
        }
    }
    assert_eq!(t.ranges_of(REL).len(), 5, "8 ranges, 3 kept for the other slots");
    for rel in 1..4u32 {
        t.acquire(0, RelId::new(2, rel), &pt(1), &holder(7)).unwrap();
    }
    t.release_all(0, TxEnd::Aborted);
}

mod model {
    //! The table against a naive model: a Vec of (span, xid, committed).
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Acquire { slot: u8, a: u16, len: u16 },
        End { slot: u8, commit: bool },
        Horizon,
        Check { a: u16, len: u16, mask: u8 },
        Split,
        Merge,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (0u8..4, 0u16..500, 0u16..30).prop_map(|(slot, a, len)| Op::Acquire { slot, a, len }),
            2 => (0u8..4, any::<bool>()).prop_map(|(slot, commit)| Op::End { slot, commit }),
            1 => Just(Op::Horizon),
            4 => (0u16..500, 0u16..80, any::<u8>()).prop_map(|(a, len, mask)| Op::Check { a, len, mask }),
            1 => Just(Op::Split),
            1 => Just(Op::Merge),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn matches_naive_model(ops in proptest::collection::vec(op(), 1..150)) {
            let t = table(Config { max_entries: 4096, max_ranges: 32, max_tables: 4, max_backends: 4 });
            // Model: every latch ever published that is live or a tombstone.
            let mut latches: Vec<(Span, u32, bool)> = Vec::new(); // span, xid, live
            let mut xid_of = [0u32; 4];
            let mut next_xid = 10u32;
            let mut horizon = 3u32;
            for op in ops {
                match op {
                    Op::Acquire { slot, a, len } => {
                        let s = slot as usize;
                        if xid_of[s] == 0 { xid_of[s] = next_xid; next_xid += 1; }
                        let span = if len == 0 { pt(a) } else { sp(a, a + len) };
                        t.acquire(slot as u32, REL, &span, &holder(xid_of[s])).unwrap();
                        latches.push((span, xid_of[s], true));
                    }
                    Op::End { slot, commit } => {
                        let x = xid_of[slot as usize];
                        if x == 0 { continue; }
                        t.release_all(slot as u32, if commit { TxEnd::Committed } else { TxEnd::Aborted });
                        if commit {
                            for l in latches.iter_mut().filter(|l| l.1 == x) { l.2 = false; }
                        } else {
                            latches.retain(|l| l.1 != x);
                        }
                        xid_of[slot as usize] = 0;
                    }
                    Op::Horizon => {
                        // Everything finished so far may be forgotten.
                        horizon = xid_of.iter().copied().filter(|&x| x != 0).min().unwrap_or(next_xid);
                        t.set_horizon(Xid(horizon));
                        t.reclaim_all(0);
                    }
                    Op::Check { a, len, mask } => {
                        // A snapshot taken now-ish: in progress = a subset of
                        // xids at or after the horizon (a valid snapshot never
                        // lists anything older).
                        let xip: Vec<u32> = (horizon..next_xid).filter(|x| mask & (1 << (x % 8)) != 0).collect();
                        let q = if len == 0 { pt(a) } else { sp(a, a + len) };
                        let got = conflicts_of(t, REL, &q, &xip, next_xid);
                        let want: BTreeSet<u32> = latches.iter()
                            .filter(|l| l.0.overlaps(&q) && xip.contains(&l.1))
                            .map(|l| l.1).collect();
                        prop_assert_eq!(got, want);
                    }
                    Op::Split => {
                        for r in t.ranges_of(REL) { t.split(0, r); }
                    }
                    Op::Merge => {
                        for pair in t.ranges_of(REL).chunks(2).filter(|p| p.len() == 2) {
                            t.merge(0, pair[0], pair[1]);
                        }
                    }
                }
                t.check_structure(REL);
            }
            for slot in 0..4 { t.release_all(slot, TxEnd::Aborted); }
        }
    }
}

fn st_escalated(t: &LatchTable<'_, StdLocks>) -> u64 {
    t.stats()[crate::stats::Stat::LatchesEscalated as usize]
}

mod stress {
    //! Writers, readers and a horizon keeper on real threads.  A simulated
    //! procarray hands out xids and snapshots exactly as Postgres does; the
    //! invariant checked: a reader validating a span finds every holder its
    //! snapshot saw in flight that had published a latch there before the
    //! check began — live or already committed.
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct ProcArray {
        next: u32,
        running: BTreeSet<u32>,
        reader_xmin: Option<u32>,
        /// (xid, key) published, in publication order.
        published: Vec<(u32, u16)>,
        /// Holders that decided to abort (their latches may vanish).
        aborted: BTreeSet<u32>,
    }

    #[test]
    fn readers_never_miss_an_in_flight_holder() {
        let t = table(Config { max_entries: 4096, max_ranges: 64, max_tables: 4, max_backends: 16 });
        t.set_range_max_latches(64);
        let pa = Arc::new(Mutex::new(ProcArray { next: 100, ..Default::default() }));
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for w in 0..4u32 {
            let (pa, stop) = (pa.clone(), stop.clone());
            handles.push(std::thread::spawn(move || {
                let mut rnd = 0x9E37_79B9u32.wrapping_mul(w + 1);
                let mut n = 0;
                // Escalating after a few writes puts span latches (and the
                // withdrawal of what they replace) in the race too.
                let limits = crate::holdings::Limits { escalate_points: 3, per_transaction: 64, per_role: 0 };
                let mut held = crate::holdings::Holdings::new();
                while !stop.load(Ordering::Relaxed) {
                    rnd ^= rnd << 13;
                    rnd ^= rnd >> 17;
                    rnd ^= rnd << 5;
                    let x = {
                        let mut p = pa.lock().unwrap();
                        let x = p.next;
                        p.next += 1;
                        p.running.insert(x);
                        x
                    };
                    for j in 0..(1 + rnd % 3) {
                        let key = ((rnd >> 8) as u16).wrapping_add(j as u16 * 7) % 2000;
                        match t.latch(w, &mut held, REL, &pt(key), &holder(x), &limits) {
                            Ok(_) => pa.lock().unwrap().published.push((x, key)),
                            Err(_) => {
                                t.relieve_pressure(w);
                            }
                        }
                    }
                    std::thread::yield_now();
                    let commit = !rnd.is_multiple_of(10);
                    if commit {
                        // Commit becomes visible first, then latches release.
                        pa.lock().unwrap().running.remove(&x);
                        t.release_all(w, TxEnd::Committed);
                    } else {
                        pa.lock().unwrap().aborted.insert(x);
                        t.release_all(w, TxEnd::Aborted);
                        pa.lock().unwrap().running.remove(&x);
                    }
                    held.clear();
                    n += 1;
                }
                n
            }));
        }
        // Horizon keeper: oldest of running xids and readers' xmins.
        {
            let (pa, stop) = (pa.clone(), stop.clone());
            handles.push(std::thread::spawn(move || {
                let mut round = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let h = {
                        let p = pa.lock().unwrap();
                        p.running.iter().copied().chain(p.reader_xmin).min().unwrap_or(p.next)
                    };
                    t.set_horizon(Xid(h));
                    // Drain, reclaim, split and merge while readers check:
                    // alternate rounds split every range that can be split
                    // and merge neighbours back.
                    t.reclaim_all(8);
                    round += 1;
                    let ranges = t.ranges_of(REL);
                    if !round.is_multiple_of(4) {
                        for r in ranges {
                            t.split(8, r);
                        }
                    } else {
                        for pair in ranges.windows(2).step_by(2) {
                            t.merge(8, pair[0], pair[1]);
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                0
            }));
        }
        let mut checked = 0u64;
        // Count-driven: as many holders checked on a slow machine as on a
        // fast one, however the threads get scheduled (the round cap only
        // ends a run whose writers never get to publish).
        let mut rounds = 0u64;
        // Also until the writers have run a few hundred transactions: on a
        // busy machine the reader can finish its checks while they starve.
        let started = |pa: &Mutex<ProcArray>| pa.lock().unwrap().next - 100;
        while (checked < 30_000 || started(&pa) < 300) && rounds < 10_000_000 {
            rounds += 1;
            // Take a snapshot: xmin registered atomically with it.
            let (xmax, xip) = {
                let mut p = pa.lock().unwrap();
                let xip: Vec<u32> = p.running.iter().copied().collect();
                p.reader_xmin = Some(xip.first().copied().unwrap_or(p.next));
                (p.next, xip)
            };
            std::thread::yield_now();
            // Publications by in-flight-at-snapshot holders known now, i.e.
            // before the check begins.
            let expected: Vec<(u32, u16)> = {
                let p = pa.lock().unwrap();
                p.published.iter().copied().filter(|(x, _)| xip.contains(x)).collect()
            };
            for (x, key) in expected {
                let got = conflicts_of(t, REL, &pt(key), &xip, xmax);
                // Aborted holders may vanish from the table; everyone else
                // must be found.
                let aborted = pa.lock().unwrap().aborted.contains(&x);
                assert!(got.contains(&x) || aborted, "missed holder {x} on key {key}");
                checked += 1;
            }
            pa.lock().unwrap().reader_xmin = None;
        }
        stop.store(true, Ordering::Relaxed);
        let txns: u32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(checked >= 30_000, "writers published too little to check: {checked} in {rounds} rounds");
        assert!(st_escalated(t) > 0, "no escalation raced the readers");
        let st = t.stats();
        assert!(st[super::super::stats::Stat::RangeSplits as usize] > 0, "no split raced the readers");
        assert!(st[super::super::stats::Stat::RangeMerges as usize] > 0, "no merge raced the readers");
        assert!(txns > 100, "too few transactions: {txns}");
        // Everything ended: only tombstones remain, and they all go once
        // the horizon passes.
        t.set_horizon(Xid(pa.lock().unwrap().next));
        t.reclaim_all(0);
        let mut live = 0;
        t.for_each_latch(&mut |_| live += 1);
        assert_eq!(live, 0, "latches leaked");
        assert_eq!(t.check_structure(REL), 0, "entries left in the trees");
    }
}

mod escalation {
    //! Writes covered by a span the transaction holds, escalation of many
    //! point latches into one span, and the per-transaction budget.
    use super::*;
    use crate::holdings::{Holdings, Latched, Limits};

    fn latch(t: &LatchTable<'_, StdLocks>, h: &mut Holdings, slot: u32, span: &Span, x: u32, l: &Limits) -> Latched {
        t.latch(slot, h, REL, span, &holder(x), l).unwrap()
    }

    #[test]
    fn the_journal_lists_what_was_published_and_what_escalation_folded_it_into() {
        let t = small();
        let l = Limits { escalate_points: 4, per_transaction: 64, per_role: 0 };
        let mut h = Holdings::new();
        latch(t, &mut h, 0, &pt(1), 7, &l);
        assert_eq!(h.drain_journal().count(), 0, "nothing is journalled unless asked");
        h.set_journaling(true);
        latch(t, &mut h, 0, &sp(100, 200), 7, &l);
        latch(t, &mut h, 0, &pt(150), 7, &l); // covered: nothing new
        latch(t, &mut h, 0, &pt(2), 7, &l);
        latch(t, &mut h, 0, &pt(3), 7, &l);
        latch(t, &mut h, 0, &pt(4), 7, &l); // the fourth point: folded
        let j: Vec<Span> = h
            .drain_journal()
            .map(|(r, s)| {
                assert_eq!(r, REL);
                s
            })
            .collect();
        assert_eq!(j[..4], [sp(100, 200), pt(2), pt(3), pt(4)]);
        assert_eq!(j.len(), 5, "the escalated span follows: {j:?}");
        assert!(j[4].covers(&pt(1)) && j[4].covers(&pt(4)), "{:?}", j[4]);
        // Whatever the journal lists covers every key the transaction latched.
        for v in [1, 2, 3, 4, 150] {
            assert!(j.iter().any(|s| s.covers(&pt(v))), "{v}");
        }
        assert_eq!(h.drain_journal().count(), 0, "drained");
    }

    #[test]
    fn a_write_inside_a_span_its_transaction_holds_takes_no_new_latch() {
        let t = small();
        let l = Limits::DEFAULT;
        let mut h = Holdings::new();
        assert!(matches!(latch(t, &mut h, 0, &sp(10, 20), 7, &l), Latched::Published { .. }));
        let free = t.free_entries();
        assert_eq!(latch(t, &mut h, 0, &pt(15), 7, &l), Latched::Covered);
        assert_eq!(t.free_entries(), free, "a covered write used an entry");
        assert!(matches!(latch(t, &mut h, 0, &pt(25), 7, &l), Latched::Published { .. }));
        // Another transaction's span covers nothing of ours.
        let mut other = Holdings::new();
        assert!(matches!(latch(t, &mut other, 1, &pt(15), 8, &l), Latched::Published { .. }));
    }

    #[test]
    fn many_point_latches_become_one_span_that_conflicts_wherever_they_did() {
        let t = table(Config { max_entries: 256, max_ranges: 16, max_tables: 4, max_backends: 4 });
        let l = Limits { escalate_points: 16, per_transaction: 64, per_role: 0 };
        let mut h = Holdings::new();
        // 200 writes, far more than the table could hold one latch each.
        for i in 0..200u16 {
            latch(t, &mut h, 0, &pt(1000 + 3 * i), 7, &l);
            // At most 16 points and 16 span entries, then all fold into one.
            assert!(h.live() <= 2 * 16 + 1, "write {i}: {} entries held", h.live());
        }
        assert!(t.stats()[crate::stats::Stat::LatchesEscalated as usize] > 0);
        // Every key written, and the keys between, conflict for a reader
        // that saw 7 in flight; keys outside the hull do not.
        for key in [1000, 1001, 1300, 1597] {
            assert_eq!(conflicts_of(t, REL, &pt(key), &[7], 100), set(&[7]), "key {key}");
        }
        assert!(conflicts_of(t, REL, &pt(999), &[7], 100).is_empty());
        assert!(conflicts_of(t, REL, &pt(1598), &[7], 100).is_empty());
        // Committed, then reclaimed: nothing leaks.
        t.release_all(0, TxEnd::Committed);
        h.clear();
        t.set_horizon(Xid(8));
        t.reclaim_all(0);
        assert_eq!(t.free_entries(), 256, "entries leaked");
    }

    #[test]
    fn the_transaction_budget_escalates_every_table_then_refuses() {
        let t = table(Config { max_entries: 512, max_ranges: 64, max_tables: 8, max_backends: 4 });
        let l = Limits { escalate_points: 1000, per_transaction: 10, per_role: 0 };
        let mut h = Holdings::new();
        // Points on three tables: over budget, each table escalates.
        for i in 0..12u16 {
            let rel = RelId::new(1, 100 + u32::from(i % 3));
            t.latch(0, &mut h, rel, &pt(i), &holder(7), &l).unwrap();
        }
        assert!(h.live() <= 10, "{}", h.live());
        // Split one table into many ranges, then latch across all of them:
        // escalation cannot bring that under 10 entries.
        let rel = RelId::new(1, 200);
        for i in 0..40u16 {
            t.acquire(1, rel, &pt(i * 100), &holder(8)).unwrap();
        }
        for _ in 0..4 {
            for r in t.ranges_of(rel) {
                t.split(1, r);
            }
        }
        assert!(t.ranges_of(rel).len() > 10);
        let mut h2 = Holdings::new();
        assert_eq!(t.latch(2, &mut h2, rel, &Span::ALL, &holder(9), &l), Err(AcquireError::TransactionBudget));
        // What was entered stays on the chain and goes at transaction end.
        t.release_all(2, TxEnd::Aborted);
        t.release_all(1, TxEnd::Aborted);
        t.release_all(0, TxEnd::Aborted);
        t.drain_released(0);
        assert_eq!(t.free_entries(), 512);
    }

    #[test]
    fn many_span_latches_escalate_like_points() {
        // Explicit spans (latch_span) count toward escalation too: one
        // transaction cannot crowd a range with thousands of them.
        let t = table(Config { max_entries: 512, max_ranges: 16, max_tables: 4, max_backends: 4 });
        let l = Limits { escalate_points: 16, per_transaction: 256, per_role: 0 };
        let mut h = Holdings::new();
        for i in 0..400u16 {
            t.latch(0, &mut h, REL, &sp(10 * i, 10 * i + 1), &holder(7), &l).unwrap();
            assert!(h.live() <= 17, "span {i}: {} entries held", h.live());
        }
        assert_eq!(conflicts_of(t, REL, &pt(2005), &[7], 100), set(&[7]), "inside the escalated hull");
        t.release_all(0, TxEnd::Aborted);
        t.drain_released(0);
        assert_eq!(t.free_entries(), 512);
    }

    #[test]
    fn a_load_across_many_ranges_refolds_rarely() {
        // Another transaction's latches split the table into many ranges;
        // a load in key order then escalates every few points.  Each fold
        // of all its spans publishes a piece per range crossed, so folding
        // again at every escalation would publish a quadratic number of
        // entries; the work must stay linear in the rows loaded.
        let t = table(Config { max_entries: 2048, max_ranges: 128, max_tables: 4, max_backends: 4 });
        let rel = RelId::new(1, 500);
        for i in 0..200u16 {
            t.acquire(1, rel, &pt(i * 300), &holder(8)).unwrap();
        }
        for _ in 0..6 {
            for r in t.ranges_of(rel) {
                t.split(1, r);
            }
        }
        assert!(t.ranges_of(rel).len() > 60, "{} ranges", t.ranges_of(rel).len());
        let acquired = |t: &LatchTable<'_, StdLocks>| t.stats()[crate::stats::Stat::LatchesAcquired as usize];
        let before = acquired(t);
        let l = Limits { escalate_points: 8, per_transaction: 1024, per_role: 0 };
        let mut h = Holdings::new();
        let rows = 20_000u32;
        for i in 0..rows {
            t.latch(0, &mut h, rel, &pt((i * 3) as u16), &holder(7), &l).unwrap();
        }
        let published = acquired(t) - before;
        assert!(published < 4 * u64::from(rows), "{published} entries published for {rows} rows");
        assert_eq!(conflicts_of(t, rel, &pt(30_000), &[7, 8], 100), set(&[7, 8]), "inside the load's span");
        t.release_all(0, TxEnd::Aborted);
        t.release_all(1, TxEnd::Aborted);
        t.drain_released(0);
        assert_eq!(t.free_entries(), 2048);
    }

    #[test]
    fn a_roles_sessions_share_one_budget() {
        // Three sessions of role 42, each well within its transaction's
        // budget, together over the role's: the one that looks while over
        // escalates, and fails when escalating cannot help.  Another role
        // writes on regardless.
        let t = table(Config { max_entries: 1024, max_ranges: 64, max_tables: 8, max_backends: 8 });
        let l = Limits { escalate_points: 10_000, per_transaction: 1000, per_role: 300 };
        let role = |x: u32, role: u32| Holder { role, ..holder(x) };
        let mut hs: Vec<Holdings> = (0..4).map(|_| Holdings::new()).collect();
        let mut refused = None;
        'writing: for i in 0..200u16 {
            for s in 0..3u32 {
                // Every session on its own table and keys far apart.
                let rel = RelId::new(1, 300 + s);
                let r = t.latch(s, &mut hs[s as usize], rel, &pt(i * 50), &role(10 + s, 42), &l);
                if let Err(e) = r {
                    refused = Some((e, i));
                    break 'writing;
                }
            }
        }
        let (e, at) = refused.expect("the role sessions were never held to its budget");
        assert_eq!(e, AcquireError::RoleBudget);
        assert!(t.role_live(42) <= 300 + 3 * crate::holdings::ROLE_CHECK_EVERY, "{}", t.role_live(42));
        assert!(at >= 90, "refused after only {at} writes per session");
        // Role 43 is not charged for 42's latches.
        let mut other = Holdings::new();
        t.latch(3, &mut other, RelId::new(1, 400), &pt(1), &role(20, 43), &l).unwrap();
        for s in 0..4 {
            t.release_all(s, TxEnd::Aborted);
        }
        assert_eq!(t.role_live(42), 0);
        t.drain_released(0);
        assert_eq!(t.free_entries(), 1024);
    }

    #[test]
    fn a_roles_budget_holds_however_its_transactions_escalate_and_regrow() {
        // Five sessions of role 42.  Each climbs to just under escalation on
        // one table (looking at the role's total on the way, while the
        // other sessions hold little), escalates it into one span, and then
        // regrows as many point latches on a second table.  Escalation
        // lowers a transaction's count, not what it took: the regrowth must
        // be looked at like any other growth, so the role's total never
        // goes over its budget by more than the documented slack.
        let t = table(Config { max_entries: 2048, max_ranges: 64, max_tables: 16, max_backends: 8 });
        let l = Limits { escalate_points: 200, per_transaction: 1000, per_role: 300 };
        let slack = 5 * crate::holdings::ROLE_CHECK_EVERY;
        let role = |x: u32| Holder { role: 42, ..holder(x) };
        let mut hs: Vec<Holdings> = (0..5).map(|_| Holdings::new()).collect();
        for phase in 0..2u32 {
            for s in 0..5u32 {
                let rel = RelId::new(1, 600 + 10 * phase + s);
                let n = if phase == 0 { 200 } else { 199 };
                for i in 0..n {
                    match t.latch(s, &mut hs[s as usize], rel, &pt(i * 7), &role(10 + s), &l) {
                        Ok(_) => {}
                        Err(e) => {
                            // Refused rather than let over: also fine.
                            assert_eq!(e, AcquireError::RoleBudget);
                            break;
                        }
                    }
                    let total = t.role_live(42);
                    assert!(total <= 300 + slack, "phase {phase}, session {s}, write {i}: role holds {total}");
                }
            }
        }
        assert!(t.role_live(42) <= 300 + slack, "{}", t.role_live(42));
        for s in 0..5 {
            t.release_all(s, TxEnd::Aborted);
        }
        t.drain_released(0);
        assert_eq!(t.free_entries(), 2048);
    }

    #[test]
    fn a_rolled_back_subtransaction_releases_only_what_it_published() {
        let t = small();
        let l = Limits { escalate_points: 1000, per_transaction: 1000, per_role: 0 };
        let mut h = Holdings::new();
        // The parent latches 5 and 20; subtransaction 2 latches 5 again,
        // 7, and the span [30, 40); its child 3 (committed into 2) latches
        // 50.
        latch(t, &mut h, 0, &pt(5), 7, &l);
        latch(t, &mut h, 0, &pt(20), 7, &l);
        h.set_subxact(2);
        latch(t, &mut h, 0, &pt(5), 7, &l);
        latch(t, &mut h, 0, &pt(7), 7, &l);
        latch(t, &mut h, 0, &sp(30, 40), 7, &l);
        h.set_subxact(3);
        latch(t, &mut h, 0, &pt(50), 7, &l);
        // A rollback of a later sibling releases nothing of these.
        assert_eq!(t.release_subxact(0, &mut h, 4), 0);
        assert_eq!(h.live(), 6);
        // Subtransaction 2 rolls back, child 3 with it.
        assert_eq!(t.release_subxact(0, &mut h, 2), 4);
        assert_eq!(h.live(), 2);
        assert_eq!(t.backend(0).live.load(Ordering::Relaxed), 2, "the shared count follows");
        for gone in [7, 35, 50] {
            assert!(conflicts_of(t, REL, &pt(gone), &[7], 100).is_empty(), "key {gone} still latched");
        }
        // The parent's latch on 5 stays though the subtransaction latched
        // 5 as well.
        assert_eq!(conflicts_of(t, REL, &pt(5), &[7], 100), set(&[7]));
        assert_eq!(conflicts_of(t, REL, &pt(20), &[7], 100), set(&[7]));
        // The released span covers nothing any more: a later write of the
        // parent under it takes a latch of its own.
        h.set_subxact(1);
        assert!(matches!(latch(t, &mut h, 0, &pt(35), 7, &l), Latched::Published { .. }));
        assert_eq!(conflicts_of(t, REL, &pt(35), &[7], 100), set(&[7]));
        // Top-level latches survive any subtransaction rollback.
        assert_eq!(t.release_subxact(0, &mut h, 2), 0);
        t.release_all(0, TxEnd::Aborted);
        h.clear();
        t.drain_released(0);
        assert_eq!(t.free_entries(), 256, "entries leaked");
    }

    #[test]
    fn an_escalated_span_standing_for_the_parent_stays_after_a_rollback() {
        let t = small();
        let l = Limits { escalate_points: 4, per_transaction: 1000, per_role: 0 };
        let mut h = Holdings::new();
        // Two points in the parent, two in subtransaction 2: the fourth
        // escalates all of them into one span, published inside 2.
        latch(t, &mut h, 0, &pt(10), 7, &l);
        latch(t, &mut h, 0, &pt(11), 7, &l);
        h.set_subxact(2);
        latch(t, &mut h, 0, &pt(12), 7, &l);
        latch(t, &mut h, 0, &pt(13), 7, &l);
        assert_eq!(h.live(), 1, "escalated");
        assert_eq!(t.release_subxact(0, &mut h, 2), 0, "the span stands for the parent's writes too");
        assert_eq!(conflicts_of(t, REL, &pt(10), &[7], 100), set(&[7]));
        assert_eq!(latch(t, &mut h, 0, &pt(11), 7, &l), Latched::Covered);
        // Points escalated inside subtransaction 3 alone go with it.
        h.set_subxact(3);
        for k in [100, 101, 102, 103] {
            latch(t, &mut h, 0, &pt(k), 7, &l);
        }
        assert_eq!(h.live(), 2);
        assert_eq!(t.release_subxact(0, &mut h, 3), 1);
        assert!(conflicts_of(t, REL, &pt(101), &[7], 100).is_empty());
        assert_eq!(conflicts_of(t, REL, &pt(12), &[7], 100), set(&[7]));
        t.release_all(0, TxEnd::Aborted);
        h.clear();
        t.drain_released(0);
        assert_eq!(t.free_entries(), 256, "entries leaked");
    }

    #[test]
    fn a_reader_that_saw_the_holder_in_flight_skips_what_its_subtransaction_wrote() {
        // A reader's snapshot has 7 in flight.  7's subtransaction latched
        // 5 and rolled back: the row never existed, so the reader does not
        // wait for it.
        let t = small();
        let l = Limits::DEFAULT;
        let mut h7 = Holdings::new();
        let mut h70 = Holdings::new();
        latch(t, &mut h7, 0, &pt(1), 7, &l);
        latch(t, &mut h70, 1, &pt(3), 70, &l);
        h7.set_subxact(2);
        latch(t, &mut h7, 0, &pt(5), 7, &l);
        assert_eq!(conflicts_of(t, REL, &sp(4, 6), &[7], 60), set(&[7]));
        t.release_subxact(0, &mut h7, 2);
        assert!(conflicts_of(t, REL, &sp(4, 6), &[7], 60).is_empty());
        t.release_all(0, TxEnd::Committed);
        t.release_all(1, TxEnd::Aborted);
    }

    #[test]
    fn a_bulk_write_of_a_hundred_thousand_rows_fits_a_small_table() {
        let t = table(Config { max_entries: 256, max_ranges: 16, max_tables: 4, max_backends: 4 });
        let l = Limits { escalate_points: 64, per_transaction: 128, per_role: 0 };
        let mut h = Holdings::new();
        let mut rnd = crate::rng::XorShift64(12345);
        for i in 0..100_000u32 {
            // Ascending keys (a load) then random ones (an update sweep).
            let key = if i < 50_000 { (i / 2) as u16 } else { rnd.below(60_000) as u16 };
            t.latch(0, &mut h, REL, &pt(key), &holder(7), &l).unwrap();
        }
        assert!(h.live() <= 128);
        assert!(t.free_entries() >= 256 - 128);
        t.release_all(0, TxEnd::Aborted);
        t.drain_released(0);
        assert_eq!(t.free_entries(), 256);
    }

    #[test]
    fn one_owner_cannot_take_every_table_slot() {
        let t = table(Config { max_entries: 64, max_ranges: 16, max_tables: 4, max_backends: 2 });
        t.set_max_tables_per_owner(2);
        let h = |x, owner| Holder { xid: Xid(x), pid: 1, now_us: 0, owner, role: 0 };
        t.acquire(0, RelId::new(1, 1), &pt(1), &h(10, 77)).unwrap();
        t.acquire(0, RelId::new(1, 2), &pt(1), &h(10, 77)).unwrap();
        assert_eq!(t.acquire(0, RelId::new(1, 3), &pt(1), &h(10, 77)), Err(AcquireError::TooManyTablesForOwner));
        // Another owner still gets a slot, and a table that has one keeps it.
        t.acquire(0, RelId::new(1, 3), &pt(1), &h(10, 78)).unwrap();
        t.acquire(0, RelId::new(1, 1), &pt(2), &h(10, 77)).unwrap();
    }
}

#[test]
fn latches_of_one_table_over_a_span() {
    let t = small();
    t.acquire(0, REL, &pt(10), &holder(7)).unwrap();
    t.acquire(1, REL, &sp(20, 30), &holder(8)).unwrap();
    t.acquire(2, OTHER_REL, &pt(25), &holder(9)).unwrap();
    let of = |span: &Span| {
        let mut xs = BTreeSet::new();
        t.for_each_latch_of(REL, span, &mut |l| {
            assert_eq!(l.rel, REL);
            xs.insert(l.xid.0);
        });
        xs
    };
    assert_eq!(of(&Span::ALL), set(&[7, 8]));
    assert_eq!(of(&sp(11, 40)), set(&[8]), "a span past the point latch");
    assert_eq!(of(&pt(25)), set(&[8]), "the other table's latch is not shown");
    assert_eq!(of(&sp(30, 40)), set(&[]), "half-open: [20, 30) ends before 30");
    assert_eq!(of(&Span::EMPTY), set(&[]));
}

#[test]
fn the_fog_makes_every_older_writer_in_flight_a_holder_of_every_key() {
    let t = small();
    t.acquire(0, REL, &pt(10), &holder(50)).unwrap();
    // No fog: only the real latch conflicts, and only where it is.
    assert_eq!(conflicts_of(t, REL, &pt(20), &[40, 50, 60], 70), set(&[]));
    assert_eq!(conflicts_of(t, REL, &pt(10), &[40, 50, 60], 70), set(&[50]));
    // Writers below 55 may hold latches the table never saw: on every
    // table, every key, as long as the snapshot has them in flight.
    t.raise_fog(Xid(55));
    assert_eq!(conflicts_of(t, REL, &pt(20), &[40, 50, 60], 70), set(&[40, 50]));
    assert_eq!(conflicts_of(t, OTHER_REL, &pt(20), &[40, 60], 70), set(&[40]));
    assert_eq!(conflicts_of(t, REL, &pt(20), &[60], 70), set(&[]), "ended before the snapshot");
    // Only ever raised; and cleared when recovery ends.
    t.raise_fog(Xid(45));
    assert_eq!(conflicts_of(t, REL, &pt(20), &[40, 50], 70), set(&[40, 50]));
    t.clear_fog();
    assert_eq!(conflicts_of(t, REL, &pt(20), &[40, 50], 70), set(&[]));
}

#[test]
fn a_commit_waits_only_for_older_draws_not_yet_logged() {
    let t = small();
    let w = t.writer();
    let first = w.take_draw_ticket(1);
    let second = w.take_draw_ticket(2);
    assert!(first < second, "tickets follow the order of the sections");
    assert!(w.older_draw_unlogged(2, second), "the older draw is not logged yet");
    assert!(!w.older_draw_unlogged(1, first), "a newer draw holds nobody up");
    assert!(!w.older_draw_unlogged(2, first), "nor does the caller's own ticket");
    w.return_draw_ticket(1);
    assert!(!w.older_draw_unlogged(2, second), "logged: the later drawer commits");
    // The first backend draws again, after the second: it holds up only
    // whoever drew after it.
    let third = w.take_draw_ticket(1);
    assert!(!w.older_draw_unlogged(2, second));
    assert!(w.older_draw_unlogged(3, third + 1));
    w.return_draw_ticket(1);
    w.return_draw_ticket(2);
    assert!(!w.older_draw_unlogged(3, u64::MAX), "every ticket back");
}
