"""Tenants cannot hurt each other through the latch table: each writing role
(the role SET ROLE reached) is held to its own budget however its
transactions escalate and regrow, a span latch needs more than INSERT and
is refused where row-level security applies, and a write that never
happened (refused by a policy, rolled back to a savepoint) holds no latch."""
import psycopg
import pytest

from conftest import connect

def make_role(c, name, *opts):
    """(Re)creates role `name`, dropping what a killed earlier run left."""
    if c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
        c.execute(f"DROP OWNED BY {name} CASCADE")
        c.execute(f"DROP ROLE {name}")
    c.execute(f"CREATE ROLE {name} {' '.join(opts)}")


@pytest.fixture
def roles(db):
    """Creates roles by name for one test; drops them and what they own after."""
    made = []

    def make(name, *opts):
        with connect(db) as c:
            make_role(c, name, *opts)
        made.append(name)
        return name

    yield make
    with connect(db) as c:
        for name in reversed(made):
            c.execute(f"DROP OWNED BY {name} CASCADE")
            c.execute(f"DROP ROLE {name}")


def latch_entries(c, pids):
    return c.execute("SELECT count(*) FROM pgkvx.latches WHERE holder_pid = ANY(%s)", (list(pids),)).fetchone()[0]


def pid(c):
    return c.execute("SELECT pg_backend_pid()").fetchone()[0]


def test_a_roles_budget_holds_when_its_transactions_escalate_and_regrow(db, roles):
    """Nine sessions of one role each escalate a table (its count drops to
    one entry) and then regrow as many point latches on another: the role's
    total must stay within its budget plus 64 per session."""
    bulk = roles("pgkvx_bulk", "LOGIN")
    budget, sessions_n = 600, 9
    with connect(db) as c:
        # Escalation at min(1024, 1000 / 2) = 500 points per table.
        c.execute(f"ALTER ROLE {bulk} SET pgkvx.max_latches_per_role = {budget}")
        c.execute(f"ALTER ROLE {bulk} SET pgkvx.max_latches_per_transaction = 1000")
        for i in range(sessions_n):
            for side in "ab":
                c.execute(f"DROP TABLE IF EXISTS esc_{side}{i}")
                c.execute(f"CREATE TABLE esc_{side}{i} (k int PRIMARY KEY)")
                c.execute("SELECT pgkvx.enable(%s)", (f"esc_{side}{i}",))
                c.execute(f"GRANT INSERT ON esc_{side}{i} TO {bulk}")
        c.execute("DROP TABLE IF EXISTS esc_victim")
        c.execute("CREATE TABLE esc_victim (k int PRIMARY KEY)")
        c.execute("SELECT pgkvx.enable('esc_victim')")
    sessions = [connect(db, user=bulk, autocommit=False) for _ in range(sessions_n)]
    pids = [pid(s) for s in sessions]
    refused = []
    try:
        # Climb to the escalation point (looked at on the way while the
        # others hold little), escalate to one span...
        for i, s in enumerate(sessions):
            s.execute(f"INSERT INTO esc_a{i} SELECT g FROM generate_series(1, 500) g")
        # ...then regrow below the old high-water mark.
        for i, s in enumerate(sessions):
            try:
                s.execute(f"INSERT INTO esc_b{i} SELECT g FROM generate_series(1, 499) g")
            except psycopg.errors.ConfigurationLimitExceeded as e:
                assert "max_latches_per_role" in str(e), e
                refused.append(i)
                s.rollback()
        with connect(db) as c:
            held = latch_entries(c, pids)
            assert held <= budget + 64 * sessions_n, \
                f"one role's {sessions_n} sessions hold {held} latch entries (budget {budget})"
            # Another role writes as usual meanwhile.
            c.execute("INSERT INTO esc_victim SELECT g FROM generate_series(1, 1000) g")
    finally:
        for s in sessions:
            s.close()
    with connect(db) as c:
        c.execute("DROP TABLE esc_victim, " + ", ".join(f"esc_{side}{i}" for i in range(sessions_n) for side in "ab"))


def test_tenants_behind_one_login_have_budgets_of_their_own(db, roles):
    """A pooler logs in once and reaches each tenant by SET ROLE: each
    tenant is charged for its own latches, and a SECURITY DEFINER function
    charges the role that called it, not the function's owner."""
    pool = roles("pgkvx_pool", "LOGIN")
    ta, tb, td = roles("pgkvx_ta"), roles("pgkvx_tb"), roles("pgkvx_td")
    definer = roles("pgkvx_definer")
    with connect(db) as c:
        c.execute(f"ALTER ROLE {pool} SET pgkvx.max_latches_per_role = 100")
        c.execute(f"GRANT {ta}, {tb}, {td} TO {pool}")
        for t, r in [("bud_a", ta), ("bud_b", tb), ("bud_def", definer)]:
            c.execute(f"DROP TABLE IF EXISTS {t}")
            c.execute(f"CREATE TABLE {t} (k int PRIMARY KEY)")
            c.execute("SELECT pgkvx.enable(%s)", (t,))
            c.execute(f"GRANT INSERT ON {t} TO {r}")
        c.execute("""CREATE OR REPLACE FUNCTION public.bud_fill(lo int, n int) RETURNS void
                     LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
                     AS $$ INSERT INTO public.bud_def SELECT g FROM generate_series(lo, lo + n - 1) g $$""")
        c.execute(f"ALTER FUNCTION public.bud_fill(int, int) OWNER TO {definer}")
    s = [connect(db, user=pool, autocommit=False) for _ in range(4)]
    try:
        # Tenant A holds its whole budget in an open transaction.
        s[0].execute(f"SET ROLE {ta}")
        s[0].execute("INSERT INTO bud_a SELECT g FROM generate_series(1, 100) g")
        # Tenant B, through the same login, is not charged for it.
        s[1].execute(f"SET ROLE {tb}")
        s[1].execute("INSERT INTO bud_b SELECT g FROM generate_series(1, 100) g")
        # Tenant A calling the owner's function is charged as A: over.
        s[2].execute(f"SET ROLE {ta}")
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded) as e:
            s[2].execute("SELECT public.bud_fill(1, 100)")
        assert "max_latches_per_role" in str(e.value)
        s[2].rollback()
        # Tenant D calling it is charged as D, who holds nothing.
        s[3].execute(f"SET ROLE {td}")
        s[3].execute("SELECT public.bud_fill(1001, 100)")
        for c in s:
            c.commit()
    finally:
        for c in s:
            c.close()
    with connect(db) as c:
        assert c.execute("SELECT count(*) FROM bud_def").fetchone()[0] == 100
        c.execute("DROP FUNCTION public.bud_fill(int, int)")
        c.execute("DROP TABLE bud_a, bud_b, bud_def")


@pytest.fixture
def rls_table(db, roles):
    """A latched table whose rows belong to tenants (row-level security),
    with tenant b's rows at keys 100..200 step 10; yields (a, b)."""
    a, b = roles("pgkvx_rls_a", "LOGIN"), roles("pgkvx_rls_b", "LOGIN")
    with connect(db) as c:
        c.execute("DROP TABLE IF EXISTS rls_t")
        c.execute("CREATE TABLE rls_t (k int PRIMARY KEY, tenant name NOT NULL DEFAULT current_user, v text)")
        c.execute("SELECT pgkvx.enable('rls_t')")
        c.execute("ALTER TABLE rls_t ENABLE ROW LEVEL SECURITY")
        c.execute("CREATE POLICY own ON rls_t USING (tenant = current_user) WITH CHECK (tenant = current_user)")
        c.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON rls_t TO {a}, {b}")
        c.execute(f"INSERT INTO rls_t (k, tenant) SELECT g, '{b}' FROM generate_series(100, 200, 10) g")
    yield a, b
    with connect(db) as c:
        c.execute("DROP TABLE IF EXISTS rls_t")


def test_latch_span_is_refused_where_row_security_applies(db, rls_table):
    a, _ = rls_table
    with connect(db, user=a, autocommit=False) as c:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
            c.execute("SELECT pgkvx.latch_span('rls_t', NULL, NULL)")
        assert "row-level security" in str(e.value), e.value
        c.rollback()
        assert latch_entries(c, [pid(c)]) == 0
    # The owner, to whom no policy applies, still may.
    with connect(db, autocommit=False) as c:
        c.execute("SELECT pgkvx.latch_span('rls_t', NULL, NULL)")
        c.rollback()


def test_a_write_refused_by_row_security_holds_no_latch(db, rls_table):
    """Tenant a tries ten times to insert a key among b's rows, each in a
    savepoint that the policy's WITH CHECK refuses (42501), then idles with
    its transaction open: b's reads of its own rows must not wait for a."""
    a, b = rls_table
    with connect(db, user=a, autocommit=False) as ca, connect(db, user=b) as cb, connect(db) as su:
        ca.execute("INSERT INTO rls_t (k) VALUES (5)")  # a's own row, latched in the parent
        for _ in range(10):
            ca.execute("SAVEPOINT s")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                ca.execute("INSERT INTO rls_t (k, tenant) VALUES (150, %s)", (b,))
            ca.execute("ROLLBACK TO SAVEPOINT s")
        # A hang guard, not a timing expectation: a read stalled behind a
        # runs into it (57014) rather than hanging the test.
        cb.execute("SET statement_timeout = '30s'")
        got = [k for (k,) in cb.execute("SELECT k FROM rls_t WHERE k >= 100 ORDER BY k LIMIT 50")]
        assert got == list(range(100, 201, 10))
        spans = [r[0] for r in su.execute(
            "SELECT span FROM pgkvx.latches WHERE holder_pid = %s ORDER BY span", (pid(ca),))]
        assert spans == ["[5]"], f"a holds latches {spans}"
        ca.rollback()


def test_a_rollback_to_savepoint_keeps_the_parents_latch_on_the_same_key(db, rls_table):
    a, _ = rls_table
    with connect(db, user=a, autocommit=False) as ca, connect(db) as su:
        ca.execute("INSERT INTO rls_t (k) VALUES (5), (7)")
        ca.execute("SAVEPOINT s")
        ca.execute("UPDATE rls_t SET v = 'x' WHERE k = 5")  # latches 5 again, inside s
        ca.execute("INSERT INTO rls_t (k) VALUES (9)")
        ca.execute("ROLLBACK TO SAVEPOINT s")
        spans = sorted(r[0] for r in su.execute(
            "SELECT span FROM pgkvx.latches WHERE holder_pid = %s", (pid(ca),)))
        assert spans == ["[5]", "[7]"], spans
        # Written again after the rollback: latched again.
        ca.execute("INSERT INTO rls_t (k) VALUES (9)")
        spans = sorted(r[0] for r in su.execute(
            "SELECT span FROM pgkvx.latches WHERE holder_pid = %s", (pid(ca),)))
        assert spans == ["[5]", "[7]", "[9]"], spans
        ca.rollback()


def test_latch_span_needs_update_delete_or_truncate(db, roles):
    """A span latch stalls every reader of the span: INSERT alone does not
    allow it (LOCK TABLE in a mode that blocks readers asks the same)."""
    names = {p: roles(f"pgkvx_priv_{p.lower()}", "LOGIN") for p in ["INSERT", "UPDATE", "DELETE", "TRUNCATE"]}
    with connect(db) as c:
        c.execute("DROP TABLE IF EXISTS priv_t")
        c.execute("CREATE TABLE priv_t (k int PRIMARY KEY)")
        c.execute("SELECT pgkvx.enable('priv_t')")
        for p, r in names.items():
            c.execute(f"GRANT SELECT, {p} ON priv_t TO {r}")
    try:
        with connect(db, user=names["INSERT"], autocommit=False) as c:
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
                c.execute("SELECT pgkvx.latch_span('priv_t', '10', '20')")
            assert "UPDATE, DELETE or TRUNCATE" in str(e.value), e.value
            c.rollback()
            assert latch_entries(c, [pid(c)]) == 0
            # Its own rows it still latches, by writing them.
            c.execute("INSERT INTO priv_t VALUES (15)")
            c.rollback()
        for p in ["UPDATE", "DELETE", "TRUNCATE"]:
            with connect(db, user=names[p], autocommit=False) as c:
                c.execute("SELECT pgkvx.latch_span('priv_t', '10', '20')")
                assert latch_entries(c, [pid(c)]) == 1, p
                c.rollback()
    finally:
        with connect(db) as c:
            c.execute("DROP TABLE priv_t")


def test_next_key_needs_insert_or_update(db, roles):
    ro, upd, ins = roles("pgkvx_nk_ro", "LOGIN"), roles("pgkvx_nk_upd", "LOGIN"), roles("pgkvx_nk_ins", "LOGIN")
    with connect(db) as c:
        c.execute("DROP TABLE IF EXISTS nk_t")
        c.execute("CREATE TABLE nk_t (id bigserial PRIMARY KEY, v text)")
        c.execute("SELECT pgkvx.enable('nk_t', gapless => true)")
        c.execute(f"GRANT USAGE, UPDATE ON SEQUENCE nk_t_id_seq TO {ro}, {upd}, {ins}")
        c.execute(f"GRANT SELECT ON nk_t TO {ro}")
        c.execute(f"GRANT SELECT, UPDATE ON nk_t TO {upd}")
        c.execute(f"GRANT INSERT ON nk_t TO {ins}")
        c.execute("INSERT INTO nk_t (v) VALUES ('a')")
    try:
        with connect(db, user=ro, autocommit=False) as c:
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
                c.execute("SELECT pgkvx.next_key('nk_t')")
            assert "INSERT or UPDATE" in str(e.value), e.value
            c.rollback()
            assert latch_entries(c, [pid(c)]) == 0
        # UPDATE may move a row to a newly drawn key.
        with connect(db, user=upd, autocommit=False) as c:
            c.execute("UPDATE nk_t SET id = pgkvx.next_key('nk_t') WHERE id = 1")
            c.commit()
        with connect(db, user=ins, autocommit=False) as c:
            c.execute("INSERT INTO nk_t (v) VALUES ('b')")
            c.commit()
        with connect(db) as c:
            assert [i for (i,) in c.execute("SELECT id FROM nk_t ORDER BY id")] == [2, 3]
    finally:
        with connect(db) as c:
            c.execute("DROP TABLE nk_t")


def test_next_key_of_a_partition_needs_the_privilege_on_its_parent(db, roles):
    """A partition draws the parent's keys: INSERT on the partition alone is
    not the right to draw (and latch) them."""
    ins = roles("pgkvx_nkp_ins", "LOGIN")
    with connect(db) as c:
        c.execute("DROP TABLE IF EXISTS nkp_t")
        c.execute("""CREATE TABLE nkp_t (id bigserial, at int NOT NULL, PRIMARY KEY (id, at))
                     PARTITION BY RANGE (at)""")
        c.execute("CREATE TABLE nkp_t_1 PARTITION OF nkp_t FOR VALUES FROM (0) TO (100)")
        c.execute("SELECT pgkvx.enable('nkp_t', gapless => true)")
        c.execute(f"GRANT USAGE, UPDATE ON SEQUENCE nkp_t_id_seq TO {ins}")
        c.execute(f"GRANT INSERT ON nkp_t_1 TO {ins}")
    try:
        with connect(db, user=ins, autocommit=False) as c:
            for rel in ("nkp_t", "nkp_t_1"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
                    c.execute("SELECT pgkvx.next_key(%s)", (rel,))
                assert 'table "nkp_t"' in str(e.value), e.value
                c.rollback()
                assert latch_entries(c, [pid(c)]) == 0
    finally:
        with connect(db) as c:
            c.execute("DROP TABLE nkp_t")


def test_attaching_another_roles_table_says_only_must_be_owner(db, roles):
    """ATTACH into a gapless tree of one's own, naming another role's table:
    the answer is PostgreSQL's ownership refusal whatever that table holds
    -- never a message that tells whether it holds rows."""
    owner, other = roles("pgkvx_att_owner", "LOGIN"), roles("pgkvx_att_other", "LOGIN")
    with connect(db) as c:
        c.execute("DROP TABLE IF EXISTS att_t, att_full, att_empty")
        c.execute(f"GRANT CREATE ON SCHEMA public TO {owner}, {other}")
    try:
        with connect(db, user=owner) as c:
            c.execute("""CREATE TABLE att_t (id bigserial, at int NOT NULL, PRIMARY KEY (id, at))
                         PARTITION BY RANGE (at)""")
            c.execute("SELECT pgkvx.enable('att_t', gapless => true)")
        with connect(db, user=other) as c:
            for t in ("att_full", "att_empty"):
                c.execute(f"CREATE TABLE {t} (id bigint NOT NULL, at int NOT NULL, PRIMARY KEY (id, at))")
            c.execute("INSERT INTO att_full VALUES (1, 1)")
        with connect(db, user=owner) as c:
            for t, bounds in (("att_full", "(0) TO (100)"), ("att_empty", "(100) TO (200)")):
                with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
                    c.execute(f"ALTER TABLE att_t ATTACH PARTITION {t} FOR VALUES FROM {bounds}")
                assert "must be owner" in str(e.value), (t, e.value)
    finally:
        with connect(db) as c:
            c.execute("DROP TABLE IF EXISTS att_t, att_full, att_empty")
            c.execute(f"REVOKE CREATE ON SCHEMA public FROM {owner}, {other}")
