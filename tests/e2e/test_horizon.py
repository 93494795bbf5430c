"""Tombstones go once no running snapshot can see their holders in
progress.  A replication slot retains old xids for its own reasons (an idle
CDC slot for ever); it must not pin the latch table."""
from conftest import connect, stats, wait_until


def test_a_replication_slot_does_not_pin_tombstones(db, table_name):
    with connect(db) as c:
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (table_name,))
        try:
            c.execute(f"CREATE TABLE {table_name} (k int PRIMARY KEY)")
            c.execute("SELECT pgkvx.enable(%s)", (table_name,))
            (first,) = c.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
            for i in range(200):
                c.execute(f"INSERT INTO {table_name} VALUES (%s)", (i,))
            # The slot holds the cluster's own horizon behind every write...
            (slot_xmin,) = c.execute("SELECT catalog_xmin::text::bigint FROM pg_replication_slots "
                                     "WHERE slot_name = %s", (table_name,)).fetchone()
            assert slot_xmin <= first
            # ...but the tombstones of those writes are reclaimed.
            wait_until(lambda: sum(1 for r in c.execute(
                "SELECT 1 FROM pgkvx.latch_list(true) WHERE relid = %s::regclass", (table_name,))) == 0,
                "tombstones to be reclaimed", timeout=30)
            assert stats(c)["tombstones_reclaimed"] > 0
        finally:
            c.execute("SELECT pg_drop_replication_slot(%s)", (table_name,))
            c.execute(f"DROP TABLE IF EXISTS {table_name}")
