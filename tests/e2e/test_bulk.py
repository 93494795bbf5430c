"""One big write transaction takes a bounded part of the latch table: its
point latches escalate into spans, so a million-row load or delete works
and writers of other tables go on meanwhile."""
import threading

import pytest

from conftest import connect, stats


def watch_entries(db, stop, peak):
    with connect(db) as c:
        while not stop.is_set():
            peak[0] = max(peak[0], stats(c)["latch_entries_used"])


@pytest.mark.parametrize("rows", [1_000_000])
def test_million_row_load_and_delete(db, table_name, rows):
    other = table_name + "_other"
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (k bigint PRIMARY KEY, v int)")
        c.execute(f"CREATE TABLE {other} (k bigint PRIMARY KEY)")
        c.execute("SELECT pgkvx.enable(%s), pgkvx.enable(%s)", (table_name, other))
        (budget,) = c.execute("SHOW pgkvx.max_latches_per_transaction").fetchone()
        budget = int(budget)
    for stmt in (f"INSERT INTO {table_name} SELECT g, g % 7 FROM generate_series(1, {rows}) g",
                 f"DELETE FROM {table_name}"):
        stop, peak = threading.Event(), [0]
        watcher = threading.Thread(target=watch_entries, args=(db, stop, peak))
        watcher.start()
        try:
            with connect(db, autocommit=False) as big, connect(db) as small:
                big.execute(stmt)
                # While the big transaction is open, others latch as usual.
                for i in range(100):
                    small.execute(f"INSERT INTO {other} VALUES (%s) ON CONFLICT (k) DO UPDATE SET k = excluded.k", (i,))
                big.commit()
        finally:
            stop.set()
            watcher.join()
        assert peak[0] <= budget + 200, f"{stmt}: {peak[0]} latch entries used at once"
    with connect(db) as c:
        assert c.execute(f"SELECT count(*) FROM {table_name}").fetchone() == (0,)
        assert stats(c)["latches_escalated"] > 0
        c.execute(f"DROP TABLE {table_name}, {other}")


def test_many_explicit_spans_escalate_and_crowd_no_range(db, table_name):
    """latch_span() spans count toward escalation like row latches: a
    transaction taking thousands of small spans ends up holding a few
    entries, so no range is crowded past the back-pressure limit and other
    writers of the table are not held back by it."""
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (k bigint PRIMARY KEY)")
        c.execute("SELECT pgkvx.enable(%s)", (table_name,))
        (limit,) = c.execute("SHOW pgkvx.range_max_latches").fetchone()
    with connect(db, autocommit=False) as big, connect(db) as other:
        pid = big.execute("SELECT pg_backend_pid()").fetchone()[0]
        for g in range(4096):
            big.execute("SELECT pgkvx.latch_span(%s, %s, %s)", (table_name, str(2 * g), str(2 * g + 1)))
        held = other.execute("SELECT count(*) FROM pgkvx.latches WHERE holder_pid = %s", (pid,)).fetchone()[0]
        crowd = other.execute("SELECT coalesce(max(live + tombstones), 0) FROM pgkvx.ranges WHERE relid = %s::regclass",
                              (table_name,)).fetchone()[0]
        assert held < 200, f"{held} latch entries for 4096 spans"
        assert crowd <= 4 * int(limit), f"a range holds {crowd} latches (limit {limit})"
        assert stats(other)["latches_escalated"] > 0
        other.execute(f"INSERT INTO {table_name} VALUES (100000)")
        big.rollback()
    with connect(db) as c:
        c.execute(f"DROP TABLE {table_name}")
