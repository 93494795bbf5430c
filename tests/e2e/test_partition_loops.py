"""A tail on a table partitioned by time runs under one guard over the
MergeAppend of its partitions (src/scan/tree.rs); every way a client reads
it gets exactly the rows a plain read returns.

Keys interleave across the partitions (row i goes to a pseudo-random
month), so every batch takes rows from several partitions, and the guard
follows the last row it handed up through each loop: one statement, a
cursor fetched in batches and past its end, a PL/pgSQL FOR loop, a WITH
HOLD cursor, prepared statements with custom and generic plans -- in both
protected modes, ascending and descending, compared row for row with
`pgkvx.scan_mode = off`.
"""
import psycopg
import pytest

from conftest import connect, connect_in_mode as session

ROWS = 400
LIMITS = [1, 9, 10, 11, 50, 51, 100, 1000]
MODES = ["optimistic", "fenced"]
ORDERS = ["ASC", "DESC"]

SETUP = [
    """CREATE TABLE tl (id bigserial, created_at timestamptz NOT NULL, v text NOT NULL,
                       PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)""",
    "CREATE TABLE tl_1 PARTITION OF tl FOR VALUES FROM ('2024-01-01') TO ('2024-02-01')",
    "CREATE TABLE tl_2 PARTITION OF tl FOR VALUES FROM ('2024-02-01') TO ('2024-03-01')",
    "CREATE TABLE tl_3 PARTITION OF tl FOR VALUES FROM ('2024-03-01') TO ('2024-04-01')",
    "SELECT pgkvx.enable('tl', gapless => true)",
    f"""INSERT INTO tl (created_at, v)
        SELECT '2024-01-01'::timestamptz + ((g * 37) % 3) * interval '1 month' + g * interval '1 second', 'v' || g
          FROM generate_series(1, {ROWS}) g""",
    """CREATE FUNCTION tl_for_asc(after bigint, n bigint) RETURNS bigint[] LANGUAGE plpgsql AS $$
        DECLARE r record; acc bigint[] := '{}';
        BEGIN
            FOR r IN SELECT id FROM tl WHERE id > after ORDER BY id LIMIT n LOOP
                acc := acc || r.id;
            END LOOP;
            RETURN acc;
        END $$""",
    """CREATE FUNCTION tl_for_desc(after bigint, n bigint) RETURNS bigint[] LANGUAGE plpgsql AS $$
        DECLARE r record; acc bigint[] := '{}';
        BEGIN
            FOR r IN SELECT id FROM tl WHERE id < after ORDER BY id DESC LIMIT n LOOP
                acc := acc || r.id;
            END LOOP;
            RETURN acc;
        END $$""",
]


def tail(order, after, limit):
    cmp = ">" if order == "ASC" else "<"
    return f"SELECT id FROM tl WHERE id {cmp} {int(after)} ORDER BY id {order} LIMIT {int(limit)}"


def after_for(order):
    return 100 if order == "ASC" else ROWS - 100


@pytest.fixture(scope="module")
def tl(db):
    with connect(db) as c:
        for stmt in SETUP:
            c.execute(stmt)
        plan = "\n".join(r for (r,) in c.execute("EXPLAIN (COSTS OFF) " + tail("ASC", 1, 10)))
    # One guard, over the MergeAppend: what these loops are here to exercise.
    assert plan.count("PgkvxLimitScan") == 1, plan
    assert plan.index("PgkvxLimitScan") < plan.index("Merge Append"), plan
    return db


@pytest.fixture(scope="module")
def plain(tl):
    with connect(tl) as c:
        c.execute("SET pgkvx.scan_mode = off")
        return {(o, n): [i for (i,) in c.execute(tail(o, after_for(o), n))] for o in ORDERS for n in LIMITS}


def one_statement(db, mode, order, n):
    with session(db, mode) as c:
        return [i for (i,) in c.execute(tail(order, after_for(order), n))]


def declare_fetch(db, mode, order, n):
    with session(db, mode) as c:
        ids = []
        with c.transaction():
            c.execute(f"DECLARE tc NO SCROLL CURSOR FOR {tail(order, after_for(order), n)}")
            while rows := c.execute("FETCH 7 FROM tc").fetchall():
                ids += [i for (i,) in rows]
            assert c.execute("FETCH 7 FROM tc").fetchall() == []
            c.execute("CLOSE tc")
        return ids


def holdable(db, mode, order, n):
    with session(db, mode) as c:
        ids = []
        with c.transaction():
            c.execute(f"DECLARE hc NO SCROLL CURSOR WITH HOLD FOR {tail(order, after_for(order), n)}")
            ids += [i for (i,) in c.execute(f"FETCH {max(1, n // 2)} FROM hc").fetchall()]
        while rows := c.execute("FETCH 10 FROM hc").fetchall():
            ids += [i for (i,) in rows]
        c.execute("CLOSE hc")
        return ids


def prepared(plan_mode):
    def run(db, mode, order, n):
        with session(db, mode) as c:
            c.execute(f"SET plan_cache_mode = {plan_mode}")
            cmp = ">" if order == "ASC" else "<"
            c.execute(f"PREPARE q(bigint, bigint) AS SELECT id FROM tl WHERE id {cmp} $1 ORDER BY id {order} LIMIT $2")
            runs = [[i for (i,) in c.execute(f"EXECUTE q({after_for(order)}, {n})")] for _ in range(3)]
            assert all(r == runs[0] for r in runs), runs
            return runs[0]
    return run


def plpgsql_for(db, mode, order, n):
    with session(db, mode) as c:
        return list(c.execute(f"SELECT tl_for_{order.lower()}(%s, %s)", (after_for(order), n)).fetchone()[0])


LOOPS = {
    "statement": one_statement,
    "declare_fetch": declare_fetch,
    "holdable": holdable,
    "prepared_custom": prepared("force_custom_plan"),
    "prepared_generic": prepared("force_generic_plan"),
    "plpgsql_for": plpgsql_for,
}


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(LOOPS))
def test_partitioned_tail_loop_matches_plain(tl, plain, kind, mode, order, limit):
    expected = plain[(order, limit)]
    assert expected, "the plain read returns rows"
    assert LOOPS[kind](tl, mode, order, limit) == expected


def test_touched_span_ends_at_last_row(tl):
    """EXPLAIN ANALYZE of the one guard: it touched from the cursor to the
    last row returned, though every partition's scan ran."""
    with session(tl, "optimistic") as c:
        rows = [i for (i,) in c.execute(tail("ASC", 100, 10))]
        plan = "\n".join(r for (r,) in c.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + tail("ASC", 100, 10)))
    assert f"Touched Span: [101, {rows[-1]}]" in plan, plan


def test_writer_in_flight_past_the_batch_does_not_hold_it(tl):
    """A writer in flight in another partition, past the rows a read
    returns (also past the last row of the stream), does not make it wait;
    one inside them does (the read returns its row once it commits)."""
    with connect(tl) as w, session(tl, "optimistic") as r:
        w.execute("BEGIN")
        (drawn,) = w.execute("INSERT INTO tl (created_at, v) VALUES ('2024-03-15', 'late') RETURNING id").fetchone()
        r.execute("SET statement_timeout = '5s'")
        # Stops before the writer's key: returns at once.
        assert [i for (i,) in r.execute(tail("ASC", drawn - 20, 5))] == list(range(drawn - 19, drawn - 14))
        # Runs out at the head, before the writer's key: returns at once too.
        assert [i for (i,) in r.execute(tail("ASC", drawn - 20, 100))] == list(range(drawn - 19, drawn))
        # A row committed past the writer: the read returns it, so it must
        # wait for the writer -- here it times out.
        with connect(tl) as a:
            a.execute("INSERT INTO tl (created_at, v) VALUES ('2024-03-16', 'after')")
        with pytest.raises(psycopg.errors.QueryCanceled):
            r.execute("SET statement_timeout = '300ms'")
            r.execute(tail("ASC", drawn - 20, 100))
        r.execute("SET statement_timeout = 0")
        w.execute("COMMIT")
        assert [i for (i,) in r.execute(tail("ASC", drawn - 20, 100))] == list(range(drawn - 19, drawn + 2))


@pytest.mark.parametrize("mode", MODES)
def test_projected_tail_matches_plain(tl, mode):
    """Partitions that compute the query's expressions (a Result over each
    scan) are read under the one guard too, row for row as plain."""
    sql = "SELECT id, upper(v) || id FROM tl WHERE id > 100 ORDER BY id LIMIT 50"
    with session(tl, "off") as c:
        expected = c.execute(sql).fetchall()
    with session(tl, mode) as c:
        plan = "\n".join(r for (r,) in c.execute("EXPLAIN (COSTS OFF, VERBOSE) " + sql))
        got = c.execute(sql).fetchall()
        with c.transaction():
            c.execute(f"DECLARE pc NO SCROLL CURSOR FOR {sql}")
            fetched = []
            while rows := c.execute("FETCH 7 FROM pc").fetchall():
                fetched += rows
    assert plan.count("PgkvxLimitScan") == 1 and "Result" in plan, plan
    assert got == expected and fetched == expected
