"""The extension works when preloaded and refuses clearly when it is not."""
import os
import shutil

import psycopg
import pytest

from conftest import cluster, conninfo


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
