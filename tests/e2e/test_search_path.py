"""Every entry point: no SQL pgkvx runs resolves a name
through the caller's search_path.  A role with CREATE on a schema searched
before pg_catalog plants exact-match operators and functions named like
pg_catalog's; then superuser and a non-superuser table owner call every
entry point of pgkvx with that search_path.  Each planted object records
that it ran (and as whom) into hostile.fired, then behaves like the real
one, so a call that ran one would still succeed: only the record shows it.
security.sql plants a few of these for enable/insert/read/check/disable;
this covers latch_span, key_bytes, next_key, arrow_scan, arrow_query, the
views, stats(), TRUNCATE, DROP TABLE, DROP/CREATE EXTENSION and ALTER
EXTENSION UPDATE, with a wider set of plants."""
import psycopg
import pytest

from conftest import connect

# Exact-match operators a query over regclass/oid/name/text/int2[] columns
# or parameters would pick from the first schema on the search_path.
OPERATORS = [
    ("=", "regclass", "oid"), ("=", "oid", "regclass"), ("=", "regclass", "regclass"),
    ("=", "oid", "oid"), ("=", "text", "text"), ("=", "name", "name"), ("=", "name", "text"),
    ("=", "text", "name"), ("=", "int2", "int2"), ("=", "int4", "int4"), ("=", "int8", "int8"),
    ("=", "bool", "bool"), ("=", '"char"', '"char"'), ("=", "int2[]", "int2[]"),
    ("=", "regnamespace", "regnamespace"), ("=", "regproc", "regproc"),
    ("<>", "oid", "oid"), ("<>", "text", "text"), ("<>", '"char"', '"char"'), ("<>", "name", "name"),
    (">", "name", "text"), ("&", "int2", "int4"), ("||", "text", "text"),
]
# Functions named like pg_catalog's that pgkvx's SQL (its own or pgrx's)
# could call unqualified: name, argument types, result type.
FUNCTIONS = [
    ("format", ["text"], "text"), ("format", ["text", "text"], "text"),
    ("format", ["text", "text", "text"], "text"),
    ("quote_ident", ["text"], "text"), ("quote_literal", ["text"], "text"),
    ("quote_nullable", ["text"], "text"), ("to_regclass", ["text"], "regclass"),
    ("nextval", ["regclass"], "int8"), ("currval", ["regclass"], "int8"),
    ("setval", ["regclass", "int8"], "int8"), ("pg_get_serial_sequence", ["text", "text"], "text"),
    ("current_setting", ["text"], "text"), ("set_config", ["text", "text", "bool"], "text"),
    ("now", [], "timestamptz"), ("clock_timestamp", [], "timestamptz"),
    ("pg_has_role", ["oid", "text"], "bool"), ("has_table_privilege", ["oid", "text"], "bool"),
    ("has_table_privilege", ["text", "text"], "bool"), ("lower", ["text"], "text"),
    ("length", ["text"], "int4"), ("cardinality", ["int2[]"], "int4"),
    ("pg_backend_pid", [], "int4"), ("pg_extension_config_dump", ["regclass", "text"], "void"),
    ("array_to_string", ["text[]", "text"], "text"), ("pg_get_expr", ["pg_node_tree", "oid"], "text"),
]


def plant(c):
    c.execute("CREATE SCHEMA hostile AUTHORIZATION pgkvx_sp_mallory")
    c.execute("GRANT USAGE ON SCHEMA hostile TO PUBLIC")
    c.execute("SET ROLE pgkvx_sp_mallory")
    c.execute("CREATE TABLE hostile.fired (what text, who text)")
    c.execute("GRANT INSERT, SELECT ON hostile.fired TO PUBLIC")
    for i, (op, l, r) in enumerate(OPERATORS):
        label = f"{op}({l}, {r})".replace('"', "")
        ret = "boolean" if op in ("=", "<>", ">") else l
        c.execute(f"""CREATE FUNCTION hostile.op_{i}(a {l}, b {r}) RETURNS {ret} LANGUAGE plpgsql AS $$ BEGIN
                        INSERT INTO hostile.fired VALUES ('{label}', current_user);
                        RETURN a OPERATOR(pg_catalog.{op}) b; END $$""")
        c.execute(f"CREATE OPERATOR hostile.{op} (LEFTARG = {l}, RIGHTARG = {r}, FUNCTION = hostile.op_{i})")
    for name, args, ret in FUNCTIONS:
        params = ", ".join(f"a{j} {t}" for j, t in enumerate(args))
        call = ", ".join(f"a{j}" for j in range(len(args)))
        body = "PERFORM" if ret == "void" else "RETURN"
        c.execute(f"""CREATE FUNCTION hostile.{name}({params}) RETURNS {ret} LANGUAGE plpgsql AS $$ BEGIN
                        INSERT INTO hostile.fired VALUES ('{name}', current_user);
                        {body} pg_catalog.{name}({call}); END $$""")
    c.execute("RESET ROLE")


def fired(c):
    return c.execute("SELECT what, who FROM hostile.fired ORDER BY 1, 2").fetchall()


HOSTILE_PATH = "SET search_path = hostile, pg_catalog, public"


@pytest.fixture
def planted(db):
    with connect(db) as c:
        c.execute("DROP ROLE IF EXISTS pgkvx_sp_mallory")
        c.execute("DROP ROLE IF EXISTS pgkvx_sp_alice")
        c.execute("CREATE ROLE pgkvx_sp_mallory")
        c.execute("CREATE ROLE pgkvx_sp_alice")
        c.execute("GRANT CREATE ON SCHEMA public TO pgkvx_sp_alice")
        plant(c)
        # The plants work: an unqualified use under this search_path runs them.
        c.execute(HOSTILE_PATH)
        c.execute("SELECT 'a'::text = 'a'::text, format('%s', 'x'), quote_ident('x'), 1::oid = 1::oid")
        assert {w for w, _ in fired(c)} >= {"=(text, text)", "format", "quote_ident", "=(oid, oid)"}, fired(c)
        c.execute("DELETE FROM hostile.fired")
    yield db
    with connect(db) as c:
        c.execute("DROP SCHEMA IF EXISTS hostile CASCADE")
        c.execute("DROP TABLE IF EXISTS public.sp_events, public.sp_kv, public.sp_alice CASCADE")
        c.execute("REVOKE ALL ON SCHEMA public FROM pgkvx_sp_alice")
        c.execute("DROP OWNED BY pgkvx_sp_alice")
        c.execute("DROP ROLE IF EXISTS pgkvx_sp_mallory")
        c.execute("DROP ROLE IF EXISTS pgkvx_sp_alice")


class Checked:
    """A connection whose every statement is followed by the check that no
    planted object ran, naming the statement that ran one."""

    def __init__(self, c):
        self.c = c

    def check(self, what):
        got = fired(self.c)
        assert got == [], (what, got)

    def execute(self, sql, params=None):
        cur = self.c.execute(sql, params)
        rows = cur.fetchall() if cur.description else None
        self.check(sql)
        return rows

    def transaction(self):
        return self.c.transaction()


def arrow(c, sql, params=()):
    out = b"".join(bytes(r[0]) for r in c.c.cursor(binary=True).execute(sql, params))
    c.check(sql)
    return out


def exercise(c, events, kv):
    """Every entry point on a gapless table `events` and a keyed table `kv`
    the session's role owns, under the session's (hostile) search_path."""
    c = Checked(c)
    c.execute(f"CREATE TABLE public.{events} (id bigserial PRIMARY KEY, v text)")
    c.execute(f"CREATE TABLE public.{kv} (k int PRIMARY KEY, v text)")
    c.execute("SELECT pgkvx.enable(%s, gapless => true)", (f"public.{events}",))
    c.execute("SELECT pgkvx.enable(%s)", (f"public.{kv}",))
    c.execute(f"INSERT INTO public.{events} (v) VALUES ('a'), ('b')")
    c.execute(f"INSERT INTO public.{kv} SELECT g, 'v' FROM generate_series(1, 20) g")
    c.execute(f"UPDATE public.{kv} SET k = 100 WHERE k OPERATOR(pg_catalog.=) 20")
    c.execute(f"DELETE FROM public.{kv} WHERE k OPERATOR(pg_catalog.=) 19")
    with c.transaction():
        c.execute("SELECT pgkvx.latch_span(%s, '1', '10')", (f"public.{kv}",))
        c.execute("SELECT pgkvx.latch_span(%s, NULL, NULL)", (f"public.{kv}",))
        c.execute("SELECT pgkvx.next_key(%s)", (f"public.{events}",))
        assert c.execute("SELECT count(*) FROM pgkvx.latch_list(true)")[0][0] > 0
        c.execute("SELECT * FROM pgkvx.latches")
        c.execute("SELECT * FROM pgkvx.ranges")
        c.execute("SELECT * FROM pgkvx.stats()")
    assert c.execute("SELECT pgkvx.key_bytes(%s, '5')", (f"public.{kv}",))[0][0]
    for mode in ("optimistic", "fenced"):
        c.execute(f"SET pgkvx.scan_mode = {mode}")
        assert c.execute(f"SELECT k FROM public.{kv} WHERE k > 2 ORDER BY k LIMIT 2") == [(3,), (4,)]
        assert arrow(c, "SELECT pgkvx.arrow_scan(%s, '{k,v}', lower => '3', upper => '9', max_rows => 3)",
                     (f"public.{kv}",))
        assert arrow(c, "SELECT pgkvx.arrow_scan(%s)", (f"public.{events}",))
    c.execute("RESET pgkvx.scan_mode")
    assert arrow(c, f"SELECT pgkvx.arrow_query('SELECT k, v FROM public.{kv}')")
    c.execute("SELECT * FROM pgkvx.check()")
    c.execute(f"TRUNCATE public.{kv}")
    c.execute("SELECT pgkvx.disable(%s)", (f"public.{kv}",))
    c.execute("SELECT pgkvx.enable(%s)", (f"public.{kv}",))
    c.execute(f"DROP TABLE public.{kv}")  # the sql_drop event trigger


def test_no_entry_point_runs_planted_objects(planted):
    db = planted
    with connect(db) as c:
        c.execute(HOSTILE_PATH)
        exercise(c, "sp_events", "sp_kv")
    # A table owner who is not a superuser.
    with connect(db) as c:
        c.execute("SET ROLE pgkvx_sp_alice")
        c.execute(HOSTILE_PATH)
        exercise(c, "sp_alice", "sp_alice_kv")
        c.execute("RESET ROLE")


def test_extension_drop_create_and_update_run_no_planted_objects(planted):
    db = planted
    with connect(db) as raw:
        raw.execute(HOSTILE_PATH)
        c = Checked(raw)
        c.execute("CREATE TABLE public.sp_events (id bigserial PRIMARY KEY, v text)")
        c.execute("SELECT pgkvx.enable('public.sp_events', gapless => true)")
        c.execute("INSERT INTO public.sp_events (v) VALUES ('a')")
        # The DROP EXTENSION event trigger gives the gapless table its
        # sequence default back.
        c.execute("DROP EXTENSION pgkvx CASCADE")
        c.execute("INSERT INTO public.sp_events (v) VALUES ('after drop')")
        c.execute("CREATE EXTENSION pgkvx")
        c.execute("SELECT pgkvx.enable('public.sp_events', gapless => true)")
        c.execute("INSERT INTO public.sp_events (v) VALUES ('b')")
        # The upgrade path: 0.1.0 installed and used, then updated, all
        # under the hostile search_path.
        c.execute("DROP EXTENSION pgkvx CASCADE")
        c.execute("CREATE EXTENSION pgkvx VERSION '0.1.0'")
        c.execute("SELECT pgkvx.enable('public.sp_events', gapless => true)")
        c.execute("INSERT INTO public.sp_events (v) VALUES ('c')")
        c.execute("ALTER EXTENSION pgkvx UPDATE")
        assert c.execute("SELECT extversion FROM pg_extension WHERE extname OPERATOR(pg_catalog.=) 'pgkvx'") == [("0.2.0",)]
        c.execute("INSERT INTO public.sp_events (v) VALUES ('d')")
        assert len(c.execute("SELECT id FROM public.sp_events WHERE id > 0 ORDER BY id LIMIT 10")) == 5
        c.execute("SELECT * FROM pgkvx.check()")
        c.execute("DROP TABLE public.sp_events")
