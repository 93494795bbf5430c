"""bench/torture's engine: long rounds of pgkvx's randomized torture test
against the scratch cluster, one seed after another, with a report of how
much the oracle checked and what it found.

The test itself is tests/e2e/torture.py (imported from there, not copied):
writers of every kind append to, move within and delete from a gapless
`events` table while consumers of every kind tail it, and an oracle checks
that every consumer got every committed row its predicate matches, once, in
key order, and nothing that never committed.  `make test` runs one 20-second
round; this runs rounds as long and as many as asked, in a fresh database
(pgkvx_torture), and writes DIR/<date>-torture.md and .json.

Exit status 1 when any round found a skipped row, a phantom, a row out of
order or an unexpected error: unlike the benchmarks this is a check.
"""
import argparse
import collections
import importlib.util
import json
import os
import sys
import time

from common import (DURABILITY, ROOT, add_durable_arg, connect, durability, durability_text,
                    interrupted, log as _log, machine, recreate_database, report_base, run_engine,
                    stats_delta, stats_snapshot)

DBNAME = "pgkvx_torture"
TORTURE_PY = os.path.join(ROOT, "tests", "e2e", "torture.py")


def load_torture():
    """tests/e2e/torture.py as a module of our own: the poll counting below
    wraps its consumers without touching the copy pytest imports."""
    spec = importlib.util.spec_from_file_location("pgkvx_torture", TORTURE_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def count_polls(torture):
    """torture's Report counts polls over all consumers only; the long run
    reports them per consumer kind.  Returns the dict the counts go to, name
    -> polls answered, reset by each round's consumers()."""
    counts = {}
    make = torture.consumers

    def consumers(*args, **kwargs):
        made = make(*args, **kwargs)
        counts.clear()
        for cons in made:
            counts[cons.name] = 0
            cons.poll = _counted(cons.poll, cons.name, counts)
        return made

    torture.consumers = consumers
    return counts


def _counted(poll, name, counts):
    def wrapped(*args):
        ids = poll(*args)
        counts[name] += 1   # each consumer runs in one thread: no lost updates
        return ids
    return wrapped


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="bench/torture", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0,
                    help="seconds writers run in each round (120); consumers then drain")
    ap.add_argument("--seed", type=int, default=20261124,
                    help="seed of the first round; round i runs seed + i (20261124)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds, one seed each (1)")
    ap.add_argument("--writers", type=int, default=4, help="writer threads (4)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"),
                    help="where <date>-torture.md/.json go (default bench/out)")
    add_durable_arg(ap)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.writers < 1:
        sys.exit("bench/torture: --rounds and --writers must be at least 1, --seconds above 0")
    return args


def round_record(report, polls, stats, elapsed):
    """One round's JSON record, from torture's Report."""
    return {
        "seed": report.seed,
        "elapsed_s": elapsed,
        "ok": report.ok(),
        "writer_txns": report.writer_txns,
        "writer_rollbacks": report.writer_rollbacks,
        "writer_retries": report.writer_retries,
        "writer_kinds": dict(report.writer_kinds),
        "polls": report.polls,
        "consumer_retries": report.consumer_retries,
        "polls_by_consumer": dict(polls),
        "delivered_by_consumer": dict(report.consumers),
        "committed_rows": report.committed_rows,
        "protocol": dict(report.stats),
        "stats": stats,
        # Counts, plus the first few ids for whoever debugs a failure.
        "skipped": {k: len(v) for k, v in report.skipped.items()},
        "skipped_sample": {k: v[:10] for k, v in report.skipped.items() if v},
        "phantoms": {k: len(v) for k, v in report.phantoms.items()},
        "phantoms_sample": {k: v[:10] for k, v in report.phantoms.items() if v},
        "disorder": [list(map(str, d)) for d in report.disorder[:20]],
        "disorder_count": len(report.disorder),
        "head_read_waits": report.head_read_waits,
        "errors": list(report.errors),
        "summary": report.summary(),
    }


def totals(rounds):
    """Sums over the rounds of everything the report's totals table shows."""
    t = collections.Counter()
    kinds, polls, delivered, stats = (collections.Counter() for _ in range(4))
    for r in rounds:
        for k in ("writer_txns", "writer_rollbacks", "writer_retries", "polls", "consumer_retries",
                  "committed_rows", "disorder_count"):
            t[k] += r[k]
        t["head_read_waits"] += r.get("head_read_waits", 0)
        t["skipped"] += sum(r["skipped"].values())
        t["phantoms"] += sum(r["phantoms"].values())
        t["errors"] += len(r["errors"])
        t["delivered"] += sum(r["delivered_by_consumer"].values())
        t["seconds"] += r["elapsed_s"]
        kinds.update(r["writer_kinds"])
        polls.update(r["polls_by_consumer"])
        delivered.update(r["delivered_by_consumer"])
        stats.update({k: v for k, v in r["stats"].items() if not k.endswith("_used")})
    return {**t, "writer_kinds": dict(kinds), "polls_by_consumer": dict(polls),
            "delivered_by_consumer": dict(delivered), "stats": dict(stats)}


def render(result):
    cfg, m = result["config"], result["machine"]
    rounds = result["rounds"]
    t = totals(rounds)
    clean = t["skipped"] == t["phantoms"] == t["disorder_count"] == t["errors"] == t["head_read_waits"] == 0
    seeds = [r["seed"] for r in rounds]
    stats = t["stats"]
    out = [
        f"# pgkvx torture long run, {result['started']}", "",
        *(["**Interrupted**: the tables hold only the rounds that finished.", ""]
          if result.get("interrupted") else []),
        f"- machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB RAM; "
        f"{m['postgres'].split(' on ')[0]}; load average {m['loadavg']:.2f} at the start",
        f"- pgkvx {m['pgkvx_version']}: {m['pgkvx_library']}; harness commit {m['harness_commit']}",
        "- " + ", ".join(f"{k}={m['settings'].get(k, '?')}" for k in DURABILITY)
        + f": {durability_text(cfg)}",
        f"- `bench/torture --seconds {cfg['seconds']:g} --writers {cfg['writers']} "
        f"--seed {cfg['seed']} --rounds {cfg['rounds']}"
        + (" --durable" if cfg.get("durable") and cfg.get("replica_delay_ms") is None else "")
        + (f" --replica-delay {cfg['replica_delay_ms']:g}" if cfg.get("replica_delay_ms") is not None
           else "")
        + f"`: {len(rounds)} round(s), seeds {', '.join(map(str, seeds)) or '–'}, "
        f"{t.get('seconds', 0) / 60:.1f} min in all (writers run `--seconds`, then consumers drain)",
        "",
        "The test is tests/e2e/torture.py: writers of every kind against a gapless `events` "
        "table, consumers of every kind tailing it; the oracle checks that each consumer got "
        "every committed, never deleted or moved row its predicate matches, once, in key "
        "order, and no row that never committed, and that no read of a table written in key "
        "order waited for its writer (always past every row a read returned).",
        "",
        ("**Oracle: nothing found**" if clean else "**Oracle: FAILED**")
        + f" — skipped rows {t['skipped']}, phantom rows {t['phantoms']}, "
        f"out-of-order or duplicate deliveries {t['disorder_count']}, unexpected errors {t['errors']}, "
        f"reads at the head that waited {t['head_read_waits']}.",
        "",
        "## Totals", "",
        "| what | count |", "| --- | ---: |",
        f"| writer transactions | {t['writer_txns']:,} |",
        f"| … of which rolled back on purpose | {t['writer_rollbacks']:,} |",
        f"| writer transactions retried (deadlock, lock timeout) | {t['writer_retries']:,} |",
        f"| rows committed (every id the oracle saw commit) | {t['committed_rows']:,} |",
        f"| consumer polls answered | {t['polls']:,} |",
        f"| consumer polls retried (40001, deadlock) | {t['consumer_retries']:,} |",
        f"| rows delivered, over all consumers | {t['delivered']:,} |",
        *[f"| pgkvx.stats() `{k}` | {stats.get(k, 0):,} |"
          for k in ("validations", "conflicts", "retries", "fallbacks_to_fenced",
                    "serialization_failures", "fresh_snapshots", "latches_escalated")],
        "",
        "## Writer transactions by kind", "",
        "| kind | transactions |", "| --- | ---: |",
        *[f"| {k} | {n:,} |" for k, n in sorted(t["writer_kinds"].items(), key=lambda kv: -kv[1])],
        "",
        "## Consumers by kind", "",
        "Polls answered (a REPEATABLE READ or SERIALIZABLE poll whose commit then failed counts "
        "and is retried), rows delivered, and what the oracle found, summed over the rounds.", "",
        "| consumer | polls | rows delivered | skipped | phantoms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name in t["polls_by_consumer"]:
        skipped = sum(r["skipped"].get(name, 0) for r in rounds)
        phantoms = sum(r["phantoms"].get(name, 0) for r in rounds)
        out.append(f"| {name} | {t['polls_by_consumer'][name]:,} | "
                   f"{t['delivered_by_consumer'].get(name, 0):,} | {skipped} | {phantoms} |")
    out += [
        "",
        "## Rounds", "",
        "| seed | s | writer tx | polls | rows committed | rows delivered | conflicts | retries "
        "| fallbacks | skipped | phantoms | disorder | errors |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rounds:
        p = r["protocol"]
        out.append(f"| {r['seed']} | {r['elapsed_s']:.0f} | {r['writer_txns']:,} | {r['polls']:,} | "
                   f"{r['committed_rows']:,} | {sum(r['delivered_by_consumer'].values()):,} | "
                   f"{p.get('conflicts', 0):,} | {p.get('retries', 0):,} | "
                   f"{p.get('fallbacks_to_fenced', 0):,} | {sum(r['skipped'].values())} | "
                   f"{sum(r['phantoms'].values())} | {r['disorder_count']} | {len(r['errors'])} |")
    out += ["", "## pgkvx.stats(), every counter that moved (sum over the rounds)", "",
            ", ".join(f"`{k}` {v:,}" for k, v in sorted(stats.items())) or "–", ""]
    problems = [(r["seed"], e) for r in rounds for e in r["errors"]]
    problems += [(r["seed"], f"{k}: skipped {v}") for r in rounds for k, v in r["skipped_sample"].items()]
    problems += [(r["seed"], f"{k}: phantoms {v}") for r in rounds for k, v in r["phantoms_sample"].items()]
    problems += [(r["seed"], f"disorder {d}") for r in rounds for d in r["disorder"]]
    if problems:
        out += ["## What the oracle found", ""] + [f"- seed {s}: `{e}`" for s, e in problems[:50]] + [""]
    return "\n".join(out)


def main(argv):
    return run_engine(argv, parse_args, _run)


def _run(args):
    torture = load_torture()
    polls = count_polls(torture)
    started, base = report_base(args, "-torture")
    recreate_database(DBNAME)

    def connect_torture(autocommit=True):
        return connect(DBNAME, autocommit=autocommit)

    with connect(DBNAME) as conn:
        mach = machine(conn)
    result = {"started": started.strftime("%Y-%m-%d %H:%M:%S"),
              "config": {"seconds": args.seconds, "seed": args.seed, "rounds": args.rounds,
                         "writers": args.writers, **durability(args)},
              "machine": mach, "rounds": [], "interrupted": False}
    _log(f"pgkvx {mach['pgkvx_version']}; {args.rounds} round(s) of {args.seconds:g} s, "
         f"{args.writers} writers, seeds {args.seed}..{args.seed + args.rounds - 1}")
    try:
        for i in range(args.rounds):
            seed = args.seed + i
            with connect(DBNAME) as conn:
                before = stats_snapshot(conn)
            t = time.monotonic()
            report = torture.run(connect_torture, seed, args.seconds, args.writers)
            elapsed = time.monotonic() - t
            with connect(DBNAME) as conn:
                stats = stats_delta(before, stats_snapshot(conn))
            record = round_record(report, polls, stats, elapsed)
            result["rounds"].append(record)
            _log(f"round {i + 1}/{args.rounds} ({elapsed:.0f} s): "
                 f"{'ok' if record['ok'] else 'FAILED'}; {report.summary()}")
    except BaseException as e:
        if not interrupted(e):
            raise
        result["interrupted"] = True
        _log("interrupted: writing the rounds that finished")
    finally:
        with open(base + ".json", "w") as f:
            json.dump(result, f, indent=1)
        with open(base + ".md", "w") as f:
            f.write(render(result))
        _log(f"wrote {base}.md and .json")
    if result["interrupted"]:
        return 130
    return 0 if all(r["ok"] for r in result["rounds"]) else 1


if __name__ == "__main__":
    rc = main(sys.argv[1:])
    if rc == 130:
        # An interrupted round leaves torture's worker threads running (they
        # stop only when a round ends) and they would keep the process alive;
        # the durability settings are already restored by now.
        sys.stdout.flush()
        os._exit(rc)
    sys.exit(rc)
