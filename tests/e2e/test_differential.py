"""Without concurrency, optimistic, fenced and off return identical results
for random queries of every covered shape, and queries outside those shapes
keep plain Postgres plans."""
import random

import pytest


@pytest.fixture(scope="module")
def tables(db):
    from conftest import connect
    with connect(db) as c:
        c.execute("DROP TABLE IF EXISTS dk, dc")
        c.execute("CREATE TABLE dk (k bigint PRIMARY KEY, v int NOT NULL, t text)")
        c.execute("INSERT INTO dk SELECT g * 3, g % 11, md5(g::text) FROM generate_series(-300, 300) g")
        c.execute("CREATE TABLE dc (a int, b text COLLATE \"C\", c int, v int, PRIMARY KEY (a, b, c))")
        c.execute("INSERT INTO dc SELECT g % 7, chr(97 + g % 5), g, g % 13 FROM generate_series(0, 400) g")
        c.execute("SELECT pgkvx.enable('dk'), pgkvx.enable('dc')")
        c.execute("ANALYZE dk, dc")
    return ("dk", "dc")


def random_query(r):
    if r.random() < 0.6:
        conds = []
        for _ in range(r.randint(0, 2)):
            op = r.choice([">", ">=", "<", "<=", "=", "BETWEEN"])
            x = r.randint(-1000, 1000)
            conds.append(f"k BETWEEN {x} AND {x + r.randint(0, 300)}" if op == "BETWEEN" else f"k {op} {x}")
        if r.random() < 0.4:
            conds.append(f"v {r.choice(['=', '<>', '<'])} {r.randint(0, 10)}")
        where = ("WHERE " + " AND ".join(conds)) if conds else ""
        order = r.choice(["k", "k DESC"])
        sel = r.choice(["*", "k", "k, v * 2 AS w", "t, k"])
        q = f"SELECT {sel} FROM dk {where} ORDER BY {order} LIMIT {r.randint(0, 40)}"
        if r.random() < 0.3:
            q += f" OFFSET {r.randint(0, 20)}"
        if r.random() < 0.2:
            q = f"SELECT count(*), sum(length(x::text)) FROM ({q}) x"
        return q
    conds = [f"a = {r.randint(0, 7)}"]
    if r.random() < 0.6:
        conds.append(f"b {r.choice(['>', '>=', '<', '=', '<='])} '{chr(97 + r.randint(0, 5))}'")
    if r.random() < 0.3:
        conds.append(f"v < {r.randint(0, 12)}")
    d = r.choice(["", " DESC"])
    return f"SELECT * FROM dc WHERE {' AND '.join(conds)} ORDER BY a{d}, b{d}, c{d} LIMIT {r.randint(1, 30)}"


def results(conn, mode, q):
    conn.execute(f"SET pgkvx.scan_mode = {mode}")
    return conn.execute(q).fetchall()


def test_modes_agree_on_random_queries(conn, tables):
    r = random.Random(20261122)
    used = 0
    for _ in range(300):
        q = random_query(r)
        base = results(conn, "off", q)
        assert results(conn, "optimistic", q) == base, q
        assert results(conn, "fenced", q) == base, q
        plan = "\n".join(x for (x,) in conn.execute("EXPLAIN (COSTS OFF) " + q))
        used += "PgkvxLimitScan" in plan
    assert used > 200, "most generated queries should use the custom scan"


@pytest.mark.parametrize("q", [
    "SELECT * FROM dk WHERE k > 10 LIMIT 5",
    "SELECT * FROM dk ORDER BY v LIMIT 5",
    "SELECT * FROM dk ORDER BY k",
    "SELECT v, count(*) FROM dk GROUP BY v ORDER BY v LIMIT 3",
    "SELECT DISTINCT v FROM dk ORDER BY v LIMIT 3",
    "SELECT * FROM dk ORDER BY k LIMIT 5 FOR SHARE",
    "SELECT a.k FROM dk a JOIN dk b ON a.k = b.k ORDER BY a.k LIMIT 5",
    "SELECT k, generate_series(1, 2) FROM dk ORDER BY k LIMIT 5",
])
def test_other_shapes_stay_plain(conn, tables, q):
    conn.execute("SET pgkvx.scan_mode = optimistic")
    plan = "\n".join(x for (x,) in conn.execute("EXPLAIN (COSTS OFF) " + q))
    assert "PgkvxLimitScan" not in plan, plan
