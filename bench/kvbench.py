"""The kv workloads (CockroachDB's `workload kv` in Postgres terms): resetting
the kv table for a mode, and one pgbench run of one workload in one mode.

The workload scripts are the files in bench/pgbench/, exactly as a user would
run them with `pgbench -f`.
"""
import glob
import os
import re
import subprocess
from dataclasses import dataclass

from common import BENCH, DBNAME, percentile, scan_node, stats_delta, stats_snapshot

PGBENCH_DIR = os.path.join(BENCH, "pgbench")

# name -> what it does; the order is the report's order.
WORKLOADS = {
    "kv0": "writes only (upserts of random keys)",
    "kv95": "95% point reads, 5% upserts",
    "kvS70-L1": "70% span reads LIMIT 1 from a random key, 30% upserts",
    "kvS70-L5": "70% span reads LIMIT 5 from a random key, 30% upserts",
    "kvS70-L100": "70% span reads LIMIT 100 from a random key, 30% upserts",
    "kvS70-L1000": "70% span reads LIMIT 1000 from a random key, 30% upserts",
    "kvS70-L1-first": "kvS70-L1 with every span read starting at the table's first key",
}


@dataclass(frozen=True)
class Mode:
    name: str
    label: str
    latched: bool       # kv registered with pgkvx.enable (writes take latches)
    scan_mode: str      # pgkvx.scan_mode for every session


# The plain baseline leaves kv unregistered and scans off: what a Postgres
# user gets.  pgkvx stays preloaded (that needs a restart to change), but with
# the table unlatched and scans off none of its code is on the query path.
KV_MODES = [
    Mode("plain", "plain PG", False, "off"),
    Mode("latched-off", "latched, off", True, "off"),
    Mode("fenced", "fenced", True, "fenced"),
    Mode("optimistic", "optimistic", True, "optimistic"),
]


def prepare_seed(conn, keys, psql):
    """Loads kv once with bench/pgbench/kv-init.sql (the file users run) and
    keeps it as kv_seed, so that every run of every mode starts from the same
    rows in the same physical order."""
    conn.execute("DROP TABLE IF EXISTS kv_seed, kv")
    subprocess.run([psql, "-X", "-q", "-v", f"keys={keys}", "-d", DBNAME,
                    "-f", os.path.join(PGBENCH_DIR, "kv-init.sql")], check=True)
    conn.execute("ALTER TABLE kv RENAME TO kv_seed")
    conn.execute("ALTER INDEX kv_pkey RENAME TO kv_seed_pkey")
    return conn.execute("SELECT count(*) FROM kv_seed").fetchone()[0]


def reset_kv(conn, mode, table="kv"):
    """A fresh kv (or `table`, schema-qualified) from the seed, registered
    when the mode is latched, vacuumed and checkpointed so that no run pays
    for the previous run's garbage."""
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"CREATE TABLE {table} (LIKE public.kv_seed INCLUDING ALL)")
    conn.execute(f"INSERT INTO {table} SELECT * FROM public.kv_seed")
    if mode.latched:
        conn.execute("SELECT pgkvx.enable(%s::regclass)", (table,))
    conn.execute(f"VACUUM (ANALYZE) {table}")
    conn.execute("CHECKPOINT")


def read_statement(workload):
    """The workload's read query with a constant key, for EXPLAIN; None for a
    workload without reads."""
    with open(os.path.join(PGBENCH_DIR, workload + ".sql")) as f:
        for line in f:
            if line.startswith("SELECT"):
                return line.strip().rstrip(";").replace(":k", "0")
    return None


def read_scan_node(conn, workload, scan_mode):
    """Whether the workload's read query gets pgkvx's LIMIT scan node; only
    LIMIT queries can."""
    stmt = read_statement(workload)
    if stmt is None or "LIMIT" not in stmt:
        return "– (no LIMIT read)"
    return scan_node(conn, stmt, scan_mode)


def pgbench_cmd(pgbench, workload, clients, jobs, duration, extra=()):
    """The pgbench command line every kv run uses (before the database)."""
    return [pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", str(jobs),
            "-T", str(duration), "-f", os.path.join(PGBENCH_DIR, workload + ".sql"),
            *extra, DBNAME]


def parse_tps(out):
    """tps from pgbench's summary (without connection time); None if absent."""
    m = re.search(r"^tps = ([\d.]+) \(without initial connection time\)", out, re.M)
    return float(m.group(1)) if m else None


def run_pgbench(pgbench, workload, scan_mode, cfg, logdir, conn):
    """One pgbench run; returns tps, latency percentiles from the
    per-transaction logs, failures, error messages and pgkvx counter deltas.
    Never raises for a failing pgbench: the failure is part of the result."""
    prefix = os.path.join(logdir, "pgbench")
    for old in glob.glob(prefix + ".*"):
        os.remove(old)
    cmd = pgbench_cmd(pgbench, workload, cfg.clients, cfg.jobs, cfg.duration,
                      ("-l", "--log-prefix", prefix))
    env = dict(os.environ, PGOPTIONS=f"-c pgkvx.scan_mode={scan_mode}")
    before = stats_snapshot(conn)
    errors = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env) as proc:
        try:
            out, err = proc.communicate(timeout=cfg.duration + 120)
        except subprocess.TimeoutExpired:
            # A client stuck for ever (e.g. a wait that never ends) must not
            # stall the whole matrix.
            proc.kill()
            out, err = proc.communicate()
            errors.append(f"pgbench did not finish within {cfg.duration + 120}s; killed")
        except BaseException:
            proc.terminate()
            proc.wait()
            raise
    latencies = read_latencies(prefix)
    failed = re.search(r"^number of failed transactions: (\d+)", out, re.M)
    errors += error_lines(err)
    return {
        "tps": parse_tps(out),
        "transactions": len(latencies),
        "p50_ms": ms(percentile(latencies, 50)),
        "p99_ms": ms(percentile(latencies, 99)),
        "failed": int(failed.group(1)) if failed else None,
        "rc": proc.returncode,
        "errors": errors,
        "stats": stats_delta(before, stats_snapshot(conn)),
    }


def read_latencies(prefix):
    """Latencies (µs) of the completed transactions in pgbench's
    per-transaction logs (one file per thread); the logs are removed after
    reading: a full run would otherwise leave gigabytes behind."""
    latencies = []
    for path in glob.glob(prefix + ".*"):
        with open(path) as f:
            for line in f:
                # client_id transaction_no time script_no time_epoch time_us;
                # time is "failed" or "skipped" for transactions that did not
                # complete.
                field = line.split(maxsplit=3)[2]
                if field.isdigit():
                    latencies.append(int(field))
        os.remove(path)
    return latencies


def error_lines(stderr, keep=5):
    """The distinct error messages pgbench printed, client numbers folded."""
    seen = []
    for line in stderr.splitlines():
        if re.search(r"error|aborted|FATAL|ERROR", line):
            line = re.sub(r"client \d+", "client N", line.strip())[:300]
            if line not in seen:
                seen.append(line)
    return seen[:keep]


def ms(us):
    return None if us is None else us / 1000.0
