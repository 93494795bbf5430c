"""The extension works when preloaded and refuses clearly when it is not."""
import os
import shutil

import psycopg
import pytest

from conftest import cluster, connect, conninfo, free_port


def test_version_is_reported(conn):
    (v,) = conn.execute("SELECT pgkvx.version()").fetchone()
    (ext,) = conn.execute("SELECT extversion FROM pg_extension WHERE extname='pgkvx'").fetchone()
    assert v == ext


def test_objects_live_in_pgkvx_schema(conn):
    rows = conn.execute(
        """SELECT p.proname FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid
           JOIN pg_extension e ON e.oid = d.refobjid
           WHERE e.extname = 'pgkvx' AND p.pronamespace <> 'pgkvx'::regnamespace"""
    ).fetchall()
    assert rows == []


def scratch_cluster_env(name, offset, preload):
    """The environment of scripts/cluster for a scratch cluster of our tree
    on the first free port from PGPORT + `offset`, preloading `preload`."""
    port = str(free_port(int(os.environ.get("PGPORT", "55432")) + offset))
    env = dict(os.environ, PGKVX_PORT=port, PGKVX_PRELOAD=preload,
               PGKVX_CLUSTER=f"/tmp/pgkvx-cluster-{name}-{port}")
    env.pop("PGHOST", None)
    env.pop("PGPORT", None)
    cluster("destroy", env=env)
    cluster("start", env=env)
    return env, conninfo("postgres", host=f"{env['PGKVX_CLUSTER']}/sock", port=port)


@pytest.fixture
def unpreloaded_cluster():
    env, info = scratch_cluster_env("nopreload", 17, "")
    try:
        yield info
    finally:
        cluster("destroy", env=env)


def test_create_extension_without_preload_is_refused(unpreloaded_cluster):
    with psycopg.connect(unpreloaded_cluster, autocommit=True) as c:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
            c.execute("CREATE EXTENSION pgkvx")
        assert "shared_preload_libraries" in str(e.value)


@pytest.fixture
def once_preloaded_cluster():
    """A cluster whose database got pgkvx and latched tables while the
    server preloaded it, then restarted without the preload (an operator
    switching it off, a restore or a promoted replica set up otherwise)."""
    env, info = scratch_cluster_env("unloaded", 19, "pgkvx")
    try:
        with psycopg.connect(info, autocommit=True) as c:
            c.execute("CREATE EXTENSION pgkvx")
            c.execute("CREATE TABLE ev (id bigserial PRIMARY KEY, v text)")
            c.execute("SELECT pgkvx.enable('ev', gapless => true)")
            c.execute("CREATE TABLE ob (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)")
            c.execute("SELECT pgkvx.enable('ob', gapless => true)")
            c.execute("""CREATE TABLE pt (id bigserial, at int NOT NULL, PRIMARY KEY (id, at))
                         PARTITION BY RANGE (at)""")
            c.execute("CREATE TABLE pt_1 PARTITION OF pt FOR VALUES FROM (0) TO (100)")
            c.execute("SELECT pgkvx.enable('pt', gapless => true)")
            c.execute("INSERT INTO ev (v) VALUES ('a'), ('b')")
        # (ALTER SYSTEM would write the empty list as one empty name.)
        with open(f"{env['PGKVX_CLUSTER']}/data/postgresql.conf", "a") as f:
            f.write("\nshared_preload_libraries = ''\n")
        cluster("restart", env=env)
        yield info
    finally:
        cluster("destroy", env=env)


def test_without_the_preload_ddl_and_drop_extension_work_and_writes_say_why(once_preloaded_cluster):
    with psycopg.connect(once_preloaded_cluster, autocommit=True) as c:
        assert c.execute("SHOW shared_preload_libraries").fetchone() == ("",)
        # Reads are plain PostgreSQL.
        assert c.execute("SELECT id FROM ev WHERE id > 0 ORDER BY id LIMIT 10").fetchall() == [(1,), (2,)]
        # check() says the protection is off, for every latched table.
        problems = c.execute("SELECT relid::text, problem FROM pgkvx.check()").fetchall()
        for t in ("ev", "ob", "pt"):
            assert any(r == t and "shared_preload_libraries" in p for r, p in problems), problems
        # Writes of latched tables fail with one clear error naming the setting.
        for sql in ("INSERT INTO ev (v) VALUES ('c')", "INSERT INTO ob (v) VALUES ('c')",
                    "INSERT INTO pt (at) VALUES (1)", "UPDATE ev SET v = 'x' WHERE id = 1"):
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
                c.execute(sql)
            assert "shared_preload_libraries" in str(e.value), (sql, e.value)
        # DDL on any table, latched or not, works.
        c.execute("CREATE TABLE other (x int)")
        c.execute("ALTER TABLE other ADD COLUMN y int")
        c.execute("ALTER TABLE other OWNER TO postgres")
        c.execute("ALTER TABLE ev ADD COLUMN w int")
        c.execute("ALTER TABLE ev OWNER TO postgres")
        c.execute("CREATE TABLE pt_2 (id bigint NOT NULL, at int NOT NULL, PRIMARY KEY (id, at))")
        c.execute("ALTER TABLE pt ATTACH PARTITION pt_2 FOR VALUES FROM (100) TO (200)")
        # A table can be disabled; its writes then work plainly.
        c.execute("SELECT pgkvx.disable('ob')")
        c.execute("INSERT INTO ob (v) VALUES ('c')")
        # The extension can be dropped, CASCADE included; gapless tables
        # keep working with their sequence default.
        with pytest.raises(psycopg.errors.DependentObjectsStillExist):
            c.execute("DROP EXTENSION pgkvx")
        c.execute("DROP EXTENSION pgkvx CASCADE")
        c.execute("INSERT INTO ev (v) VALUES ('after')")
        assert c.execute("SELECT max(id) FROM ev").fetchone() == (3,)
    # And without the preload it cannot come back (a new session loads the
    # library as CREATE EXTENSION runs).
    with psycopg.connect(once_preloaded_cluster, autocommit=True) as c:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            c.execute("CREATE EXTENSION pgkvx")


def test_drop_extension_leaves_nothing_and_tables_keep_working(conn):
    """DROP EXTENSION refuses while tables are latched (Postgres's own
    dependency error); with CASCADE, gapless tables get their sequence
    default back before their next_key default goes, so inserts go on; the
    pgkvx schema goes with the extension."""
    conn.execute("CREATE TABLE dx_events (id bigserial PRIMARY KEY, v text)")
    conn.execute("SELECT pgkvx.enable('dx_events', gapless => true)")
    conn.execute("INSERT INTO dx_events (v) VALUES ('before')")
    try:
        with pytest.raises(psycopg.errors.DependentObjectsStillExist):
            conn.execute("DROP EXTENSION pgkvx")
        conn.execute("DROP EXTENSION pgkvx CASCADE")
        conn.execute("INSERT INTO dx_events (v) VALUES ('after')")
        assert [i for (i,) in conn.execute("SELECT id FROM dx_events ORDER BY id")] == [1, 2]
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgkvx'").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'zz_pgkvx%'").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'pgkvx%'").fetchone() == (0,)
    finally:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgkvx")
        conn.execute("DROP TABLE dx_events")


def test_a_schema_named_pgkvx_made_beforehand_is_not_used(db):
    """Someone who creates a schema called pgkvx before the extension must
    not end up owning the schema its objects live in."""
    with connect(db) as c:
        c.execute("DROP EXTENSION pgkvx CASCADE")
        try:
            c.execute("CREATE SCHEMA pgkvx")
            with pytest.raises(psycopg.errors.DuplicateSchema):
                c.execute("CREATE EXTENSION pgkvx")
        finally:
            c.execute("DROP SCHEMA IF EXISTS pgkvx")
            c.execute("CREATE EXTENSION pgkvx")
