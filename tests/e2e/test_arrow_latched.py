"""pgkvx.arrow_scan on a latched table: key order is the latched key index,
and the scan honours pgkvx.scan_mode like a LIMIT scan — it waits for a
writer in flight inside what it reads and then includes the row, and never
returns a batch it would have to take back.

No timing thresholds: a reader "waits" when Postgres says it is blocked by
the writer (pg_blocking_pids), and statement_timeout only turns a hang into
a failure."""
import threading
import time

import psycopg
import pytest

from conftest import connect, stats
from test_arrow import chunks, read_pyarrow, read_polars

HANG_GUARD_S = 60


def wait_until_blocked(c, pid, by_pid):
    """Until backend `pid` waits on a lock held by `by_pid` (hang guard only)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        if by_pid in c.execute("SELECT pg_blocking_pids(%s)", (pid,)).fetchone()[0]:
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} never blocked on {by_pid}")


class Reader(threading.Thread):
    """Runs one arrow_scan in its own session and keeps the raw values."""

    def __init__(self, db, sql, params, settings=()):
        super().__init__(daemon=True)
        self.conn = connect(db)
        self.conn.execute(f"SET statement_timeout = '{HANG_GUARD_S}s'")
        for s in settings:
            self.conn.execute(s)
        self.pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        self.sql, self.params = sql, params
        self.values, self.error = None, None

    def run(self):
        try:
            self.values = chunks(self.conn, self.sql, self.params)
        except Exception as e:  # reported by the test
            self.error = e


@pytest.fixture
def ev(conn, table_name):
    conn.execute(f"CREATE TABLE {table_name} (k int PRIMARY KEY, v text)")
    conn.execute("SELECT pgkvx.enable(%s)", (table_name,))
    conn.execute(f"INSERT INTO {table_name} SELECT g * 10, 'old' FROM generate_series(1, 5) g")
    return table_name


def scan_bounded(table, max_rows=None):
    return ("SELECT pgkvx.arrow_scan(%s::regclass, lower => '0', upper => '40', max_rows => %s)",
            (table, max_rows))


def test_optimistic_scan_waits_for_a_writer_inside_the_bounds_and_includes_its_row(db, conn, ev):
    before = stats(conn)
    with connect(db, autocommit=False) as w:
        w.execute(f"INSERT INTO {ev} VALUES (25, 'fresh')")
        wpid = w.execute("SELECT pg_backend_pid()").fetchone()[0]
        r = Reader(db, *scan_bounded(ev, max_rows=100), settings=["SET pgkvx.scan_mode = optimistic"])
        r.start()
        wait_until_blocked(conn, r.pid, wpid)
        assert r.is_alive() and r.values is None, "nothing may be returned while the writer is in flight"
        w.commit()
    r.join(HANG_GUARD_S)
    assert r.error is None
    t = read_pyarrow(b"".join(r.values))
    assert t.column("k").to_pylist() == [10, 20, 25, 30]
    assert t.column("v").to_pylist() == ["old", "old", "fresh", "old"]
    after = stats(conn)
    assert after["scans_optimistic"] > before["scans_optimistic"]
    assert after["conflicts"] > before["conflicts"]
    assert after["wait_us"] > before["wait_us"]
    r.conn.close()


def test_scan_mode_off_returns_at_once_without_the_row(db, conn, ev):
    with connect(db, autocommit=False) as w:
        w.execute(f"INSERT INTO {ev} VALUES (25, 'fresh')")
        conn.execute(f"SET statement_timeout = '{HANG_GUARD_S}s'")
        conn.execute("SET pgkvx.scan_mode = off")
        before = stats(conn)["scans_off"]
        # Were it to wait, it would wait for ever: this session is the only
        # one that could end the writer.
        t = read_pyarrow(b"".join(chunks(conn, *scan_bounded(ev, max_rows=100))))
        assert t.column("k").to_pylist() == [10, 20, 30]
        assert stats(conn)["scans_off"] == before + 1
        w.rollback()
    conn.execute("RESET pgkvx.scan_mode")


def test_writer_outside_the_bounds_does_not_delay_the_scan(db, conn, ev):
    with connect(db, autocommit=False) as w:
        w.execute(f"INSERT INTO {ev} VALUES (45, 'fresh')")
        conn.execute(f"SET statement_timeout = '{HANG_GUARD_S}s'")
        for mode, max_rows in (("optimistic", 100), ("fenced", None)):
            conn.execute(f"SET pgkvx.scan_mode = {mode}")
            t = read_pyarrow(b"".join(chunks(conn, *scan_bounded(ev, max_rows=max_rows))))
            assert t.column("k").to_pylist() == [10, 20, 30]
        w.rollback()
    conn.execute("RESET pgkvx.scan_mode")


def test_fenced_stream_of_many_batches_waits_then_streams_everything(db, conn, table_name):
    conn.execute(f"CREATE TABLE {table_name} (k int PRIMARY KEY, v text)")
    conn.execute("SELECT pgkvx.enable(%s)", (table_name,))
    conn.execute(f"INSERT INTO {table_name} SELECT g * 2, 'old' FROM generate_series(1, 5000) g")
    with connect(db, autocommit=False) as w:
        w.execute(f"INSERT INTO {table_name} VALUES (9999, 'fresh')")
        wpid = w.execute("SELECT pg_backend_pid()").fetchone()[0]
        # No max_rows: unbounded, so fenced; 7 batches.
        r = Reader(db, "SELECT pgkvx.arrow_scan(%s::regclass, batch_rows => 1000)", (table_name,))
        r.start()
        wait_until_blocked(conn, r.pid, wpid)
        w.commit()
    r.join(HANG_GUARD_S)
    assert r.error is None
    assert len(r.values) == 6
    t = read_pyarrow(b"".join(r.values))
    assert t.column("k").to_pylist() == sorted([g * 2 for g in range(1, 5001)] + [9999])
    r.conn.close()


def test_fallback_to_fenced_returns_one_stream_read_after_the_wait(db, conn, ev):
    """With no optimistic retries the first conflict falls back to fenced:
    what the optimistic attempt had read and encoded must not be sent."""
    before = stats(conn)
    with connect(db, autocommit=False) as w:
        w.execute(f"INSERT INTO {ev} VALUES (25, 'fresh')")
        wpid = w.execute("SELECT pg_backend_pid()").fetchone()[0]
        r = Reader(db, *scan_bounded(ev, max_rows=100), settings=[
            "SET pgkvx.scan_mode = optimistic", "SET pgkvx.optimistic_retries = 0"])
        r.start()
        wait_until_blocked(conn, r.pid, wpid)
        w.commit()
    r.join(HANG_GUARD_S)
    assert r.error is None
    buf = b"".join(r.values)
    # Exactly one stream: one end-of-stream marker, at the end.
    eos = b"\xff\xff\xff\xff\x00\x00\x00\x00"
    assert buf.endswith(eos) and buf.count(eos) == 1
    t = read_pyarrow(buf)
    assert t.column("k").to_pylist() == [10, 20, 25, 30]
    assert read_polars(buf)["k"].to_list() == [10, 20, 25, 30]
    assert stats(conn)["fallbacks_to_fenced"] > before["fallbacks_to_fenced"]
    r.conn.close()


def test_repeatable_read_raises_40001_naming_the_table_not_keys(db, conn, ev):
    """PostgreSQL's own message (client retry logic matches it); the detail
    names the table but no key, which is table data."""
    with connect(db, autocommit=False) as w, connect(db, autocommit=False) as rr:
        w.execute(f"INSERT INTO {ev} VALUES (25, 'fresh')")
        rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        rr.execute("SELECT 1")  # takes the transaction snapshot
        w.commit()
        with pytest.raises(psycopg.errors.SerializationFailure) as e:
            chunks(rr, *scan_bounded(ev, max_rows=100))
        assert e.value.diag.message_primary == "could not serialize access due to concurrent update"
        assert f'"{ev}"' in e.value.diag.message_detail
        assert "arrow_scan" in e.value.diag.message_detail
        assert "[0, 40)" not in str(e.value)


def test_latched_key_index_gives_the_order_and_the_bounds(conn, table_name):
    """A table latched on a unique index other than its primary key is read
    in that index's order, and lower/upper bound that key."""
    conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY, k text COLLATE \"C\" NOT NULL, v int)")
    conn.execute(f"CREATE UNIQUE INDEX {table_name}_k ON {table_name} (k)")
    conn.execute(f"INSERT INTO {table_name} VALUES (1, 'd', 1), (2, 'b', 2), (3, 'a', 3), (4, 'c', 4)")
    conn.execute("SELECT pgkvx.enable(%s, %s)", (table_name, f"{table_name}_k"))
    t = read_pyarrow(b"".join(chunks(conn, "SELECT pgkvx.arrow_scan(%s::regclass)", (table_name,))))
    assert t.column("k").to_pylist() == ["a", "b", "c", "d"]
    assert t.column("id").to_pylist() == [3, 2, 4, 1]
    t = read_pyarrow(b"".join(chunks(
        conn, "SELECT pgkvx.arrow_scan(%s::regclass, '{id}', 'b', 'd', 10)", (table_name,))))
    assert t.column("id").to_pylist() == [2, 4]
    conn.execute("SELECT pgkvx.disable(%s)", (table_name,))
    t = read_pyarrow(b"".join(chunks(conn, "SELECT pgkvx.arrow_scan(%s::regclass, '{id}')", (table_name,))))
    assert t.column("id").to_pylist() == [1, 2, 3, 4]
