"""pgkvx.arrow_scan / pgkvx.arrow_query: the stream contract, every type of the
mapping table (src/arrow/README.md) through pyarrow, polars and DuckDB, bounds,
batching, privileges and row level security."""
import datetime
import io
import math
import uuid

import duckdb
import polars as pl
import psycopg
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from conftest import connect

# --- helpers (also used by test_arrow_memory.py) ---------------------------


def chunks(conn, sql, params=None):
    """The bytea values a statement returns, in order (binary results: raw bytes)."""
    cur = conn.cursor(binary=True)
    return [bytes(r[0]) for r in cur.execute(sql, params)]


def stream(conn, sql, params=None):
    return b"".join(chunks(conn, sql, params))


def read_pyarrow(buf) -> pa.Table:
    return ipc.open_stream(io.BytesIO(buf)).read_all()


def read_polars(buf) -> pl.DataFrame:
    return pl.read_ipc_stream(io.BytesIO(buf))


def read_duckdb(buf, project=None):
    """DuckDB consumes the stream through the Arrow C stream interface."""
    con = duckdb.connect()
    rel = con.from_arrow(ipc.open_stream(io.BytesIO(buf)))
    cols = rel.columns
    if project:
        rel = rel.project(project)
    return cols, rel.fetchall()


def scan_sql(**kw):
    args = "".join(f", {k} => %({k})s" for k in kw if k != "t")
    return f"SELECT pgkvx.arrow_scan(%(t)s::regclass{args})"


def scan(conn, table, **kw):
    return read_pyarrow(stream(conn, scan_sql(t=table, **kw), {"t": table, **kw}))


def query(conn, q, batch_rows=65536):
    return read_pyarrow(stream(conn, "SELECT pgkvx.arrow_query(%s, %s)", (q, batch_rows)))


def nan_safe(values):
    return ["NaN" if isinstance(v, float) and math.isnan(v) else v for v in values]


# --- the type mapping -------------------------------------------------------

BIG_RANDOM = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 200))"  # ~6.4 kB, incompressible

# (column type, SQL literals, expected arrow type, SQL giving the expected
#  value of column v, how to turn the arrow column into comparable values)
CASES = [
    ("int2", ["-32768", "32767", "0"], pa.int16(), "v", None),
    ("int4", ["-2147483648", "2147483647", "0"], pa.int32(), "v", None),
    ("int8", ["-9223372036854775808", "9223372036854775807", "0"], pa.int64(), "v", None),
    ("float4", ["'NaN'", "'Infinity'", "'-Infinity'", "1.5", "'-0'", "'3.4028235e38'", "'1e-45'"],
     pa.float32(), "v::float8", "nan"),
    ("float8", ["'NaN'", "'Infinity'", "'-Infinity'", "'1.7976931348623157e308'", "'5e-324'", "0.1"],
     pa.float64(), "v", "nan"),
    ("bool", ["true", "false"], pa.bool_(), "v", None),
    ("text", ["''", "'héllo wörld ✓ 😀 日本'", "repeat('toast me ', 20000)", BIG_RANDOM, "E'tab\\tnew\\nline'"],
     pa.string(), "v", None),
    ("varchar(12)", ["''", "'ünïcødé'", "'twelve chars'"], pa.string(), "v", None),
    ("char(5)", ["'ab'", "''", "'abcde'"], pa.string(), "v", None),
    ("name", ["'pg_class'", "''", "'ñame'"], pa.string(), "v::text", None),
    ("bytea", ["'\\x'", "'\\x00ff10'", f"convert_to({BIG_RANDOM}, 'UTF8')",
               "convert_to(repeat('a', 100000), 'UTF8')"], pa.binary(), "v", None),
    ("numeric(38,0)", ["'99999999999999999999999999999999999999'", "'-99999999999999999999999999999999999999'", "0"],
     pa.decimal128(38, 0), "v", None),
    ("numeric(38,38)", ["'0.99999999999999999999999999999999999999'", "'-0.00000000000000000000000000000000000001'"],
     pa.decimal128(38, 38), "v", None),
    ("numeric(10,2)", ["'12345678.91'", "'-0.01'", "0", "'1.005'"], pa.decimal128(10, 2), "v", None),
    ("numeric(5,0)", ["99999", "-99999", "1"], pa.decimal128(5, 0), "v", None),
    ("numeric(19,4)", ["'922337203685477.5807'", "'-0.0001'", "'10000'"], pa.decimal128(19, 4), "v", None),
    ("numeric", ["'NaN'", "'Infinity'", "'-Infinity'", "'1e-30'", "'123456789012345678901234567890.0123456789'",
                 "0", "'-1.50'"], pa.string(), "v::text", None),
    ("numeric(40,2)", ["'12345678901234567890123456789012345678.12'"], pa.string(), "v::text", None),
    ("date", ["'4713-01-01 BC'", "'5874897-12-31'", "'2000-01-01'", "'1970-01-01'", "'1969-12-31'"],
     pa.date32(), "v - '1970-01-01'::date", "int32"),
    ("timestamp", ["'4713-01-01 00:00:00 BC'", "'294246-12-31 23:59:59.999999'", "'2000-01-01'",
                   "'1970-01-01 00:00:00.000001'", "'1969-12-31 23:59:59.999999'"],
     pa.timestamp("us"), "(extract(epoch from v) * 1000000)::int8", "int64"),
    ("timestamptz", ["'4713-01-01 00:00:00+00 BC'", "'2024-02-29 12:00:00.123456+05:30'", "'2000-01-01+00'"],
     pa.timestamp("us", tz="UTC"), "(extract(epoch from v) * 1000000)::int8", "int64"),
    ("time", ["'00:00'", "'23:59:59.999999'", "'24:00:00'", "'12:34:56.789'"], pa.time64("us"),
     "(extract(epoch from v) * 1000000)::int8", "int64"),
    ("interval", ["'1 year 2 mons 3 days 04:05:06.789'", "'-178000000 years'", "'-1 day +02:00'", "'0'",
                  "'2562047 hours'"],
     pa.month_day_nano_interval(),
     "CASE WHEN v IS NOT NULL THEN"
     " ARRAY[(extract(year from v) * 12 + extract(month from v))::int8, extract(day from v)::int8,"
     " ((extract(hour from v) * 3600 + extract(minute from v) * 60) * 1000000000"
     "  + extract(microseconds from v) * 1000)::int8] END",
     "interval"),
    ("uuid", ["'00000000-0000-0000-0000-000000000000'", "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
              "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"], pa.binary(16), "v::text", "uuid"),
    ("json", ["'{\"a\": [1, 2.50, null]}'", "'\"ü\"'", "'[]'"], pa.string(), "v::text", None),
    ("jsonb", ["'{\"b\": 1, \"a\": [1, 2.50, null]}'", "'\"ü\"'", "'{}'"], pa.string(), "v::text", None),
    ("int4[]", ["'{}'", "'{1,NULL,3}'", "'{2147483647}'", "'[0:1]={7,8}'"], pa.list_(pa.int32()), "v", None),
    ("text[]", ["'{}'", "'{a,NULL,\"\",ü}'", "ARRAY[repeat('x', 5000)]"], pa.list_(pa.string()), "v", None),
    ("numeric(6,2)[]", ["'{1.5,NULL,-9999.99}'"], pa.list_(pa.decimal128(6, 2)), "v", None),
    ("date[]", ["'{2000-01-01,1970-01-01}'"], pa.list_(pa.date32()),
     "CASE WHEN v IS NOT NULL THEN ARRAY(SELECT x - '1970-01-01'::date FROM unnest(v) x) END", "listint32"),
    ("inet", ["'192.168.0.1/24'", "'::1'"], pa.string(), "CASE WHEN v IS NOT NULL THEN format('%s', v) END", None),
    ("timetz", ["'12:00+02'"], pa.string(), "v::text", None),
    ("mood", ["'sad'", "'happy'"], pa.string(), "v::text", None),
    ("pair", ["ROW(1, 'x y')::pair"], pa.string(), "v::text", None),
    ("point[]", ["ARRAY[point(1,2)]"], pa.string(), "v::text", None),
    ("posint", ["1", "2147483647"], pa.int32(), "v", None),
    ("oid", ["4294967295", "0"], pa.string(), "v::text", None),
]


def normalise(col: pa.ChunkedArray, how):
    if how is None:
        return col.to_pylist()
    if how == "nan":
        return nan_safe(col.to_pylist())
    if how in ("int32", "int64"):
        storage = pa.int32() if col.type == pa.date32() else pa.int64()
        return col.cast(storage).to_pylist()
    if how == "interval":
        return [None if v is None else [v.months, v.days, v.nanoseconds] for v in col.to_pylist()]
    if how == "uuid":
        return [None if v is None else str(uuid.UUID(bytes=v)) for v in col.to_pylist()]
    if how == "listint32":
        epoch = datetime.date(1970, 1, 1)
        return [None if v is None else [(d - epoch).days for d in v] for v in col.to_pylist()]
    raise AssertionError(how)


@pytest.fixture(scope="module")
def typed(db):
    with connect(db) as c:
        c.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
        c.execute("CREATE TYPE pair AS (a int, b text)")
        c.execute("CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)")
    return db


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_type_round_trip(typed, case):
    pgtype, literals, arrow_type, expected_sql, how = case
    with connect(typed) as c:
        t = "ty_" + uuid.uuid4().hex[:8]
        c.execute(f"CREATE TABLE {t} (k int4 PRIMARY KEY, v {pgtype})")
        if pgtype == "text":
            c.execute(f"ALTER TABLE {t} ALTER v SET STORAGE EXTERNAL")  # out of line, uncompressed
        for i, lit in enumerate(literals):
            c.execute(f"INSERT INTO {t} VALUES ({i}, {lit})")
        c.execute(f"INSERT INTO {t} VALUES ({len(literals)}, NULL)")
        expected = [r[0] for r in c.execute(f"SELECT {expected_sql} FROM {t} ORDER BY k")]
        if how == "nan":
            expected = nan_safe(expected)
        if how == "interval":
            expected = [None if v is None else [int(x) for x in v] for v in expected]

        for table in (scan(c, t, columns=["v"]), query(c, f"SELECT v FROM {t} ORDER BY k")):
            assert table.schema.field("v").type == arrow_type
            assert normalise(table.column("v"), how) == expected

        # polars and DuckDB read the same stream unmodified.
        buf = stream(c, scan_sql(t=t), {"t": t})
        n = len(literals) + 1
        if arrow_type != pa.month_day_nano_interval():
            assert read_polars(buf).height == n
        # (projected in DuckDB: Python cannot hold years 4713 BC or 294246 AD)
        cols, rows = read_duckdb(buf, "k, v IS NULL")
        assert cols == ["k", "v"] and [r[0] for r in rows] == list(range(n))
        assert [r[1] for r in rows] == [False] * (n - 1) + [True]


def test_toasted_values_are_detoasted(conn):
    """Compressed inline, compressed external and external uncompressed values."""
    conn.execute("CREATE TABLE toasty (k int PRIMARY KEY, main text, ext text, b bytea)")
    conn.execute("ALTER TABLE toasty ALTER ext SET STORAGE EXTERNAL")
    conn.execute(
        "INSERT INTO toasty SELECT g, repeat('m' || g, 3000), repeat(md5(g::text), 300),"
        " decode(repeat(md5(g::text), 400), 'hex') FROM generate_series(1, 50) g")
    (compressed,) = conn.execute(
        "SELECT count(*) FROM toasty WHERE pg_column_compression(main) IS NOT NULL").fetchone()
    assert compressed == 50
    t = scan(conn, "toasty")
    want = conn.execute("SELECT main, ext, b FROM toasty ORDER BY k").fetchall()
    assert list(zip(t.column("main").to_pylist(), t.column("ext").to_pylist(), t.column("b").to_pylist())) == \
        [(m, e, bytes(b)) for m, e, b in want]


# --- stream shape -----------------------------------------------------------


@pytest.fixture(scope="module")
def kv(db):
    with connect(db) as c:
        c.execute("CREATE TABLE kv (k int8 PRIMARY KEY, a int4, s text, d numeric(12,3), z text)")
        # inserted out of key order so physical order differs from key order
        c.execute("INSERT INTO kv SELECT g, g % 7, 's' || g, g / 8.0, 'z' FROM generate_series(1000, 1, -1) g")
    return "kv"


def test_stream_contract_schema_batches_eos(conn, kv):
    vals = chunks(conn, "SELECT pgkvx.arrow_scan('kv', batch_rows => 300)")
    # 1000 rows in batches of 300: 4 values, the last one ends with EOS
    assert len(vals) == 4
    buf = b"".join(vals)
    assert buf.endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    bs = list(ipc.open_stream(io.BytesIO(buf)))
    assert [b.num_rows for b in bs] == [300, 300, 300, 100]
    # the first value alone is the schema plus one complete batch
    r = ipc.open_stream(io.BytesIO(vals[0]))
    assert r.read_next_batch().num_rows == 300


def test_exact_multiple_ends_with_eos_only_value(conn, kv):
    vals = chunks(conn, "SELECT pgkvx.arrow_scan('kv', batch_rows => 250)")
    assert len(vals) == 5 and vals[-1] == b"\xff\xff\xff\xff\x00\x00\x00\x00"
    assert read_pyarrow(b"".join(vals)).num_rows == 1000


def test_rows_in_key_order_and_projection_order(conn, kv):
    t = scan(conn, "kv", columns=["s", "k", "a"])
    assert t.column_names == ["s", "k", "a"]
    assert t.column("k").to_pylist() == list(range(1, 1001))
    assert t.column("s").to_pylist() == [f"s{i}" for i in range(1, 1001)]
    assert t.schema.field("k").nullable is False and t.schema.field("s").nullable is True


def test_values_equal_across_batch_boundaries(conn, kv):
    whole = scan(conn, "kv", batch_rows=1000000)
    for br in (1, 7, 64, 999):
        buf = stream(conn, scan_sql(t="kv", batch_rows=br), {"t": "kv", "batch_rows": br})
        bs = list(ipc.open_stream(io.BytesIO(buf)))
        assert all(b.num_rows <= br for b in bs)
        assert pa.Table.from_batches(bs).equals(whole)
        assert read_polars(buf).equals(pl.from_arrow(whole))


def test_bounds_are_half_open_and_parsed_by_the_key_type(conn, kv):
    t = scan(conn, "kv", columns=["k"], lower="10", upper="20")
    assert t.column("k").to_pylist() == list(range(10, 20))
    assert scan(conn, "kv", columns=["k"], lower="995").column("k").to_pylist() == [995, 996, 997, 998, 999, 1000]
    assert scan(conn, "kv", columns=["k"], upper="3").column("k").to_pylist() == [1, 2]
    assert scan(conn, "kv", columns=["k"], lower="20", upper="10").num_rows == 0
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        scan(conn, "kv", lower="ten")
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        scan(conn, "kv", lower="99999999999999999999999")


def test_text_key_bounds_follow_index_order(conn):
    conn.execute('CREATE TABLE tk (k text COLLATE "C" PRIMARY KEY, v int)')
    conn.execute("INSERT INTO tk VALUES ('b', 1), ('a', 2), ('ab', 3), ('B', 4), ('c', 5)")
    t = scan(conn, "tk", lower="a", upper="b")
    assert t.column("k").to_pylist() == ["a", "ab"]
    assert scan(conn, "tk").column("k").to_pylist() == ["B", "a", "ab", "b", "c"]


def test_max_rows(conn, kv):
    assert scan(conn, "kv", columns=["k"], max_rows=0).num_rows == 0
    assert scan(conn, "kv", columns=["k"], max_rows=5).column("k").to_pylist() == [1, 2, 3, 4, 5]
    buf = stream(conn, scan_sql(t="kv", max_rows=25, batch_rows=10, lower="100"),
                 {"t": "kv", "max_rows": 25, "batch_rows": 10, "lower": "100"})
    bs = list(ipc.open_stream(io.BytesIO(buf)))
    assert [b.num_rows for b in bs] == [10, 10, 5]
    assert pa.Table.from_batches(bs).column("k").to_pylist() == list(range(100, 125))


def test_empty_result_is_schema_plus_eos(conn):
    conn.execute("CREATE TABLE empty_t (k int PRIMARY KEY, s text, n numeric(5,1))")
    vals = chunks(conn, "SELECT pgkvx.arrow_scan('empty_t')")
    assert len(vals) == 1
    for buf in (vals[0], stream(conn, "SELECT pgkvx.arrow_query('SELECT * FROM empty_t')")):
        t = read_pyarrow(buf)
        assert t.num_rows == 0 and t.column_names == ["k", "s", "n"]
        assert t.schema.field("n").type == pa.decimal128(5, 1)
        df = read_polars(buf)
        assert df.height == 0 and df.columns == ["k", "s", "n"]
        cols, rows = read_duckdb(buf)
        assert cols == ["k", "s", "n"] and rows == []


def test_table_without_key_reads_physical_order_and_refuses_bounds(conn):
    conn.execute("CREATE TABLE nokey (a int, b text)")
    conn.execute("INSERT INTO nokey SELECT g, 'b' || g FROM generate_series(5, 1, -1) g")
    assert scan(conn, "nokey").column("a").to_pylist() == [5, 4, 3, 2, 1]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="no key"):
        scan(conn, "nokey", lower="1")


def test_multicolumn_key_orders_by_all_columns_and_refuses_bounds(conn):
    conn.execute("CREATE TABLE mk (a int, b text, v int, PRIMARY KEY (a, b))")
    conn.execute("INSERT INTO mk VALUES (2,'a',1),(1,'b',2),(1,'a',3),(2,'0',4)")
    assert scan(conn, "mk", columns=["v"]).column("v").to_pylist() == [3, 2, 4, 1]
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="multi-column key"):
        scan(conn, "mk", lower="1")


def test_dropped_columns_are_skipped(conn):
    conn.execute("CREATE TABLE dropped (k int PRIMARY KEY, gone text, v int)")
    conn.execute("INSERT INTO dropped VALUES (1, 'x', 10)")
    conn.execute("ALTER TABLE dropped DROP COLUMN gone")
    t = scan(conn, "dropped")
    assert t.column_names == ["k", "v"] and t.column("v").to_pylist() == [10]
    with pytest.raises(psycopg.errors.UndefinedColumn):
        scan(conn, "dropped", columns=["gone"])


def test_select_star_from_materialises_but_returns_the_same_stream(conn, kv):
    a = stream(conn, "SELECT pgkvx.arrow_scan('kv', batch_rows => 100)")
    b = stream(conn, "SELECT * FROM pgkvx.arrow_scan('kv', batch_rows => 100)")
    assert a == b


# --- infinities, NaN, numeric modes -----------------------------------------


@pytest.mark.parametrize("pgtype,lit", [("date", "'infinity'"), ("date", "'-infinity'"),
                                        ("timestamp", "'infinity'"), ("timestamptz", "'-infinity'"),
                                        ("timestamp", "'294276-12-31 23:59:59'")])
def test_infinite_datetimes_raise_instead_of_a_wrong_value(conn, pgtype, lit):
    t = "inf_" + uuid.uuid4().hex[:8]
    conn.execute(f"CREATE TABLE {t} (k int PRIMARY KEY, v {pgtype})")
    conn.execute(f"INSERT INTO {t} SELECT g, now() FROM generate_series(1, 100) g")
    conn.execute(f"INSERT INTO {t} VALUES (50000, {lit})")
    with pytest.raises(psycopg.errors.DatetimeFieldOverflow, match='column "v"'):
        scan(conn, t, batch_rows=10)
    # the connection is fine afterwards, and filtering the value out works
    assert query(conn, f"SELECT v FROM {t} WHERE k < 50000").num_rows == 100
    assert query(conn, f"SELECT v::text AS v FROM {t}").column("v").to_pylist()[-1] is not None


@pytest.mark.parametrize("lit", ["'NaN'", "'Infinity'", "'-Infinity'"])
def test_numeric_specials_in_decimal_columns_raise(conn, lit):
    t = "nan_" + uuid.uuid4().hex[:8]
    # (Postgres itself refuses ±Infinity in a numeric with a typmod)
    conn.execute(f"CREATE TABLE {t} (k int PRIMARY KEY, v numeric(10,2), u numeric)")
    conn.execute(f"INSERT INTO {t} VALUES (1, 1.5, {lit}), (2, 'NaN', 1)")
    assert scan(conn, t, columns=["u"]).column("u").to_pylist() == [lit.strip("'"), "1"]
    with pytest.raises(psycopg.errors.NumericValueOutOfRange, match='column "v"'):
        scan(conn, t, columns=["v"])
    conn.execute("SET pgkvx.arrow_numeric = 'decimal128'")
    try:
        with pytest.raises(psycopg.errors.NumericValueOutOfRange, match='column "u"'):
            scan(conn, t, columns=["u"])
    finally:
        conn.execute("RESET pgkvx.arrow_numeric")


def test_numeric_mode_settings_for_unconstrained_numeric(conn):
    conn.execute("CREATE TABLE nm (k int PRIMARY KEY, u numeric)")
    conn.execute("INSERT INTO nm VALUES (1, 1.23456789012), (2, 'NaN'), (3, -2.5), (4, NULL)")
    try:
        conn.execute("SET pgkvx.arrow_numeric = 'float64'")
        t = scan(conn, "nm")
        assert t.schema.field("u").type == pa.float64()
        assert nan_safe(t.column("u").to_pylist()) == [1.23456789012, "NaN", -2.5, None]
        conn.execute("SET pgkvx.arrow_numeric = 'decimal128'")
        conn.execute("SET pgkvx.arrow_numeric_scale = 4")
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            scan(conn, "nm")
        t = scan(conn, "nm", upper="2")
        assert t.schema.field("u").type == pa.decimal128(38, 4)
        assert [str(x) for x in t.column("u").to_pylist()] == ["1.2346"]
        t = scan(conn, "nm", lower="3")
        assert [None if x is None else str(x) for x in t.column("u").to_pylist()] == ["-2.5000", None]
    finally:
        conn.execute("RESET pgkvx.arrow_numeric")
        conn.execute("RESET pgkvx.arrow_numeric_scale")


def test_multidimensional_array_is_refused(conn):
    conn.execute("CREATE TABLE md (k int PRIMARY KEY, v int[])")
    conn.execute("INSERT INTO md VALUES (1, '{1,2}'), (2, '{{1,2},{3,4}}')")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="2-dimensional"):
        scan(conn, "md")
    assert query(conn, "SELECT v::text AS v FROM md ORDER BY k").column("v").to_pylist() == ["{1,2}", "{{1,2},{3,4}}"]


# --- arrow_query ------------------------------------------------------------


def test_arrow_query_joins_and_expressions(conn, kv):
    conn.execute("CREATE TABLE dim (a int PRIMARY KEY, label text)")
    conn.execute("INSERT INTO dim SELECT g, 'label ' || g FROM generate_series(0, 6) g")
    q = ("SELECT kv.k, dim.label, kv.d * 2 AS d2, kv.k::float8 / 3 AS third, upper(kv.s) AS s,"
         " date '2020-01-01' + kv.a AS day, kv.k % 2 = 0 AS even"
         " FROM kv JOIN dim USING (a) WHERE kv.k <= 500 ORDER BY kv.k DESC")
    t = query(conn, q, batch_rows=64)
    want = conn.execute(q).fetchall()
    got = list(zip(*[t.column(i).to_pylist() for i in range(t.num_columns)]))
    assert len(got) == 500
    assert [(r[0], r[1], str(r[2]), r[3], r[4], r[5], r[6]) for r in want] == \
        [(r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in got]
    assert t.schema.field("d2").type == pa.string()  # numeric(12,3) * 2 is unconstrained
    assert t.schema.field("day").type == pa.date32()


def test_arrow_query_batches_and_aggregates(conn, kv):
    buf = stream(conn, "SELECT pgkvx.arrow_query('SELECT a, count(*)::int8 AS n FROM kv GROUP BY a ORDER BY a', 3)")
    bs = list(ipc.open_stream(io.BytesIO(buf)))
    assert [b.num_rows for b in bs] == [3, 3, 1]
    assert sum(pa.Table.from_batches(bs).column("n").to_pylist()) == 1000


@pytest.mark.parametrize("q", [
    "INSERT INTO kv VALUES (-1, 0, 'x', 0, 'z') RETURNING k",
    "WITH d AS (DELETE FROM kv WHERE k = 1 RETURNING k) SELECT * FROM d",
    "SELECT k FROM kv FOR UPDATE",
    "SELECT 1; SELECT 2",
    "CREATE TABLE sneaky AS SELECT 1",
    "EXPLAIN ANALYZE DELETE FROM kv",
])
def test_arrow_query_refuses_anything_but_a_read_only_select(conn, kv, q):
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="read-only SELECT"):
        stream(conn, "SELECT pgkvx.arrow_query(%s)", (q,))
    assert conn.execute("SELECT count(*) FROM kv").fetchone()[0] == 1000


@pytest.mark.parametrize("q", [
    "SELECT * FROM (SELECT k FROM kv FOR UPDATE) s",
    "WITH x AS (SELECT k FROM kv FOR UPDATE) SELECT * FROM x",
    "WITH x AS MATERIALIZED (SELECT k FROM kv FOR NO KEY UPDATE) SELECT * FROM x",
    "SELECT k FROM kv WHERE k IN (SELECT k FROM kv FOR SHARE)",
    "SELECT k, (SELECT a FROM kv k2 WHERE k2.k = kv.k FOR KEY SHARE) FROM kv",
    "SELECT * FROM kv_locked_view",
])
def test_arrow_query_refuses_row_locks_in_subqueries(db, conn, kv, q):
    """A row lock below the top level (subquery, CTE, sublink, a view's FOR
    UPDATE) must not surface as PostgreSQL's misleading 'SELECT FOR UPDATE
    is not allowed in a non-volatile function'.  It gets
    pgkvx's own 0A000, before anything runs: no row stays locked."""
    conn.execute("CREATE OR REPLACE VIEW kv_locked_view AS SELECT k FROM kv FOR UPDATE")
    conn.execute("BEGIN")
    try:
        with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
            stream(conn, "SELECT pgkvx.arrow_query(%s)", (q,))
        assert e.value.sqlstate == "0A000"
        assert "read-only SELECT" in str(e.value), e.value
        assert "non-volatile" not in str(e.value), e.value
        assert "FOR UPDATE/SHARE" in (e.value.diag.message_hint or ""), e.value.diag.message_hint
        # The aborted transaction still holds whatever it locked: nothing.
        with connect(db) as other:
            other.execute("SET lock_timeout = '5s'")
            assert other.execute("SELECT count(*) FROM (SELECT k FROM kv FOR UPDATE NOWAIT) s").fetchone() == (1000,)
    finally:
        conn.execute("ROLLBACK")
        conn.execute("DROP VIEW IF EXISTS kv_locked_view")


def test_arrow_query_syntax_error_is_reported(conn):
    with pytest.raises(psycopg.errors.SyntaxError):
        stream(conn, "SELECT pgkvx.arrow_query('SELEC 1')")


# --- early termination and errors leave nothing behind -----------------------


def test_limit_and_cursor_close_release_the_scan(conn, kv):
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    with conn.transaction():
        assert len(chunks(conn, "SELECT pgkvx.arrow_scan('kv', batch_rows => 10) LIMIT 2")) == 2
        assert len(chunks(conn, "SELECT pgkvx.arrow_query('SELECT * FROM kv', 10) LIMIT 2")) == 2
        conn.execute("DECLARE c CURSOR FOR SELECT pgkvx.arrow_scan('kv', batch_rows => 10)")
        conn.execute("FETCH 3 FROM c")
        conn.execute("CLOSE c")
        conn.execute("DECLARE q CURSOR FOR SELECT pgkvx.arrow_query('SELECT * FROM kv', 10)")
        conn.execute("FETCH 3 FROM q")
        conn.execute("CLOSE q")
        # left open: dropped at commit
        conn.execute("DECLARE c2 CURSOR FOR SELECT pgkvx.arrow_scan('kv', batch_rows => 10)")
        conn.execute("FETCH 1 FROM c2")
        conn.execute("DECLARE q2 CURSOR FOR SELECT pgkvx.arrow_query('SELECT * FROM kv', 10)")
        conn.execute("FETCH 1 FROM q2")
    # A pin, relcache reference or snapshot not given back would be reported
    # as a leak WARNING at commit.
    assert not [n for n in notices if "leak" in n.lower() or "not closed" in n.lower()], notices
    conn.execute("SELECT 1")


def test_cursor_fetch_in_pieces_gives_the_whole_stream(conn, kv):
    with conn.transaction():
        conn.execute("DECLARE c CURSOR FOR SELECT pgkvx.arrow_scan('kv', batch_rows => 128)")
        parts = []
        cur = conn.cursor(binary=True)
        while True:
            rows = cur.execute("FETCH 2 FROM c").fetchall()
            if not rows:
                break
            parts.extend(bytes(r[0]) for r in rows)
    assert read_pyarrow(b"".join(parts)).column("k").to_pylist() == list(range(1, 1001))


def test_statement_timeout_cancels_a_long_scan(conn):
    conn.execute("CREATE TABLE slowish AS SELECT g::int8 AS k FROM generate_series(1, 300000) g")
    conn.execute("ALTER TABLE slowish ADD PRIMARY KEY (k)")
    conn.execute("SET statement_timeout = '5ms'")
    try:
        with pytest.raises(psycopg.errors.QueryCanceled):
            chunks(conn, "SELECT pgkvx.arrow_scan('slowish', batch_rows => 1000000)")
    finally:
        conn.execute("RESET statement_timeout")
    assert scan(conn, "slowish", max_rows=3).column("k").to_pylist() == [1, 2, 3]


def test_wrong_relation_kinds_are_refused(conn, kv):
    conn.execute("CREATE VIEW kv_view AS SELECT * FROM kv")
    with pytest.raises(psycopg.errors.WrongObjectType) as e:
        scan(conn, "kv_view")
    assert "arrow_query" in e.value.diag.message_hint
    conn.execute("CREATE MATERIALIZED VIEW kv_mat AS SELECT k, s FROM kv WITH NO DATA")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        scan(conn, "kv_mat")
    conn.execute("REFRESH MATERIALIZED VIEW kv_mat")
    assert scan(conn, "kv_mat").num_rows == 1000


def test_no_internal_name_lookup_through_search_path(conn, kv):
    conn.execute("CREATE SCHEMA IF NOT EXISTS evil")
    conn.execute("CREATE TABLE IF NOT EXISTS evil.kv (k int PRIMARY KEY)")
    conn.execute("SET search_path = ''")
    try:
        assert scan(conn, "public.kv", columns=["k"], lower="1", upper="3").column("k").to_pylist() == [1, 2]
        assert query(conn, "SELECT count(*) AS n FROM public.kv").column("n").to_pylist() == [1000]
        conn.execute("SET search_path = evil, public")
        # the caller's regclass decides; the extension looks nothing up by name
        assert scan(conn, "public.kv", columns=["k"], max_rows=1).column("k").to_pylist() == [1]
    finally:
        conn.execute("RESET search_path")


# --- privileges and row level security --------------------------------------


@pytest.fixture(scope="module")
def secured(db):
    with connect(db) as c:
        c.execute("DROP ROLE IF EXISTS arrow_reader")
        c.execute("CREATE ROLE arrow_reader")
        c.execute("GRANT USAGE ON SCHEMA pgkvx TO arrow_reader")
        c.execute("CREATE TABLE sec (k int PRIMARY KEY, pub text, secret text)")
        c.execute("INSERT INTO sec SELECT g, 'p' || g, 's' || g FROM generate_series(1, 10) g")
        c.execute("GRANT SELECT (k, pub) ON sec TO arrow_reader")
        c.execute("CREATE TABLE keyless_grant (k int PRIMARY KEY, pub text)")
        c.execute("INSERT INTO keyless_grant VALUES (1, 'x')")
        c.execute("GRANT SELECT (pub) ON keyless_grant TO arrow_reader")
        c.execute("CREATE TABLE rls (k int PRIMARY KEY, owner_name text, v int)")
        c.execute("INSERT INTO rls SELECT g, CASE WHEN g % 2 = 0 THEN 'arrow_reader' ELSE 'other' END, g"
                  " FROM generate_series(1, 10) g")
        c.execute("ALTER TABLE rls ENABLE ROW LEVEL SECURITY")
        c.execute("CREATE POLICY mine ON rls FOR SELECT USING (owner_name = current_user)")
        c.execute("GRANT SELECT ON rls TO arrow_reader")
    yield db
    with connect(db) as c:
        c.execute("DROP OWNED BY arrow_reader")
        c.execute("DROP ROLE arrow_reader")


@pytest.fixture
def reader(secured):
    with connect(secured) as c:
        c.execute("SET ROLE arrow_reader")
        yield c


def test_column_privileges_are_checked(reader):
    t = scan(reader, "sec", columns=["k", "pub"])
    assert t.column("pub").to_pylist()[:2] == ["p1", "p2"]
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
        scan(reader, "sec", columns=["pub", "secret"])
    assert "secret" in (e.value.diag.message_detail or "")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        scan(reader, "sec")  # all columns
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        query(reader, "SELECT secret FROM sec")
    assert query(reader, "SELECT pub FROM sec ORDER BY k").num_rows == 10


def test_key_columns_need_select_because_the_scan_orders_by_them(reader):
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
        scan(reader, "keyless_grant", columns=["pub"])
    assert '"k"' in (e.value.diag.message_detail or "")


def test_no_privilege_at_all(secured):
    with connect(secured) as c:
        c.execute("CREATE TABLE IF NOT EXISTS hidden (k int PRIMARY KEY)")
        c.execute("SET ROLE arrow_reader")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            scan(c, "hidden")


def test_rls_refused_by_arrow_scan_and_applied_by_arrow_query(reader):
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row level security") as e:
        scan(reader, "rls")
    assert "arrow_query" in (e.value.diag.message_hint or "")
    t = query(reader, "SELECT k, v FROM rls ORDER BY k")
    assert t.column("k").to_pylist() == [2, 4, 6, 8, 10]
    reader.execute("SET row_security = off")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        scan(reader, "rls")


def test_rls_does_not_apply_to_the_owner(secured):
    with connect(secured) as c:
        assert scan(c, "rls").num_rows == 10


def test_rls_forced_on_the_owner_is_refused(secured):
    with connect(secured) as c:
        c.execute("CREATE TABLE rls_own (k int PRIMARY KEY, v int)")
        c.execute("INSERT INTO rls_own VALUES (1, 1), (2, -1)")
        c.execute("ALTER TABLE rls_own OWNER TO arrow_reader")
        c.execute("SET ROLE arrow_reader")
        c.execute("CREATE POLICY pos ON rls_own USING (v > 0)")
        c.execute("ALTER TABLE rls_own ENABLE ROW LEVEL SECURITY")
        assert scan(c, "rls_own").num_rows == 2  # owner, not forced
        c.execute("ALTER TABLE rls_own FORCE ROW LEVEL SECURITY")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row level security"):
            scan(c, "rls_own")
        assert query(c, "SELECT k FROM rls_own").column("k").to_pylist() == [1]


@pytest.mark.parametrize("fn", ["arrow_scan('sp', batch_rows => 10)",
                                "arrow_query('SELECT * FROM sp ORDER BY k', 10)"])
@pytest.mark.parametrize("close", [True, False])
def test_cursor_failing_inside_a_rolled_back_savepoint(conn, fn, close):
    """The cursor's resources are released by the savepoint's abort; closing
    the failed cursor later (or committing with it open) must not release
    them again."""
    conn.execute("CREATE TABLE IF NOT EXISTS sp (k int PRIMARY KEY, d date)")
    conn.execute("TRUNCATE sp")
    conn.execute("INSERT INTO sp SELECT g, '2020-01-01' FROM generate_series(1, 100) g")
    conn.execute("INSERT INTO sp VALUES (1000, 'infinity')")
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    with conn.transaction():
        conn.execute(f"DECLARE c CURSOR FOR SELECT pgkvx.{fn}")
        conn.execute("FETCH 2 FROM c")
        with pytest.raises(psycopg.errors.DatetimeFieldOverflow):
            with conn.transaction():
                conn.execute("FETCH ALL FROM c")
        if close:
            conn.execute("CLOSE c")
        assert scan(conn, "sp", columns=["k"], max_rows=3).column("k").to_pylist() == [1, 2, 3]
    assert conn.execute("SELECT 1").fetchone() == (1,)
    assert not [n for n in notices if "leak" in n.lower() or "not closed" in n.lower()], notices


# --- arrow_scan's own heap fetch and deforming against the executor ---------


@pytest.mark.parametrize("vacuumed", [False, True])
@pytest.mark.parametrize("physical", ["clustered", "shuffled"])
def test_scan_matches_the_executor_on_a_table_with_history(conn, table_name, physical, vacuumed):
    """arrow_scan reads heap pages itself and deforms tuples without a slot
    (src/arrow/fetch.rs): every alignment, NULL pattern, varlena header (1
    and 4 bytes, TOASTed), fixed-offset shortcut,
    attribute added after the row was written (with and without a default),
    HOT and non-HOT updates and deletes must read exactly as the executor
    reads them (arrow_query over ORDER BY k), on tables whose heap follows
    the key and on tables whose heap does not.  Vacuumed, most pages are
    all-visible (read without visibility checks) and hold pruned HOT chains
    (redirect line pointers); a few are changed again afterwards."""
    t = table_name
    conn.execute(f"""CREATE TABLE {t} (k int8 PRIMARY KEY, c "char", b bool, s int2, t1 text, i int4,
                     n name, f float8, t2 varchar(30), d date, g text, x numeric) WITH (fillfactor = 60)""")
    order = "1" if physical == "clustered" else "(q * 7919) % 3001"
    conn.execute(f"""INSERT INTO {t}
        SELECT q, chr(65 + q % 26)::"char", CASE WHEN q % 5 = 0 THEN NULL ELSE q % 2 = 0 END, (q % 300)::int2,
               CASE WHEN q % 7 = 0 THEN NULL WHEN q % 11 = 0 THEN repeat('long', 40) ELSE 'v' || q END,
               CASE WHEN q % 3 = 0 THEN NULL ELSE q END, ('n' || q)::name, q / 4.0,
               CASE WHEN q % 13 = 0 THEN NULL ELSE 'w' || q END, date '2000-01-01' + q,
               CASE WHEN q % 17 = 0 THEN repeat(md5(q::text), 200) ELSE '' END, q * 1.5
          FROM generate_series(1, 3000) q ORDER BY {order}""")
    conn.execute(f"ALTER TABLE {t} ADD COLUMN m1 int DEFAULT 7, ADD COLUMN m2 text DEFAULT 'dflt', ADD COLUMN m3 int8")
    conn.execute(f"INSERT INTO {t} (k, c, s, n, f, d, m1, m2, m3) SELECT q, 'z', 1, 'late', 0.5, '1999-01-01', q, NULL, q"
                 f" FROM generate_series(3001, 3100) q")
    # HOT (no indexed column changes; the fill factor leaves room on the page)
    conn.execute(f"UPDATE {t} SET t1 = 'hot ' || k WHERE k % 10 = 1")
    assert count_items(conn, t, "i.t_infomask2 & 32768 <> 0") > 0  # HEAP_ONLY_TUPLE
    conn.execute(f"UPDATE {t} SET k = k + 100000 WHERE k % 97 = 0")           # non-HOT: new index entries
    conn.execute(f"DELETE FROM {t} WHERE k % 89 = 0")
    if vacuumed:
        conn.execute(f"VACUUM {t}")
        # redirects on all-visible pages
        assert count_items(conn, t, "i.lp_flags = 2 AND (page_header(get_raw_page(%s, b::int))).flags & 4 <> 0") > 0
        conn.execute(f"UPDATE {t} SET t2 = 'after vacuum ' || k WHERE k BETWEEN 2000 AND 2010")       # HOT
        conn.execute(f"UPDATE {t} SET k = k + 200000 WHERE k BETWEEN 2500 AND 2505")                 # non-HOT
        assert conn.execute(f"SELECT relallvisible FROM pg_class WHERE oid = '{t}'::regclass").fetchone()[0] > 0
    cols = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped"
        " ORDER BY attnum", (t,))]
    # (k, c, b, s and the first varlena t1 sit at fixed offsets: read
    # directly when no NULL precedes them, walked otherwise)
    for proj in (None, ["k"], ["s", "b"], ["t1", "c", "s"], ["c", "x"], ["m2", "t1", "k"], ["d", "m1"], ["m3"]):
        got = scan(conn, t, columns=proj, batch_rows=700)
        want = query(conn, f"SELECT {', '.join(proj or cols)} FROM {t} ORDER BY k")
        assert got.num_rows == 3100 - len(range(89, 3101, 89))
        same(got, want)
    same(scan(conn, t, columns=["k", "t1"], lower="500", upper="1500"),
         query(conn, f"SELECT k, t1 FROM {t} WHERE k >= 500 AND k < 1500 ORDER BY k"))


def count_items(conn, t, where):
    """Line pointers of table `t` matching `where` (over pageinspect's
    heap_page_items `i` of page `b`; `%s` is the table's name)."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
    return conn.execute(f"""
        SELECT count(*) FROM generate_series(0, pg_relation_size(%s) / 8192 - 1) b,
               LATERAL heap_page_items(get_raw_page(%s, b::int)) i
         WHERE {where}""", (t, t) + ((t,) if "%s" in where else ())).fetchone()[0]


def same(got: pa.Table, want: pa.Table):
    """Same columns, types and values (arrow_query cannot know NOT NULL)."""
    assert got.column_names == want.column_names
    for name in got.column_names:
        assert got.column(name).type == want.column(name).type, name
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
