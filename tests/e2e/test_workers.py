"""Maintenance workers come back after they are terminated, and writers
never wait for splits from workers that are not running."""
import os
import signal

from conftest import SCRATCH, connect, wait_until


def workers():
    """The pids of the scratch cluster's maintenance workers (they have no
    database connection, so pg_stat_activity does not list them)."""
    with open(f"{SCRATCH}/data/postmaster.pid") as f:
        postmaster = f.readline().strip()
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = f.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().decode(errors="replace")
        except OSError:
            continue
        if ppid == postmaster and "pgkvx maintenance" in title:
            out.append(int(pid))
    return sorted(out)


def test_terminated_workers_come_back():
    before = workers()
    assert before, "no maintenance workers are running"
    for p in before:
        os.kill(p, signal.SIGTERM)
    wait_until(lambda: len(workers()) == len(before) and not set(workers()) & set(before),
               "the maintenance workers to restart", timeout=60)


def test_writers_do_not_wait_for_stopped_workers(db, conn, table_name):
    """Workers that exist but do not run (stopped) split nothing: a writer
    to a crowded range must not wait for them, 50 ms per latch."""
    conn.execute("ALTER SYSTEM SET pgkvx.range_max_latches = 16")
    conn.execute("SELECT pg_reload_conf()")
    conn.execute(f"CREATE TABLE {table_name} (k int PRIMARY KEY)")
    conn.execute("SELECT pgkvx.enable(%s)", (table_name,))
    pids = workers()
    assert pids
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        with connect(db) as w:
            # A hang guard far above what the statement needs; writers
            # waiting for the stopped workers would take minutes.
            w.execute("SET statement_timeout = '60s'")
            w.execute(f"INSERT INTO {table_name} SELECT g FROM generate_series(1, 6000) g")
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)
        conn.execute("ALTER SYSTEM RESET pgkvx.range_max_latches")
        conn.execute("SELECT pg_reload_conf()")
        conn.execute(f"DROP TABLE {table_name}")
