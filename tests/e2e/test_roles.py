"""A table owner who is not a superuser uses pgkvx with row_security off,
and dumps and restores a database with latched tables with plain pg_dump."""
import os
import subprocess

import pyarrow
import pytest

from conftest import PG_BINDIR, connect


def login_role(db, name, *setup):
    """A fresh LOGIN role, set up by `setup` (statements with {role}), and
    everything it owns dropped with it afterwards."""
    with connect(db) as c:
        c.execute(f"DROP ROLE IF EXISTS {name}")
        c.execute(f"CREATE ROLE {name} LOGIN")
        for stmt in setup:
            c.execute(stmt.format(role=name))
    yield name
    with connect(db) as c:
        c.execute(f"DROP OWNED BY {name} CASCADE")
        c.execute(f"DROP ROLE {name}")


@pytest.fixture
def owner(db):
    yield from login_role(db, "pgkvx_owner", "GRANT CREATE, USAGE ON SCHEMA public TO {role}")


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


@pytest.fixture
def tenant(db):
    yield from login_role(db, "pgkvx_tenant", "ALTER ROLE {role} SET pgkvx.max_latches_per_role = 100")


def test_one_role_cannot_take_the_latch_table_from_everyone(db, tenant):
    """A role's sessions share one budget of latch entries, however many
    transactions it opens: once over, its writes fail (53400) and every
    other role's go on."""
    import psycopg
    tables = [f"tenant_t{i}" for i in range(40)]
    with connect(db) as c:
        for t in tables + ["victim_t"]:
            c.execute(f"CREATE TABLE {t} (k int PRIMARY KEY)")
            c.execute("SELECT pgkvx.enable(%s)", (t,))
            c.execute(f"GRANT INSERT ON {t} TO {tenant}")
    sessions = [connect(db, user=tenant, autocommit=False) for _ in range(4)]
    refused = []
    try:
        for i, s in enumerate(sessions):
            # Ten tables each, a few rows per table: below escalation, so
            # every row holds an entry of its own until the budget says so.
            for t in tables[10 * i:10 * i + 10]:
                try:
                    s.execute(f"INSERT INTO {t} SELECT g FROM generate_series(1, 20) g")
                except psycopg.errors.ConfigurationLimitExceeded as e:
                    refused.append(str(e))
                    s.rollback()
                    break
        assert refused, "the tenant's sessions were never held to the role's budget"
        assert all("max_latches_per_role" in e for e in refused), refused
        with connect(db) as c:
            used = c.execute("SELECT count(*) FROM pgkvx.latches").fetchone()[0]
            assert used <= 100 + 4 * 64, f"{used} latch entries held by one role's sessions"
            # Another role writes as usual meanwhile.
            c.execute("INSERT INTO victim_t SELECT g FROM generate_series(1, 200) g")
    finally:
        for s in sessions:
            s.close()
    with connect(db) as c:
        c.execute("DROP TABLE " + ", ".join(tables + ["victim_t"]))
