"""The tail-consumer workload, pgkvx's headline use case.

Producers insert one row per transaction into `events`, keys drawn from a
sequence, hold the transaction open for a random few milliseconds and roll back
a share of them, so rows commit in a different order than their keys were
drawn.  Consumers tail the table by key:

    SELECT id, payload FROM events WHERE id > $cursor ORDER BY id LIMIT n

Every consumer reads the whole stream (think: one consumer group each).
Measured: rows/s delivered per consumer, lag from the producer's COMMIT
returning to the row's delivery, and rows committed but never delivered
(checked at the end against the table).

Standalone, one mode (recreates the database pgkvx_bench; libpq settings from
`scripts/cluster env`): python bench/tail.py --mode plain --duration 10
"""
import argparse
import collections
import json
import multiprocessing
import queue
import random
import threading
import time
from dataclasses import dataclass

import psycopg

from common import connect, fatal_messages, percentile, recreate_database, scan_node, stats_delta, stats_snapshot


@dataclass(frozen=True)
class TailMode:
    name: str
    label: str
    horizon: bool       # consumer filters by the xid horizon instead of id order
    latched: bool       # events registered with pgkvx, keys from pgkvx.next_key
    scan_mode: str


TAIL_MODES = [
    TailMode("plain", "plain PG", False, False, "off"),
    TailMode("horizon", "xid horizon", True, False, "off"),
    TailMode("fenced", "fenced", False, True, "fenced"),
    TailMode("optimistic", "optimistic", False, True, "optimistic"),
]

SCENARIOS = {
    "steady": "producers and consumers only",
    "idle-in-tx": "plus one session elsewhere in the database idle in a "
                  "transaction that holds an xid for the whole run",
}


@dataclass
class TailConfig:
    duration: float = 15.0          # seconds producers run
    producers: int = 4
    consumers: int = 2
    limit: int = 100                # consumer batch (LIMIT n)
    max_commit_delay_ms: float = 5.0
    rollback_fraction: float = 0.1
    poll_ms: float = 1.0            # consumer pause after a short batch
    drain_timeout: float = 20.0     # seconds consumers get to catch up after producers stop
    seed: int = 1
    standby_consumers: int = 0      # more consumers, on the hot standby run_tail is given


PLAIN_QUERY = "SELECT id, payload FROM events WHERE id > %s ORDER BY id LIMIT %s"
# The transaction-id horizon consumer: rows written by transactions older than
# the oldest one still running anywhere are final, so reading only those, in
# (xid, id) order, never skips -- but stalls behind the oldest open
# transaction.  Keyset on (xid, id) because xids are not assigned in id order:
# with `id > $cursor` alone a row with a smaller id and a later-finishing xid
# would still be skipped.
HORIZON_QUERY = """SELECT id, payload, xid::text FROM events
    WHERE (xid, id) > (%s::xid8, %s) AND xid < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY xid, id LIMIT %s"""


def setup_events(conn, mode):
    """A fresh events table for the mode.  Every mode has the xid column so
    rows are the same size; only the horizon consumer needs its index."""
    conn.execute("DROP TABLE IF EXISTS events")
    conn.execute("""CREATE TABLE events (
        id bigserial PRIMARY KEY,
        xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
        payload text NOT NULL)""")
    if mode.horizon:
        conn.execute("CREATE INDEX events_xid_id ON events (xid, id)")
    if mode.latched:
        # gapless: the key's DEFAULT becomes pgkvx.next_key.  A plain
        # sequence default lets a reader see a later id committed while an
        # earlier one is drawn but not yet latched, so the scans could not
        # help.
        conn.execute("SELECT pgkvx.enable('events', gapless => true)")
    conn.execute("VACUUM (ANALYZE) events")
    conn.execute("CHECKPOINT")


def _first_line(exc):
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _wait_until(t):
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def producer(idx, cfg, ready, go, t0, out):
    """Inserts, waits a random commit delay, commits or rolls back; records
    the monotonic time (system-wide clock) at which each COMMIT returned."""
    try:
        rng = random.Random(cfg.seed * 1000 + idx)
        payload = f"producer {idx} " + "x" * 48
        conn = connect(autocommit=False)
        ready.wait()
        go.wait()
        _wait_until(t0.value)
        end = t0.value + cfg.duration
        commits, rollbacks, errors = {}, 0, collections.Counter()
        while time.monotonic() < end:
            try:
                (key,) = conn.execute("INSERT INTO events (payload) VALUES (%s) RETURNING id",
                                      (payload,), prepare=True).fetchone()
                time.sleep(rng.uniform(0, cfg.max_commit_delay_ms / 1000))
                if rng.random() < cfg.rollback_fraction:
                    conn.rollback()
                    rollbacks += 1
                else:
                    conn.commit()
                    commits[key] = time.monotonic()
            except psycopg.Error as e:
                conn.rollback()
                errors[_first_line(e)] += 1
        conn.close()
        out.put(("producer", idx, {"commits": commits, "rollbacks": rollbacks,
                                   "errors": dict(errors)}))
    except KeyboardInterrupt:
        pass
    except Exception as e:  # reported, so the driver neither hangs nor hides it
        ready.abort()
        out.put(("producer", idx, {"fatal": _first_line(e)}))


def consumer(idx, cfg, mode, scan_mode, server, ready, go, t0, done, final_count, final_max, out):
    """Tails events in batches of cfg.limit until it has caught up after the
    producers stopped (or the drain timeout passed); on the primary, or on
    the standby `server` names."""
    try:
        conn = connect(scan_mode=scan_mode, server=server)
        ready.wait()
        go.wait()
        _wait_until(t0.value)
        deadline = t0.value + cfg.duration + cfg.drain_timeout
        cursor_id, cursor_xid = 0, "0"
        ids, times, polls, errors = [], [], 0, collections.Counter()
        timed_out = False
        while True:
            finished = done.is_set()   # before the query: it then sees every commit
            try:
                if mode.horizon:
                    rows = conn.execute(HORIZON_QUERY, (cursor_xid, cursor_id, cfg.limit),
                                        prepare=True).fetchall()
                else:
                    rows = conn.execute(PLAIN_QUERY, (cursor_id, cfg.limit),
                                        prepare=True).fetchall()
            except psycopg.Error as e:
                errors[_first_line(e)] += 1
                rows = []
            now = time.monotonic()
            polls += 1
            for r in rows:
                ids.append(r[0])
                times.append(now)
            if rows:
                cursor_id = rows[-1][0]
                if mode.horizon:
                    cursor_xid = rows[-1][2]
            if len(rows) < cfg.limit:
                # Caught up: every committed row delivered, or (id order) the
                # cursor is past the last key so nothing more can come.
                if finished and (len(ids) >= final_count.value
                                 or (not mode.horizon and cursor_id >= final_max.value)):
                    break
                if now > deadline:
                    timed_out = True
                    break
                time.sleep(cfg.poll_ms / 1000)
        conn.close()
        out.put(("consumer", idx, {"ids": ids, "times": times, "polls": polls,
                                   "errors": dict(errors), "timed_out": timed_out}))
    except KeyboardInterrupt:
        pass
    except Exception as e:
        ready.abort()
        out.put(("consumer", idx, {"fatal": _first_line(e)}))


def run_tail(mode, scenario, cfg, standby=None, scan_mode=None):
    """One run of the tail workload; returns its measurements.  Raises only
    on setup failure or interruption; worker failures are in the result.
    With `standby` (libpq keywords of a hot standby of the cluster),
    cfg.standby_consumers more consumers tail there, measured apart
    (result["standby"]); `scan_mode` overrides the mode's for every
    consumer."""
    scan_mode = scan_mode or mode.scan_mode
    with connect() as conn:
        setup_events(conn, mode)
        node = scan_node(conn, _explainable(mode, cfg), scan_mode)
        stats_before = stats_snapshot(conn)
        if standby is not None:
            wait_replayed(conn, standby)
    placed = [None] * cfg.consumers + [standby] * (cfg.standby_consumers if standby else 0)
    # fork, not spawn: spawn would re-import the harness (matplotlib and all)
    # in every worker.  Workers inherit the parent's open libpq sockets but
    # never touch them, and multiprocessing ends a forked worker with
    # os._exit, so no inherited connection is closed or used behind the
    # parent's back.
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Barrier(cfg.producers + len(placed) + 1)
    go, done = ctx.Event(), ctx.Event()
    t0 = ctx.Value("d", 0.0)
    final_count, final_max = ctx.Value("q", 0), ctx.Value("q", 0)
    out = ctx.Queue()
    procs = [ctx.Process(target=producer, args=(i, cfg, ready, go, t0, out))
             for i in range(cfg.producers)]
    procs += [ctx.Process(target=consumer,
                          args=(i, cfg, mode, scan_mode, server, ready, go, t0, done,
                                final_count, final_max, out))
              for i, server in enumerate(placed)]
    idle = None
    results = {"producer": {}, "consumer": {}}
    try:
        for p in procs:
            p.start()
        if scenario == "idle-in-tx":
            # Holds an xid (and a snapshot) in the same database, touching no
            # table of the workload: the horizon consumer's known weakness.
            idle = connect(autocommit=False)
            idle.execute("SELECT pg_current_xact_id()")
        try:
            ready.wait(timeout=60)
        except threading.BrokenBarrierError:
            raise RuntimeError("tail workers did not start: " + fatal_messages(out)) from None
        t0.value = time.monotonic() + 0.2
        go.set()
        _collect(out, results, "producer", cfg.producers, cfg.duration + 60)
        if idle is not None:
            idle.commit()
            idle.close()
            idle = None
        with connect() as conn:
            committed = {r[0] for r in conn.execute("SELECT id FROM events")}
            final_count.value = len(committed)
            final_max.value = max(committed, default=0)
            done.set()
            _collect(out, results, "consumer", len(placed), cfg.drain_timeout + 60)
            stats = stats_delta(stats_before, stats_snapshot(conn))
        for p in procs:
            p.join(timeout=10)
    finally:
        if idle is not None:
            idle.close()
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
    primary = {i: r for i, r in results["consumer"].items() if placed[i] is None}
    result = {"scan_node": node,
              **summarize(cfg, results["producer"], primary, committed, stats, t0.value)}
    if standby is not None:
        result["standby"] = summarize(cfg, results["producer"],
                                      {i: r for i, r in results["consumer"].items()
                                       if i not in primary}, committed, stats, t0.value)
    return result


def wait_replayed(conn, standby, timeout=60):
    """Waits until `standby` has replayed all the WAL `conn`'s server has
    written so far (its consumers then find the tables just made)."""
    (lsn,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    deadline = time.monotonic() + timeout
    with connect("postgres", server=standby) as s:
        while not s.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()[0]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby did not replay to {lsn} within {timeout}s")
            time.sleep(0.05)


def _explainable(mode, cfg):
    """The consumer's query with constants in place of its parameters."""
    if mode.horizon:
        return HORIZON_QUERY % ("'0'", 0, cfg.limit)
    return PLAIN_QUERY % (0, cfg.limit)


def _collect(out, results, role, count, timeout):
    """Waits for `count` reports of `role`; reports of the other role that
    arrive meanwhile (a consumer failing early) are kept too."""
    deadline = time.monotonic() + timeout
    while len(results[role]) < count:
        try:
            r, idx, payload = out.get(timeout=max(1.0, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(f"{count - len(results[role])} {role}(s) did not report "
                               f"within {timeout:g}s") from None
        results[r][idx] = payload


def summarize(cfg, producers, reports, committed, stats, start):
    """The run's figures for the consumers whose reports (by id) are in
    `reports`."""
    errors = collections.Counter()
    commit_time, rollbacks = {}, 0
    for r in producers.values():
        if "fatal" in r:
            errors["producer: " + r["fatal"]] += 1
            continue
        commit_time.update(r["commits"])
        rollbacks += r["rollbacks"]
        errors.update(r["errors"])
    end = start + cfg.duration
    lags, delivered_in_window, skipped, duplicates, timed_out = [], [], 0, 0, False
    skipped_sample = set()   # a few skipped keys, in the JSON only, for whoever debugs
    for r in reports.values():
        if "fatal" in r:
            errors["consumer: " + r["fatal"]] += 1
            continue
        errors.update(r["errors"])
        timed_out |= r["timed_out"]
        # A row can show before its producer sees COMMIT return; such a lag
        # counts as 0 rather than negative.
        lags += [max(0.0, t - commit_time[i]) for i, t in zip(r["ids"], r["times"])
                 if i in commit_time]
        delivered_in_window.append(sum(1 for t in r["times"] if t <= end))
        seen = set(r["ids"])
        missed = committed - seen
        skipped += len(missed)
        skipped_sample.update(sorted(missed)[:10])
        duplicates += len(r["ids"]) - len(seen)
    consumers = len(delivered_in_window)
    return {
        "committed": len(committed),
        "rollbacks": rollbacks,
        "commits_per_s": len(committed) / cfg.duration,
        "delivered_per_s": (sum(delivered_in_window) / consumers / cfg.duration
                            if consumers else None),
        "lag_p50_ms": _ms(percentile(lags, 50)),
        "lag_p99_ms": _ms(percentile(lags, 99)),
        "lag_max_ms": _ms(max(lags, default=None)),
        "skipped": skipped if consumers else None,
        "skipped_pct": (100.0 * skipped / (len(committed) * consumers)
                        if consumers and committed else None),
        "skipped_sample": sorted(skipped_sample)[:10],
        "duplicates": duplicates,
        "drain_timed_out": timed_out,
        "errors": [f"{n}x {msg}" for msg, n in errors.most_common(5)],
        "stats": stats,
    }


def _ms(seconds):
    return None if seconds is None else seconds * 1000.0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=[m.name for m in TAIL_MODES], default="plain")
    ap.add_argument("--scenario", choices=list(SCENARIOS), default="steady")
    for field, default in vars(TailConfig()).items():
        ap.add_argument("--" + field.replace("_", "-"), type=type(default), default=default)
    args = ap.parse_args()
    cfg = TailConfig(**{f: getattr(args, f) for f in vars(TailConfig())})
    mode = next(m for m in TAIL_MODES if m.name == args.mode)
    recreate_database()
    print(json.dumps(run_tail(mode, args.scenario, cfg), indent=2))


if __name__ == "__main__":
    main()
