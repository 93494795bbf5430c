"""Bounded memory: a 5M-row arrow_scan / arrow_query makes the backend use
about as much private memory as a 100k-row one, because each call builds and
returns one batch (value-per-call) and nothing accumulates across batches.

Measured as the peak of the backend's RssAnon (private memory; shared buffers
are RssShmem and do not count) sampled while the statement streams, minus the
value before it started, each in a fresh backend."""
import io
import threading
import time

import pyarrow.ipc as ipc
import pytest

from conftest import connect

BIG = 5_000_000
SMALL = 100_000


def rss_anon_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc status")


def streamed_growth_kb(db, sql):
    """Runs `sql` in a fresh backend, streaming its rows; returns (peak private
    memory growth in kB, rows in the Arrow stream)."""
    with connect(db) as c:
        (pid,) = c.execute("SELECT pg_backend_pid()").fetchone()
        c.execute("SELECT pgkvx.version()")  # library loaded before the baseline
        base = rss_anon_kb(pid)
        peak = [base]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                try:
                    peak[0] = max(peak[0], rss_anon_kb(pid))
                except (FileNotFoundError, ProcessLookupError):
                    return
                time.sleep(0.001)

        th = threading.Thread(target=sample)
        th.start()
        buf = io.BytesIO()
        try:
            cur = c.cursor(binary=True)
            for (chunk,) in cur.stream(sql):
                buf.write(chunk)
        finally:
            stop.set()
            th.join()
        peak[0] = max(peak[0], rss_anon_kb(pid))
        buf.seek(0)
        rows = sum(b.num_rows for b in ipc.open_stream(buf))
        return peak[0] - base, rows


@pytest.fixture(scope="module")
def tables(db):
    with connect(db) as c:
        for name, n in (("small", SMALL), ("big", BIG)):
            c.execute(f"CREATE TABLE {name} AS SELECT g::int8 AS k, (g % 1000)::int4 AS a,"
                      f" md5(g::text) AS s, g / 7.0 AS x FROM generate_series(1, {n}) g")
            c.execute(f"ALTER TABLE {name} ADD PRIMARY KEY (k)")
            c.execute(f"VACUUM ANALYZE {name}")
    return db


@pytest.mark.parametrize("fn", ["scan", "query"])
def test_memory_is_flat_in_table_size(tables, fn):
    def sql(t):
        if fn == "scan":
            return f"SELECT pgkvx.arrow_scan('{t}', '{{k,a,s}}')"
        return f"SELECT pgkvx.arrow_query('SELECT k, a, s, x FROM {t} ORDER BY k')"

    small_kb, small_rows = streamed_growth_kb(tables, sql("small"))
    big_kb, big_rows = streamed_growth_kb(tables, sql("big"))
    print(f"\n{fn}: peak growth small={small_kb} kB big={big_kb} kB")
    assert (small_rows, big_rows) == (SMALL, BIG)
    # 50x the rows; the same batch size, so (allowing for allocator noise)
    # the same peak.  A leak of even 10 bytes per row would add ~48 MB.
    assert big_kb < small_kb + 24 * 1024, (small_kb, big_kb)
