"""Shared helpers of the benchmark tooling's self-check (bench/selfcheck).

The checks run the engines the way a user does (bench/run, bench/torture,
scripts/replica) against the scratch cluster whose libpq settings
scripts/env.sh exported, each for a second or two, and read what they wrote.
"""
import glob
import json
import os
import subprocess

import psycopg
import pytest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCH)
# A hang guard for each engine run, not a performance expectation.
ENGINE_TIMEOUT = 180


def connect(dbname="postgres", **kw):
    return psycopg.connect(dbname=dbname, autocommit=True, **kw)


def run(*cmd, expect_rc=0):
    """Runs a command of the tooling; fails showing its output when the exit
    status is not `expect_rc`."""
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=ENGINE_TIMEOUT)
    assert r.returncode == expect_rc, (
        f"{' '.join(map(str, cmd))}: exit {r.returncode}, expected {expect_rc}\n"
        f"--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}")
    return r


def report(out_dir, suffix):
    """The one report an engine wrote to `out_dir`: (json dict, markdown
    text, base path), checked for being well-formed."""
    found = glob.glob(os.path.join(out_dir, f"*{suffix}.json"))
    assert len(found) == 1, f"expected one *{suffix}.json in {out_dir}, found {os.listdir(out_dir)}"
    base = found[0][:-len(".json")]
    with open(base + ".json") as f:
        data = json.load(f)
    with open(base + ".md") as f:
        md = f.read()
    assert md.startswith("# pgkvx "), md[:200]
    assert_tables_well_formed(md)
    return data, md, base


def assert_tables_well_formed(md):
    """Every markdown table has a header, a separator row, and as many cells
    in each row as in its header."""
    tables, current = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    assert tables, "the report has no table"
    for t in tables:
        width = t[0].count("|")
        assert len(t) >= 3, f"table without rows: {t}"
        assert set(t[1].replace("|", "").replace(" ", "")) <= set("-:"), f"no separator row: {t[:2]}"
        bad = [row for row in t if row.count("|") != width]
        assert not bad, f"rows whose cell count differs from the header {t[0]!r}: {bad}"


@pytest.fixture(scope="session")
def db():
    """A database of the self-check's own, pgkvx created; yields its name."""
    name = "pgkvx_selfcheck"
    with connect() as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
    try:
        with connect(name) as c:
            c.execute("CREATE EXTENSION pgkvx")
        yield name
    finally:
        with connect() as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def pgkvx_version(db):
    with connect(db) as c:
        return c.execute("SELECT pgkvx.version()").fetchone()[0]
