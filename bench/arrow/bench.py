"""Time to a pyarrow.Table in the client: pgkvx.arrow_scan against the ADBC
PostgreSQL driver, ConnectorX and psycopg binary COPY, on one table of N rows
x 16 mixed columns, for 2 projected columns and for all 16.

Methods run interleaved (A B C D A B C D ...) so drift hits them alike; the
report gives medians and ratios against peers measured in the same run, plus
the backend's peak private memory for arrow_scan at N/10 and N rows.

Two scenarios, each comparing methods that return the same result:
- key order: pgkvx.arrow_scan (primary key index) against the peers running
  `SELECT cols FROM t ORDER BY k`;
- any order: pgkvx.arrow_query('SELECT cols FROM t') against the peers
  running the same query (sequential scans all round).
"""
import argparse
import io
import json
import os
import platform
import statistics
import threading
import time

import adbc_driver_postgresql.dbapi as adbc
import connectorx as cx
import psycopg
import pyarrow as pa
import pyarrow.ipc as ipc

DB = "pgkvx_bench_arrow"
TABLE = "bench16"
TWO = ["i2", "t1"]
COLUMNS = ["k", "i1", "i2", "i3", "f1", "f2", "f3", "t1", "t2", "t3", "n1", "n2", "ts1", "ts2", "u1", "u2"]


def libpq(dbname):
    host = os.environ.get("PGHOST", "/tmp")
    port = os.environ.get("PGPORT", "55432")
    return f"host={host} port={port} user=postgres dbname={dbname}"


def tcp_uri(dbname):
    # All methods talk TCP to 127.0.0.1 so transport costs are equal.
    return f"postgresql://postgres@127.0.0.1:{os.environ.get('PGPORT', '55432')}/{dbname}"


def setup(rows):
    with psycopg.connect(libpq("postgres"), autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB,)).fetchone():
            c.execute(f"CREATE DATABASE {DB}")
    with psycopg.connect(libpq(DB), autocommit=True) as c:
        c.execute("DROP EXTENSION IF EXISTS pgkvx")
        c.execute("CREATE EXTENSION pgkvx")
        have = c.execute("SELECT obj_description(%s::regclass)", (TABLE,)).fetchone() \
            if c.execute("SELECT to_regclass(%s)", (TABLE,)).fetchone()[0] else None
        if have and have[0] == f"rows={rows}":
            settle(c)
            return
        print(f"loading {rows} rows ...", flush=True)
        c.execute(f"DROP TABLE IF EXISTS {TABLE}")
        c.execute(f"""
            CREATE TABLE {TABLE} (
              k int8 PRIMARY KEY, i1 int4, i2 int8, i3 int2,
              f1 float8, f2 float4, f3 float8,
              t1 text, t2 text, t3 varchar(40),
              n1 numeric(12,2), n2 numeric(18,6),
              ts1 timestamptz, ts2 timestamptz, u1 uuid, u2 uuid)""")
        c.execute(f"""
            INSERT INTO {TABLE}
            SELECT g, (g * 7) % 1000000, g::int8 * 1000003, (g % 30000)::int2,
                   g / 3.0, (g % 1000) / 7.0, CASE WHEN g % 10 = 0 THEN NULL ELSE random() END,
                   'user_' || g, md5(g::text), 'status-' || (g % 17),
                   (g % 100000) / 100.0, g / 1000000.0,
                   timestamptz '2020-01-01' + g * interval '1 second',
                   CASE WHEN g % 5 = 0 THEN NULL ELSE now() - g * interval '1 minute' END,
                   md5(g::text)::uuid, md5((g + 1)::text)::uuid
            FROM generate_series(1, {rows}) g""")
        c.execute(f"COMMENT ON TABLE {TABLE} IS 'rows={rows}'")
        settle(c)


def settle(c):
    """Vacuums the table until every page is all-visible, as autovacuum
    leaves a table that is read more than written: a VACUUM that ran while
    some snapshot was open (another benchmark, a forgotten session) leaves
    pages that every method would then check tuple by tuple."""
    for _ in range(5):
        c.execute(f"VACUUM (FREEZE, ANALYZE) {TABLE}")
        visible, pages = c.execute(
            "SELECT relallvisible, relpages FROM pg_class WHERE oid = %s::regclass", (TABLE,)).fetchone()
        if visible >= pages:
            return
        time.sleep(1)
    print(f"warning: only {visible} of {pages} pages of {TABLE} are all-visible "
          "(a long-running transaction holds the xmin horizon back)", flush=True)


# --- the methods: each returns a pyarrow.Table ------------------------------

class ArrowScan:
    name = "pgkvx.arrow_scan"

    def __init__(self):
        self.conn = psycopg.connect(tcp_uri(DB), autocommit=True)

    def pid(self):
        return self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]

    def run(self, cols, ordered=True, max_rows=None):
        assert ordered
        cur = self.conn.cursor(binary=True)
        cur.execute("SELECT pgkvx.arrow_scan(%s::regclass, %s, max_rows => %s)", (TABLE, cols, max_rows))
        buf = b"".join(r[0] for r in cur)
        return ipc.open_stream(buf).read_all()


class ArrowQuery(ArrowScan):
    name = "pgkvx.arrow_query"

    def run(self, cols, ordered=False):
        cur = self.conn.cursor(binary=True)
        cur.execute("SELECT pgkvx.arrow_query(%s)", (sql(cols, ordered),))
        buf = b"".join(r[0] for r in cur)
        return ipc.open_stream(buf).read_all()


class Adbc:
    name = "ADBC postgresql"

    def __init__(self):
        self.conn = adbc.connect(tcp_uri(DB))

    def pid(self):
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            return cur.fetchone()[0]

    def run(self, cols, ordered):
        with self.conn.cursor() as cur:
            cur.execute(sql(cols, ordered))
            return cur.fetch_arrow_table()


class ConnectorX:
    name = "ConnectorX"

    def run(self, cols, ordered):
        t = cx.read_sql(tcp_uri(DB) + "?cxprotocol=binary", sql(cols, ordered),
                        return_type="arrow")
        if isinstance(t, pa.RecordBatchReader):
            t = t.read_all()
        return t


class PsycopgCopy:
    name = "psycopg binary COPY"

    def __init__(self):
        self.conn = psycopg.connect(tcp_uri(DB), autocommit=True)
        self.types = dict(self.conn.execute(
            "SELECT attname, atttypid::int FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0", (TABLE,)).fetchall())

    def run(self, cols, ordered):
        cur = self.conn.cursor()
        out = [[] for _ in cols]
        with cur.copy(f"COPY ({sql(cols, ordered)}) TO STDOUT (FORMAT binary)") as cp:
            cp.set_types([self.types[c] for c in cols])
            for row in cp.rows():
                for i, v in enumerate(row):
                    out[i].append(v)
        return pa.table(dict(zip(cols, out)))


# --- measurement ------------------------------------------------------------

def rss_anon_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def peak_growth_kb(pid, fn):
    base = rss_anon_kb(pid)
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_anon_kb(pid))
            time.sleep(0.001)

    th = threading.Thread(target=sample)
    th.start()
    try:
        fn()
    finally:
        stop.set()
        th.join()
    return max(peak[0], rss_anon_kb(pid)) - base


def sql(cols, ordered):
    return f"SELECT {', '.join(cols)} FROM {TABLE}" + (" ORDER BY k" if ordered else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--copy-reps", type=int, default=2, help="psycopg COPY is slow; fewer repetitions")
    ap.add_argument("--out", default="bench/results/arrow")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    setup(args.rows)

    scan, query, adbc_m, cx_m, copy_m = ArrowScan(), ArrowQuery(), Adbc(), ConnectorX(), PsycopgCopy()
    peers = [adbc_m, cx_m, copy_m]
    scenarios = {"key order": (True, [scan] + peers), "any order": (False, [query] + peers)}
    projections = {"2 of 16 columns": TWO, "16 of 16 columns": COLUMNS}
    times = {(s, p, m.name): [] for s, (_, ms) in scenarios.items() for p in projections for m in ms}

    # warm-up: caches, connections, the extension loaded in each backend
    for s_name, (ordered, ms) in scenarios.items():
        for cols in projections.values():
            for m in ms:
                if m is not copy_m:
                    assert m.run(cols, ordered).num_rows == args.rows, (m.name, s_name)

    for rep in range(args.reps):
        for s_name, (ordered, ms) in scenarios.items():
            for p_name, cols in projections.items():
                for m in ms:
                    if m is copy_m and rep >= args.copy_reps:
                        continue
                    t0 = time.perf_counter()
                    t = m.run(cols, ordered)
                    dt = time.perf_counter() - t0
                    assert t.num_rows == args.rows and t.num_columns == len(cols), (m.name, t.shape)
                    if ordered:
                        k = t.column(0).to_pylist()[:3] if cols[0] == "k" else None
                        assert k in (None, [1, 2, 3])
                    times[(s_name, p_name, m.name)].append(dt)
                    print(f"rep {rep} {s_name:9} {p_name:17} {m.name:22} {dt:8.3f} s", flush=True)

    pid = scan.pid()
    mem = {
        f"arrow_scan, {args.rows // 4} rows (max_rows)": peak_growth_kb(
            pid, lambda: scan.run(COLUMNS, True, args.rows // 4)),
        f"arrow_scan, {args.rows} rows": peak_growth_kb(pid, lambda: scan.run(COLUMNS)),
        f"ADBC (COPY), {args.rows} rows": peak_growth_kb(adbc_m.pid(), lambda: adbc_m.run(COLUMNS, True)),
    }
    med = {k: statistics.median(v) for k, v in times.items()}
    report(args, scenarios, projections, times, med, mem)


def report(args, scenarios, projections, times, med, mem):
    load = os.getloadavg()
    lines = [
        "# Arrow projection benchmark",
        "",
        f"`bench/arrow/run --rows {args.rows} --reps {args.reps} --copy-reps {args.copy_reps}` on "
        f"{platform.node()} ({os.cpu_count()} cores; load average at the end {load[0]:.1f}, {load[1]:.1f}, "
        f"{load[2]:.1f} -- the machine is shared, so compare ratios within this run, not absolute times), "
        f"{time.strftime('%Y-%m-%d %H:%M')}.",
        "",
        f"Table `{TABLE}`: {args.rows} rows x 16 columns (int8 key, int4/int8/int2, 3 floats, 3 text, "
        "numeric(12,2), numeric(18,6), 2 timestamptz, 2 uuid). Time from query to a complete `pyarrow.Table` "
        f"in the client, over TCP to 127.0.0.1; median of {args.reps} interleaved runs ({args.copy_reps} for "
        f"psycopg COPY, which decodes row by row in Python). 2 columns = `{', '.join(TWO)}`.",
        "",
        "- **key order**: `pgkvx.arrow_scan` (primary key index) vs the peers on `SELECT cols FROM t ORDER BY k`"
        " -- the same result;",
        "- **any order**: `pgkvx.arrow_query('SELECT cols FROM t')` vs the peers on the same query"
        " (sequential scans).",
        "",
        "Speed-up = peer median / pgkvx median (higher is better for pgkvx).",
        "",
    ]
    for s_name, (_, ms) in scenarios.items():
        lines += [f"### {s_name}", "",
                  "| method | " + " | ".join(f"{p}: median s | speed-up" for p in projections) + " |",
                  "| --- | " + " | ".join("---: | ---:" for _ in projections) + " |"]
        for m in ms:
            cells = []
            for p in projections:
                mine = med[(s_name, p, ms[0].name)]
                cells.append(f"{med[(s_name, p, m.name)]:.3f} | {med[(s_name, p, m.name)] / mine:.2f}x")
            lines.append(f"| {m.name} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["Backend peak private memory (RssAnon growth during the statement):", "",
              "| run | peak growth |", "| --- | ---: |"]
    for k, v in mem.items():
        lines.append(f"| {k} | {v / 1024:.1f} MiB |")
    lines += ["", "All runs (s):", ""]
    for (s_name, p, m), v in times.items():
        lines.append(f"- {s_name}, {p}, {m}: " + ", ".join(f"{x:.3f}" for x in v))
    md = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"rows": args.rows, "reps": args.reps, "loadavg": load,
                   "times": {f"{s} | {p} | {m}": v for (s, p, m), v in times.items()},
                   "memory_kb": mem}, f, indent=1)
    chart(args, scenarios, projections, med)
    print(md)


def chart(args, scenarios, projections, med):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(scenarios), len(projections), figsize=(12, 3.2 * len(scenarios)))
    for row, (s_name, (_, ms)) in zip(axes, scenarios.items()):
        for ax, p in zip(row, projections):
            names = [m.name for m in ms]
            vals = [med[(s_name, p, n)] for n in names]
            bars = ax.barh(names, vals, color=["#2a7" if n.startswith("pgkvx") else "#888" for n in names])
            ax.bar_label(bars, fmt="%.2f s", padding=3)
            ax.set_title(f"{s_name}, {p} ({args.rows:,} rows)")
            ax.set_xlabel("seconds to pyarrow.Table (median; lower is better)")
            ax.invert_yaxis()
            ax.set_xlim(0, max(vals) * 1.3)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "arrow_bench.png"), dpi=100)


if __name__ == "__main__":
    main()
