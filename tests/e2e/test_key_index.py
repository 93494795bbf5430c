"""A table latched by a named unique index keeps working when that index is
rebuilt under a new oid, and says clearly when its key index is gone."""
import psycopg
import pyarrow
import pytest

from conftest import connect


@pytest.fixture
def coded(conn, table_name):
    conn.execute(f"CREATE TABLE {table_name} (id int, code int NOT NULL)")
    conn.execute(f"CREATE UNIQUE INDEX {table_name}_code ON {table_name} (code)")
    conn.execute("SELECT pgkvx.enable(%s, %s)", (table_name, f"{table_name}_code"))
    conn.execute(f"INSERT INTO {table_name} SELECT g, g FROM generate_series(1, 10) g")
    yield table_name
    conn.execute(f"DROP TABLE IF EXISTS {table_name}")


def works(c, t):
    c.execute(f"INSERT INTO {t} VALUES (100, (SELECT max(code) + 1 FROM {t}))")
    assert c.execute(f"SELECT code FROM {t} WHERE code > 5 ORDER BY code LIMIT 2").fetchall() == [(6,), (7,)]
    stream = b"".join(r[0] for r in c.cursor(binary=True).execute(
        "SELECT pgkvx.arrow_scan(%s, '{code}', lower => '9')", (t,)).fetchall())
    assert pyarrow.ipc.open_stream(stream).read_all().column("code").to_pylist()[:2] == [9, 10]
    assert c.execute("SELECT * FROM pgkvx.check() WHERE relid = %s::regclass", (t,)).fetchall() == []


def test_rebuilt_key_index_is_followed(conn, coded):
    works(conn, coded)
    conn.execute(f"REINDEX INDEX CONCURRENTLY {coded}_code")
    works(conn, coded)
    conn.execute(f"ALTER TABLE {coded} ALTER COLUMN code TYPE bigint")
    works(conn, coded)


def test_dropped_key_index_is_reported_and_refused_clearly(conn, coded):
    conn.execute(f"DROP INDEX {coded}_code")
    problems = conn.execute("SELECT problem FROM pgkvx.check() WHERE relid = %s::regclass", (coded,)).fetchall()
    assert problems and "key index no longer exists" in problems[0][0]
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
        conn.execute(f"INSERT INTO {coded} VALUES (1, 1000)")
    assert "no longer exists" in str(e.value)
    # Enabling again with a new key index puts it right.
    conn.execute(f"CREATE UNIQUE INDEX {coded}_code2 ON {coded} (code)")
    conn.execute("SELECT pgkvx.enable(%s, %s)", (coded, f"{coded}_code2"))
    works(conn, coded)


def test_dropped_primary_key_is_reported_and_refused_clearly(conn, table_name):
    """A lost key index, primary-key version: a table latched by its primary
    key whose PRIMARY KEY constraint is dropped.  check() says so; inserts,
    key-order reads and arrow_scan fail with a clear SQLSTATE, never XX000
    "could not open relation"."""
    t = table_name
    conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    conn.execute("SELECT pgkvx.enable(%s)", (t,))
    conn.execute(f"INSERT INTO {t} SELECT g, 'x' FROM generate_series(1, 10) g")
    try:
        conn.execute(f"ALTER TABLE {t} DROP CONSTRAINT {t}_pkey")
        problems = [p for (p,) in conn.execute(
            "SELECT problem FROM pgkvx.check() WHERE relid = %s::regclass", (t,)).fetchall()]
        assert any("no primary key" in p for p in problems), problems

        def refused(sql, params=()):
            with pytest.raises(psycopg.Error) as e:
                conn.cursor(binary=True).execute(sql, params).fetchall()
            assert e.value.sqlstate != "XX000", e.value
            assert "could not open relation" not in str(e.value), e.value
            return e.value

        for err in (refused(f"INSERT INTO {t} VALUES (100, 'y')"),
                    refused(f"UPDATE {t} SET v = 'z' WHERE id = 1"),
                    refused(f"SELECT id FROM {t} WHERE id > 5 ORDER BY id LIMIT 2"),
                    refused("SELECT pgkvx.arrow_scan(%s, '{id}', lower => '5')", (t,))):
            # 42P16: the table definition lacks what its latching needs.
            assert isinstance(err, psycopg.errors.InvalidTableDefinition), (type(err), err)
            assert "no primary key" in str(err), err
        # A new primary key puts it right.
        conn.execute(f"ALTER TABLE {t} ADD PRIMARY KEY (id)")
        assert conn.execute("SELECT * FROM pgkvx.check() WHERE relid = %s::regclass", (t,)).fetchall() == []
        conn.execute(f"INSERT INTO {t} VALUES (100, 'y')")
        assert conn.execute(f"SELECT id FROM {t} WHERE id > 5 ORDER BY id LIMIT 2").fetchall() == [(6,), (7,)]
    finally:
        conn.execute(f"DROP TABLE IF EXISTS {t}")
