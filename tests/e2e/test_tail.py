"""The headline promise: consumers tailing a table by key never skip a row
that commits late.  Producers draw ids with pgkvx.next_key, hold their
transactions open for random milliseconds and roll back 10% of them;
consumers poll `WHERE id > cursor ORDER BY id LIMIT n`.  Plain Postgres
skips rows (so the test can fail); fenced and optimistic never do."""
import random
import threading
import time

import pytest

from conftest import connect


def run_tail(db, table, mode, seed, producers=4, consumers=2, seconds=2.5, limit=5):
    rnd = random.Random(seed)
    committed, lock = set(), threading.Lock()
    stop = threading.Event()
    errors = []

    def producer(pseed):
        r = random.Random(pseed)
        try:
            with connect(db, autocommit=False) as c:
                while not stop.is_set():
                    ids = [c.execute(f"INSERT INTO {table} (payload) VALUES ('x') RETURNING id").fetchone()[0]
                           for _ in range(r.randint(1, 3))]
                    time.sleep(r.random() * 0.005)
                    if r.random() < 0.1:
                        c.rollback()
                    else:
                        c.commit()
                        with lock:
                            committed.update(ids)
        except Exception as e:
            errors.append(e)

    delivered = [set() for _ in range(consumers)]

    # Consumers drain only once every producer has finished: a producer
    # slow to commit its last transaction after `stop` must not find the
    # consumers gone, which would count its rows as skipped.
    produced = threading.Event()

    def consumer(i):
        try:
            with connect(db) as c:
                c.execute("SET pgkvx.scan_mode = %s" % mode)
                cursor, idle = 0, 0
                while True:
                    rows = c.execute(f"SELECT id FROM {table} WHERE id > %s ORDER BY id LIMIT %s",
                                     (cursor, limit)).fetchall()
                    for (id_,) in rows:
                        assert id_ > cursor
                        delivered[i].add(id_)
                        cursor = id_
                    if not rows:
                        if produced.is_set():
                            idle += 1
                            if idle > 20:
                                return
                        time.sleep(0.001)
        except Exception as e:
            errors.append(e)

    makers = [threading.Thread(target=producer, args=(rnd.random(),)) for _ in range(producers)]
    takers = [threading.Thread(target=consumer, args=(i,)) for i in range(consumers)]
    for t in makers + takers:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in makers:
        t.join()
    produced.set()
    for t in takers:
        t.join()
    assert not errors, errors
    skipped = [sorted(committed - d) for d in delivered]
    return committed, skipped


@pytest.fixture
def events(conn, table_name):
    conn.execute(f"CREATE TABLE {table_name} (id bigserial PRIMARY KEY, payload text)")
    conn.execute("SELECT pgkvx.enable(%s, gapless => true)", (table_name,))
    yield table_name
    conn.execute(f"DROP TABLE {table_name}")


def test_plain_postgres_skips_rows(db, events):
    total = 0
    for seed in range(3):
        committed, skipped = run_tail(db, events, "off", seed)
        assert committed
        total += sum(len(s) for s in skipped)
    assert total > 0, "no skip observed: the workload does not exercise late commits"


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pgkvx_never_skips(db, events, mode, seed):
    committed, skipped = run_tail(db, events, mode, seed)
    assert len(committed) > 100
    assert skipped == [[]] * len(skipped), f"{mode} skipped {skipped}"
