"""Shared fixtures for pgkvx's end-to-end tests.

Tests talk to the scratch cluster started by scripts/cluster (PGHOST/PGPORT
come from scripts/env.sh).  Each test module gets a database of its own with
the extension created, so modules cannot disturb each other.
"""
import contextlib
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


def connect_in_mode(dbname, mode, **kw):
    """A connection whose reads run in `pgkvx.scan_mode = mode` (committed,
    so that it holds for every transaction of the session)."""
    c = connect(dbname, **kw)
    c.execute(f"SET pgkvx.scan_mode = {mode}")
    if not c.autocommit:
        c.commit()
    return c


def stats(c):
    """pgkvx.stats() as a dict: counter or gauge name -> value."""
    return dict(c.execute("SELECT stat, value FROM pgkvx.stats()").fetchall())


@contextlib.contextmanager
def scratch_database(name):
    """A new, empty database (no extension in it), dropped afterwards."""
    with connect("postgres") as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with connect("postgres") as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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


PG_BINDIR = subprocess.run([os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config"), "--bindir"],
                           capture_output=True, text=True, check=True).stdout.strip()
PORT = int(os.environ.get("PGPORT", "55432"))
SCRATCH = os.environ.get("PGKVX_CLUSTER", f"/tmp/pgkvx-cluster-{PORT}")


def as_postgres(*cmd, check=True, timeout=120):
    """Runs a command as the postgres OS user (the server refuses root)."""
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run(prefix + [str(c) for c in cmd], check=check, capture_output=True, text=True,
                          timeout=timeout)


def free_port(start):
    """The first port from `start` up that nothing listens on (TCP on
    loopback, or a socket in /tmp): tests never assume a port is free."""
    import socket
    p = start
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", p))
                if not os.path.exists(f"/tmp/.s.PGSQL.{p}"):
                    return p
            except OSError:
                pass
        p += 1


def wait_until(fn, what, timeout=60.0, step=0.1):
    """Polls `fn` until it is true; fails with `what` after `timeout` seconds
    (a hang guard, not a performance expectation)."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


STANDBY_DIR = f"{SCRATCH}-standby"


def restart_standby():
    """Restarts the `standby` fixture's server (fast shutdown): its replay
    starts over from its last restartpoint, with an empty latch table."""
    data = f"{STANDBY_DIR}/data"
    as_postgres(f"{PG_BINDIR}/pg_ctl", "-D", data, "-l", f"{STANDBY_DIR}/server.log", "-w", "-t", "60",
                "-m", "fast", "restart")


@pytest.fixture(scope="module")
def standby():
    """A hot standby of the scratch cluster, streaming, pgkvx preloaded as on
    the primary: yields its connection keywords."""
    import shutil
    d = STANDBY_DIR
    port = free_port(PORT + 3)
    data = f"{d}/data"

    def stop():
        if os.path.exists(f"{data}/postmaster.pid"):
            as_postgres(f"{PG_BINDIR}/pg_ctl", "-D", data, "stop", "-m", "immediate", check=False)
        shutil.rmtree(d, ignore_errors=True)

    stop()
    os.makedirs(f"{d}/sock")
    shutil.chown(d, "postgres")
    shutil.chown(f"{d}/sock", "postgres")
    as_postgres(f"{PG_BINDIR}/pg_basebackup", "-h", "127.0.0.1", "-p", PORT, "-D", data, "-X", "stream",
                "-c", "fast", "-R")
    with open(f"{data}/postgresql.conf", "a") as f:
        f.write(f"\nport = {port}\nunix_socket_directories = '{d}/sock'\nhot_standby = on\n")
    as_postgres(f"{PG_BINDIR}/pg_ctl", "-D", data, "-l", f"{d}/server.log", "-w", "-t", "60", "start")
    try:
        yield {"host": f"{d}/sock", "port": port}
    finally:
        stop()


def replayed(p, s):
    """Waits until the standby has replayed everything the primary wrote
    so far.  The insert position: with synchronous_commit off (the scratch
    cluster) the write position can still be before these commits."""
    (lsn,) = p.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
    p.execute("SELECT pg_switch_wal()")  # pushes it out now
    wait_until(lambda: s.execute("SELECT pg_last_wal_replay_lsn() >= %s", (lsn,)).fetchone()[0],
               "the standby to replay")


def events_table(p, t):
    """A gapless latched table `t` with keys 1..5 (made afresh)."""
    p.execute(f"DROP TABLE IF EXISTS {t}")
    p.execute(f"CREATE TABLE {t} (id bigserial PRIMARY KEY, payload text)")
    p.execute(f"SELECT pgkvx.enable('{t}', gapless => true)")
    p.execute(f"INSERT INTO {t} (payload) SELECT 'x' FROM generate_series(1, 5)")


def writer_behind_a_commit(p, db, t):
    """Makes `t` an events table, then leaves a writer with key 6 open
    behind a committed key 7: returns the open writer's connection."""
    events_table(p, t)
    w6 = connect(db, autocommit=False)
    w6.execute(f"INSERT INTO {t} (payload) VALUES ('late')")
    with connect(db) as w7:
        w7.execute(f"INSERT INTO {t} (payload) VALUES ('early')")
    return w6


def side_cluster(name, port, preload, **env):
    """A scratch cluster of the same private PostgreSQL tree beside the
    main one (scripts/cluster with another port and directory): returns
    (run scripts/cluster with its environment, its connection keywords)."""
    tree = os.environ.get("PGKVX_TREE", f"/var/tmp/pgkvx-pg15-{PORT}")
    cenv = dict(os.environ, PGKVX_PORT=str(port), PGKVX_CLUSTER=f"{SCRATCH}-{name}", PGKVX_PRELOAD=preload,
                PGKVX_TREE=tree, **env)
    cenv.setdefault("PG_CONFIG", f"{tree}/usr/lib/postgresql/15/bin/pg_config")
    return (lambda *args, check=True: cluster(*args, check=check, env=cenv),
            {"host": f"{SCRATCH}-{name}/sock", "port": port, "data": f"{SCRATCH}-{name}/data",
             "log": f"{SCRATCH}-{name}/server.log"})


@pytest.fixture(scope="module")
def plain_cluster():
    """The same PostgreSQL without pgkvx preloaded, on another port: what
    plain PostgreSQL does, for parity tests.  Yields its connection
    keywords (host, port); stopped and removed afterwards."""
    run, where = side_cluster("plain", free_port(PORT + 5), "")
    run("destroy", check=False)
    run("start")
    try:
        yield {"host": where["host"], "port": where["port"]}
    finally:
        run("destroy", check=False)
