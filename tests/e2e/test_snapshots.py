"""Folding waited-for writers into a snapshot costs what the read's tables'
writers cost, however many xids the cluster assigned meanwhile: a snapshot
taken long ago on a busy system is still folded into, not replaced, and
returns every row it must and none it must not."""
from conftest import connect, stats


def test_an_old_cursor_snapshot_is_spliced_however_many_xids_came_since(db, table_name):
    """A cursor's snapshot taken long ago, with thousands of transactions
    since: the read folds in the writer it waited for and hides only the
    table's other writers since its snapshot -- no fresh snapshot, so no
    chase -- and a row committed after the snapshot stays invisible."""
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (id bigserial PRIMARY KEY, v text)")
        c.execute("SELECT pgkvx.enable(%s, gapless => true)", (table_name,))
    with connect(db, autocommit=False) as w, connect(db, autocommit=False) as r, connect(db) as busy:
        w.execute(f"INSERT INTO {table_name} (v) VALUES ('late')")        # id 1, in flight
        busy.execute(f"INSERT INTO {table_name} (v) VALUES ('early')")    # id 2, committed
        r.execute(f"DECLARE c CURSOR FOR SELECT id FROM {table_name} WHERE id > 0 ORDER BY id LIMIT 10")
        busy.execute(f"INSERT INTO {table_name} (v) VALUES ('after')")    # id 3, after the snapshot
        before = stats(busy)["fresh_snapshots"]
        # More top-level transactions since the cursor's snapshot than a
        # pull-in could ever list one by one.
        busy.execute("DO $$ BEGIN FOR i IN 1..20000 LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$")
        w.commit()
        assert r.execute("FETCH ALL FROM c").fetchall() == [(1,), (2,)]
        r.commit()
        assert stats(busy)["fresh_snapshots"] == before
    with connect(db) as c:
        c.execute(f"DROP TABLE {table_name}")
