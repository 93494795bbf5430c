"""Executions whose read protocol is done before their executor starts
(fenced, optimistic with clean declared spans, off) run their plan with the
guard node spliced out (src/scan/unguarded.rs); the rest keep it.  An
optimistic read checks its declared spans first (read/run.rs), so the
reads here that must run optimistic have a writer in flight in them.

What ran is read from auto_explain's log of each executed plan (without
ANALYZE, so nothing is instrumented); what it returned is compared with
`pgkvx.scan_mode = off` -- column names and junk columns included, since
the spliced plan's top node must still label the result.
"""
import contextlib
import shutil
import threading

import pytest

from conftest import PORT, connect, connect_in_mode, free_port, side_cluster, wait_until

SETUP = [
    """CREATE TABLE ev (id bigserial, created_at timestamptz NOT NULL, v text NOT NULL,
                       PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)""",
    "CREATE TABLE ev_1 PARTITION OF ev FOR VALUES FROM ('2024-01-01') TO ('2024-02-01')",
    "CREATE TABLE ev_2 PARTITION OF ev FOR VALUES FROM ('2024-02-01') TO ('2024-03-01')",
    "SELECT pgkvx.enable('ev', gapless => true)",
    """INSERT INTO ev (created_at, v)
        SELECT '2024-01-01'::timestamptz + (g % 2) * interval '1 month' + g * interval '1 second', 'v' || g
          FROM generate_series(1, 200) g""",
    "CREATE TABLE kv (id bigserial PRIMARY KEY, v text NOT NULL, w int NOT NULL DEFAULT 0)",
    "SELECT pgkvx.enable('kv', gapless => true)",
    "INSERT INTO kv (v) SELECT 'k' || g FROM generate_series(1, 200) g",
    "ANALYZE ev, kv",
]

TAILS = {
    "partitioned": "SELECT id, v FROM ev WHERE id > 50 ORDER BY id LIMIT 70",
    "plain": "SELECT id, v FROM kv WHERE id > 50 ORDER BY id LIMIT 70",
    # A projection and a junk sort column: the top node's labels must stay.
    "junk": "SELECT v AS label FROM ev WHERE id > 50 ORDER BY id LIMIT 70",
    "distinct": "SELECT DISTINCT ON (id) id, v FROM kv WHERE id > 50 ORDER BY id LIMIT 70",
    # An aggregate over a batch, as the kv workloads read.
    "aggregate": "SELECT count(v), max(id) FROM (SELECT id, v FROM kv WHERE id > 50 ORDER BY id LIMIT 70) t",
}


def session(db, mode):
    """A connection in `mode` whose plans use the tables' indexes, as tails
    on tables of any size do (these are small)."""
    c = connect_in_mode(db, mode)
    c.execute("SET enable_seqscan = off")
    c.execute("SET enable_sort = off")
    return c


@pytest.fixture(scope="module")
def ready(db):
    with connect(db) as c:
        for s in SETUP:
            c.execute(s)
    return db


def log_plans(c, load=True):
    """Has auto_explain log every plan `c` executes to `c` itself; returns
    the list the logged plans are appended to."""
    plans = []
    if load:
        c.execute("LOAD 'auto_explain'")
    c.execute("SET auto_explain.log_min_duration = 0")
    c.execute("SET auto_explain.log_nested_statements = on")
    c.execute("SET client_min_messages = log")
    c.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    return plans


def logged(db, mode, sql, params=None, prepare=False):
    """Runs `sql` in `mode` with auto_explain logging every executed plan;
    returns (column names, rows, the plans logged)."""
    with session(db, mode) as c:
        plans = log_plans(c)
        cur = c.execute(sql, params, prepare=prepare)
        rows = cur.fetchall()
        names = [d.name for d in cur.description]
    return names, rows, [p for p in plans if "Query Text" in p or "Limit" in p or "Scan" in p]


def plain(db, sql):
    with session(db, "off") as c:
        c.execute("LOAD 'auto_explain'")
        cur = c.execute(sql)
        return [d.name for d in cur.description], cur.fetchall()


@pytest.mark.parametrize("shape", sorted(TAILS))
@pytest.mark.parametrize("mode", ["optimistic", "fenced", "off"])
def test_reads_done_at_start_run_without_the_node(ready, mode, shape):
    sql = TAILS[shape]
    names, rows, plans = logged(ready, mode, sql)
    assert (names, rows) == plain(ready, sql)
    assert rows == [(70, 120)] if shape == "aggregate" else len(rows) == 70
    assert plans, "auto_explain logged no plan"
    # An optimistic aggregate returns one row, whatever its batch: it is
    # cheaper held back than checked first (read/run.rs), so it keeps its
    # node to validate with -- out of the row path (scan/bypass.rs), so the
    # plan the executor ran shows none either.
    assert not any("PgkvxLimitScan" in p for p in plans), plans
    assert any("Limit" in p for p in plans), plans


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_explain_analyze_still_shows_the_node(ready, mode):
    with session(ready, mode) as c:
        plan = "\n".join(r for (r,) in c.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + TAILS["partitioned"]))
    assert "PgkvxLimitScan" in plan, plan
    assert "Mode:" in plan, plan


@contextlib.contextmanager
def writer_past_rows(db):
    """A transaction in flight with a kv row past the reads' rows, inside
    their declared spans: they run optimistic, and neither wait nor change."""
    writer = connect(db, autocommit=False)
    try:
        writer.execute("INSERT INTO kv (v) VALUES ('late')")
        yield
    finally:
        writer.rollback()
        writer.close()


SMALL = "SELECT id, v FROM kv WHERE id > 50 ORDER BY id LIMIT 7"
FILTERED = "SELECT id, v FROM kv WHERE id > 50 AND v <> 'none' ORDER BY id LIMIT 7"


def test_a_small_optimistic_read_keeps_the_node_out_of_its_row_path(ready):
    # It validates the span its guard touched after a buffered first run,
    # read from the index scan once it is over: its rows go past the node
    # (scan/bypass.rs), so the plan the executor ran shows none.
    with writer_past_rows(ready):
        names, rows, plans = logged(ready, "optimistic", SMALL)
    assert (names, rows) == plain(ready, SMALL)
    assert plans and not any("PgkvxLimitScan" in p for p in plans), plans


def test_a_filtered_optimistic_read_keeps_the_node_in_its_row_path(ready):
    # Its last row is the last one its filter passed, which only the node
    # sees go by.
    with writer_past_rows(ready):
        names, rows, plans = logged(ready, "optimistic", FILTERED)
    assert (names, rows) == plain(ready, FILTERED)
    assert any("PgkvxLimitScan" in p for p in plans), plans


def validations(c):
    return c.execute("SELECT value FROM pgkvx.stats() WHERE stat = 'validations'").fetchone()[0]


def test_small_optimistic_reads_check_their_declared_spans_while_they_are_clean(ready):
    """A small optimistic read checks its declared span first and, clean,
    streams spliced, like a fenced read that met nobody (one validation).
    Beside a writer always in flight there, the check is wasted: the
    backend then skips it for more and more reads (one validation each,
    T's), and checks every read again once one comes out clean.  The
    filtered read keeps its node when it runs optimistic, so the plans
    show which way each read ran."""
    def run(c, plans):
        before, n = validations(c), len(plans)
        rows = c.execute(FILTERED).fetchall()
        assert rows == expected
        node = any("PgkvxLimitScan" in p for p in plans[n:])
        return validations(c) - before, node
    expected = plain(ready, FILTERED)[1]
    with session(ready, "optimistic") as c:
        plans = log_plans(c)
        # Clean: streamed, its node spliced out, one validation.
        assert [run(c, plans) for _ in range(3)] == [(1, False)] * 3
        with writer_past_rows(ready):
            beside = [run(c, plans) for _ in range(40)]
        assert all(node for _, node in beside), beside
        checked = sum(v == 2 for v, _ in beside)   # D checked, then T validated
        assert sum(v == 1 for v, _ in beside) + checked == len(beside), beside
        assert beside[0] == (2, True), beside
        # Skipped more and more often: checks far fewer than reads.
        assert 2 <= checked <= 8, beside
        # Clean again: within the longest skip (63) a check comes out clean,
        # and from then on every read streams.
        after = [run(c, plans) for _ in range(70)]
        first = after.index((1, False))
        assert all(not node for _, node in after[first:]), after


def test_a_guard_at_the_top_keeps_its_place(ready):
    # No node above the guard to carry the result's labels: not spliced.
    sql = "SELECT id, v FROM kv WHERE id > 190 ORDER BY id"
    names, rows, plans = logged(ready, "fenced", sql)
    assert (names, rows) == plain(ready, sql)
    assert any("PgkvxLimitScan" in p for p in plans), plans


def test_an_optimistic_read_with_a_writer_in_flight_validates_past_the_node(ready):
    """A writer in flight in the declared span: the read runs optimistic and
    validates the span its guard touched, read from the index scan after
    the run, its rows gone past the node (scan/bypass.rs).  The writer's
    key lies past the read's rows, so the read neither waits nor changes."""
    writer = connect(ready, autocommit=False)
    try:
        writer.execute("INSERT INTO kv (v) VALUES ('late')")
        names, rows, plans = logged(ready, "optimistic", TAILS["plain"])
        assert (names, rows) == plain(ready, TAILS["plain"])
        assert plans and not any("PgkvxLimitScan" in p for p in plans), plans
    finally:
        writer.rollback()
        writer.close()


def test_a_fenced_read_waits_for_a_writer_then_runs_spliced(ready):
    """The fence folds the writer in before the spliced plan starts: the
    row committed late, behind one committed already, is returned, not
    skipped."""
    writer = connect(ready, autocommit=False)
    (late,) = writer.execute("INSERT INTO kv (v) VALUES ('late') RETURNING id").fetchone()
    with connect(ready) as c:
        c.execute("INSERT INTO kv (v) VALUES ('after')")
    out = {}

    def read():
        out["r"] = logged(ready, "fenced", f"SELECT id FROM kv WHERE id >= {late} ORDER BY id LIMIT 1")

    t = threading.Thread(target=read)
    t.start()
    with connect(ready) as c:
        wait_until(lambda: c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s AND wait_event_type = 'Lock'",
            (f"%id >= {late}%",)).fetchone()[0] > 0, "the fenced read to wait")
    writer.commit()
    writer.close()
    t.join(60)
    assert not t.is_alive()
    names, rows, plans = out["r"]
    assert rows == [(late,)]
    assert not any("PgkvxLimitScan" in p for p in plans), plans


def test_plans_replaced_and_invalidated_get_their_own_splice(ready):
    """A prepared statement run past the generic plan switch, deallocated and
    prepared again on another table, and one whose plan is invalidated by
    DDL: each execution runs its own plan's splice."""
    with session(ready, "fenced") as c:
        plans = log_plans(c)
        for round_ in range(3):
            table = "ev" if round_ % 2 == 0 else "kv"
            c.execute(f"PREPARE q(bigint) AS SELECT id FROM {table} WHERE id > $1 ORDER BY id LIMIT 3")
            for i in range(8):
                plans.clear()
                got = c.execute(f"EXECUTE q({i * 10})").fetchall()
                assert got == [(i * 10 + 1,), (i * 10 + 2,), (i * 10 + 3,)]
                text = "\n".join(plans)
                # ev is read through a Merge Append of its partitions, kv alone.
                assert ("Merge Append" in text) == (table == "ev"), text
                assert ("on kv" in text) == (table == "kv"), text
                assert "PgkvxLimitScan" not in text, text
            c.execute("DEALLOCATE q")
        # DDL invalidates the generic plan; the statement is planned again.
        c.execute("PREPARE r(bigint) AS SELECT id, v FROM kv WHERE id > $1 ORDER BY id LIMIT 2")
        for _ in range(7):
            assert c.execute("EXECUTE r(10)").fetchall() == [(11, "k11"), (12, "k12")]
        # From another session: psycopg deallocates its own on DDL.
        with connect(ready) as ddl:
            ddl.execute("ALTER TABLE kv ADD COLUMN extra int NOT NULL DEFAULT 42")
        try:
            plans.clear()
            assert c.execute("EXECUTE r(20)").fetchall() == [(21, "k21"), (22, "k22")]
            assert "PgkvxLimitScan" not in "\n".join(plans)
        finally:
            with connect(ready) as ddl:
                ddl.execute("ALTER TABLE kv DROP COLUMN extra")


@pytest.fixture(scope="module")
def auto_explain_first():
    """A cluster preloading auto_explain before pgkvx, so that auto_explain's
    ExecutorStart hook runs inside pgkvx's: yields its connection keywords."""
    run, where = side_cluster("ae", free_port(PORT + 4), "auto_explain,pgkvx")
    run("destroy", check=False)
    run("start")
    try:
        kw = {"host": where["host"], "port": where["port"]}
        with connect("postgres", **kw) as c:
            c.execute("CREATE EXTENSION pgkvx")
            for stmt in SETUP[5:]:
                c.execute(stmt.replace("ev, kv", "kv") if stmt.startswith("ANALYZE") else stmt)
        yield kw
    finally:
        run("destroy", check=False)
        shutil.rmtree(where["host"].rsplit("/", 1)[0], ignore_errors=True)


@pytest.mark.parametrize("analyze", [True, False])
@pytest.mark.parametrize("mode", ["fenced", "optimistic"])
def test_auto_explain_loaded_first_still_sees_the_node_it_analyzes(auto_explain_first, mode, analyze):
    with connect("postgres", **auto_explain_first) as c:
        c.execute(f"SET pgkvx.scan_mode = {mode}")
        c.execute("SET enable_seqscan = off")
        c.execute(f"SET auto_explain.log_analyze = {'on' if analyze else 'off'}")
        # Preloaded: a LOAD would put its hook outside ours.
        plans = log_plans(c, load=False)
        rows = c.execute(TAILS["plain"]).fetchall()
    assert [r[0] for r in rows] == list(range(51, 121))
    text = "\n".join(p for p in plans if "Query Text" in p)
    assert "Limit" in text, plans
    # Analyzed: the node and what it saw; not analyzed: spliced out.
    assert ("PgkvxLimitScan" in text) == analyze, text
    assert ("Mode:" in text) == analyze, text
