"""A consumer at the head waits for nobody.  With one producer, whose
transactions commit in key order and hold their key a moment before
committing, a writer is nearly always in flight, and always past every
committed row: no read of any shape, in any scan mode that reads
optimistically, has a reason to wait for it.  The table's read-wait count
must stay 0 while consumers of every shape deliver every row."""
import threading
import time

import pyarrow
import pytest

from conftest import connect

SECONDS = 3


def read_waits(c, t):
    return dict(c.execute("SELECT stat, value FROM pgkvx.stats(%s::regclass)", (t,)).fetchall())["read_waits"]


def shapes(t):
    def sql(q):
        return lambda c, cur: [r[0] for r in c.execute(q.format(t=t), {"c": cur}).fetchall()]

    def arrow(c, cur):
        cb = c.cursor(binary=True)
        stream = b"".join(r[0] for r in cb.execute(
            "SELECT pgkvx.arrow_scan(%s, '{id}', lower => %s, max_rows => 50)", (t, str(cur + 1))).fetchall())
        return pyarrow.ipc.open_stream(stream).read_all().column("id").to_pylist()

    return {
        "tail": sql("SELECT id FROM {t} WHERE id > %(c)s ORDER BY id LIMIT 50"),
        "through a sort": sql("SELECT id FROM (SELECT id FROM {t} WHERE id > %(c)s OFFSET 0) s ORDER BY id LIMIT 50"),
        "an OR of a range and the rest": sql(
            "SELECT id FROM {t} WHERE (id > %(c)s AND id <= %(c)s + 3) OR id > %(c)s + 3 ORDER BY id LIMIT 50"),
        "a cursor from a CTE": sql(
            "SELECT id FROM (WITH last AS (SELECT %(c)s::bigint AS cur) "
            "SELECT * FROM {t} WHERE id > (SELECT cur FROM last)) m ORDER BY id LIMIT 50"),
        "arrow_scan": arrow,
    }


@pytest.mark.parametrize("partitioned", [False, True], ids=["table", "partitioned"])
def test_a_consumer_at_the_head_waits_for_nobody(db, table_name, partitioned):
    t = table_name
    with connect(db) as c:
        if partitioned:
            c.execute(f"CREATE TABLE {t} (id bigserial PRIMARY KEY, v text) PARTITION BY RANGE (id)")
            for i in range(4):
                c.execute(f"CREATE TABLE {t}_{i} PARTITION OF {t} FOR VALUES FROM ({i * 100 + 1}) TO ({i * 100 + 101})")
            c.execute(f"CREATE TABLE {t}_rest PARTITION OF {t} FOR VALUES FROM (401) TO (MAXVALUE)")
        else:
            c.execute(f"CREATE TABLE {t} (id bigserial PRIMARY KEY, v text)")
        c.execute("SELECT pgkvx.enable(%s, gapless => true)", (t,))
        before = read_waits(c, t)
    stop, drained, errors, committed = threading.Event(), threading.Event(), [], []

    def producer():
        try:
            with connect(db, autocommit=False) as p:
                while not stop.is_set():
                    (i,) = p.execute(f"INSERT INTO {t} (v) VALUES ('x') RETURNING id").fetchone()
                    time.sleep(0.002)
                    p.commit()
                    committed.append(i)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    got = {name: [] for name in shapes(t)}

    def consumer(name, read):
        try:
            with connect(db) as k:
                cur = 0
                deadline = time.monotonic() + SECONDS + 60
                while time.monotonic() < deadline:
                    ids = read(k, cur)
                    got[name] += ids
                    if ids:
                        cur = ids[-1]
                    elif drained.is_set() and cur >= committed[-1]:
                        return
                    else:
                        time.sleep(0.001)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((name, e))

    producing = threading.Thread(target=producer)
    consuming = [threading.Thread(target=consumer, args=item) for item in shapes(t).items()]
    for th in [producing, *consuming]:
        th.start()
    time.sleep(SECONDS)
    stop.set()
    producing.join(120)
    drained.set()
    for th in consuming:
        th.join(120)
    assert not errors, errors
    assert len(committed) > 100, len(committed)
    for name, ids in got.items():
        assert ids == sorted(committed), (name, len(ids), len(committed))
    with connect(db) as c:
        assert read_waits(c, t) == before, "a read at the head waited for the writer of the next row"
        c.execute(f"DROP TABLE {t}")
