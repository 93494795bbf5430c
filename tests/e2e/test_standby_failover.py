"""A standby across its primary's crash and its own promotion: the latches
of writers the crash killed go once the standby learns they are gone (no
release was ever logged for them), and promotion leaves the new primary a
latch table with nothing of the old primary's writers in it."""
from conftest import (PG_BINDIR, SCRATCH, STANDBY_DIR, as_postgres, cluster, connect, events_table, replayed,
                      wait_until, writer_behind_a_commit)

TAIL = "SELECT id FROM {t} WHERE id > %s ORDER BY id LIMIT 10"


def live_latches(s, t):
    return s.execute(f"SELECT holder_xid FROM pgkvx.latches WHERE relid = '{t}'::regclass").fetchall()


def crash_primary():
    as_postgres(f"{PG_BINDIR}/pg_ctl", "-D", f"{SCRATCH}/data", "stop", "-m", "immediate")
    cluster("start")


def test_a_primary_crash_leaves_no_writer_the_standby_waits_for(db, standby):
    with connect(db) as p:
        events_table(p, "sf_crash")
    w = connect(db, autocommit=False)
    w.execute("INSERT INTO sf_crash (payload) VALUES ('killed')")
    (xid,) = w.execute("SELECT txid_current()").fetchone()
    with connect(db) as p, connect(db, **standby) as s:
        replayed(p, s)
        assert (xid,) in live_latches(s, "sf_crash")
    # Crash recovery replays the latch record too, and must come up.
    crash_primary()
    w.close()
    with connect(db) as p:
        # Enough writers for the standby to look its transactions over.
        for _ in range(40):
            p.execute("INSERT INTO sf_crash (payload) VALUES ('after')")
        with connect(db, **standby) as s:
            wait_until(lambda: s.execute("SELECT pg_last_wal_receive_lsn() IS NOT NULL").fetchone()[0],
                       "the standby to stream again")
            replayed(p, s)
            assert (xid,) not in live_latches(s, "sf_crash")
            s.execute("SET pgkvx.scan_mode = fenced")
            rows = [r[0] for r in s.execute(TAIL.format(t="sf_crash"), (5,)).fetchall()]
            assert len(rows) == 10 and rows == sorted(rows) and rows[0] > 6, rows
        # And the primary's own table has no latch of the dead writer.
        assert live_latches(p, "sf_crash") == []


def test_promotion_leaves_nothing_of_the_old_primarys_writers(db, standby):
    with connect(db) as p, connect(db, **standby) as s, writer_behind_a_commit(p, db, "sf_promote") as w:
        replayed(p, s)
        assert len(live_latches(s, "sf_promote")) == 1
        as_postgres(f"{PG_BINDIR}/pg_ctl", "-D", f"{STANDBY_DIR}/data", "promote", "-w")
        wait_until(lambda: not s.execute("SELECT pg_is_in_recovery()").fetchone()[0], "the promotion")
        assert live_latches(s, "sf_promote") == []
        # A tail on the new primary does not wait for the old one's writer,
        # and the new primary latches and protects its own.
        for mode in ("optimistic", "fenced"):
            s.execute(f"SET pgkvx.scan_mode = {mode}")
            assert s.execute(TAIL.format(t="sf_promote"), (5,)).fetchall() == [(7,)]
        s.execute("INSERT INTO sf_promote (payload) VALUES ('new primary')")
        got = [r[0] for r in s.execute(TAIL.format(t="sf_promote"), (5,)).fetchall()]
        assert got[0] == 7 and len(got) == 2, got
        w.rollback()
