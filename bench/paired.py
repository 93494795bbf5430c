"""bench/run --paired's engine: two modes of one workload run at the same
time, each on its own copy of the workload's table, and the ratio of their
throughputs.

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

Workloads: the kv workloads (kvbench.py: kv reloaded from the same random
keys, modes plain / latched-off / fenced / optimistic) and append
(append.py: single-row inserts into an empty events table, modes plain =
nextval default / gapless = pgkvx.next_key default).  Each side's table lives
in its own schema (pgkvx_side_a / pgkvx_side_b), reached through
search_path, so the workload files in bench/pgbench/ run unchanged.  Timings
are reported, never asserted.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import append
import kvbench
import ptail
from common import (DURABILITY, add_durable_arg, connect, durability, durability_text,
                    interrupted as was_interrupted, log as _log, machine, pg_bindir,
                    recreate_database, report_base, run_engine, stats_delta, stats_snapshot)

SCHEMAS = ("pgkvx_side_a", "pgkvx_side_b")
KV_MODES = {m.name: m for m in kvbench.KV_MODES}
APPEND_MODES = {m.name: m for m in append.MODES}
PTAIL_MODES = {m.name: m for m in ptail.MODES}
WORKLOADS = [*kvbench.WORKLOADS, append.WORKLOAD, *ptail.WORKLOADS]
# The comparisons the latch-table, LIMIT-scan and key-draw issues ask about.
# kv0:plain runs plain against plain: the method's own noise floor.
DEFAULT_PAIRS = ("kv0:plain,kv0:latched-off,kvS70-L1:optimistic,kvS70-L1:fenced,"
                 "kvS70-L1000:optimistic,append:gapless")
# Connections the engine itself holds besides the pgbench clients.
OWN_CONNECTIONS = 2


def modes_for(workload):
    """The modes a workload runs in; each has a `plain` baseline."""
    if workload in ptail.WORKLOADS:
        return PTAIL_MODES
    return APPEND_MODES if workload == append.WORKLOAD else KV_MODES


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="bench/run --paired", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", default=DEFAULT_PAIRS,
                    help=f"comma list of workload:mode, each run against the workload's plain "
                         f"mode (default {DEFAULT_PAIRS})")
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
    if wl not in WORKLOADS or mode not in modes_for(wl):
        sys.exit(f"bench/run --paired: bad pair {text!r}; kv workloads "
                 f"{', '.join(kvbench.WORKLOADS)} with modes {', '.join(KV_MODES)}; "
                 f"{append.WORKLOAD} with modes {', '.join(APPEND_MODES)}")
    return wl, mode


def check_connections(conn, clients):
    """Refuses up front a client count the server cannot admit: pgbench
    would abort the clients it cannot connect and the round would measure
    fewer."""
    limit = conn.execute("""SELECT current_setting('max_connections')::int
                                 - current_setting('superuser_reserved_connections')::int""").fetchone()[0]
    in_use = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                          ).fetchone()[0]
    if clients + OWN_CONNECTIONS + in_use > limit:
        sys.exit(f"bench/run --paired: {clients} clients, {in_use} connections in use and "
                 f"{OWN_CONNECTIONS} of the engine's own exceed the server's {limit} "
                 f"(max_connections less superuser_reserved_connections)")


def reset_side(conn, schema, workload, mode):
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    if workload == append.WORKLOAD:
        append.reset_events(conn, mode, schema)
    elif workload in ptail.WORKLOADS:
        ptail.reset(conn, workload, mode, schema)
    else:
        kvbench.reset_kv(conn, mode, table=f"{schema}.kv")


def run_round(pgbench, workload, sides, clients, duration):
    """Starts one pgbench per side at once; returns each side's tps (None when
    its pgbench failed) and error lines."""
    procs = []
    for schema, mode in sides:
        env = dict(os.environ)
        env["PGOPTIONS"] = f"-c search_path={schema},public -c pgkvx.scan_mode={mode.scan_mode}"
        # Names the side in pg_stat_activity, to tell the sides' waits apart.
        env["PGAPPNAME"] = f"pgbench {mode.name}"
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
    m, cfg = result["machine"], result["config"]
    workloads = {p["workload"] for p in result["pairs"]}
    tables = []
    if workloads & set(ptail.WORKLOADS):
        tables.append(f"ptail: `events` partitioned by created_at, {ptail.ROWS:,} rows (bench/ptail.py)")
    if workloads - {append.WORKLOAD} - set(ptail.WORKLOADS):
        tables.append(f"kv workloads: the kv table reloaded from the same {cfg['keys']:,} random keys")
    if append.WORKLOAD in workloads:
        tables.append(f"{append.WORKLOAD}: an empty `events (id bigserial PRIMARY KEY, payload text)`, "
                      "registered with `pgkvx.enable('events', gapless => true)` on the gapless side")
    lines = [
        f"# pgkvx paired benchmark, {result['started']}",
        "",
        f"{m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB; {m['postgres'].split(' on ')[0]}; "
        f"load average {m['loadavg']:.2f} at start; pgkvx {m['pgkvx_version']}; "
        + ", ".join(f"{k}={m['settings'].get(k, '?')}" for k in DURABILITY)
        + f": {durability_text(cfg)}.",
        "",
        f"Each round runs the baseline and the mode at the same time, {cfg['clients']} clients in all, "
        f"{cfg['clients'] // 2} per side (`pgbench -M prepared`, one thread per client, "
        f"{cfg['duration']} s), each side on its own copy of the workload's table ("
        + "; ".join(tables) + "); over every four rounds the sides take both schemas and both "
        "start orders. Ratio = mode tps / baseline tps within a round (above 1: the mode is "
        "faster); a row whose mode is its baseline runs plain against plain and shows the "
        "method's noise.",
        "",
        "| workload | mode | baseline | clients | rounds | median ratio | min | max "
        "| baseline tps (median) | mode tps (median) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in result["pairs"]:
        s = p["summary"]
        modes = modes_for(p["workload"])
        fmt = lambda x: "–" if x is None else f"{x:.3f}"  # noqa: E731
        base = statistics.median([r["plain_tps"] for r in p["rounds"] if r["plain_tps"]] or [0])
        mode = statistics.median([r["mode_tps"] for r in p["rounds"] if r["mode_tps"]] or [0])
        lines.append(f"| {p['workload']} | {modes[p['mode']].label} | {modes['plain'].label} | "
                     f"{cfg['clients']} | {s['n']} | **{fmt(s['median'])}** | {fmt(s['min'])} | "
                     f"{fmt(s['max'])} | {base:,.0f} | {mode:,.0f} |")
    counters = [(p, _mean_stats(p["rounds"])) for p in result["pairs"]]
    if any(s for _, s in counters):
        lines += ["", "pgkvx.stats() per round (mean; only the mode's side is registered, so "
                  "these are its writes, draws and scans):", ""]
        lines += [f"- {p['workload']} {p['label']}: "
                  + (", ".join(f"{k}={v:,.0f}" for k, v in sorted(s.items())) or "nothing moved")
                  for p, s in counters]
    errors = [e for p in result["pairs"] for r in p["rounds"] for e in r["errors"]]
    if errors:
        lines += ["", "Errors:", ""] + [f"- {e}" for e in errors[:10]]
    return "\n".join(lines) + "\n"


def _mean_stats(rounds):
    total = {}
    for r in rounds:
        for k, v in r.get("stats", {}).items():
            total[k] = total.get(k, 0) + v
    return {k: v / len(rounds) for k, v in total.items()} if rounds else {}


def main(argv):
    return run_engine(argv, parse_args, _run)


def _run(args):
    started, base = report_base(args, "-paired")
    recreate_database()
    pgbench = os.path.join(pg_bindir(), "pgbench")
    result = {"started": started.strftime("%Y-%m-%d %H:%M:%S"),
              "config": {"rounds": args.rounds, "duration": args.duration,
                         "clients": args.clients, "clients_per_side": args.clients // 2,
                         "keys": args.keys, **durability(args)},
              "pairs": []}
    interrupted = False
    with connect() as conn:
        check_connections(conn, args.clients)
        result["machine"] = machine(conn)
        if any(wl in kvbench.WORKLOADS for wl, _ in args.pairs):
            _log(f"loading kv_seed with {args.keys:,} random keys")
            kvbench.prepare_seed(conn, args.keys, os.path.join(pg_bindir(), "psql"))
        try:
            for wl, mode_name in args.pairs:
                modes = modes_for(wl)
                mode, plain = modes[mode_name], modes["plain"]
                pair = {"workload": wl, "mode": mode_name, "label": mode.label,
                        "baseline": plain.label, "rounds": []}
                result["pairs"].append(pair)
                for rnd in range(args.rounds):
                    # Swap which schema each side uses every round.
                    a, b = SCHEMAS if rnd % 2 == 0 else SCHEMAS[::-1]
                    reset_side(conn, a, wl, plain)
                    reset_side(conn, b, wl, mode)
                    # ... and which pgbench starts first (a plain-against-
                    # plain trial showed the second one ~1% behind).
                    sides = [(a, plain), (b, mode)]
                    if rnd % 4 >= 2:
                        sides.reverse()
                    before = stats_snapshot(conn)
                    results = run_round(pgbench, wl, sides, args.clients // 2, args.duration)
                    stats = stats_delta(before, stats_snapshot(conn))
                    if rnd % 4 >= 2:
                        results.reverse()
                    (plain_tps, e1), (mode_tps, e2) = results
                    ratio = mode_tps / plain_tps if plain_tps and mode_tps else None
                    pair["rounds"].append({"plain_tps": plain_tps, "mode_tps": mode_tps,
                                           "ratio": ratio, "errors": e1 + e2, "stats": stats})
                    _log(f"{wl} {mode.label} round {rnd + 1}/{args.rounds}: {plain.label} {plain_tps} tps, "
                         f"{mode.label} {mode_tps} tps, ratio "
                         + ("–" if ratio is None else f"{ratio:.3f}"))
                pair["summary"] = summarise([r["ratio"] for r in pair["rounds"]])
        except BaseException as e:
            if not was_interrupted(e):
                raise
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
