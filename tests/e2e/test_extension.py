"""The extension works when preloaded and refuses clearly when it is not."""
import os
import shutil

import psycopg
import pytest

from conftest import cluster, connect, conninfo


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


@pytest.fixture
def unpreloaded_cluster():
    port = str(int(os.environ.get("PGPORT", "55432")) + 17)
    env = dict(os.environ, PGKVX_PORT=port, PGKVX_PRELOAD="",
               PGKVX_CLUSTER=f"/tmp/pgkvx-cluster-nopreload-{port}")
    env.pop("PGHOST", None)
    env.pop("PGPORT", None)
    cluster("destroy", env=env)
    cluster("start", env=env)
    try:
        yield conninfo("postgres", host=f"{env['PGKVX_CLUSTER']}/sock", port=port)
    finally:
        cluster("destroy", env=env)


def test_create_extension_without_preload_is_refused(unpreloaded_cluster):
    with psycopg.connect(unpreloaded_cluster, autocommit=True) as c:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
            c.execute("CREATE EXTENSION pgkvx")
        assert "shared_preload_libraries" in str(e.value)


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
