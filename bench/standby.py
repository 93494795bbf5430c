"""bench/run --standby's engine: tail consumers on a hot standby beside the
same consumers on the primary.

The tail workload (tail.py) with its events table registered gapless on the
primary: 4 producers commit out of key order there; 2 consumers tail on the
primary and 2 on an asynchronous hot standby streaming straight from it
(`scripts/replica start-async`), all in the same `pgkvx.scan_mode`.  For
each side: rows/s delivered, lag from the producer's COMMIT returning on the
primary to the row's delivery (on the standby that includes replication and
replay), and committed rows never delivered.  `off` is there to show that
the run can see skips on both sides.  Timings are reported, never asserted.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict

import tail
from common import (ROOT, add_durable_arg, connect, durability, durability_text,
                    interrupted as was_interrupted, log, machine, recreate_database,
                    report_base, run_engine)

MODES = ("off", "optimistic", "fenced")
SIDES = (("primary", None), ("standby", "standby"))


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="bench/run --standby", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out"))
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma list of consumer scan modes (default {','.join(MODES)})")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds producers run (15)")
    ap.add_argument("--reps", type=int, default=2, help="runs of each mode (2)")
    ap.add_argument("--quick", action="store_true", help="5 s, one run of each mode")
    add_durable_arg(ap)
    args = ap.parse_args(argv)
    if args.replica_delay is not None:
        ap.error("--standby makes its own asynchronous standby; --replica-delay does not apply")
    args.modes = [m for m in args.modes.split(",") if m]
    for m in args.modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r} (known: {', '.join(MODES)})")
    if args.quick:
        args.duration, args.reps = 5.0, 1
    return args


def standby_server():
    """Starts the asynchronous standby; its libpq keywords."""
    script = os.path.join(ROOT, "scripts", "replica")
    subprocess.run([script, "start-async"], check=True)
    replica = os.environ["PGKVX_CLUSTER"] + "-replica"  # bench/run exports it (scripts/env.sh)
    with open(f"{replica}/port") as f:
        port = f.read().strip()
    return {"host": f"{replica}/sock", "port": port}


def main(argv):
    return run_engine(argv, parse_args, _run)


def _run(args):
    started, base = report_base(args, "-standby")
    cfg = tail.TailConfig(duration=args.duration, consumers=2, standby_consumers=2,
                          drain_timeout=10.0 if args.quick else 20.0)
    mode = next(m for m in tail.TAIL_MODES if m.name == "optimistic")  # latched, gapless
    result = {"started": started.strftime("%Y-%m-%d %H:%M:%S"),
              "config": {**asdict(cfg), "reps": args.reps, **durability(args)}, "runs": []}
    interrupted = False
    script = os.path.join(ROOT, "scripts", "replica")
    try:
        recreate_database()
        server = standby_server()
        with connect() as conn:
            result["machine"] = machine(conn)
        for scan_mode in args.modes:
            for rep in range(args.reps):
                log(f"standby tail {scan_mode} rep {rep + 1}/{args.reps}")
                run = {"mode": scan_mode, "rep": rep}
                try:
                    run.update(tail.run_tail(mode, "steady", cfg, standby=server,
                                             scan_mode=scan_mode))
                except BaseException as e:
                    if was_interrupted(e):
                        raise
                    run["error"] = str(e)
                result["runs"].append(run)
                for side, key in SIDES:
                    r = run.get(key, run) if key else run
                    log(f"  {side}: lag p50 {r.get('lag_p50_ms')} ms, skipped {r.get('skipped')}")
    except BaseException as e:
        if not was_interrupted(e):
            raise
        interrupted = True
    finally:
        subprocess.run([script, "stop"], check=False)
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(base + ".md", "w") as f:
        f.write(render(result))
    log(f"wrote {base}.md and .json")
    print(render(result))
    return 130 if interrupted else 0


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(v, spec="{:,.2f}"):
    return "–" if v is None else spec.format(v)


def render(result):
    cfg = result["config"]
    m = result.get("machine", {})
    out = [f"# pgkvx standby tail benchmark, {result['started']}", "",
           f"{m.get('nproc', '?')} CPUs, {m.get('ram_gib', '?')} GiB; {m.get('postgres', '?')}; "
           f"pgkvx {m.get('pgkvx_version', '?')}; load average {m.get('loadavg', 0):.2f} at start; "
           f"{durability_text(cfg)}.", "",
           f"{cfg['producers']} producers on the primary (one row per transaction, keys from "
           f"`pgkvx.next_key`, 0–{cfg['max_commit_delay_ms']:g} ms before COMMIT, "
           f"{cfg['rollback_fraction']:.0%} rolled back), {cfg['duration']:g} s; "
           f"{cfg['consumers']} consumers on the primary and {cfg['standby_consumers']} on an "
           f"asynchronous hot standby streaming from it, each tailing the whole stream with "
           f"LIMIT {cfg['limit']} in the mode shown; {cfg['reps']} runs per mode (medians; "
           f"skipped rows summed). Lag: from COMMIT returning on the primary to the row's "
           f"delivery.", "",
           "| consumers' mode | consumers on | commits/s | rows/s delivered (per consumer) "
           "| lag p50 ms | lag p99 ms | skipped rows | errors |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    modes = list(dict.fromkeys(r["mode"] for r in result["runs"]))
    for mode in modes:
        runs = [r for r in result["runs"] if r["mode"] == mode and "error" not in r]
        for side, key in SIDES:
            rs = [r[key] if key else r for r in runs if not key or key in r]
            skipped = sum(r["skipped"] or 0 for r in rs)
            total = sum(r["committed"] for r in rs) * cfg["standby_consumers" if key else "consumers"]
            share = f" of {total:,} ({100.0 * skipped / total:.1f}%)" if total else ""
            errors = sum(int(e.split("x ", 1)[0]) for r in rs for e in r["errors"])
            out.append(f"| {mode} | {side} | {_fmt(_median(r['commits_per_s'] for r in rs), '{:,.0f}')} "
                       f"| {_fmt(_median(r['delivered_per_s'] for r in rs), '{:,.0f}')} "
                       f"| {_fmt(_median(r['lag_p50_ms'] for r in rs))} "
                       f"| {_fmt(_median(r['lag_p99_ms'] for r in rs))} "
                       f"| {skipped:,}{share} | {errors:,} |")
    failed = [r for r in result["runs"] if "error" in r]
    if failed:
        out += ["", "Runs that failed:", ""] + [f"- {r['mode']} rep {r['rep'] + 1}: {r['error']}"
                                                 for r in failed]
    errs = sorted({e for r in result["runs"] for k in ("", "standby")
                   for e in (r.get(k, {}) if k else r).get("errors", [])})
    if errs:
        out += ["", "Errors seen (count and first line):", ""] + [f"- {e}" for e in errs[:10]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
