"""Time to a pyarrow.Table in the client: pgkvx.arrow_scan against the ADBC
PostgreSQL driver, ConnectorX and psycopg binary COPY, on one table of N rows
x 16 mixed columns, for 2 projected columns and for all 16.

Methods run interleaved (A B C D A B C D ...) so drift hits them alike; the
report gives medians and ratios against peers measured in the same run, plus
the backend's peak private memory for arrow_scan at N/10 and N rows.

Peers get `SELECT cols FROM t` without ORDER BY (a sequential scan, their
fastest plan) while arrow_scan returns key order through the primary key
index: the comparison favours the peers.
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
            SELECT g, (g * 7) % 1000000, g * 1000003, (g % 30000)::int2,
                   g / 3.0, (g % 1000) / 7.0, CASE WHEN g % 10 = 0 THEN NULL ELSE random() END,
                   'user_' || g, md5(g::text), 'status-' || (g % 17),
                   (g % 100000) / 100.0, g / 1000000.0,
                   timestamptz '2020-01-01' + g * interval '1 second',
                   CASE WHEN g % 5 = 0 THEN NULL ELSE now() - g * interval '1 minute' END,
                   md5(g::text)::uuid, md5((g + 1)::text)::uuid
            FROM generate_series(1, {rows}) g""")
        c.execute(f"VACUUM (FREEZE, ANALYZE) {TABLE}")
        c.execute(f"COMMENT ON TABLE {TABLE} IS 'rows={rows}'")


# --- the methods: each returns a pyarrow.Table ------------------------------

class ArrowScan:
    name = "pgkvx.arrow_scan"

    def __init__(self):
        self.conn = psycopg.connect(tcp_uri(DB), autocommit=True)

    def pid(self):
        return self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]

    def run(self, cols, max_rows=None):
        cur = self.conn.cursor(binary=True)
        cur.execute("SELECT pgkvx.arrow_scan(%s::regclass, %s, max_rows => %s)", (TABLE, cols, max_rows))
        buf = b"".join(r[0] for r in cur)
        return ipc.open_stream(buf).read_all()


class ArrowQuery(ArrowScan):
    name = "pgkvx.arrow_query"

    def run(self, cols, max_rows=None):
        cur = self.conn.cursor(binary=True)
        cur.execute("SELECT pgkvx.arrow_query(%s)", (f"SELECT {', '.join(cols)} FROM {TABLE}",))
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

    def run(self, cols):
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT {', '.join(cols)} FROM {TABLE}")
            return cur.fetch_arrow_table()


class ConnectorX:
    name = "ConnectorX"

    def run(self, cols):
        t = cx.read_sql(tcp_uri(DB) + "?cxprotocol=binary", f"SELECT {', '.join(cols)} FROM {TABLE}",
                        return_type="arrow")
        if isinstance(t, pa.RecordBatchReader):
            t = t.read_all()
        return t


class PsycopgCopy:
    name = "psycopg binary COPY"

    def __init__(self):
        self.conn = psycopg.connect(tcp_uri(DB), autocommit=True)
        self.types = dict(self.conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0", (TABLE,)).fetchall())

    def run(self, cols):
        cur = self.conn.cursor()
        out = [[] for _ in cols]
        with cur.copy(f"COPY (SELECT {', '.join(cols)} FROM {TABLE}) TO STDOUT (FORMAT binary)") as cp:
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--copy-reps", type=int, default=2, help="psycopg COPY is slow; fewer repetitions")
    ap.add_argument("--out", default="bench/results/arrow")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    setup(args.rows)

    methods = [ArrowScan(), ArrowQuery(), Adbc(), ConnectorX(), PsycopgCopy()]
    projections = {"2 of 16 columns": TWO, "16 of 16 columns": COLUMNS}
    times = {(m.name, p): [] for m in methods for p in projections}

    # warm-up: caches, connections, the extension loaded in each backend
    for m in methods:
        for cols in projections.values():
            t = m.run(cols) if not isinstance(m, PsycopgCopy) else None
            if t is not None:
                assert t.num_rows == args.rows, (m.name, t.num_rows)

    for rep in range(args.reps):
        for pname, cols in projections.items():
            for m in methods:
                if isinstance(m, PsycopgCopy) and rep >= args.copy_reps:
                    continue
                t0 = time.perf_counter()
                t = m.run(cols)
                dt = time.perf_counter() - t0
                assert t.num_rows == args.rows and t.num_columns == len(cols), (m.name, t.shape)
                times[(m.name, pname)].append(dt)
                print(f"rep {rep} {pname:17} {m.name:22} {dt:8.3f} s", flush=True)

    scan = methods[0]
    pid = scan.pid()
    mem = {
        f"arrow_scan, {args.rows // 10} rows (max_rows)": peak_growth_kb(
            pid, lambda: scan.run(COLUMNS, args.rows // 10)),
        f"arrow_scan, {args.rows} rows": peak_growth_kb(pid, lambda: scan.run(COLUMNS)),
    }
    adbc_m = methods[2]
    mem[f"ADBC (COPY), {args.rows} rows"] = peak_growth_kb(adbc_m.pid(), lambda: adbc_m.run(COLUMNS))

    med = {k: statistics.median(v) for k, v in times.items()}
    report(args, methods, projections, times, med, mem)


def report(args, methods, projections, times, med, mem):
    lines = [
        "# Arrow projection benchmark",
        "",
        f"`bench/arrow/run --rows {args.rows} --reps {args.reps}` on {platform.node()} "
        f"({os.cpu_count()} cores), {time.strftime('%Y-%m-%d %H:%M')}. Table `{TABLE}`: {args.rows} rows x 16 "
        "columns (int8 key, int4/int8/int2, 3 floats, 3 text, numeric(12,2), numeric(18,6), 2 timestamptz, "
        "2 uuid). Time from query to a complete `pyarrow.Table` in the client, over TCP to 127.0.0.1; "
        f"median of {args.reps} interleaved runs ({args.copy_reps} for psycopg COPY). "
        f"2 columns = `{', '.join(TWO)}`.",
        "",
        "Peers run `SELECT cols FROM t` (sequential scan, no ORDER BY); arrow_scan returns key order via the "
        "primary key index.",
        "",
        "| method | " + " | ".join(f"{p}: median s | arrow_scan speed-up" for p in projections) + " |",
        "| --- | " + " | ".join("---: | ---:" for _ in projections) + " |",
    ]
    for m in methods:
        cells = []
        for p in projections:
            mine = med[("pgkvx.arrow_scan", p)]
            cells.append(f"{med[(m.name, p)]:.3f} | {med[(m.name, p)] / mine:.2f}x")
        lines.append(f"| {m.name} | " + " | ".join(cells) + " |")
    lines += ["", "Backend peak private memory (RssAnon growth during the statement):", "",
              "| run | peak growth |", "| --- | ---: |"]
    for k, v in mem.items():
        lines.append(f"| {k} | {v / 1024:.1f} MiB |")
    lines += ["", "All runs (s):", ""]
    for (m, p), v in times.items():
        lines.append(f"- {m}, {p}: " + ", ".join(f"{x:.3f}" for x in v))
    md = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"rows": args.rows, "reps": args.reps,
                   "times": {f"{m} | {p}": v for (m, p), v in times.items()},
                   "memory_kb": mem}, f, indent=1)
    chart(args, methods, projections, med)
    print(md)


def chart(args, methods, projections, med):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(projections), figsize=(11, 4))
    for ax, p in zip(axes, projections):
        names = [m.name for m in methods]
        vals = [med[(n, p)] for n in names]
        bars = ax.barh(names, vals, color=["#2a7" if n.startswith("pgkvx") else "#888" for n in names])
        ax.bar_label(bars, fmt="%.2f s", padding=3)
        ax.set_title(f"{p} ({args.rows:,} rows)")
        ax.set_xlabel("seconds to pyarrow.Table (median, lower is better)")
        ax.invert_yaxis()
        ax.set_xlim(0, max(vals) * 1.25)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "arrow_bench.png"), dpi=110)


if __name__ == "__main__":
    main()
