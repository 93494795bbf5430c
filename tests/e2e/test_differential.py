"""Without concurrency, a latched table read in every scan mode returns what
an identical table that was never latched returns, for random queries of
every shape a tail takes (key ranges, category tails through a composite
index, joins, semi-joins, subquery filters, LATERAL, UNION ALL, windows);
those shapes are protected, and reads that are not LIMIT scans in key order
keep plain plans."""
import random

import pytest

from conftest import connect

# Each query is written once over {k} (the keyed table), {c} (the
# composite-key table), {cat} and {subs} (plain lookup tables), and run over
# the latched copies and the never-latched ones.
LATCHED = {"k": "dk", "c": "dc", "cat": "dcat", "subs": "dsubs"}
PLAIN = {"k": "pk", "c": "pc", "cat": "dcat", "subs": "dsubs"}


@pytest.fixture(scope="module")
def tables(db):
    with connect(db) as c:
        for k, cc in (("dk", "dc"), ("pk", "pc")):
            c.execute(f"DROP TABLE IF EXISTS {k}, {cc}")
            c.execute(f"CREATE TABLE {k} (k bigint PRIMARY KEY, v int NOT NULL, t text)")
            c.execute(f"CREATE INDEX ON {k} (v, k)")
            c.execute(f"INSERT INTO {k} SELECT g * 3, g % 11, md5(g::text) FROM generate_series(-300, 300) g")
            c.execute(f"CREATE TABLE {cc} (a int, b text COLLATE \"C\", c int, v int, PRIMARY KEY (a, b, c))")
            c.execute(f"INSERT INTO {cc} SELECT g % 7, chr(97 + g % 5), g, g % 13 FROM generate_series(0, 400) g")
        c.execute("DROP TABLE IF EXISTS dcat, dsubs")
        c.execute("CREATE TABLE dcat (v int PRIMARY KEY, label text, paid bool)")
        c.execute("INSERT INTO dcat SELECT g, 'cat' || g, g % 3 <> 0 FROM generate_series(0, 10) g")
        c.execute("CREATE TABLE dsubs (who int, v int)")
        c.execute("INSERT INTO dsubs SELECT g % 4, g FROM generate_series(0, 10) g WHERE g % 2 = 0")
        c.execute("SELECT pgkvx.enable('dk'), pgkvx.enable('dc')")
        c.execute("ANALYZE dk, dc, pk, pc, dcat, dsubs")
    return LATCHED


def key_conds(r):
    conds = []
    for _ in range(r.randint(0, 2)):
        op = r.choice([">", ">=", "<", "<=", "=", "BETWEEN"])
        x = r.randint(-1000, 1000)
        conds.append(f"k BETWEEN {x} AND {x + r.randint(0, 300)}" if op == "BETWEEN" else f"k {op} {x}")
    return conds


def tail(r):
    """A LIMIT query over {k} in key order, filtered in one of many ways."""
    conds = key_conds(r)
    shape = r.choice(["plain", "category", "filter", "semi", "exists", "subquery", "join", "lateral"])
    sel = r.choice(["*", "k", "k, v * 2 AS w", "t, k"])
    frm = "{k}"
    if shape == "category":
        conds.append(f"v = {r.randint(0, 10)}")
    elif shape == "filter":
        conds.append(f"v {r.choice(['=', '<>', '<'])} {r.randint(0, 10)}")
    elif shape == "semi":
        conds.append(f"v IN (SELECT v FROM {{subs}} WHERE who = {r.randint(0, 3)})")
    elif shape == "exists":
        conds.append(f"{r.choice(['', 'NOT '])}EXISTS (SELECT 1 FROM {{subs}} s WHERE s.v = {{k}}.v)")
    elif shape == "subquery":
        conds.append("(SELECT paid FROM {cat} c WHERE c.v = {k}.v)")
    elif shape == "join":
        frm = "{k} JOIN {cat} USING (v)"
        sel = r.choice(["k, label", "*"])
    else:
        frm = "{k} CROSS JOIN LATERAL (SELECT label FROM {cat} c WHERE c.v = {k}.v) l"
        sel = "k, label"
    where = ("WHERE " + " AND ".join(conds)) if conds else ""
    order = r.choice(["k", "k DESC"])
    q = f"SELECT {sel} FROM {frm} {where} ORDER BY {order} LIMIT {r.randint(0, 40)}"
    if r.random() < 0.3:
        q += f" OFFSET {r.randint(0, 20)}"
    return q


def random_query(r):
    x = r.random()
    if x < 0.55:
        q = tail(r)
        if r.random() < 0.15:
            q = f"SELECT count(*), sum(length(x::text)) FROM ({q}) x"
        return q
    if x < 0.65:
        a, b = r.randint(-1000, 0), r.randint(0, 1000)
        return (f"(SELECT k FROM {{k}} WHERE k < {a}) UNION ALL (SELECT k FROM {{k}} WHERE k > {b}) "
                f"ORDER BY k LIMIT {r.randint(1, 30)}")
    if x < 0.72:
        return (f"SELECT k, row_number() OVER (ORDER BY k) FROM {{k}} WHERE k > {r.randint(-1000, 1000)} "
                f"ORDER BY k LIMIT {r.randint(1, 30)}")
    if x < 0.78:
        return (f"WITH t AS (SELECT * FROM {{k}} WHERE v = {r.randint(0, 10)} ORDER BY k LIMIT {r.randint(1, 30)}) "
                "SELECT k, label FROM t JOIN {cat} USING (v) ORDER BY k")
    conds = [f"a = {r.randint(0, 7)}"]
    if r.random() < 0.6:
        conds.append(f"b {r.choice(['>', '>=', '<', '=', '<='])} '{chr(97 + r.randint(0, 5))}'")
    if r.random() < 0.3:
        conds.append(f"v < {r.randint(0, 12)}")
    d = r.choice(["", " DESC"])
    return f"SELECT * FROM {{c}} WHERE {' AND '.join(conds)} ORDER BY a{d}, b{d}, c{d} LIMIT {r.randint(1, 30)}"


def results(conn, mode, q):
    conn.execute(f"SET pgkvx.scan_mode = {mode}")
    return conn.execute(q).fetchall()


def plan_of(conn, q):
    """EXPLAIN of `q` as planned under the default optimistic mode."""
    conn.execute("SET pgkvx.scan_mode = optimistic")
    return "\n".join(x for (x,) in conn.execute("EXPLAIN (COSTS OFF) " + q))


def test_modes_agree_with_a_table_never_latched(conn, tables):
    r = random.Random(20261122)
    used = 0
    for _ in range(400):
        q = random_query(r)
        base = results(conn, "optimistic", q.format(**PLAIN))
        latched = q.format(**LATCHED)
        for mode in ("off", "optimistic", "fenced"):
            assert results(conn, mode, latched) == base, (mode, latched)
        plan = plan_of(conn, latched)
        used += "PgkvxLimitScan" in plan
    assert used > 300, f"only {used} of 400 generated queries were protected"


@pytest.mark.parametrize("q", [
    "SELECT * FROM dk WHERE v = 3 AND k > 10 ORDER BY k LIMIT 5",
    "SELECT * FROM dk ORDER BY k LIMIT 5 FOR SHARE",
    "SELECT a.k FROM dk a JOIN dk b ON a.k = b.k ORDER BY a.k LIMIT 5",
    "SELECT k, generate_series(1, 2) FROM dk ORDER BY k LIMIT 5",
    "SELECT k FROM dk WHERE v IN (SELECT v FROM dsubs WHERE who = 1) ORDER BY k LIMIT 5",
    "SELECT k FROM dk WHERE (SELECT paid FROM dcat c WHERE c.v = dk.v) ORDER BY k LIMIT 5",
    # In key order without a LIMIT: a cursor fetched in batches is a tail.
    "SELECT * FROM dk ORDER BY k",
    "SELECT * FROM (SELECT * FROM dk WHERE k > 10 ORDER BY k LIMIT 5) t ORDER BY v",
])
def test_tail_shapes_are_protected(conn, tables, q):
    plan = plan_of(conn, q)
    assert "PgkvxLimitScan" in plan, plan


@pytest.mark.parametrize("q", [
    "SELECT * FROM dk WHERE k > 10 LIMIT 5",
    "SELECT * FROM dk ORDER BY v LIMIT 5",
    "SELECT * FROM dk WHERE k > 10",
    "SELECT v, count(*) FROM dk GROUP BY v ORDER BY v LIMIT 3",
    "SELECT DISTINCT v FROM dk ORDER BY v LIMIT 3",
])
def test_reads_that_are_not_tails_stay_plain(conn, tables, q):
    plan = plan_of(conn, q)
    assert "PgkvxLimitScan" not in plan, plan
