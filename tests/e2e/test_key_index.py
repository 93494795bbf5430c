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
