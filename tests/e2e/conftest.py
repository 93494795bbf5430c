"""Shared fixtures for pgkvx's end-to-end tests.

Tests talk to the scratch cluster started by scripts/cluster (PGHOST/PGPORT
come from scripts/env.sh).  Each test module gets a database of its own with
the extension created, so modules cannot disturb each other.
"""
import os
import re
import subprocess
import uuid

import psycopg
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def conninfo(dbname="postgres", **kw):
    parts = {
        "host": os.environ.get("PGHOST", "/tmp"),
        "port": os.environ.get("PGPORT", "55432"),
        "user": os.environ.get("PGUSER", "postgres"),
        "dbname": dbname,
    }
    parts.update(kw)
    return " ".join(f"{k}={v}" for k, v in parts.items())


def connect(dbname, **kw):
    return psycopg.connect(conninfo(dbname), autocommit=kw.pop("autocommit", True), **kw)


def stats(c):
    """pgkvx.stats() as a dict: counter or gauge name -> value."""
    return dict(c.execute("SELECT stat, value FROM pgkvx.stats()").fetchall())


@pytest.fixture(scope="module")
def db(request):
    """A fresh database with pgkvx created; yields its name."""
    name = "e2e_" + re.sub(r"\W", "_", request.module.__name__.split(".")[-1])[:40]
    with connect("postgres") as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    with connect(name) as c:
        c.execute("CREATE EXTENSION pgkvx")
    yield name
    with connect("postgres") as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def conn(db):
    with connect(db) as c:
        yield c


@pytest.fixture
def table_name():
    return "t_" + uuid.uuid4().hex[:10]


def cluster(*args, check=True, env=None):
    """Runs scripts/cluster with the given arguments."""
    return subprocess.run([os.path.join(ROOT, "scripts", "cluster"), *args],
                          check=check, capture_output=True, text=True, env=env)
