"""A hot standby has an empty latch table, and its snapshots keep their
in-progress xids where our reads do not look: tails there refuse
(feature_not_supported, with a hint) instead of pretending to protect, and
every other read runs as plain PostgreSQL."""
import psycopg
import pytest

from conftest import connect, wait_until


def test_guarded_reads_on_a_standby_refuse(db, standby):
    with connect(db) as p:
        p.execute("CREATE TABLE sb_events (id bigserial PRIMARY KEY, payload text)")
        p.execute("SELECT pgkvx.enable('sb_events', gapless => true)")
        p.execute("INSERT INTO sb_events (payload) SELECT 'x' FROM generate_series(1, 5)")
        p.execute("CREATE TABLE sb_plain (id int PRIMARY KEY)")
        p.execute("INSERT INTO sb_plain SELECT generate_series(1, 5)")
        # The insert position: with synchronous_commit off (the scratch
        # cluster) the write position can still be before these commits.
        (lsn,) = p.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
    with connect(db, **standby) as s:
        assert s.execute("SELECT pg_is_in_recovery()").fetchone()[0]
        wait_until(lambda: s.execute("SELECT pg_last_wal_replay_lsn() >= %s", (lsn,)).fetchone()[0],
                   "the standby to replay")
        tail = "SELECT id FROM sb_events WHERE id > 0 ORDER BY id LIMIT 3"
        for mode in ("optimistic", "fenced"):
            s.execute(f"SET pgkvx.scan_mode = {mode}")
            with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
                s.execute(tail)
            assert "hot standby" in str(e.value) and e.value.diag.message_hint
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            s.execute("SELECT pgkvx.arrow_scan('sb_events')")
        # Reads that are no tails -- newest first, max(id), a count beside
        # a max -- run as plain PostgreSQL in every mode.
        for mode in ("optimistic", "fenced"):
            s.execute(f"SET pgkvx.scan_mode = {mode}")
            assert s.execute("SELECT id FROM sb_events ORDER BY id DESC LIMIT 2").fetchall() == [(5,), (4,)]
            assert s.execute("SELECT max(id), min(id) FROM sb_events").fetchone() == (5, 1)
            assert s.execute(
                "SELECT count(*) FROM sb_events WHERE id > (SELECT max(id) - 2 FROM sb_events)").fetchone() == (2,)
        # Reads of tables that are not latched, and reads asked to be plain,
        # run as usual.
        assert s.execute("SELECT id FROM sb_plain ORDER BY id LIMIT 2").fetchall() == [(1,), (2,)]
        s.execute("SET pgkvx.scan_mode = off")
        assert s.execute(tail).fetchall() == [(1,), (2,), (3,)]
