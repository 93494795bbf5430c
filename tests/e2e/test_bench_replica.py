"""scripts/replica, which bench/run --replica-delay relies on: while it is up
every commit that asks for it is confirmed by a synchronous replica through
the delaying proxy; once stopped the primary no longer names a synchronous
standby, so no commit can be left waiting for one that is gone."""
import os
import subprocess
import time

from conftest import ROOT, connect

REPLICA = os.path.join(ROOT, "scripts", "replica")
PORT = int(os.environ.get("PGPORT", "55432"))
REPLICA_DIR = os.environ.get("PGKVX_CLUSTER", f"/tmp/pgkvx-cluster-{PORT}") + "-replica"


def replica(*args):
    return subprocess.run([REPLICA, *args], capture_output=True, text=True, timeout=300)


def standby_names(c):
    return c.execute("SHOW synchronous_standby_names").fetchone()[0]


def test_replica_confirms_commits_then_goes_away(db):
    started = replica("start", "1")
    try:
        assert started.returncode == 0, started.stderr
        with connect(db) as c:
            assert standby_names(c) == "pgkvx_replica"
            state = c.execute("SELECT state, sync_state, host(client_addr) FROM pg_stat_replication "
                              "WHERE application_name = 'pgkvx_replica'").fetchall()
            # Through the proxy on loopback, synchronous.
            assert state == [("streaming", "sync", "127.0.0.1")]
            c.execute("CREATE TABLE replica_probe (x int)")
            c.execute("SET synchronous_commit = remote_apply")
            c.execute("INSERT INTO replica_probe VALUES (42)")
        # remote_apply returned: the row is already visible on the replica.
        with connect(db, host=os.path.join(REPLICA_DIR, "sock"), port=PORT + 1) as r:
            assert r.execute("SELECT pg_is_in_recovery()").fetchone()[0]
            assert r.execute("SELECT x FROM replica_probe").fetchall() == [(42,)]
    finally:
        stopped = replica("stop")
    assert stopped.returncode == 0, stopped.stderr
    with connect(db) as c:
        assert standby_names(c) == ""
        # The walsender notices the gone replica on its own schedule.
        for _ in range(300):
            if c.execute("SELECT count(*) FROM pg_stat_replication").fetchone()[0] == 0:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("a walsender outlived the replica")
    assert not os.path.exists(REPLICA_DIR)


def test_replica_start_refuses_a_bad_delay():
    bad = replica("start", "soon")
    assert bad.returncode != 0
    assert "delay in milliseconds" in bad.stderr
