"""A latched table written by a logical-replication
subscription is exposed (rows arrive in the publisher's commit order, its
writers in flight are invisible here).  pgkvx.check() reports it and a
key-order LIMIT read of it warns (pgkvx.unprotected_reads = warning), or
fails with error.  The publisher is another database of the same cluster
(wal_level = logical in scripts/cluster)."""
import os

import psycopg
import pytest

from conftest import PORT, connect, wait_until

PUB = "e2e_subscriber_publisher"
SLOT = "pgkvx_e2e_sub_slot"


@pytest.fixture
def subscribed(db):
    with connect("postgres") as c:
        assert c.execute("SHOW wal_level").fetchone() == ("logical",)
        c.execute(f'DROP DATABASE IF EXISTS "{PUB}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{PUB}"')
    with connect(PUB) as p:
        p.execute("CREATE TABLE events (id bigint PRIMARY KEY, payload text)")
        p.execute("CREATE PUBLICATION pgkvx_pub FOR TABLE events")
        # A subscription in the same cluster cannot create its own slot.
        p.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    with connect(db) as s:
        s.execute("CREATE TABLE events (id bigserial PRIMARY KEY, payload text)")
        s.execute("SELECT pgkvx.enable('events', gapless => true)")
        host = os.environ.get("PGHOST", "/tmp")
        s.execute(f"CREATE SUBSCRIPTION pgkvx_sub CONNECTION 'host={host} port={PORT} dbname={PUB} user=postgres'"
                  f" PUBLICATION pgkvx_pub WITH (create_slot = false, slot_name = '{SLOT}')")
    try:
        yield db
    finally:
        with connect(db) as s:
            s.execute("ALTER SUBSCRIPTION pgkvx_sub DISABLE")
            s.execute("ALTER SUBSCRIPTION pgkvx_sub SET (slot_name = NONE)")
            s.execute("DROP SUBSCRIPTION pgkvx_sub")
            s.execute("DROP TABLE events")
        with connect(PUB) as p:
            wait_until(lambda: p.execute("SELECT NOT active FROM pg_replication_slots WHERE slot_name = %s",
                                         (SLOT,)).fetchone() in ((True,), None), "the slot to be released")
            p.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
        with connect("postgres") as c:
            c.execute(f'DROP DATABASE IF EXISTS "{PUB}" WITH (FORCE)')


def test_subscribed_latched_table_is_reported_and_its_reads_warn(subscribed):
    with connect(PUB) as p:
        p.execute("INSERT INTO events SELECT g, 'p' FROM generate_series(1, 5) g")
    with connect(subscribed) as s:
        wait_until(lambda: s.execute("SELECT count(*) FROM events").fetchone() == (5,),
                   "the apply worker to copy and apply the rows")
        problems = [p for (r, p) in s.execute("SELECT relid::text, problem FROM pgkvx.check()").fetchall()
                    if r == "events"]
        assert any("logical replication writes into it" in p for p in problems), problems
        warnings = []
        s.add_notice_handler(lambda d: warnings.append((d.severity_nonlocalized, d.message_primary)))
        assert s.execute("SELECT id FROM events WHERE id > 2 ORDER BY id LIMIT 2").fetchall() == [(3,), (4,)]
        assert any(sev == "WARNING" and "logical replication writes into it" in msg for sev, msg in warnings), warnings
        s.execute("SET pgkvx.unprotected_reads = error")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
            s.execute("SELECT id FROM events WHERE id > 2 ORDER BY id LIMIT 2").fetchall()
        assert "logical replication writes into it" in str(e.value), e.value
    # Replication goes on into the gapless table with the publisher's keys.
    with connect(PUB) as p:
        p.execute("INSERT INTO events VALUES (6, 'late')")
    with connect(subscribed) as s:
        wait_until(lambda: s.execute("SELECT max(id) FROM events").fetchone() == (6,), "row 6 to be applied")
