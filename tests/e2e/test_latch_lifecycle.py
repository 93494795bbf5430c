"""Latches never outlive their holders: commit, abort, termination, crash,
and a full table all leave the latch table clean."""
import os
import random
import signal
import threading
import time

import psycopg
import pytest

from conftest import cluster, conninfo, connect, free_port, stats


def live_latches(c, table=None):
    q = "SELECT count(*) FROM pgkvx.latches"
    if table:
        return c.execute(q + " WHERE relid = %s::regclass", (table,)).fetchone()[0]
    return c.execute(q).fetchone()[0]


@pytest.fixture
def kv(conn, table_name):
    conn.execute(f"CREATE TABLE {table_name} (k bigint PRIMARY KEY, v int)")
    conn.execute("SELECT pgkvx.enable(%s)", (table_name,))
    yield table_name
    conn.execute(f"DROP TABLE IF EXISTS {table_name}")


def test_terminated_holder_releases_its_latches(db, conn, kv):
    holder = connect(db, autocommit=False)
    holder.execute(f"INSERT INTO {kv} VALUES (1, 0), (2, 0)")
    pid = holder.info.backend_pid
    assert live_latches(conn, kv) == 2
    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    for _ in range(100):
        if not conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            break
        time.sleep(0.05)
    assert live_latches(conn, kv) == 0
    # and a reader is not left waiting for a dead holder
    conn.execute("SET pgkvx.scan_mode = fenced")
    assert conn.execute(f"SELECT count(*) FROM (SELECT k FROM {kv} ORDER BY k LIMIT 5) t").fetchone()[0] == 0


def test_killed_backend_restarts_the_cluster_with_an_empty_table(db, table_name):
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (k bigint PRIMARY KEY, v int)")
        c.execute("SELECT pgkvx.enable(%s)", (table_name,))
        # The scratch cluster commits asynchronously: make the table survive
        # the crash we are about to cause.
        c.execute("CHECKPOINT")
    holder = connect(db, autocommit=False)
    holder.execute(f"INSERT INTO {table_name} SELECT g, 0 FROM generate_series(1, 50) g")
    with connect(db) as c:
        assert live_latches(c, table_name) == 50
    os.kill(holder.info.backend_pid, signal.SIGKILL)  # the postmaster resets shared memory
    deadline = time.time() + 60
    while True:
        try:
            with connect(db) as c:
                if live_latches(c) != 0 and time.time() < deadline:
                    # Connected before the postmaster noticed the death and
                    # reset shared memory: that reset ends this session too.
                    time.sleep(0.2)
                    continue
                assert live_latches(c) == 0
                assert stats(c)["latch_entries_used"] == 0
                # writes latch again as before
                c.execute("BEGIN")
                c.execute(f"INSERT INTO {table_name} VALUES (1000, 1)")
                assert live_latches(c, table_name) == 1
                c.execute("ROLLBACK")
                c.execute(f"DROP TABLE {table_name}")
            break
        except psycopg.OperationalError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def test_random_transactions_leave_no_live_latches(db, conn, kv):
    """8 connections, 10,000 transactions committing or aborting at random."""
    errors = []

    def worker(seed):
        rnd = random.Random(seed)
        try:
            with connect(db, autocommit=False) as c:
                for _ in range(1250):
                    for _ in range(rnd.randint(1, 3)):
                        k = rnd.randint(1, 500)
                        op = rnd.random()
                        if op < 0.5:
                            c.execute(f"INSERT INTO {kv} VALUES (%s, 0) ON CONFLICT (k) DO UPDATE SET v = {kv}.v + 1", (k,))
                        elif op < 0.8:
                            c.execute(f"UPDATE {kv} SET k = %s WHERE k = %s AND NOT EXISTS (SELECT 1 FROM {kv} WHERE k = %s)",
                                      (k + 1000, k, k + 1000))
                        else:
                            c.execute(f"DELETE FROM {kv} WHERE k = %s", (k,))
                    if rnd.random() < 0.3:
                        c.rollback()
                    else:
                        try:
                            c.commit()
                        except psycopg.errors.SerializationFailure:
                            c.rollback()
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Deadlocks between random writers are Postgres's business; anything
    # else is ours.
    assert all(isinstance(e, psycopg.errors.DeadlockDetected) for e in errors), errors
    assert live_latches(conn) == 0
    assert stats(conn)["latches_acquired"] > 10000


@pytest.fixture
def tiny_cluster():
    """A second scratch cluster whose latch table holds 64 entries."""
    port = str(free_port(int(os.environ.get("PGPORT", "55432")) + 23))
    env = dict(os.environ, PGKVX_PORT=port, PGKVX_CLUSTER=f"/tmp/pgkvx-cluster-tiny-{port}",
               PGKVX_EXTRA_CONF="pgkvx.max_latches = 64\\nmax_connections = 20")
    env.pop("PGHOST", None)
    env.pop("PGPORT", None)
    cluster("destroy", env=env)
    cluster("start", env=env)
    info = conninfo("postgres", host=f"{env['PGKVX_CLUSTER']}/sock", port=port)
    with psycopg.connect(info, autocommit=True) as c:
        c.execute("CREATE EXTENSION pgkvx")
        c.execute("CREATE TABLE kv (k bigint PRIMARY KEY, v int)")
        c.execute("SELECT pgkvx.enable('kv')")
    try:
        yield info
    finally:
        cluster("destroy", env=env)


def test_full_table_errors_cleanly_and_recovers(tiny_cluster):
    with psycopg.connect(tiny_cluster, autocommit=True) as c:
        assert c.execute("SHOW pgkvx.max_latches").fetchone()[0] == "64"
        # A reader pins the horizon so released latches must be kept.
        pin = psycopg.connect(tiny_cluster, autocommit=False)
        pin.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT 1")
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded) as e:
            c.execute("INSERT INTO kv SELECT g, 0 FROM generate_series(1, 100) g")
        assert "pgkvx.max_latches" in str(e.value)
        # the failed transaction left nothing behind
        assert c.execute("SELECT count(*) FROM pgkvx.latches").fetchone()[0] == 0
        assert c.execute("SELECT count(*) FROM kv").fetchone()[0] == 0
        # committed tombstones pinned by the old snapshot are coalesced
        # under pressure, so writing goes on
        for i in range(200):
            c.execute("INSERT INTO kv VALUES (%s, 0)", (i,))
        used = stats(c)
        assert used["tombstones_coalesced"] > 0
        assert used["latch_table_full"] >= 1
        pin.rollback()
        pin.close()
        assert c.execute("SELECT count(*) FROM kv").fetchone()[0] == 200
