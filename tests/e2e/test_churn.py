"""A caught-up consumer must not chase producers for ever while xids are
assigned fast elsewhere in the cluster (another database burning xids, a
batch with a savepoint per row).  A read waits only for the writers in
flight at its first snapshot, then reads at a fresh one and stops before
the keys of producers that started since.  Here no poll may take more than
a couple of fresh snapshots (counted in pgkvx.stats(), not timed), none
may skip a row, and the churn must really have happened (the xids
assigned are counted, not assumed)."""
import threading
import time

import pytest

from conftest import connect, scratch_database, stats


@pytest.fixture
def churn_db():
    with scratch_database("e2e_churn_elsewhere") as name:
        yield name


def next_xid(c):
    return int(c.execute("SELECT pg_current_snapshot()::text").fetchone()[0].split(":")[1])


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
@pytest.mark.parametrize("churn", ["transactions", "savepoints"])
def test_a_tail_finishes_while_xids_are_burnt_elsewhere(db, churn_db, table_name, mode, churn):
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (id bigserial PRIMARY KEY, payload text)")
        c.execute("SELECT pgkvx.enable(%s, gapless => true)", (table_name,))
    stop = threading.Event()
    committed, lock, errors = set(), threading.Lock(), []

    def producer():
        try:
            with connect(db, autocommit=False) as c:
                while not stop.is_set():
                    (i,) = c.execute(f"INSERT INTO {table_name} (payload) VALUES ('x') RETURNING id").fetchone()
                    time.sleep(0.3)
                    c.commit()
                    with lock:
                        committed.add(i)
        except Exception as e:  # noqa: BLE001 - checked below
            errors.append(e)

    burn = {
        # Many short transactions in another database.
        "transactions": "DO $$ BEGIN FOR i IN 1..2000 LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$",
        # One transaction with a subtransaction (and its xid) per row.
        "savepoints": """DO $$ BEGIN FOR i IN 1..2000 LOOP
                             BEGIN INSERT INTO burn VALUES (i); EXCEPTION WHEN OTHERS THEN NULL; END;
                         END LOOP; END $$""",
    }[churn]
    burnt = [0]

    def churner():
        try:
            with connect(churn_db) as c:
                c.execute("CREATE UNLOGGED TABLE IF NOT EXISTS burn (i int)")
                start = next_xid(c)
                while not stop.is_set():
                    c.execute(burn)
                burnt[0] = next_xid(c) - start
        except Exception as e:  # noqa: BLE001 - checked below
            errors.append(e)

    threads = [threading.Thread(target=producer) for _ in range(3)] + [threading.Thread(target=churner)]
    for t in threads:
        t.start()
    delivered, polls = [], 0
    try:
        with connect(db) as c:
            c.execute(f"SET pgkvx.scan_mode = {mode}")
            # A hang guard only: a poll that chased producers would never end.
            c.execute("SET statement_timeout = '120s'")
            fresh_before = stats(c)["fresh_snapshots"]
            cursor = 0
            deadline = time.monotonic() + 4.0
            while time.monotonic() < deadline:
                rows = c.execute(f"SELECT id FROM {table_name} WHERE id > %s ORDER BY id LIMIT 100",
                                 (cursor,)).fetchall()
                polls += 1
                for (i,) in rows:
                    delivered.append(i)
                    cursor = i
            fresh = stats(c)["fresh_snapshots"] - fresh_before
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors
    assert burnt[0] > 5000, f"the churn assigned only {burnt[0]} xids: the test proves nothing"
    assert polls > 5 and delivered, (polls, delivered)
    # A poll waits only for writers in flight at its first snapshot, then
    # reads at a fresh one (stopping before writers that started since):
    # it never chases the producers, whatever the churn.
    assert fresh <= 2 * polls, f"{fresh} fresh snapshots in {polls} polls: the reads chased writers"
    assert delivered == sorted(delivered)
    # Every committed row up to the cursor was delivered: none skipped.
    with lock:
        behind = {i for i in committed if i <= delivered[-1]}
    assert behind <= set(delivered), sorted(behind - set(delivered))
