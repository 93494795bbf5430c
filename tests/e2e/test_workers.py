"""The maintenance launcher comes back after it is terminated, holds the
only worker slot pgkvx takes while the server is idle, sleeps until a
writer wakes it, and writers never wait for splits from workers that are
not running."""
import os
import signal
import time

import pytest

from conftest import SCRATCH, connect, wait_until


def workers(kind="launcher"):
    """The pids of the scratch cluster's maintenance processes of `kind`
    ("launcher", "helper", or "" for both); they have no database
    connection, so pg_stat_activity does not list them."""
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
        if ppid == postmaster and f"pgkvx maintenance {kind}" in title:
            out.append(int(pid))
    return sorted(out)


def test_idle_pgkvx_holds_one_worker_slot_and_parallel_queries_get_the_rest(db, conn):
    """Idle, one launcher and no helper: a query that plans as many parallel
    workers as the server has slots to spare besides it launches them all."""
    wait_until(lambda: len(workers("")) == 1, "helpers to exit once the queue is empty", timeout=60)
    assert len(workers()) == 1
    (slots, parallel) = conn.execute(
        "SELECT current_setting('max_worker_processes')::int, current_setting('max_parallel_workers')::int").fetchone()
    want = min(slots - 1, parallel, 4)
    conn.execute("CREATE TABLE par_probe AS SELECT g FROM generate_series(1, 200000) g")
    plans = []

    def launched_all():
        # A helper that a sweep started meanwhile holds a slot a moment: the
        # launcher alone must leave the rest to the query.
        wait_until(lambda: len(workers("")) == 1, "helpers to exit once the queue is empty", timeout=60)
        with connect(db) as c:
            for s in ["SET max_parallel_workers_per_gather = %d" % want, "SET parallel_setup_cost = 0",
                      "SET parallel_tuple_cost = 0", "SET min_parallel_table_scan_size = 0"]:
                c.execute(s)
            plans.append("\n".join(r[0] for r in c.execute(
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT count(*) FROM par_probe")))
        return f"Workers Planned: {want}" in plans[-1] and f"Workers Launched: {want}" in plans[-1]
    wait_until(launched_all, "a parallel query to launch every worker it planned", timeout=60)
    conn.execute("DROP TABLE par_probe")


def switches(pid):
    """How often process `pid` has gone to sleep (and so woken)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError(f"no context switch count for {pid}")


# The system calls a latch wait sleeps in (PostgreSQL waits with epoll on
# Linux), by machine, and which argument is the timeout.
EPOLL_WAITS = {"x86_64": {232, 281}, "aarch64": {22}}


def sleeps_without_timeout(pid):
    """Whether `pid` sleeps in epoll_wait with no timeout (-1): nothing but
    a signal or a SetLatch can wake it.  /proc/PID/syscall names the call
    a sleeping process is in, with its arguments."""
    import platform
    calls = EPOLL_WAITS.get(platform.machine())
    if calls is None:
        pytest.skip(f"no epoll system call numbers known for {platform.machine()}")
    with open(f"/proc/{pid}/syscall") as f:
        fields = f.read().split()
    if not fields or not fields[0].isdigit() or int(fields[0]) not in calls:
        return False
    return int(fields[4], 16) & 0xFFFFFFFF == 0xFFFFFFFF


def stat(conn, name):
    return conn.execute("SELECT value FROM pgkvx.stats() WHERE stat = %s", (name,)).fetchone()[0]


def test_an_idle_launcher_sleeps_until_a_writer_wakes_it(db, conn, table_name):
    """Idle -- nothing latched, no tombstone, no table slot left for the
    idle-table sweep -- the launcher sleeps with no timeout (it used to
    tick five times a second).  Then only a writer can wake it: the commit
    of a latched write does, it moves the released latch on until it is
    reclaimed, and sleeps again."""
    conn.execute(f"CREATE TABLE {table_name} (k int PRIMARY KEY)")
    conn.execute("SELECT pgkvx.enable(%s)", (table_name,))
    wait_until(lambda: len(workers("")) == 1, "helpers to exit once the queue is empty", timeout=60)
    (pid,) = workers()

    def asleep():
        return (stat(conn, "tables_used") == 0 and stat(conn, "latch_entries_used") == 0
                and sleeps_without_timeout(pid))
    try:
        wait_until(asleep, "the idle launcher to sleep with no timeout", timeout=90)
        before = switches(pid)
        conn.execute(f"INSERT INTO {table_name} VALUES (1)")
        wait_until(lambda: switches(pid) > before, "the commit to wake the launcher", timeout=30)
        wait_until(lambda: stat(conn, "latch_entries_used") == 0, "the released latch to be reclaimed", timeout=30)
        wait_until(asleep, "the launcher to sleep again with no timeout", timeout=90)
    finally:
        conn.execute(f"DROP TABLE {table_name}")


def test_terminated_workers_come_back():
    before = workers()
    assert before, "no maintenance workers are running"
    for p in before:
        os.kill(p, signal.SIGTERM)
    wait_until(lambda: len(workers()) == len(before) and not set(workers()) & set(before),
               "the maintenance workers to restart", timeout=60)


def stop_workers(db, conn, pids):
    """SIGSTOPs the workers `pids` at a moment none of them holds a lock a
    writer needs: a worker stopped inside a split keeps its LWLock, and an
    LWLock wait is not interruptible (no statement_timeout ends it).  A
    latching write from another session tells: if it does not finish at
    once, the workers are let go on and stopped again."""
    import threading
    probe = "pgkvx_stop_probe"
    conn.execute(f"CREATE TABLE IF NOT EXISTS {probe} (k bigserial PRIMARY KEY)")
    conn.execute("SELECT pgkvx.enable(%s)", (probe,))
    for _ in range(50):
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        def write():
            with connect(db) as c:
                c.execute(f"INSERT INTO {probe} DEFAULT VALUES")
        t = threading.Thread(target=write)
        t.start()
        t.join(timeout=2)
        if not t.is_alive():
            return
        for p in pids:
            os.kill(p, signal.SIGCONT)
        t.join()
    raise AssertionError("the maintenance workers never stopped outside a lock")


def test_writers_do_not_wait_for_stopped_workers(db, conn, table_name):
    """Workers that exist but do not run (stopped) split nothing: a writer
    to a crowded range must not wait for them, 50 ms per latch."""
    conn.execute("ALTER SYSTEM SET pgkvx.range_max_latches = 16")
    conn.execute("SELECT pg_reload_conf()")
    conn.execute(f"CREATE TABLE {table_name} (k int PRIMARY KEY)")
    conn.execute("SELECT pgkvx.enable(%s)", (table_name,))
    # A test before may have ended the launcher; the postmaster starts it
    # again a second later.
    wait_until(lambda: workers(), "the maintenance launcher to run", timeout=60)
    pids = workers("")
    stop_workers(db, conn, pids)
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


def ranges(c, t):
    """(number of latch ranges, most live latches in one) of table `t`."""
    return c.execute("SELECT count(*), coalesce(max(live), 0) FROM pgkvx.ranges WHERE relid = %s::regclass",
                     (t,)).fetchone()


def test_crowded_writer_does_not_wait_for_stopped_or_terminated_workers(db, conn, table_name):
    """Back-pressure, with the crowding it reacts to: OTHER open
    transactions hold far more than 4 x range_max_latches latches in the
    range a writer latches into.  Back-pressure then waits up to 50 ms per
    latch for a split; with the workers stopped (SIGSTOP: present but not
    ticking) or terminated, no split comes, and a 2,000-row insert would
    take 100 s.  pgkvx.stats() counts no back-pressure wait, so the bound
    is the statement_timeout below: a third of what waiting would take.
    Then the terminated workers come back and split the crowded range."""
    rows = 2000
    guard = "30s"  # 2,000 latches x 50 ms = 100 s if the writer waited
    crowd_sessions, crowd_rows = 4, 30  # 120 live latches; each below escalation (2 x 16)
    conn.execute("ALTER SYSTEM SET pgkvx.range_max_latches = 16")
    conn.execute("SELECT pg_reload_conf()")
    warm = f"{table_name}_warm"
    crowd = []
    stopped = []
    try:
        conn.execute(f"CREATE TABLE {table_name} (k int PRIMARY KEY)")
        conn.execute("SELECT pgkvx.enable(%s)", (table_name,))
        conn.execute(f"CREATE TABLE {warm} (k int PRIMARY KEY)")
        conn.execute("SELECT pgkvx.enable(%s)", (warm,))
        # The workers run with the new limit: 30 live latches get split.
        with connect(db, autocommit=False) as w:
            w.execute(f"INSERT INTO {warm} SELECT g FROM generate_series(1, 30) g")
            wait_until(lambda: ranges(conn, warm)[0] > 1, "the workers to split a range of 30 latches")
            w.rollback()

        # Helpers too: one started for the warm-up split may still run.
        wait_until(lambda: len(workers()) == 1, "the maintenance launcher to run", timeout=60)
        stopped = workers("")
        stop_workers(db, conn, stopped)
        # A helper the launcher asked for just before it stopped starts
        # after: it would split the crowded range.  Stop any that appear
        # until none has for half a second.
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < 0.5:
            late = [p for p in workers("") if p not in stopped]
            if late:
                stop_workers(db, conn, late)
                stopped += late
                quiet_since = time.monotonic()
            time.sleep(0.05)
        for i in range(crowd_sessions):
            c = connect(db, autocommit=False)
            crowd.append(c)
            c.execute(f"INSERT INTO {table_name} SELECT g FROM generate_series(%s::int, %s::int) g",
                      (i * crowd_rows + 1, (i + 1) * crowd_rows))
        n, live = ranges(conn, table_name)
        assert (n, live) == (1, crowd_sessions * crowd_rows), "the other transactions do not crowd one range"
        assert live > 4 * 16

        with connect(db) as w:
            w.execute(f"SET statement_timeout = '{guard}'")
            w.execute(f"INSERT INTO {table_name} SELECT g FROM generate_series(10001, 10000 + {rows}) g")

        # Terminated (a stopped process takes SIGTERM when continued): a
        # writer does not wait for them either, and they come back.
        old = stopped
        for p in old:
            os.kill(p, signal.SIGTERM)
            os.kill(p, signal.SIGCONT)
        stopped = []
        with connect(db) as w:
            w.execute(f"SET statement_timeout = '{guard}'")
            w.execute(f"INSERT INTO {table_name} SELECT g FROM generate_series(20001, 20000 + {rows}) g")
        # The launcher comes back; helpers end for good.
        wait_until(lambda: len(workers()) == 1 and not set(workers()) & set(old),
                   "the maintenance launcher to restart", timeout=60)
        wait_until(lambda: ranges(conn, table_name)[0] > 1,
                   "the restarted workers to split the crowded range", timeout=60)
        assert conn.execute(f"SELECT count(*) FROM {table_name} WHERE k > 10000").fetchone() == (2 * rows,)
    finally:
        for p in stopped:
            os.kill(p, signal.SIGCONT)
        for c in crowd:
            c.rollback()
            c.close()
        conn.execute("ALTER SYSTEM RESET pgkvx.range_max_latches")
        conn.execute("SELECT pg_reload_conf()")
        conn.execute(f"DROP TABLE IF EXISTS {table_name}, {warm}")
