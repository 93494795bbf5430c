"""bench/run --paired's engine: two modes of one kv workload run at the same
time, each on its own copy of kv, and the ratio of their throughputs.

Why: on a shared machine the throughput of one 20-second run drifts by 10-20%
from the next, so ratios between runs taken one after another cannot resolve
the few percent pgkvx costs.  Two pgbench processes running side by side share
every disturbance.  Each gets half the clients; with the CPUs saturated each
side's throughput is inversely proportional to the CPU one of its transactions
costs, so tps(mode) / tps(baseline) is the cost ratio the sequential matrix
estimates, with the noise common to both sides cancelled.  Over every four
rounds the sides take both schemas and both start orders, so neither is
favoured, and every pgbench client has its own thread (with one thread per
side, whichever pgbench the scheduler favoured ran ahead: ratios spread
0.70-1.19).  A plain-against-plain pair (kv0:plain, in the defaults) shows
the noise floor of the method itself.

Each side's table is `kv` in its own schema (pgkvx_side_a / pgkvx_side_b),
reached through search_path, so the workload files in bench/pgbench/ run
unchanged.  Timings are reported, never asserted.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import kvbench
from common import (DURABILITY, add_durable_arg, connect, durability, durability_text, log as _log,
                    machine, pg_bindir, recreate_database, report_base, run_engine)

SCHEMAS = ("pgkvx_side_a", "pgkvx_side_b")
MODES = {m.name: m for m in kvbench.KV_MODES}
# The comparisons the latch-table and LIMIT-scan issues ask about.
# kv0:plain runs plain against plain: the method's own noise floor.
DEFAULT_PAIRS = "kv0:plain,kv0:latched-off,kvS70-L1:optimistic,kvS70-L1:fenced,kvS70-L1000:optimistic"


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="bench/run --paired", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", default=DEFAULT_PAIRS,
                    help=f"comma list of workload:mode, each run against plain PostgreSQL "
                         f"(default {DEFAULT_PAIRS})")
    ap.add_argument("--rounds", type=int, default=8, help="rounds per pair (8)")
    ap.add_argument("--duration", type=int, default=15, help="seconds per round (15)")
    ap.add_argument("--clients", type=int, default=16, help="clients in all, half per side (16)")
    ap.add_argument("--keys", type=int, default=100_000, help="kv preload (random keys)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out"))
    add_durable_arg(ap)
    args = ap.parse_args(argv)
    args.pairs = [_pair(p) for p in args.pairs.split(",") if p.strip()]
    if args.clients < 2 or args.clients % 2:
        sys.exit("bench/run --paired: --clients must be even and at least 2")
    return args


def _pair(text):
    wl, _, mode = text.strip().partition(":")
    if wl not in kvbench.WORKLOADS or mode not in MODES:
        sys.exit(f"bench/run --paired: bad pair {text!r}; workloads {', '.join(kvbench.WORKLOADS)}; "
                 f"modes {', '.join(MODES)}")
    return wl, mode


def reset_side(conn, schema, mode):
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    kvbench.reset_kv(conn, mode, table=f"{schema}.kv")


def run_round(pgbench, workload, sides, clients, duration):
    """Starts one pgbench per side at once; returns each side's tps (None when
    its pgbench failed) and error lines."""
    procs = []
    for schema, mode in sides:
        env = dict(os.environ)
        env["PGOPTIONS"] = f"-c search_path={schema},public -c pgkvx.scan_mode={mode.scan_mode}"
        cmd = kvbench.pgbench_cmd(pgbench, workload, clients, clients, duration)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    out = []
    try:
        for p in procs:
            try:
                stdout, stderr = p.communicate(timeout=duration + 120)
            except subprocess.TimeoutExpired:
                # A client stuck for ever must not stall the other pairs.
                p.kill()
                p.communicate()
                out.append((None, [f"pgbench did not finish within {duration + 120}s; killed"]))
                continue
            out.append((kvbench.parse_tps(stdout), kvbench.error_lines(stderr)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def summarise(ratios):
    ok = [r for r in ratios if r is not None]
    if not ok:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(ok), "min": min(ok), "max": max(ok), "n": len(ok)}


def render(result):
    m = result["machine"]
    lines = [
        f"# pgkvx paired benchmark, {result['started']}",
        "",
        f"{m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB; {m['postgres'].split(' on ')[0]}; "
        f"load average {m['loadavg']:.2f} at start; pgkvx {m['pgkvx_version']}; "
        + ", ".join(f"{k}={m['settings'].get(k, '?')}" for k in DURABILITY)
        + f": {durability_text(result['config'])}.",
        "",
        f"Each round runs plain PostgreSQL and the mode at the same time, {result['config']['clients'] // 2} "
        f"pgbench clients each (`-M prepared`, one thread per client, {result['config']['duration']} s), "
        f"on separate copies of the {result['config']['keys']:,}-key kv table; over every four rounds "
        "the sides take both schemas and both start orders. "
        "Ratio = mode tps / plain tps within a round (above 1: the mode is faster); "
        "the `plain PG` row runs plain against plain and shows the method's noise.",
        "",
        "| workload | mode | rounds | median ratio | min | max | plain tps (median) | mode tps (median) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in result["pairs"]:
        s = p["summary"]
        fmt = lambda x: "–" if x is None else f"{x:.3f}"  # noqa: E731
        base = statistics.median([r["plain_tps"] for r in p["rounds"] if r["plain_tps"]] or [0])
        mode = statistics.median([r["mode_tps"] for r in p["rounds"] if r["mode_tps"]] or [0])
        lines.append(f"| {p['workload']} | {MODES[p['mode']].label} | {s['n']} | **{fmt(s['median'])}** | "
                     f"{fmt(s['min'])} | {fmt(s['max'])} | {base:,.0f} | {mode:,.0f} |")
    errors = [e for p in result["pairs"] for r in p["rounds"] for e in r["errors"]]
    if errors:
        lines += ["", "Errors:", ""] + [f"- {e}" for e in errors[:10]]
    return "\n".join(lines) + "\n"


def main(argv):
    return run_engine(argv, parse_args, _run)


def _run(args):
    started, base = report_base(args, "-paired")
    recreate_database()
    pgbench = os.path.join(pg_bindir(), "pgbench")
    result = {"started": started.strftime("%Y-%m-%d %H:%M:%S"),
              "config": {"rounds": args.rounds, "duration": args.duration,
                         "clients": args.clients, "keys": args.keys, **durability(args)},
              "pairs": []}
    interrupted = False
    with connect() as conn:
        result["machine"] = machine(conn)
        _log(f"loading kv_seed with {args.keys:,} random keys")
        kvbench.prepare_seed(conn, args.keys, os.path.join(pg_bindir(), "psql"))
        try:
            for wl, mode_name in args.pairs:
                mode = MODES[mode_name]
                pair = {"workload": wl, "mode": mode_name, "rounds": []}
                result["pairs"].append(pair)
                for rnd in range(args.rounds):
                    # Swap which schema each side uses every round.
                    a, b = SCHEMAS if rnd % 2 == 0 else SCHEMAS[::-1]
                    reset_side(conn, a, MODES["plain"])
                    reset_side(conn, b, mode)
                    # ... and which pgbench starts first (a plain-against-
                    # plain trial showed the second one ~1% behind).
                    sides = [(a, MODES["plain"]), (b, mode)]
                    if rnd % 4 >= 2:
                        sides.reverse()
                    results = run_round(pgbench, wl, sides, args.clients // 2, args.duration)
                    if rnd % 4 >= 2:
                        results.reverse()
                    (plain_tps, e1), (mode_tps, e2) = results
                    ratio = mode_tps / plain_tps if plain_tps and mode_tps else None
                    pair["rounds"].append({"plain_tps": plain_tps, "mode_tps": mode_tps,
                                           "ratio": ratio, "errors": e1 + e2})
                    _log(f"{wl} {mode.label} round {rnd + 1}/{args.rounds}: plain {plain_tps} tps, "
                         f"{mode.label} {mode_tps} tps, ratio "
                         + ("–" if ratio is None else f"{ratio:.3f}"))
                pair["summary"] = summarise([r["ratio"] for r in pair["rounds"]])
        except KeyboardInterrupt:
            interrupted = True
        for p in result["pairs"]:
            p.setdefault("summary", summarise([r["ratio"] for r in p["rounds"]]))
        for schema in SCHEMAS:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(render(result))
    _log(f"wrote {base}.md and .json")
    print(render(result))
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
