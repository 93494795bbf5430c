"""Identity-keyed gapless tables: every key the identity default draws is
drawn through pgkvx.next_key -- through generic plans, PL/pgSQL and plans
made before enable -- and what would draw or move keys around it (COPY,
OVERRIDING SYSTEM VALUE, RESTART, setval) is refused or reported."""
import threading

import psycopg
import pytest

from conftest import connect, wait_until
from test_tail import run_tail


@pytest.fixture(params=["ALWAYS", "BY DEFAULT"])
def ident(request, conn, table_name):
    conn.execute(f"CREATE TABLE {table_name} (id bigint GENERATED {request.param} AS IDENTITY PRIMARY KEY,"
                 " payload text)")
    conn.execute("SELECT pgkvx.enable(%s, gapless => true)", (table_name,))
    yield table_name
    conn.execute(f"DROP TABLE IF EXISTS {table_name} CASCADE")


def latched_keys(db, table):
    """The keys other sessions see latched on `table` right now."""
    with connect(db) as c:
        return sorted(int(s.strip("[]")) for (s,) in c.execute(
            "SELECT span FROM pgkvx.latches WHERE relid = %s::regclass", (table,)).fetchall())


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
@pytest.mark.parametrize("seed", [1, 2])
def test_identity_tail_never_skips(db, ident, mode, seed):
    committed, skipped = run_tail(db, ident, mode, seed)
    assert len(committed) > 50
    assert skipped == [[]] * len(skipped), f"{mode} skipped {skipped}"


def test_generic_plan_draws_latched(db, ident):
    with connect(db, autocommit=False) as c:
        c.execute("SET plan_cache_mode = force_generic_plan")
        ids = [c.execute(f"INSERT INTO {ident} (payload) VALUES (%s), (%s) RETURNING id", ("a", "b"),
                         prepare=True).fetchall() for _ in range(6)]
        drawn = sorted(i for rows in ids for (i,) in rows)
        # Latched before commit: the keys were drawn through next_key.
        assert latched_keys(db, ident) == drawn
        c.commit()
    assert len(drawn) == 12


def test_plpgsql_and_sql_functions(db, conn, ident):
    conn.execute(f"""CREATE FUNCTION {ident}_pl(n int) RETURNS SETOF bigint LANGUAGE plpgsql AS $$
        BEGIN FOR i IN 1..n LOOP RETURN QUERY INSERT INTO {ident} (payload) VALUES ('pl') RETURNING id;
        END LOOP; END $$""")
    conn.execute(f"""CREATE FUNCTION {ident}_sql() RETURNS bigint LANGUAGE sql AS
        $$ INSERT INTO {ident} (payload) SELECT 'sql' RETURNING id $$""")
    with connect(db, autocommit=False) as c:
        got = [r[0] for r in c.execute(f"SELECT {ident}_pl(3)").fetchall()]
        got += [c.execute(f"SELECT {ident}_sql()").fetchone()[0] for _ in range(3)]
        got += [r[0] for r in c.execute(f"SELECT {ident}_pl(2)").fetchall()]  # its cached plans again
        assert latched_keys(db, ident) == sorted(got)
        c.commit()


def test_plan_cached_before_enable(db, conn, table_name):
    conn.execute(f"CREATE TABLE {table_name} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload text)")
    with connect(db, autocommit=False) as c:
        c.execute("SET plan_cache_mode = force_generic_plan")
        c.execute(f"CREATE FUNCTION {table_name}_pl() RETURNS bigint LANGUAGE plpgsql AS $$ DECLARE k bigint;"
                  f" BEGIN INSERT INTO {table_name} (payload) VALUES ('pl') RETURNING id INTO k; RETURN k; END $$")
        sql = f"INSERT INTO {table_name} (payload) VALUES (%s) RETURNING id"
        for _ in range(3):
            c.execute(sql, ("before",), prepare=True)
            c.execute(f"SELECT {table_name}_pl()")
        c.commit()
        conn.execute("SELECT pgkvx.enable(%s, gapless => true)", (table_name,))
        # Both cached plans are made again: their draws go through next_key.
        k1 = c.execute(sql, ("after",), prepare=True).fetchone()[0]
        k2 = c.execute(f"SELECT {table_name}_pl()").fetchone()[0]
        assert latched_keys(db, table_name) == sorted([k1, k2])
        c.commit()


def test_overriding_and_explicit_keys_are_refused(db, conn, ident):
    with pytest.raises(psycopg.errors.GeneratedAlways) as e:
        conn.execute(f"INSERT INTO {ident} (id, payload) OVERRIDING SYSTEM VALUE VALUES (1000, 'x')")
    assert "gapless" in str(e.value)
    if "ALWAYS" not in conn.execute(
            "SELECT CASE attidentity WHEN 'a' THEN 'ALWAYS' ELSE 'BY DEFAULT' END FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum = 1", (ident,)).fetchone()[0]:
        with pytest.raises(psycopg.errors.GeneratedAlways):
            conn.execute(f"INSERT INTO {ident} (id, payload) VALUES (1000, 'x')")
    # A key this transaction drew with next_key is its own.
    with connect(db, autocommit=False) as c:
        k = c.execute("SELECT pgkvx.next_key(%s)", (ident,)).fetchone()[0]
        c.execute(f"INSERT INTO {ident} (id, payload) OVERRIDING SYSTEM VALUE VALUES (%s, 'drawn')", (k,))
        c.commit()


def test_copy_is_refused_or_hand_drawn(db, conn, ident):
    with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
        with conn.cursor().copy(f"COPY {ident} (payload) FROM STDIN") as cp:
            cp.write_row(("copied",))
    assert "COPY" in str(e.value) and e.value.diag.message_hint
    with pytest.raises(psycopg.errors.GeneratedAlways):
        with conn.cursor().copy(f"COPY {ident} (id, payload) FROM STDIN") as cp:
            cp.write_row((77, "copied"))
    assert conn.execute(f"SELECT count(*) FROM {ident}").fetchone() == (0,)
    # Keys drawn first, then copied: accepted.
    with connect(db, autocommit=False) as c:
        keys = [c.execute("SELECT pgkvx.next_key(%s)", (ident,)).fetchone()[0] for _ in range(3)]
        with c.cursor().copy(f"COPY {ident} (id, payload) FROM STDIN") as cp:
            for k in keys:
                cp.write_row((k, "copied"))
        c.commit()
    assert conn.execute(f"SELECT count(*) FROM {ident}").fetchone() == (3,)


def test_copy_with_a_default_marker_is_refused(db, conn, ident):
    """COPY's DEFAULT option (16 on) lets a field of the listed key take its
    default, which COPY draws without the planner: refused up front like a
    COPY that leaves the key out, not row by row."""
    if conn.info.server_version < 160000:
        pytest.skip("COPY has a DEFAULT option from PostgreSQL 16")
    with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
        with conn.cursor().copy(f"COPY {ident} (id, payload) FROM STDIN WITH (DEFAULT '\\D')") as cp:
            cp.write(b"\\D\tcopied\n")
    assert "COPY" in str(e.value) and e.value.diag.message_hint
    assert conn.execute(f"SELECT count(*) FROM {ident}").fetchone() == (0,)


def test_restart_is_refused(db, conn, ident):
    conn.execute(f"INSERT INTO {ident} (payload) SELECT 'x' FROM generate_series(1, 5)")
    seq = conn.execute("SELECT pg_get_serial_sequence(%s, 'id')", (ident,)).fetchone()[0]
    for ddl in [f"ALTER TABLE {ident} ALTER COLUMN id RESTART",
                f"ALTER TABLE {ident} ALTER COLUMN id RESTART WITH 2",
                f"ALTER SEQUENCE {seq} RESTART",
                f"ALTER SEQUENCE {seq} RESTART WITH 5",
                f"ALTER SEQUENCE {seq} INCREMENT BY -1",
                f"TRUNCATE {ident} RESTART IDENTITY"]:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            conn.execute(ddl)
    conn.execute(f"ALTER TABLE {ident} ALTER COLUMN id RESTART WITH 100")
    assert conn.execute(f"INSERT INTO {ident} (payload) VALUES ('y') RETURNING id").fetchone() == (100,)


def test_a_cache_other_than_1_is_refused_when_it_is_set(db, conn, ident):
    # A session that cached values while CACHE was 5 would draw them later,
    # behind keys other sessions committed: refused when set, not only at
    # the next draw.
    seq = conn.execute("SELECT pg_get_serial_sequence(%s, 'id')", (ident,)).fetchone()[0]
    for ddl in [f"ALTER SEQUENCE {seq} CACHE 5",
                f"ALTER TABLE {ident} ALTER COLUMN id SET CACHE 20"]:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="CACHE 1"):
            conn.execute(ddl)
    assert conn.execute("SELECT seqcache FROM pg_sequence WHERE seqrelid = %s::regclass", (seq,)).fetchone() == (1,)
    conn.execute(f"ALTER SEQUENCE {seq} CACHE 1")
    conn.execute(f"INSERT INTO {ident} (payload) VALUES ('x')")


def test_restart_is_checked_after_draws_in_flight(db, conn, ident):
    """A RESTART waits for the transactions drawing from the sequence and
    is checked against what they drew meanwhile."""
    conn.execute(f"INSERT INTO {ident} (payload) VALUES ('x')")
    with connect(db, autocommit=False) as p:
        k = p.execute(f"INSERT INTO {ident} (payload) VALUES ('in flight') RETURNING id").fetchone()[0]
        result = []

        def restart():
            try:
                with connect(db) as c:
                    c.execute(f"ALTER TABLE {ident} ALTER COLUMN id RESTART WITH {k + 1}")
                result.append("ok")
            except psycopg.errors.ObjectNotInPrerequisiteState:
                result.append("refused")
        t = threading.Thread(target=restart)
        t.start()
        wait_until(lambda: conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'ALTER TABLE%%'"
        ).fetchone()[0] == 1, "the RESTART to wait for the drawing transaction")
        # Drawn while the RESTART waits: k + 1 is taken now.
        assert p.execute(f"INSERT INTO {ident} (payload) VALUES ('meanwhile') RETURNING id").fetchone()[0] == k + 1
        p.commit()
        t.join()
    assert result == ["refused"]


def test_setval_backwards_is_reported(db, conn, ident):
    conn.execute(f"INSERT INTO {ident} (payload) SELECT 'x' FROM generate_series(1, 5)")
    seq = conn.execute("SELECT pg_get_serial_sequence(%s, 'id')", (ident,)).fetchone()[0]
    assert conn.execute("SELECT * FROM pgkvx.check()").fetchall() == []
    conn.execute("SELECT setval(%s, 2)", (seq,))
    problems = conn.execute("SELECT problem FROM pgkvx.check() WHERE relid = %s::regclass", (ident,)).fetchall()
    assert len(problems) == 1 and "behind key 5" in problems[0][0], problems
    conn.execute("SELECT setval(%s, 5)", (seq,))
    assert conn.execute("SELECT * FROM pgkvx.check()").fetchall() == []


def test_disable_and_enable_again(db, conn, ident):
    conn.execute(f"INSERT INTO {ident} (payload) VALUES ('gapless')")
    conn.execute("SELECT pgkvx.disable(%s)", (ident,))
    conn.execute(f"INSERT INTO {ident} (payload) VALUES ('plain')")
    conn.execute("SELECT pgkvx.enable(%s, gapless => true)", (ident,))
    with connect(db, autocommit=False) as c:
        k = c.execute(f"INSERT INTO {ident} (payload) VALUES ('gapless again') RETURNING id").fetchone()[0]
        assert latched_keys(db, ident) == [k]
        c.commit()
    assert [r[0] for r in conn.execute(f"SELECT id FROM {ident} ORDER BY id")] == [1, 2, 3]
