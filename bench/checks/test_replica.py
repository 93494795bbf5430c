"""scripts/replica, which bench/run --replica-delay relies on: while it is up
every commit that asks for it is confirmed by a synchronous replica through
the delaying proxy; once stopped the primary no longer names a synchronous
standby, so no commit can be left waiting for one that is gone."""
import os
import time

from conftest import BENCH, ROOT, connect, report, run

REPLICA = os.path.join(ROOT, "scripts", "replica")
PORT = int(os.environ.get("PGPORT", "55432"))
REPLICA_DIR = os.environ.get("PGKVX_CLUSTER", f"/tmp/pgkvx-cluster-{PORT}") + "-replica"


def standby_names(c):
    return c.execute("SHOW synchronous_standby_names").fetchone()[0]


def assert_replica_gone():
    with connect() as c:
        assert standby_names(c) == ""
        # The walsender notices the gone replica on its own schedule; this
        # bounds a hang, it does not time anything.
        for _ in range(300):
            if c.execute("SELECT count(*) FROM pg_stat_replication").fetchone()[0] == 0:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("a walsender outlived the replica")
    assert not os.path.exists(REPLICA_DIR)


def test_replica_confirms_commits_then_goes_away(db):
    import socket
    # Another server on the port above the primary's: the replica takes
    # the next free one.
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        squatter.bind(("127.0.0.1", PORT + 1))
        squatter.listen(1)
    except OSError:
        pass  # taken already: all the better
    try:
        run(REPLICA, "start", "1")
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
        with open(os.path.join(REPLICA_DIR, "port")) as f:
            replica_port = int(f.read())
        with connect(db, host=os.path.join(REPLICA_DIR, "sock"), port=replica_port) as r:
            assert r.execute("SELECT pg_is_in_recovery()").fetchone()[0]
            assert r.execute("SELECT x FROM replica_probe").fetchall() == [(42,)]
        assert replica_port != PORT + 1
    finally:
        run(REPLICA, "stop")
        squatter.close()
    assert_replica_gone()


def test_replica_start_refuses_a_bad_delay():
    r = run(REPLICA, "start", "soon", expect_rc=1)
    assert "delay in milliseconds" in r.stderr


def test_replica_delay_run_reports_its_commit_time_and_cleans_up(tmp_path):
    run(os.path.join(BENCH, "run"), "--paired", "--replica-delay", 1, "--pairs", "kv0:plain",
        "--rounds", 1, "--duration", 1, "--clients", 2, "--keys", 1000, "--out", tmp_path)
    data, md, _ = report(tmp_path, "-paired-replica1ms")
    cfg = data["config"]
    assert cfg["replica_delay_ms"] == 1 and cfg["durable"] and cfg["commit_ms"] > 0, cfg
    assert data["machine"]["settings"]["synchronous_commit"] == "on"
    assert "confirmed by a synchronous replica" in md
    ((r,),) = [p["rounds"] for p in data["pairs"]]
    assert r["ratio"] > 0 and r["errors"] == [], r
    assert_replica_gone()
    # --durable (implied) is undone: the scratch cluster's settings are back.
    with connect() as c:
        assert c.execute("SHOW fsync").fetchone()[0] == "off"


def test_standby_tail_run_sees_skips_only_unprotected_and_cleans_up(tmp_path):
    # An asynchronous standby, consumers on it and on the primary; `off`
    # shows the run can see a skip on each side, optimistic skips none.
    run(os.path.join(BENCH, "run"), "--standby", "--modes", "off,optimistic", "--duration", 3,
        "--reps", 1, "--out", tmp_path)
    data, md, _ = report(tmp_path, "-standby")
    runs = {r["mode"]: r for r in data["runs"]}
    assert set(runs) == {"off", "optimistic"} and all("error" not in r for r in runs.values()), runs
    for mode, r in runs.items():
        for side in (r, r["standby"]):
            assert side["committed"] > 0 and side["delivered_per_s"] > 0, (mode, side)
            assert side["duplicates"] == 0 and not side["drain_timed_out"], (mode, side)
    assert runs["optimistic"]["skipped"] == 0 and runs["optimistic"]["standby"]["skipped"] == 0, runs
    assert runs["off"]["standby"]["skipped"] > 0, "the standby consumer in off mode skipped nothing"
    assert "| optimistic | standby |" in md
    assert_replica_gone()
