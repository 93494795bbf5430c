"""The wake-up workload: how fast does a consumer at the head of a
tail learn that a row was committed, and what does that cost the producers?

Producers are pgbench clients (C, so 64 of them still leave the CPUs to the
server) inserting into a latched gapless table, one row or ten per
transaction, sleeping 0-5 ms inside the transaction before COMMIT so that
commits land out of key order.  Against them, one consumer kind at a time
tails the same stream (KINDS): polling every 1 ms or 100 ms, woken by
LISTEN/NOTIFY (the producers NOTIFY in their transaction), woken by
pgkvx.wait_for, or reading PgQ batches (pgq.insert_event in the producers'
transaction, Debian's pgqd ticking at its default period).

Lag is measured on one clock: the server's commit timestamp of each row's
transaction (track_commit_timestamp, switched on for the workload and off
again after) against the wall clock at which the consumer's read returned.
The commit timestamp is taken when the commit record is written, before
the commit becomes visible and before the producer's COMMIT returns, so
the lag includes the whole of making the commit visible: it is never
flattered by a producer that was descheduled before stamping.

The oracle is exact: every id in the table at the end (only committed rows
are there; nothing deletes) must have been delivered, once; ids delivered
that are not in the table are phantoms.

Beside the side-by-side matrix: producers' throughput with 0, 1 and 100
consumers waiting on the same table (two tables written at the same time,
waiters on one: paired) and with 100 waiting on another table; and whether
one wait_for consumer keeps up with producers at full speed.

Standalone (recreates pgkvx_bench; libpq settings from `scripts/cluster
env`; needs track_commit_timestamp, which bench/run turns on):
    python bench/wake.py --quick
"""
import argparse
import bisect
import collections
import contextlib
import json
import multiprocessing
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

import psycopg

from common import (DBNAME, ROOT, connect, fatal_messages, log, percentile, pg_bindir, recreate_database,
                    stats_delta, stats_snapshot)


@dataclass(frozen=True)
class Kind:
    name: str
    label: str
    producer: str       # which producer script: plain, notify or pgq


KINDS = [
    Kind("poll1", "(a) poll every 1 ms", "plain"),
    Kind("poll100", "(b) poll every 100 ms", "plain"),
    Kind("notify", "(c) LISTEN/NOTIFY", "notify"),
    Kind("wait_for", "(d) pgkvx.wait_for", "plain"),
    Kind("pgq", "(e) PgQ (pgqd, default tick)", "pgq"),
]
KIND_NAMES = [k.name for k in KINDS]

SCENARIOS = {
    "steady": "producers and one consumer",
    "idle-in-tx": "plus a session elsewhere in the database idle in a transaction "
                  "holding an xid for the whole run",
}

TABLE = "wake_events"
CHANNEL = "pgkvx_wake"
QUEUE = "pgkvx_wake"
PGQ_CONSUMER = "bench"
PAYLOAD = "wake-bench payload 0123456789abcdef"


@dataclass
class WakeConfig:
    duration: float = 10.0              # seconds producers run, per cell
    # (producers, rows per transaction, max commit delay ms).  Beside the
    # issue's 8 and 64: one producer, whose rows commit in key order (no
    # row waits for a slower smaller key), and 8 without commit delay
    # (writers hold their latches only through the commit itself).
    configs: list = field(default_factory=lambda: [(1, 1, 5.0), (8, 1, 5.0), (8, 10, 5.0),
                                                   (64, 1, 5.0), (64, 10, 5.0), (8, 1, 0.0)])
    kinds: list = field(default_factory=lambda: list(KIND_NAMES))
    reps: int = 1
    idle_configs: list = field(default_factory=lambda: [(8, 1, 5.0), (8, 10, 5.0), (64, 1, 5.0),
                                                        (64, 10, 5.0)])
    limit: int = 1000                   # consumer batch (LIMIT n), as relays read
    wait_timeout_s: float = 1.0         # wait_for / NOTIFY wait per call
    pgq_poll_ms: float = 10.0           # PgQ consumer's pause when next_batch has nothing
    drain_timeout: float = 15.0         # after producers stop (PgQ needs a tick: <= ~3 s)
    pair_rounds: int = 6
    pair_duration: float = 10.0
    pair_producers: int = 8             # per side, at full speed (no commit delay)
    waiters: int = 100
    keepup_rounds: int = 2
    keepup_duration: float = 10.0
    keepup_producers: int = 8
    keepup_limit: int = 1000


def quick_config():
    return WakeConfig(duration=2.0, configs=[(8, 1, 5.0), (64, 10, 5.0)], idle_configs=[(8, 1, 5.0)],
                      drain_timeout=10.0, pair_rounds=1, pair_duration=2.0, keepup_rounds=1,
                      keepup_duration=2.0)


# ---------------------------------------------------------------- producers

def producer_script(kind_producer, table):
    """pgbench script of one producer transaction.  :rows rows, then a sleep
    of 0..:maxdelay us inside the transaction: commits land out of key
    order."""
    insert = (f"INSERT INTO public.{table} (payload) "
              f"SELECT '{PAYLOAD}' FROM pg_catalog.generate_series(1, :rows)")
    if kind_producer == "pgq":
        insert = (f"WITH i AS ({insert} RETURNING id) "
                  f"SELECT pgq.insert_event('{QUEUE}', 'insert', i.id::text) FROM i")
    lines = ["\\set d random(0, :maxdelay)", "BEGIN;", insert + ";"]
    if kind_producer == "notify":
        # One notification per transaction; its commit takes NOTIFY's
        # cluster-wide lock, which is the cost (c) puts on producers.
        lines.append(f"SELECT pg_catalog.pg_notify('{CHANNEL}', '');")
    lines += ["\\sleep :d us", "COMMIT;"]
    return "\n".join(lines) + "\n"


def waiter_script(table):
    """pgbench script of a consumer at the head that only waits: read past
    its cursor (a LIMIT scan, as a tail does), move the cursor, wait_for.
    pgbench variables live as long as the client, so :cur is its cursor."""
    return (f"SELECT COALESCE(pg_catalog.max(id), :cur::bigint) AS cur FROM (SELECT id FROM public.{table} "
            f"WHERE id > :cur ORDER BY id LIMIT 1000) AS t \\gset\n"
            f"SELECT pgkvx.wait_for('public.{table}'::regclass, :cur::text, '1 s'::interval);\n")


class Pgbench:
    """One pgbench process running a script for `seconds` (or until stop())."""

    def __init__(self, script, clients, seconds, workdir, name, defines=(), threads=None):
        path = os.path.join(workdir, name + ".sql")
        with open(path, "w") as f:
            f.write(script)
        cmd = [os.path.join(pg_bindir(), "pgbench"), "-n", "-M", "prepared",
               "-c", str(clients), "-j", str(threads or min(clients, 2)), "-T", str(int(seconds)),
               "-f", path]
        for d in defines:
            cmd += ["-D", d]
        cmd.append(DBNAME)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stop(self):
        # SIGTERM, not SIGINT: a shell starting the harness in the
        # background leaves SIGINT ignored, and pgbench inherits that.
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        # Interrupted (Ctrl-C, SIGTERM) or failed: no pgbench outlives us.
        if self.proc.poll() is None:
            self.stop()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def result(self, timeout):
        """tps without connection time, transactions, and error lines."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
        n = re.search(r"number of transactions actually processed: (\d+)", out)
        errors = [ln for ln in err.splitlines() if "error" in ln.lower() or "abort" in ln.lower()]
        return {"tps": float(m.group(1)) if m else None,
                "transactions": int(n.group(1)) if n else None,
                "rc": self.proc.returncode, "errors": errors[:3]}


def parse_config(text):
    """'8x1,64x10@0' -> [(8, 1, 5.0), (64, 10, 0.0)]: producers x rows per
    transaction, @ the maximum commit delay in ms (default 5)."""
    out = []
    for part in text.split(","):
        spec, _, delay = part.strip().partition("@")
        p, _, r = spec.partition("x")
        out.append((int(p), int(r or 1), float(delay or 5.0)))
    return out


# ----------------------------------------------------------------- tables

def setup_table(conn, table, latched=True):
    conn.execute(f"DROP TABLE IF EXISTS public.{table}")
    conn.execute(f"CREATE TABLE public.{table} (id bigserial PRIMARY KEY, payload text NOT NULL)")
    if latched:
        # gapless: the DEFAULT becomes pgkvx.next_key, without which no
        # tail on id order can avoid skipping.
        conn.execute("SELECT pgkvx.enable(%s::regclass, gapless => true)", (f"public.{table}",))
    conn.execute(f"VACUUM (ANALYZE) public.{table}")


def pgq_available(conn):
    """(True, '') or (False, why): the extension in the server's tree and
    the ticker daemon on this machine."""
    if not conn.execute("SELECT 1 FROM pg_catalog.pg_available_extensions "
                        "WHERE name = 'pgq'").fetchone():
        if conn.info.server_version >= 160000:
            return False, "PgQ comes here only as Debian's package for PostgreSQL 15 (postgresql-15-pgq3)"
        return False, "the pgq extension is not installed (scripts/bootstrap installs postgresql-15-pgq3)"
    if not pgqd_path():
        return False, "pgqd is not installed (scripts/bootstrap installs it)"
    return True, ""


def setup_pgq(conn):
    conn.execute("CREATE EXTENSION IF NOT EXISTS pgq")
    if conn.execute("SELECT 1 FROM pgq.queue WHERE queue_name = %s", (QUEUE,)).fetchone():
        conn.execute("SELECT pgq.drop_queue(%s, true)", (QUEUE,))
    conn.execute("SELECT pgq.create_queue(%s)", (QUEUE,))
    conn.execute("SELECT pgq.register_consumer(%s, %s)", (QUEUE, PGQ_CONSUMER))


def pgqd_path():
    return os.environ.get("PGKVX_PGQD") or shutil.which("pgqd")


@contextlib.contextmanager
def pgqd_running():
    """Debian's pgqd, as the server's OS user, ticking the benchmark
    database of the scratch cluster at its default settings (ticker_period
    1 s; the queue's defaults close a batch at 500 events or 3 s).  Stopped
    on the way out, also on Ctrl-C or SIGTERM (both end up here)."""
    workdir = tempfile.mkdtemp(prefix="pgkvx-pgqd-")
    ini = os.path.join(workdir, "pgqd.ini")
    with open(ini, "w") as f:
        f.write("[pgqd]\n"
                f"base_connstr = host={os.environ.get('PGHOST', '/tmp')} "
                f"port={os.environ.get('PGPORT', '5432')} user={os.environ.get('PGUSER', 'postgres')}\n"
                f"initial_database = {DBNAME}\n"
                f"database_list = {DBNAME}\n"
                f"logfile = {workdir}/pgqd.log\n"
                f"pidfile = {workdir}/pgqd.pid\n")
    kw = {}
    if os.getuid() == 0:
        # pgqd, like the server, has no business running as root.
        user = os.environ.get("PGKVX_OS_USER", "postgres")
        shutil.chown(workdir, user)
        kw = {"user": user, "group": user}
    proc = subprocess.Popen([pgqd_path(), ini], stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(workdir, "stderr"), "w"), **kw)
    try:
        time.sleep(0.2)
        if proc.poll() is not None:
            raise RuntimeError(f"pgqd exited at once ({proc.returncode}): " + _tail(workdir))
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _tail(workdir):
    text = ""
    for name in ("stderr", "pgqd.log"):
        with contextlib.suppress(OSError), open(os.path.join(workdir, name)) as f:
            text += f.read()[-400:]
    return text.strip()


# ---------------------------------------------------------------- consumers

READ = f"SELECT id FROM public.{TABLE} WHERE id > %s ORDER BY id LIMIT %s"


def consumer(kind, cfg, limit, ready, go, done, final_count, final_max, out):
    """One consumer of `kind`; reports ids and receipt times (wall clock,
    the clock of the server's commit timestamps), and its query counts."""
    try:
        conn = connect(scan_mode="optimistic")
        ids, times = [], []
        queries = wakeups = timeouts = batches = 0
        read_s, seen, waits = [], set(), []
        errors = collections.Counter()
        if kind == "notify":
            conn.execute(f"LISTEN {CHANNEL}")
        ready.wait()
        go.wait()
        deadline = None
        cursor = 0
        while True:
            finished = done.is_set()   # before the read: it then sees every commit
            if finished and deadline is None:
                deadline = time.monotonic() + cfg.drain_timeout
            started, read_wall = time.monotonic(), time.time()
            try:
                if kind == "pgq":
                    got, q = _pgq_batch(conn)
                    queries += q
                else:
                    if kind == "notify":
                        # Notifications that arrived before this read are
                        # answered by it; those arriving during it stay
                        # queued and end the next wait at once.
                        for _ in conn.notifies(timeout=0):
                            pass
                    got = [r[0] for r in conn.execute(READ, (cursor, limit), prepare=True)]
                    queries += 1
            except psycopg.Error as e:
                errors[_first_line(e)] += 1
                got = []
            now = time.time()
            if got:
                # How long reads that returned rows took: at the head, an
                # optimistic read waits for writers in flight in its span.
                read_s.append(time.monotonic() - started)
                ids += got
                seen.update(got)
                times += [now] * len(got)
                batches += 1
                if kind != "pgq":
                    cursor = got[-1]
                if kind == "pgq" or len(got) == limit:
                    continue
            if finished and (len(seen) >= final_count.value
                             or (kind != "pgq" and cursor >= final_max.value)):
                break
            if deadline is not None and time.monotonic() > deadline:
                break
            wait_start = time.time()
            if kind == "poll1":
                time.sleep(0.001)
            elif kind == "poll100":
                time.sleep(0.1)
            elif kind == "pgq":
                time.sleep(cfg.pgq_poll_ms / 1000)
            elif kind == "wait_for":
                (woken,) = conn.execute(
                    "SELECT pgkvx.wait_for(%s::regclass, %s::text, %s::interval)",
                    (f"public.{TABLE}", str(cursor), f"{cfg.wait_timeout_s} s"),
                    prepare=True).fetchone()
                queries += 1
                if woken:
                    wakeups += 1
                else:
                    timeouts += 1
            elif kind == "notify":
                for _ in conn.notifies(timeout=cfg.wait_timeout_s, stop_after=1):
                    pass
            if kind != "pgq":   # its pause is not what delays it: the tick is
                waits.append((read_wall, wait_start, time.time()))
        conn.close()
        out.put(("consumer", 0, {"ids": ids, "times": times, "queries": queries,
                                 "wakeups": wakeups, "timeouts": timeouts, "batches": batches,
                                 "read_s": read_s, "waits": waits,
                                 "errors": dict(errors)}))
    except KeyboardInterrupt:
        pass
    except Exception as e:  # reported, so the driver neither hangs nor hides it
        ready.abort()
        out.put(("consumer", 0, {"fatal": _first_line(e)}))


def _pgq_batch(conn):
    """One PgQ consumer step: next_batch; when there is one, its events and
    finish_batch.  Returns (ids, queries)."""
    (bid,) = conn.execute("SELECT pgq.next_batch(%s, %s)", (QUEUE, PGQ_CONSUMER),
                          prepare=True).fetchone()
    if bid is None:
        return [], 1
    got = [int(r[0]) for r in conn.execute("SELECT ev_data FROM pgq.get_batch_events(%s)",
                                           (bid,), prepare=True)]
    conn.execute("SELECT pgq.finish_batch(%s)", (bid,), prepare=True)
    return got, 3


def _first_line(exc):
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


# ------------------------------------------------------------ measurement

def oracle(committed, delivered):
    """Exact: every committed id delivered once, nothing else delivered."""
    seen = set(delivered)
    missed = committed - seen
    phantoms = seen - committed
    return {"skipped": len(missed), "skipped_sample": sorted(missed)[:10],
            "phantoms": len(phantoms), "phantoms_sample": sorted(phantoms)[:10],
            "duplicates": len(delivered) - len(seen)}


def lag_stats(commit_ts, ids, times):
    """Commit-to-delivery lag in ms of each id's first delivery, two ways:

    - lag_*: from the commit of the row's own transaction;
    - inorder_*: from the moment the row *and every smaller key* had
      committed, the earliest a consumer reading in key order may deliver
      it without skipping (with commits out of key order, a row waits for
      the slower writers of the keys before it: the same for every
      consumer that reads in key order, whatever wakes it).

    Ids without a commit timestamp are left out."""
    first = {}
    for i, t in zip(ids, times):
        first.setdefault(i, t)
    ready, latest = {}, None
    for i in sorted(k for k, v in commit_ts.items() if v is not None):
        latest = commit_ts[i] if latest is None else max(latest, commit_ts[i])
        ready[i] = latest
    own = [(t - commit_ts[i]) * 1000.0 for i, t in first.items() if i in ready]
    inorder = [(t - ready[i]) * 1000.0 for i, t in first.items() if i in ready]
    out = {"lag_n": len(own)}
    for name, lags in (("lag", own), ("inorder", inorder)):
        out.update({f"{name}_p50_ms": percentile(lags, 50), f"{name}_p99_ms": percentile(lags, 99),
                    f"{name}_max_ms": max(lags, default=None)})
    return out


def wake_latency(commit_ts, waits):
    """How long after a commit a sleeping consumer woke.  A wait (read
    start, wait start, wait end) counts when nothing committed between the
    start of the read before it and the start of the wait (so nothing was
    pending that could end it at once: a NOTIFY queued during the read, a
    row wait_for finds already committed) and something committed during
    it: end minus that first commit.  The others say nothing about waking
    and are left out.  This is the wake-up mechanism alone; the lag adds
    the read that follows."""
    ts = sorted({t for t in commit_ts.values() if t is not None})
    out = []
    for read_start, start, end in waits:
        i = bisect.bisect_left(ts, start)
        if i < len(ts) and ts[i] <= end and (i == 0 or ts[i - 1] < read_start):
            out.append((end - ts[i]) * 1000.0)
    return {"wake_p50_ms": percentile(out, 50), "wake_p99_ms": percentile(out, 99),
            "wake_n": len(out)}


def committed_rows(conn, table):
    """{id: commit time, epoch seconds} of every row in the table."""
    return {i: ts for i, ts in conn.execute(
        f"SELECT id, pg_catalog.date_part('epoch', pg_catalog.pg_xact_commit_timestamp(xmin)) "
        f"FROM public.{table}")}


def summarize(run, rows_by_id, consumer_report, pgbench_report, rows_per_tx):
    """Turns one cell's raw material into the numbers of the report.  Rates
    are over the window from the first commit to the last (server clock)."""
    committed = set(rows_by_id)
    ts = [t for t in rows_by_id.values() if t is not None]
    window = (max(ts) - min(ts)) if len(ts) > 1 else None
    run.update(committed=len(committed),
               producer_tps=pgbench_report["tps"],
               events_per_s=(pgbench_report["tps"] * rows_per_tx
                             if pgbench_report["tps"] is not None else None),
               errors=pgbench_report["errors"])
    c = consumer_report
    if not run.get("consumer", True):
        return run
    if "fatal" in c:
        run["errors"] = ["consumer: " + c["fatal"]] + run["errors"]
        return run
    run.update(oracle(committed, c["ids"]))
    run.update(lag_stats(rows_by_id, c["ids"], c["times"]))
    delivered = len(set(c["ids"]))
    end = max(ts) if ts else None
    in_window = len({i for i, t in zip(c["ids"], c["times"]) if end is not None and t <= end})
    run.update(delivered=delivered,
               delivered_per_s=in_window / window if window else None,
               **wake_latency(rows_by_id, c["waits"]),
               read_p50_ms=_ms(percentile(c["read_s"], 50)),
               read_p99_ms=_ms(percentile(c["read_s"], 99)),
               queries=c["queries"], wakeups=c["wakeups"], wait_timeouts=c["timeouts"],
               batches=c["batches"],
               queries_per_row=c["queries"] / delivered if delivered else None,
               wakeups_per_batch=c["wakeups"] / c["batches"] if c["batches"] else None,
               errors=[f"{n}x {m}" for m, n in c["errors"].items()] + run["errors"])
    return run


def _ms(seconds):
    return None if seconds is None else seconds * 1000.0


def run_cell(kind, scenario, producers, rows, cfg, workdir, *, max_delay_ms, limit=None,
             consumer_kind=True):
    """One run: fresh table, one consumer of `kind` (none when
    consumer_kind is False), `producers` pgbench clients for cfg.duration."""
    limit = limit or cfg.limit
    kobj = next(k for k in KINDS if k.name == kind)
    with connect() as conn:
        setup_table(conn, TABLE)
        if kobj.producer == "pgq":
            setup_pgq(conn)
        conn.execute("CHECKPOINT")
        stats_before = stats_snapshot(conn)
    ctx = multiprocessing.get_context("fork")
    parties = 2 if consumer_kind else 1
    ready, go, done = ctx.Barrier(parties), ctx.Event(), ctx.Event()
    final_count, final_max = ctx.Value("q", 0), ctx.Value("q", 0)
    out = ctx.Queue()
    procs = []
    if consumer_kind:
        procs.append(ctx.Process(target=consumer, args=(kind, cfg, limit, ready, go, done,
                                                        final_count, final_max, out)))
    idle = None
    run = {"kind": kind, "scenario": scenario, "producers": producers, "rows": rows,
           "max_delay_ms": max_delay_ms, "consumer": consumer_kind}
    with contextlib.ExitStack() as stack:
        if kobj.producer == "pgq" and consumer_kind:
            stack.enter_context(pgqd_running())
        try:
            for p in procs:
                p.start()
            if scenario == "idle-in-tx":
                idle = connect(autocommit=False)
                idle.execute("SELECT pg_catalog.pg_current_xact_id()")
            try:
                ready.wait(timeout=60)
            except threading.BrokenBarrierError:
                raise RuntimeError("consumer did not start: " + fatal_messages(out)) from None
            go.set()
            with Pgbench(producer_script(kobj.producer, TABLE), producers, cfg.duration, workdir,
                         "producer", (f"rows={rows}", f"maxdelay={int(max_delay_ms * 1000)}")) as pb:
                pgb = pb.result(cfg.duration + 60)
            if idle is not None:
                idle.commit()
                idle.close()
                idle = None
            with connect() as conn:
                rows_by_id = committed_rows(conn, TABLE)
                final_count.value = len(rows_by_id)
                final_max.value = max(rows_by_id, default=0)
                done.set()
                rep = (_collect(out, cfg.drain_timeout + 30) if consumer_kind
                       else {"ids": [], "times": [], "queries": 0, "wakeups": 0, "timeouts": 0,
                             "batches": 0, "read_s": [], "waits": [], "errors": {}})
                run["stats"] = stats_delta(stats_before, stats_snapshot(conn))
            for p in procs:
                p.join(timeout=10)
        finally:
            if idle is not None:
                idle.close()
            for p in procs:
                if p.is_alive():
                    p.terminate()
                    p.join()
    run["drain_timed_out"] = consumer_kind and len(set(rep.get("ids", []))) < len(rows_by_id)
    return summarize(run, rows_by_id, rep, pgb, rows)


def _collect(out, timeout):
    try:
        return out.get(timeout=timeout)[2]
    except queue.Empty:
        raise RuntimeError(f"the consumer did not report within {timeout:g}s") from None


# ------------------------------------------------- producers vs. waiters

PAIR_CONDITIONS = [
    ("none", "no consumer waiting (control: the two sides are alike)"),
    ("1-same", "1 consumer waiting on one side's table"),
    ("100-same", "{n} consumers waiting on one side's table"),
    ("100-other", "{n} consumers waiting on a third table nobody writes"),
]


def _waiter_count(conn, table):
    return conn.execute("SELECT pg_catalog.count(*) FROM pgkvx.waiters WHERE relid = %s::regclass",
                        (f"public.{table}",)).fetchone()[0]


def run_pair(cond, rnd, cfg, workdir):
    """Two tables written at the same time by cfg.pair_producers clients
    each at full speed; waiters (pgbench clients tailing with wait_for) on
    side A's table (the sides swap every round), or on a third table."""
    a, b = ("wake_a", "wake_b") if rnd % 2 == 0 else ("wake_b", "wake_a")
    n = {"none": 0, "1-same": 1, "100-same": cfg.waiters, "100-other": cfg.waiters}[cond]
    target = "wake_other" if cond == "100-other" else a
    with connect() as conn:
        for t in ("wake_a", "wake_b", "wake_other"):
            setup_table(conn, t)
        conn.execute("CHECKPOINT")
        stats_before = stats_snapshot(conn)
    waiters = None
    res = {"condition": cond, "round": rnd, "waiter_table": target if n else None,
           "waiters": n, "side_a": a}
    try:
        if n:
            waiters = Pgbench(waiter_script(target), n, cfg.pair_duration + 60, workdir,
                              "waiter", ("cur=0",), threads=2)
            with connect() as conn:
                for _ in range(200):
                    if _waiter_count(conn, target) >= n or waiters.proc.poll() is not None:
                        break
                    time.sleep(0.05)
                res["waiting_at_start"] = _waiter_count(conn, target)
            if res["waiting_at_start"] < n:
                waiters.stop()
                raise RuntimeError(f"only {res['waiting_at_start']} of {n} waiters waiting: "
                                   + "; ".join(waiters.result(30)["errors"]))
        with Pgbench(producer_script("plain", a), cfg.pair_producers, cfg.pair_duration,
                     workdir, "side_a", ("rows=1", "maxdelay=0"), threads=cfg.pair_producers) as sa, \
             Pgbench(producer_script("plain", b), cfg.pair_producers, cfg.pair_duration,
                     workdir, "side_b", ("rows=1", "maxdelay=0"), threads=cfg.pair_producers) as sb:
            ra, rb = sa.result(cfg.pair_duration + 60), sb.result(cfg.pair_duration + 60)
        if waiters:
            with connect() as conn:
                res["waiting_at_end"] = _waiter_count(conn, target)
    finally:
        if waiters:
            waiters.stop()
            waiters.result(30)
    with connect() as conn:
        res["stats"] = stats_delta(stats_before, stats_snapshot(conn))
        for _ in range(60):    # backends of the stopped waiters leave within a wait
            if not conn.execute("SELECT pg_catalog.count(*) FROM pgkvx.waiters").fetchone()[0]:
                break
            time.sleep(0.05)
    res.update(tps_a=ra["tps"], tps_b=rb["tps"], errors=ra["errors"] + rb["errors"],
               ratio=ra["tps"] / rb["tps"] if ra["tps"] and rb["tps"] else None,
               total_tps=(ra["tps"] or 0) + (rb["tps"] or 0))
    return res


# --------------------------------------------------------------- the run

def run_wake(cfg, wake):
    """Runs every part in order, appending to `wake` (new_result()) as they
    finish; Ctrl-C (KeyboardInterrupt) propagates to the caller."""
    wake["config"] = asdict(cfg)
    with connect() as conn:
        ok, why = pgq_available(conn)
        tcts = conn.execute("SHOW track_commit_timestamp").fetchone()[0]
    if tcts != "on":
        raise RuntimeError("track_commit_timestamp is off: bench/run turns it on for the "
                           "wake workload (lag is measured against commit timestamps)")
    kinds = [k for k in cfg.kinds if k != "pgq" or ok]
    wake["pgq_missing"] = None if ok or "pgq" not in cfg.kinds or not cfg.reps else why
    if wake["pgq_missing"]:
        log(f"wake: PgQ left out: {why}")
    # The idle-in-transaction cell right after the same configuration's
    # steady cells: compared with them, under the same load of the machine.
    cells = []
    for rep in range(cfg.reps):
        for c in cfg.configs:
            cells += [(rep, "steady", c, k) for k in kinds]
            if "wait_for" in kinds and c in cfg.idle_configs:
                cells.append((rep, "idle-in-tx", c, "wait_for"))
        if "wait_for" in kinds:
            cells += [(rep, "idle-in-tx", c, "wait_for") for c in cfg.idle_configs
                      if c not in cfg.configs]
    with tempfile.TemporaryDirectory(prefix="pgkvx-wake-") as workdir:
        for n, (rep, sc, (p, r, d), k) in enumerate(cells, 1):
            tag = f"[{n}/{len(cells)}] wake {sc} {p}x{r}@{d:g}ms {k}"
            try:
                run = run_cell(k, sc, p, r, cfg, workdir, max_delay_ms=d)
            except (psycopg.Error, RuntimeError, OSError) as e:
                wake["cells"].append({"kind": k, "scenario": sc, "producers": p, "rows": r,
                                      "max_delay_ms": d, "rep": rep,
                                      "error": str(e).strip()[:300]})
                log(f"{tag}: failed: {str(e).strip()[:300]}")
                continue
            run["rep"] = rep
            wake["cells"].append(run)
            log(f"{tag}: {run['events_per_s'] or 0:,.0f} events/s, lag p50 "
                f"{_f(run.get('lag_p50_ms'))} p99 {_f(run.get('lag_p99_ms'))} ms, "
                f"{_f(run.get('queries_per_row'), '{:.3f}')} queries/row, "
                f"skipped {run.get('skipped')}")
        if cfg.pair_rounds:
            for rnd in range(cfg.pair_rounds):
                for cond, _ in PAIR_CONDITIONS:
                    try:
                        res = run_pair(cond, rnd, cfg, workdir)
                    except (psycopg.Error, RuntimeError, OSError) as e:
                        wake["pairs"].append({"condition": cond, "round": rnd,
                                              "error": str(e).strip()[:300]})
                        log(f"wake pair {cond} round {rnd + 1}: failed: {e}")
                        continue
                    wake["pairs"].append(res)
                    log(f"wake pair round {rnd + 1}/{cfg.pair_rounds} {cond}: "
                        f"{_f(res['tps_a'], '{:,.0f}')} / {_f(res['tps_b'], '{:,.0f}')} tps, "
                        f"ratio {_f(res['ratio'], '{:.3f}')}")
        for rnd in range(cfg.keepup_rounds):
            for rows in (1, 10):
                for with_consumer in (False, True):
                    tag = f"wake keep-up round {rnd + 1}/{cfg.keepup_rounds} {rows}-row " + \
                          ("with wait_for consumer" if with_consumer else "producers alone")
                    kcfg = WakeConfig(**{**asdict(cfg), "duration": cfg.keepup_duration})
                    try:
                        run = run_cell("wait_for", "keep-up", cfg.keepup_producers, rows, kcfg,
                                       workdir, max_delay_ms=0, limit=cfg.keepup_limit,
                                       consumer_kind=with_consumer)
                    except (psycopg.Error, RuntimeError, OSError) as e:
                        wake["keepup"].append({"rows": rows, "round": rnd,
                                               "consumer": with_consumer,
                                               "error": str(e).strip()[:300]})
                        log(f"{tag}: failed: {e}")
                        continue
                    run["round"] = rnd
                    wake["keepup"].append(run)
                    log(f"{tag}: {run['events_per_s'] or 0:,.0f} events/s"
                        + (f", delivered {run['delivered_per_s'] or 0:,.0f}/s, lag p99 "
                           f"{_f(run.get('lag_p99_ms'))} ms" if with_consumer else ""))


def _f(v, spec="{:.2f}"):
    return "–" if v is None else spec.format(v)


@contextlib.contextmanager
def commit_timestamps(restart):
    """track_commit_timestamp on for the wake workload, as it was after.
    It takes a server restart each way (`restart()`); on already, nothing
    changes."""
    with connect("postgres") as c:
        was = c.execute("SHOW track_commit_timestamp").fetchone()[0]
    if was == "on":
        yield
        return
    with connect("postgres") as c:
        c.execute("ALTER SYSTEM SET track_commit_timestamp = on")
    try:
        restart()
        yield
    finally:
        with connect("postgres") as c:
            c.execute("ALTER SYSTEM RESET track_commit_timestamp")
        restart()


def restart_cluster():
    subprocess.run([os.path.join(ROOT, "scripts", "cluster"), "restart"], check=True,
                   stdout=subprocess.DEVNULL)


def config_from_args(args):
    """WakeConfig from bench/run's (or this file's) options."""
    cfg = quick_config() if args.quick else WakeConfig()
    if args.wake_duration:
        cfg.duration = cfg.pair_duration = cfg.keepup_duration = args.wake_duration
    if args.wake_configs:
        cfg.configs = parse_config(args.wake_configs)
        delayed = [c for c in cfg.configs if c[2] > 0]
        cfg.idle_configs = delayed[:1] if args.quick else delayed
    if args.wake_kinds:
        cfg.kinds = [k for k in KIND_NAMES if k in args.wake_kinds.split(",")]
    if args.wake_reps is not None:
        cfg.reps = args.wake_reps
    if args.wake_pair_rounds is not None:
        cfg.pair_rounds = args.wake_pair_rounds
    if args.wake_keepup_rounds is not None:
        cfg.keepup_rounds = args.wake_keepup_rounds
    if args.wake_waiters is not None:
        cfg.waiters = args.wake_waiters
    return cfg


def add_args(ap):
    ap.add_argument("--wake-duration", type=float,
                    help="seconds producers run in each wake cell, pair and keep-up run (10; quick 2)")
    ap.add_argument("--wake-configs", help="producers x rows per transaction [@ max commit delay "
                                           "ms, default 5], e.g. 8x1,64x10,8x1@0 (default "
                                           "1x1,8x1,8x10,64x1,64x10,8x1@0; quick 8x1,64x10)")
    ap.add_argument("--wake-kinds", help=f"comma list of consumer kinds (default all: "
                                         f"{', '.join(KIND_NAMES)})")
    ap.add_argument("--wake-reps", type=int, help="repetitions of the side-by-side matrix (1)")
    ap.add_argument("--wake-pair-rounds", type=int,
                    help="rounds of the producer-throughput pairs (6; quick 1; 0 skips them)")
    ap.add_argument("--wake-keepup-rounds", type=int,
                    help="rounds of the keep-up runs (2; quick 1; 0 skips them)")
    ap.add_argument("--wake-waiters", type=int, help="waiting consumers in the pairs (100)")


def estimate_s(cfg):
    """Roughly how long run_wake takes, for the harness's opening line."""
    kinds = len(cfg.kinds)
    cells = cfg.reps * (len(cfg.configs) * kinds + len(cfg.idle_configs))
    return (cells * (cfg.duration + 4) + cfg.pair_rounds * 4 * (cfg.pair_duration + 3)
            + cfg.keepup_rounds * 4 * (cfg.keepup_duration + 3) + 10)


def new_result():
    return {"cells": [], "pairs": [], "keepup": [], "pgq_missing": None}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    add_args(ap)
    args = ap.parse_args()
    cfg = config_from_args(args)
    recreate_database()
    wake = new_result()
    try:
        with commit_timestamps(restart_cluster):
            run_wake(cfg, wake)
    finally:
        print(json.dumps(wake, indent=1, default=str))


if __name__ == "__main__":
    main()
