"""EXPLAIN of a latched tail explains what plain PostgreSQL explains.

EXPLAIN (GENERIC_PLAN) (PostgreSQL 16 on) plans a statement with `$n`
parameters and runs none of it, with no parameter values at all: the
declared span of such a bound cannot be computed, and must say so rather
than fail where the same EXPLAIN of an unlatched table succeeds.
"""
import pytest

from conftest import connect_in_mode

QUERIES = [
    "SELECT * FROM {t} WHERE id > $1 ORDER BY id LIMIT 10",
    "SELECT * FROM {t} WHERE id = ANY($1::bigint[]) ORDER BY id LIMIT 10",
    "SELECT * FROM {t} WHERE id > $1 AND id <= $2 ORDER BY id DESC LIMIT 10",
    "SELECT * FROM {t} WHERE id > 5 ORDER BY id LIMIT $1",
]


@pytest.fixture(scope="module")
def tables(db):
    with connect_in_mode(db, "off") as c:
        for t in ("gp_latched", "gp_plain"):
            c.execute(f"CREATE TABLE {t} (id bigserial PRIMARY KEY, v text NOT NULL)")
            c.execute(f"INSERT INTO {t} (v) SELECT 'v' || g FROM generate_series(1, 100) g")
        c.execute("SELECT pgkvx.enable('gp_latched', gapless => true)")
    return db


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
@pytest.mark.parametrize("query", QUERIES)
def test_generic_plan_of_parameterised_bounds(tables, mode, query):
    with connect_in_mode(tables, mode) as c:
        if c.info.server_version < 160000:
            pytest.skip("EXPLAIN (GENERIC_PLAN) is PostgreSQL 16's")
        plain = [r[0] for r in c.execute("EXPLAIN (GENERIC_PLAN, COSTS OFF) " + query.format(t="gp_plain"))]
        latched = [r[0] for r in c.execute("EXPLAIN (GENERIC_PLAN, COSTS OFF) " + query.format(t="gp_latched"))]
    assert any("Index Scan" in line for line in plain)
    assert any("PgkvxLimitScan" in line for line in latched), latched
    span = [line.strip() for line in latched if "Declared Span" in line]
    if "$1" in query.split("LIMIT")[0]:
        assert span == ["Declared Span: computed when the statement runs"], latched
    else:
        assert span and "computed" not in span[0], latched
