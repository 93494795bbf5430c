"""Folding waited-for writers into a snapshot costs at most a bounded
number of xids; a snapshot taken long ago on a busy system takes a fresh
snapshot instead, and still returns every row."""
from conftest import connect, stats


def test_an_old_cursor_snapshot_is_refreshed_not_spliced(db, table_name):
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (id bigserial PRIMARY KEY, v text)")
        c.execute("SELECT pgkvx.enable(%s, gapless => true)", (table_name,))
    with connect(db, autocommit=False) as w, connect(db, autocommit=False) as r, connect(db) as busy:
        w.execute(f"INSERT INTO {table_name} (v) VALUES ('late')")        # id 1, in flight
        busy.execute(f"INSERT INTO {table_name} (v) VALUES ('early')")    # id 2, committed
        r.execute(f"DECLARE c CURSOR FOR SELECT id FROM {table_name} WHERE id > 0 ORDER BY id LIMIT 10")
        before = stats(busy)["fresh_snapshots"]
        # More top-level transactions since the cursor's snapshot than a
        # pull-in lists (MAX_SPLICED_XIDS, 8192).
        busy.execute("DO $$ BEGIN FOR i IN 1..9000 LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$")
        w.commit()
        assert r.execute("FETCH ALL FROM c").fetchall() == [(1,), (2,)]
        r.commit()
        assert stats(busy)["fresh_snapshots"] > before
    with connect(db) as c:
        c.execute(f"DROP TABLE {table_name}")
