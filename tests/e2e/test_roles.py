"""A table owner who is not a superuser uses pgkvx with row_security off,
and dumps and restores a database with latched tables with plain pg_dump."""
import os
import subprocess

import pyarrow
import pytest

from conftest import PG_BINDIR, connect


@pytest.fixture
def owner(db):
    with connect(db) as c:
        c.execute("DROP ROLE IF EXISTS pgkvx_owner")
        c.execute("CREATE ROLE pgkvx_owner LOGIN")
        c.execute("GRANT CREATE, USAGE ON SCHEMA public TO pgkvx_owner")
    yield "pgkvx_owner"
    with connect(db) as c:
        c.execute("DROP OWNED BY pgkvx_owner CASCADE")
        c.execute("DROP ROLE pgkvx_owner")


def test_row_security_off_changes_nothing_for_an_owner(db, owner):
    with connect(db, user=owner) as c:
        c.execute("SET row_security = off")
        c.execute("CREATE TABLE rs_events (id bigserial PRIMARY KEY, v text)")
        c.execute("SELECT pgkvx.enable('rs_events', gapless => true)")
        c.execute("INSERT INTO rs_events (v) SELECT 'x' FROM generate_series(1, 5)")
        assert c.execute("SELECT id FROM rs_events WHERE id > 2 ORDER BY id LIMIT 2").fetchall() == [(3,), (4,)]
        stream = b"".join(r[0] for r in c.cursor(binary=True).execute(
            "SELECT pgkvx.arrow_scan('rs_events', '{id}')").fetchall())
        assert pyarrow.ipc.open_stream(stream).read_all().num_rows == 5
        c.execute("SELECT pgkvx.disable('rs_events')")
        c.execute("SELECT pgkvx.enable('rs_events', gapless => true)")


def test_plain_pg_dump_by_an_owner_restores_latching(db, owner):
    with connect(db, user=owner) as c:
        c.execute("CREATE TABLE dump_events (id bigserial PRIMARY KEY, v text)")
        c.execute("SELECT pgkvx.enable('dump_events', gapless => true)")
        c.execute("INSERT INTO dump_events (v) VALUES ('a'), ('b')")
    env = dict(os.environ, PGUSER=owner)
    dump = subprocess.run([f"{PG_BINDIR}/pg_dump", "-d", db], capture_output=True, text=True, env=env)
    assert dump.returncode == 0, dump.stderr
    target = db + "_restored"
    with connect("postgres") as c:
        c.execute(f'DROP DATABASE IF EXISTS "{target}"')
        c.execute(f'CREATE DATABASE "{target}"')
    try:
        restore = subprocess.run([f"{PG_BINDIR}/psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", target],
                                 input=dump.stdout, capture_output=True, text=True)
        assert restore.returncode == 0, restore.stderr
        with connect(target) as c:
            assert c.execute("SELECT relid::text, gapless FROM pgkvx.tables").fetchall() == [("dump_events", True)]
            c.execute("INSERT INTO dump_events (v) VALUES ('c')")
            assert [i for (i,) in c.execute("SELECT id FROM dump_events ORDER BY id")] == [1, 2, 3]
            plan = "\n".join(r[0] for r in c.execute("EXPLAIN SELECT * FROM dump_events WHERE id > 1 ORDER BY id LIMIT 1"))
            assert "PgkvxLimitScan" in plan
    finally:
        with connect("postgres") as c:
            c.execute(f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')
