"""What every part of the benchmark harness shares: connections to the scratch
cluster, pgkvx's counters, durability settings, report paths, and a
description of the machine.

Connection parameters come from libpq's environment (PGHOST, PGPORT, PGUSER),
which bench/run sets from scripts/env.sh.
"""
import contextlib
import datetime
import os
import platform
import re
import signal
import subprocess
import time
import numpy
import psycopg

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
PG_CONFIG = os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
DBNAME = "pgkvx_bench"


def log(msg):
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", flush=True)


_signalled = False


def interrupt(signum, frame):
    """SIGTERM handler: the same clean-up path as Ctrl-C (the report of what
    finished is still written)."""
    global _signalled
    _signalled = True
    raise KeyboardInterrupt


def interrupted(exc):
    """Whether exc ends the run because it was interrupted. A KeyboardInterrupt
    raised while a multiprocessing lock is half released surfaces as that
    lock's own error instead, so after SIGTERM any exception counts."""
    return isinstance(exc, KeyboardInterrupt) or _signalled


def pg_bindir():
    return subprocess.run([PG_CONFIG, "--bindir"], check=True, capture_output=True,
                          text=True).stdout.strip()


def connect(dbname=DBNAME, scan_mode=None, autocommit=True, server=None):
    """A connection, to the scratch cluster or to `server` (libpq keywords:
    host, port); scan_mode, when given, is set for the whole session."""
    options = f"-c pgkvx.scan_mode={scan_mode}" if scan_mode else ""
    return psycopg.connect(dbname=dbname, autocommit=autocommit, options=options,
                           **(server or {}))


def recreate_database(dbname=DBNAME):
    """A fresh benchmark database with the currently installed pgkvx SQL."""
    with connect("postgres") as c:
        exists = c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
    if exists:
        # DROP DATABASE fires no sql_drop event trigger, so pgkvx would keep
        # the shared-memory slots and tombstones of the tables registered in
        # it until the server restarts; dropping the tables first frees them.
        try:
            with connect(dbname) as c:
                c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid()")
                c.execute("DROP SCHEMA public CASCADE")
        except psycopg.Error:
            pass  # the database goes anyway; at worst the slots stay until restart
    with connect("postgres") as c:
        c.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {dbname}")
    with connect(dbname) as c:
        c.execute("CREATE EXTENSION pgkvx")


def stats_snapshot(conn):
    """pgkvx's counters and gauges now."""
    return dict(conn.execute("SELECT stat, value FROM pgkvx.stats()").fetchall())


def is_gauge(stat):
    """pgkvx.stats() mixes counters with gauges of capacity in use (named
    *_used); a gauge's delta means nothing, its value at the end does."""
    return stat.endswith("_used")


def stats_delta(before, after):
    """What a run did to pgkvx's counters: deltas of the counters that moved,
    end values of the gauges that are not zero."""
    return {k: v if is_gauge(k) else v - before.get(k, 0) for k, v in after.items()
            if (v if is_gauge(k) else v - before.get(k, 0))}


def scan_node(conn, query, scan_mode):
    """Whether `query` gets pgkvx's LIMIT scan node under `scan_mode`:
    'PgkvxLimitScan' or 'plain'.  A fenced or optimistic mode that gets a
    plain plan is not measuring pgkvx's scans."""
    with conn.transaction():
        if scan_mode:
            conn.execute(f"SET LOCAL pgkvx.scan_mode = {scan_mode}")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (COSTS OFF) " + query))
    return "PgkvxLimitScan" if "PgkvxLimitScan" in plan else "plain"


# The scratch cluster runs with these off (scripts/cluster: tests do not need
# crash safety); PostgreSQL's defaults, and production, have them on.
DURABILITY = ("fsync", "synchronous_commit", "full_page_writes")


def add_durable_arg(ap):
    ap.add_argument("--durable", action="store_true",
                    help="run with PostgreSQL's default durability (fsync, synchronous_commit, "
                         "full_page_writes on) instead of the scratch cluster's (off); restored after")
    ap.add_argument("--replica-delay", type=float, metavar="MS",
                    help="commit through a synchronous replica behind a proxy that holds each "
                         "chunk MS milliseconds each way (scripts/replica; implies --durable); "
                         "removed after")


@contextlib.contextmanager
def durable_commits(enabled):
    """--durable: the run flushes every commit, as a default PostgreSQL does.

    Matters for the fenced/optimistic comparison: a writer's latches are
    released after its commit is durable, so with flushing on every fenced
    reader that meets an in-flight writer waits out a WAL flush, while an
    optimistic reader only waits when the writer is inside the rows it read.
    Set with ALTER SYSTEM and reset afterwards, even when interrupted."""
    if not enabled:
        yield
        return

    def apply(stmt):
        with connect("postgres") as c:
            for name in DURABILITY:
                c.execute(stmt.format(name))
            c.execute("SELECT pg_reload_conf()")

    apply("ALTER SYSTEM SET {} = on")
    try:
        # The reload is asynchronous: wait until new sessions see it.
        for _ in range(50):
            with connect("postgres") as c:
                if c.execute("SHOW fsync").fetchone()[0] == "on":
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError("--durable: the server did not pick up fsync = on")
        yield
    finally:
        apply("ALTER SYSTEM RESET {}")


@contextlib.contextmanager
def synchronous_replica(delay_ms):
    """--replica-delay: every commit waits for a replica `delay_ms` away each
    way (scripts/replica), as with a synchronous standby in another zone.
    Writers then hold their latches for a round trip, which is what a fenced
    reader waits out and an optimistic one mostly does not."""
    if delay_ms is None:
        yield
        return
    script = os.path.join(ROOT, "scripts", "replica")
    try:
        subprocess.run([script, "start", f"{delay_ms:g}"], check=True)
        yield
    finally:
        subprocess.run([script, "stop"], check=False)


def commit_ms(samples=21):
    """Median time of a one-row INSERT and its commit under the run's
    settings, in ms: how long a writer holds its latches at the least."""
    with connect("postgres") as c:
        c.execute("CREATE TABLE IF NOT EXISTS pgkvx_bench_commit_probe (x int)")
        times = []
        for _ in range(samples):
            t = time.perf_counter()
            c.execute("INSERT INTO pgkvx_bench_commit_probe VALUES (1)")
            times.append((time.perf_counter() - t) * 1000)
        c.execute("DROP TABLE pgkvx_bench_commit_probe")
    return float(numpy.median(times))


def run_engine(argv, parse_args, run):
    """An engine's main(): SIGTERM ends it like Ctrl-C (the report of what
    finished is still written), and --durable / --replica-delay hold for the
    whole run (args.commit_ms: what a one-row commit then takes)."""
    args = parse_args(argv)
    args.durable = args.durable or args.replica_delay is not None
    signal.signal(signal.SIGTERM, interrupt)
    with durable_commits(args.durable), synchronous_replica(args.replica_delay):
        args.commit_ms = commit_ms()
        return run(args)


def durability(args):
    """The report's record of how commits were made durable."""
    return {"durable": args.durable, "replica_delay_ms": args.replica_delay,
            "commit_ms": args.commit_ms}


def durability_text(cfg):
    """One sentence for a report header, from durability()'s record."""
    if cfg.get("replica_delay_ms") is not None:
        how = (f"every commit flushed and confirmed by a synchronous replica behind a proxy "
               f"holding each chunk {cfg['replica_delay_ms']:g} ms each way (`--replica-delay`)")
    elif cfg.get("durable"):
        how = "every commit flushed (`--durable`)"
    else:
        how = "commits not flushed (the scratch cluster's settings; `--durable` flushes them)"
    took = cfg.get("commit_ms")
    return (how + (f"; a one-row insert and commit took {took:.2f} ms" if took is not None else "")
            + f"; {malloc_text()}")


def malloc_pinned():
    """Whether bench/run started the server with glibc's heap trimming
    pinned (`--malloc pinned`, scripts/cluster)."""
    return os.environ.get("PGKVX_MALLOC") == "pinned"


def malloc_text():
    return ("glibc's heap trim thresholds pinned for the server (`--malloc pinned`)" if malloc_pinned()
            else "glibc's default heap trimming")


def report_base(args, kind=""):
    """When the run started, and its report files' path without extension:
    `<out>/<date>[-kind][-durable|-replica<MS>ms]`."""
    os.makedirs(args.out, exist_ok=True)
    started = datetime.datetime.now()
    suffix = (f"-replica{args.replica_delay:g}ms" if args.replica_delay is not None
              else "-durable" if args.durable else "") + ("-pinned" if malloc_pinned() else "")
    name = started.strftime("%Y-%m-%d-%H%M%S") + kind + suffix
    return started, os.path.join(args.out, name)


def machine(conn):
    """Where and how the numbers were taken, for the report's header."""
    with open("/proc/meminfo") as f:
        mem_kb = int(re.search(r"MemTotal:\s+(\d+)", f.read()).group(1))
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        m = re.search(r"model name\s*:\s*(.+)", f.read())
        if m:
            cpu = m.group(1).strip()
    settings = dict(conn.execute(
        """SELECT name, current_setting(name) FROM pg_settings
           WHERE name IN ('shared_buffers', 'max_connections', 'fsync',
                          'synchronous_commit', 'full_page_writes', 'max_wal_size',
                          'shared_preload_libraries')
              OR name LIKE 'pgkvx.%' ORDER BY name""").fetchall())
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "cpu": cpu,
        "postgres": conn.execute("SELECT version()").fetchone()[0],
        "pgkvx_version": conn.execute("SELECT pgkvx.version()").fetchone()[0],
        "settings": settings,
        "pgkvx_library": library_info(),
        "harness_commit": git_head(),
        "loadavg": os.getloadavg()[0],
        "pgkvx_gauges": {k: v for k, v in stats_snapshot(conn).items() if is_gauge(k)},
    }


def library_info():
    """The installed pgkvx library: when it was installed, and whether it
    carries debug info (`cargo pgrx test` installs an unoptimised debug
    build, which makes every latched mode look slow)."""
    pkglibdir = subprocess.run([PG_CONFIG, "--pkglibdir"], capture_output=True,
                               text=True).stdout.strip()
    path = os.path.join(pkglibdir, "pgkvx.so")
    try:
        with open(path, "rb") as f:
            data = f.read()
        mtime = datetime.datetime.fromtimestamp(os.path.getmtime(path))
    except OSError:
        return f"{path} (missing)"
    # A debug build of pgkvx is ~40 MiB, the release build (LTO, but with
    # the standard library's debug sections) ~3 MiB: size tells them apart,
    # a `.debug_info` section does not.
    debug = (", **over 16 MiB: a debug build? those are much slower than the release "
             "build of scripts/install**" if len(data) > 16 * 2**20 else "")
    return f"{path} ({len(data) / 2**20:.1f} MiB{debug}, installed {mtime:%Y-%m-%d %H:%M})"


def git_head():
    r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "?"


def percentile(values, q):
    """The q-th percentile (0-100) of a non-empty sequence, else None."""
    return float(numpy.percentile(values, q)) if len(values) else None


def fatal_messages(out):
    """The fatal errors worker processes reported on queue `out` (items
    `(kind, id, result)`), for a run whose workers did not start."""
    msgs = []
    while not out.empty():
        msgs.append(str(out.get_nowait()[2].get("fatal")))
    return "; ".join(msgs) or "timeout"
