"""bench/run's engine: every workload in every mode, modes interleaved round
by round (A B C A B C ...), raw results to DIR/<date>.json, then the table and
chart (report.py).  Timings are reported, never asserted.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import psycopg

import kvbench
import report
import tail
import wake
from common import (add_durable_arg, connect, durability, interrupted, log as _log, machine,
                    pg_bindir, recreate_database, report_base, run_engine)


@dataclass
class KvConfig:
    clients: int
    jobs: int
    duration: int
    reps: int
    keys: int


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    ap.add_argument("--quick", action="store_true",
                    help="short runs, one repetition (under 5 minutes)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out"),
                    help="where <date>.md/.png/.json go (default bench/out)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--duration", type=int, help="seconds per pgbench run (20; quick 5)")
    ap.add_argument("--reps", type=int, help="repetitions of each kv round (3; quick 1)")
    ap.add_argument("--keys", type=int, default=100_000, help="kv preload (random keys)")
    ap.add_argument("--tail-duration", type=float, help="seconds producers run (15; quick 5)")
    ap.add_argument("--tail-reps", type=int, help="repetitions of each tail round (2; quick 1)")
    ap.add_argument("--workloads", help="comma list of kv workloads, 'tail' and/or 'wake' "
                                        f"(default all: {', '.join(kvbench.WORKLOADS)}, tail, wake)")
    ap.add_argument("--modes", help="comma list of modes to run (default all: "
                                    "plain, latched-off, fenced, optimistic, horizon)")
    wake.add_args(ap)
    add_durable_arg(ap)
    args = ap.parse_args(argv)
    quick = args.quick
    args.duration = args.duration or (5 if quick else 20)
    args.reps = args.reps or (1 if quick else 3)
    args.tail_duration = args.tail_duration or (5.0 if quick else 15.0)
    args.tail_reps = args.tail_reps or (1 if quick else 2)
    known = list(kvbench.WORKLOADS) + ["tail", "wake"]
    args.workloads = _pick(args.workloads, known, "workload")
    known_modes = {m.name for m in kvbench.KV_MODES} | {m.name for m in tail.TAIL_MODES}
    args.modes = _pick(args.modes, sorted(known_modes), "mode")
    return args


def _pick(arg, known, what):
    if not arg:
        return known
    chosen = [x.strip() for x in arg.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in known]
    if unknown:
        sys.exit(f"bench/run: unknown {what}(s) {unknown}; known: {', '.join(known)}")
    return chosen


def _modes(all_modes, wanted):
    return [m for m in all_modes if m.name in wanted]


def _reconnect(conn):
    """A working connection again: after a server crash-restart (which a bug
    in the extension can cause) the old one is dead, and recovery takes a
    moment."""
    if not conn.broken:
        return conn
    conn.close()
    for _ in range(60):
        try:
            return connect()
        except psycopg.OperationalError:
            time.sleep(1)
    return connect()


def run_kv(result, modes, kvcfg, bindir, logdir):
    with connect() as conn:
        _log(f"loading kv_seed with {kvcfg.keys:,} random keys")
        kvbench.prepare_seed(conn, kvcfg.keys, os.path.join(bindir, "psql"))
    total = len(result["workloads"]) * kvcfg.reps * len(modes)
    n = 0
    conn = connect()
    try:
        for wl in result["workloads"]:
            for rep in range(kvcfg.reps):
                for m in modes:
                    n += 1
                    tag = f"[{n}/{total}] {wl} rep {rep + 1}/{kvcfg.reps} {m.label}"
                    run = {"workload": wl, "mode": m.name, "rep": rep}
                    try:
                        _kv_run(run, result, m, kvcfg, conn, bindir, logdir)
                    except psycopg.Error as e:
                        run.update(tps=None, errors=[f"{run.pop('step')}: {str(e).strip()}"])
                        _log(f"{tag}: failed: {run['errors'][0]}")
                        conn = _reconnect(conn)
                    else:
                        _log(f"{tag}: {report.fmt_tps(run['tps'])} tps, "
                             f"p50 {report.fmt(run['p50_ms'])} ms, "
                             f"p99 {report.fmt(run['p99_ms'])} ms"
                             + (f", rc {run['rc']}: {run['errors'][:1]}" if run["rc"] else ""))
                    result["kv"].append(run)
    finally:
        conn.close()


def _kv_run(run, result, mode, kvcfg, conn, bindir, logdir):
    """Reset kv for the mode, note its scan node once, run pgbench; run["step"]
    says which part an error came from."""
    scan_mode = mode.scan_mode
    run["step"] = "setup"
    kvbench.reset_kv(conn, mode)
    if run["rep"] == 0:
        result["plans"].setdefault(run["workload"], {})[mode.name] = \
            kvbench.read_scan_node(conn, run["workload"], scan_mode)
    run["step"] = "run"
    run.update(kvbench.run_pgbench(os.path.join(bindir, "pgbench"), run["workload"], scan_mode,
                                   kvcfg, logdir, conn))
    del run["step"]


def run_tail(result, modes, tcfg, reps):
    total = len(result["scenarios"]) * reps * len(modes)
    n = 0
    for sc in result["scenarios"]:
        for rep in range(reps):
            for mode in modes:
                n += 1
                tag = f"[{n}/{total}] tail {sc} rep {rep + 1}/{reps} {mode.label}"
                run = {"scenario": sc, "mode": mode.name, "rep": rep}
                try:
                    run.update(tail.run_tail(mode, sc, tcfg))
                except (psycopg.Error, RuntimeError, OSError, EOFError) as e:
                    run["error"] = str(e).strip()[:300] or type(e).__name__
                    result["tail"].append(run)
                    _log(f"{tag}: failed: {run['error']}")
                    continue
                result["tail"].append(run)
                _log(f"{tag}: {run['commits_per_s']:.0f} commits/s, "
                     f"{report.fmt_tps(run['delivered_per_s'])} rows/s/consumer, "
                     f"lag p50 {report.fmt(run['lag_p50_ms'])} ms "
                     f"p99 {report.fmt(run['lag_p99_ms'])} ms, skipped {run['skipped']}")


def main(argv):
    return run_engine(argv, parse_args, _run)


def _run(args):
    started, base = report_base(args)
    t_start = time.monotonic()

    recreate_database()
    with connect() as conn:
        mach = machine(conn)
    kvcfg = KvConfig(args.clients, args.jobs, args.duration, args.reps, args.keys)
    tcfg = tail.TailConfig(duration=args.tail_duration,
                           drain_timeout=10.0 if args.quick else 20.0)
    kv_modes = _modes(kvbench.KV_MODES, args.modes)
    tail_modes = _modes(tail.TAIL_MODES, args.modes)
    workloads = [w for w in args.workloads if w not in ("tail", "wake")]
    do_tail = "tail" in args.workloads
    wcfg = wake.config_from_args(args) if "wake" in args.workloads else None
    result = {
        "started": started.strftime("%Y-%m-%d %H:%M:%S"),
        "config": {"quick": args.quick, **durability(args), "kv": asdict(kvcfg),
                   "tail": {**asdict(tcfg), "reps": args.tail_reps}},
        "machine": mach,
        "workloads": workloads,
        "kv_modes": [{"name": m.name, "label": m.label} for m in kv_modes],
        "scenarios": list(tail.SCENARIOS) if do_tail else [],
        "tail_modes": [{"name": m.name, "label": m.label} for m in tail_modes] if do_tail else [],
        "plans": {}, "kv": [], "tail": [], "interrupted": False,
        "wake": wake.new_result() if wcfg else None,
    }
    n_kv = len(workloads) * args.reps * len(kv_modes)
    n_tail = len(tail.SCENARIOS) * args.tail_reps * len(tail_modes) if do_tail else 0
    wake_s = wake.estimate_s(wcfg) if wcfg else 0
    _log(f"pgkvx {mach['pgkvx_version']}; {n_kv} pgbench runs of {args.duration}s, {n_tail} tail runs "
         f"of {args.tail_duration:g}s" + (f", the wake workload (~{wake_s / 60:.0f} min)" if wcfg else "")
         + f"; about {(n_kv * (args.duration + 3) + n_tail * (args.tail_duration + 5) + wake_s) / 60:.0f} min")

    try:
        if workloads:
            with tempfile.TemporaryDirectory(prefix="pgkvx-bench-") as logdir:
                run_kv(result, kv_modes, kvcfg, pg_bindir(), logdir)
        if do_tail:
            run_tail(result, tail_modes, tcfg, args.tail_reps)
        if wcfg:
            # Lag is read off commit timestamps: on for this part only (a
            # server restart each way).
            with wake.commit_timestamps(wake.restart_cluster):
                wake.run_wake(wcfg, result["wake"])
    except BaseException as e:
        if not interrupted(e):
            raise
        result["interrupted"] = True
        _log("interrupted: writing what has finished")
    finally:
        result["elapsed_s"] = time.monotonic() - t_start
        result["loadavg_end"] = os.getloadavg()[0]
        with open(base + ".json", "w") as f:
            json.dump(result, f, indent=1)
        md, png = report.render(base + ".json")
        _log(f"wrote {md} and {png}")
    return 130 if result["interrupted"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
