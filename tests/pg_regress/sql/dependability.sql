-- What pgkvx must not break or do behind the user's back: whole PL/pgSQL
-- loops over held reads, errors with their CONTEXT, EXPLAIN that runs
-- nothing, trigger functions fired as they were not made to be, and an
-- enable() refusal that names the fix.
SET client_min_messages = notice;
CREATE TABLE dep_ev (id bigserial PRIMARY KEY, p text NOT NULL);
SELECT pgkvx.enable('dep_ev', gapless => true);
INSERT INTO dep_ev (p) SELECT 'e' || g FROM generate_series(1, 120) g;

-- PL/pgSQL fetches 10 rows, then 50 at a time: a held result that ends
-- inside a batch leaves the portal at its end, and the next fetch runs the
-- executor with no movement.  Every limit must give every row.
CREATE FUNCTION dep_loop(lim int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE r record; n bigint := 0; s bigint := 0;
BEGIN
  FOR r IN SELECT id FROM dep_ev WHERE id > 0 ORDER BY id LIMIT lim LOOP
    n := n + 1; s := s + r.id;
  END LOOP;
  RETURN n * 100000 + s;
END $$;
CREATE FUNCTION dep_loop_execute(lim int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE r record; n bigint := 0;
BEGIN
  FOR r IN EXECUTE 'SELECT id FROM dep_ev WHERE id > $1 ORDER BY id LIMIT $2' USING 0, lim LOOP
    n := n + 1;
  END LOOP;
  RETURN n;
END $$;
-- FETCH on past NOT FOUND, as consumers with explicit cursors do.
CREATE FUNCTION dep_fetch_past_end(lim int) RETURNS int LANGUAGE plpgsql AS $$
DECLARE c refcursor; r record; n int := 0; extra int := 0;
BEGIN
  OPEN c FOR SELECT id FROM dep_ev WHERE id > 0 ORDER BY id LIMIT lim;
  LOOP
    FETCH c INTO r;
    EXIT WHEN NOT FOUND;
    n := n + 1;
  END LOOP;
  FOR i IN 1..3 LOOP
    FETCH c INTO r;
    IF FOUND THEN extra := extra + 1; END IF;
  END LOOP;
  CLOSE c;
  RETURN n * 10 + extra;
END $$;
SELECT l, dep_loop(l) = (SELECT count(*) * 100000 + coalesce(sum(id), 0) FROM
                           (SELECT id FROM dep_ev WHERE id > 0 ORDER BY id LIMIT l) t) AS whole,
          dep_loop_execute(l), dep_fetch_past_end(l)
  FROM unnest(ARRAY[0, 1, 5, 9, 10, 11, 25, 49, 50, 51, 60, 61, 119, 120, 200]) l;
SET pgkvx.scan_mode = fenced;
SELECT l, dep_loop_execute(l), dep_fetch_past_end(l) FROM unnest(ARRAY[1, 11, 60]) l;
RESET pgkvx.scan_mode;
-- SQL cursors fetched past the end
BEGIN;
DECLARE dc CURSOR FOR SELECT id FROM dep_ev WHERE id > 100 ORDER BY id LIMIT 3;
FETCH 2 FROM dc;
FETCH 2 FROM dc;
FETCH 2 FROM dc;
FETCH 0 FROM dc;
COMMIT;

-- An error raised inside a held read reaches the client as raised,
-- CONTEXT included, and the session goes on.
CREATE FUNCTION dep_boom(i bigint) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
  IF i = 3 THEN RAISE EXCEPTION 'boom at %', i USING DETAIL = 'row three', HINT = 'it always fails there'; END IF;
  RETURN i;
END $$;
SELECT id, dep_boom(id) FROM dep_ev WHERE id > 0 ORDER BY id LIMIT 5;
SET pgkvx.scan_mode = fenced;
SELECT id, dep_boom(id) FROM dep_ev WHERE id > 0 ORDER BY id LIMIT 5;
RESET pgkvx.scan_mode;
SELECT id FROM dep_ev WHERE id > 0 ORDER BY id LIMIT 2;
CREATE TABLE dep_u (a int PRIMARY KEY);
INSERT INTO dep_u VALUES (1);
CREATE FUNCTION dep_dup() RETURNS void LANGUAGE plpgsql AS $$ BEGIN INSERT INTO dep_u VALUES (1); END $$;
SELECT dep_dup();

-- Plain EXPLAIN evaluates nothing beyond what PostgreSQL's planner does
-- (it estimates selectivity with the stable function's value: one NOTICE,
-- as for the plain table): a bound that calls a stable function is shown
-- as known only at run time.
CREATE FUNCTION dep_noisy() RETURNS bigint LANGUAGE plpgsql STABLE AS $$
BEGIN RAISE NOTICE 'dep_noisy ran'; RETURN 5; END $$;
EXPLAIN (COSTS OFF) SELECT * FROM dep_ev WHERE id > dep_noisy() ORDER BY id LIMIT 1;
EXPLAIN (COSTS OFF) SELECT * FROM dep_ev WHERE id > 5 ORDER BY id LIMIT 1;
CREATE TABLE dep_plain (id bigint PRIMARY KEY);
EXPLAIN (COSTS OFF) SELECT * FROM dep_plain WHERE id > dep_noisy() ORDER BY id LIMIT 1;

-- pgkvx's trigger functions refuse to fire in a role they were not made
-- for: the TRUNCATE latch as a row trigger would return NULL and drop
-- every row.
CREATE TABLE dep_kv (k int PRIMARY KEY, v int);
SELECT pgkvx.enable('dep_kv');
CREATE TRIGGER dep_wrong BEFORE INSERT ON dep_kv FOR EACH ROW EXECUTE FUNCTION pgkvx.latch_truncate();
INSERT INTO dep_kv VALUES (1, 1);
DROP TRIGGER dep_wrong ON dep_kv;
CREATE TRIGGER dep_wrong AFTER INSERT ON dep_kv FOR EACH ROW EXECUTE FUNCTION pgkvx.latch_row();
INSERT INTO dep_kv VALUES (2, 2);
DROP TRIGGER dep_wrong ON dep_kv;
CREATE TRIGGER dep_wrong BEFORE INSERT ON dep_kv FOR EACH STATEMENT EXECUTE FUNCTION pgkvx.latch_row();
INSERT INTO dep_kv VALUES (3, 3);
DROP TRIGGER dep_wrong ON dep_kv;
INSERT INTO dep_kv VALUES (4, 4);
SELECT k, v FROM dep_kv ORDER BY k;

-- A tail table whose primary key cannot be the tail key: the refusal
-- names the unique index that can.
CREATE TABLE dep_outbox (txid xid8 NOT NULL DEFAULT pg_current_xact_id(), id bigserial, body text,
                         PRIMARY KEY (txid, id), UNIQUE (id));
SELECT pgkvx.enable('dep_outbox', gapless => true);
SELECT pgkvx.enable('dep_outbox', 'dep_outbox_id_key', gapless => true);
CREATE TABLE dep_nokey (a int, b bigserial, PRIMARY KEY (a, b));
SELECT pgkvx.enable('dep_nokey', gapless => true);

-- A gapless table whose latch trigger was dropped is still guarded, and
-- every reader says the read cannot be protected: LIMIT reads, EXPLAIN,
-- arrow_scan and check() agree.
SET client_min_messages = warning;
CREATE TABLE dep_exposed (id bigserial PRIMARY KEY, p text);
SELECT pgkvx.enable('dep_exposed', gapless => true);
INSERT INTO dep_exposed (p) VALUES ('a'), ('b');
DROP TRIGGER zz_pgkvx_latch ON dep_exposed;
SELECT id FROM dep_exposed WHERE id > 0 ORDER BY id LIMIT 1;
EXPLAIN (COSTS OFF) SELECT id FROM dep_exposed WHERE id > 0 ORDER BY id LIMIT 1;
SELECT count(*) AS batches FROM pgkvx.arrow_scan('dep_exposed', ARRAY['id']);
SELECT relid, problem FROM pgkvx.check() WHERE relid = 'dep_exposed'::regclass;
SELECT pgkvx.disable('dep_exposed');

-- A read that may repeat a side effect never reads optimistically (an
-- optimistic read that conflicts runs its statement again): volatile
-- functions PostgreSQL's own walker does not see -- in a domain's CHECK,
-- in an aggregate's transition function -- make it fenced.
SET client_min_messages = warning;
CREATE SEQUENCE dep_side;
CREATE FUNCTION dep_bump() RETURNS bigint LANGUAGE sql VOLATILE AS $$ SELECT nextval('dep_side') $$;
CREATE DOMAIN dep_counted AS bigint CHECK (dep_bump() > 0);
CREATE FUNCTION dep_bump_sum(bigint, bigint) RETURNS bigint LANGUAGE sql VOLATILE
    AS $$ SELECT coalesce($1, 0) + $2 + 0 * nextval('dep_side') $$;
CREATE AGGREGATE dep_counted_sum(bigint) (sfunc = dep_bump_sum, stype = bigint);
CREATE TABLE dep_side_ev (id bigint PRIMARY KEY);
SELECT pgkvx.enable('dep_side_ev');
EXPLAIN (COSTS OFF) SELECT id::dep_counted AS c FROM dep_side_ev WHERE id > 0 ORDER BY id LIMIT 3;
EXPLAIN (COSTS OFF) SELECT dep_counted_sum(id) FROM (SELECT id FROM dep_side_ev WHERE id > 0 ORDER BY id LIMIT 3) s;
EXPLAIN (COSTS OFF) SELECT sum(id) FROM (SELECT id FROM dep_side_ev WHERE id > 0 ORDER BY id LIMIT 3) s;

-- Keys are table data: EXPLAIN shows spans only to a role that may read
-- every row of the key.  Through a view that hides the key column, a role
-- sees the plan but not the keys.
RESET client_min_messages;
CREATE ROLE dep_viewer;
CREATE TABLE dep_mail (email text COLLATE "C" PRIMARY KEY, n int);
SELECT pgkvx.enable('dep_mail');
INSERT INTO dep_mail VALUES ('alice@example.com', 1), ('bob@example.com', 2);
CREATE VIEW dep_mail_counts AS SELECT n FROM dep_mail WHERE email > '' ORDER BY email;
GRANT SELECT ON dep_mail_counts TO dep_viewer;
SELECT * FROM test_support.explain($$SELECT n FROM dep_mail_counts LIMIT 1$$);
SET ROLE dep_viewer;
SELECT n FROM dep_mail_counts LIMIT 1;
SELECT * FROM test_support.explain($$SELECT n FROM dep_mail_counts LIMIT 1$$);
RESET ROLE;
DROP VIEW dep_mail_counts;
DROP ROLE dep_viewer;

-- A cursor an init plan computes bounds the span once the scan starts;
-- plain EXPLAIN runs no init plan to show it.
CREATE TABLE dep_offsets (grp text PRIMARY KEY, acked bigint NOT NULL);
INSERT INTO dep_offsets VALUES ('g', 100);
SELECT * FROM test_support.explain($$
  WITH last AS (SELECT acked FROM dep_offsets WHERE grp = 'g' FOR UPDATE)
  SELECT id FROM dep_ev WHERE id > (SELECT acked FROM last) ORDER BY id LIMIT 10$$, run => false);
WITH last AS (SELECT acked FROM dep_offsets WHERE grp = 'g' FOR UPDATE)
  SELECT id FROM dep_ev WHERE id > (SELECT acked FROM last) ORDER BY id LIMIT 3;

-- A call whose omitted argument defaults to a volatile function has that
-- side effect on every run: it reads fenced too.
CREATE FUNCTION dep_with_default(a bigint, b bigint DEFAULT nextval('dep_side')) RETURNS bigint
    LANGUAGE sql STABLE AS 'SELECT $1 + 0 * $2';
EXPLAIN (COSTS OFF) SELECT dep_with_default(id) FROM dep_side_ev WHERE id > 0 ORDER BY id LIMIT 3;

-- A bound converted to the key's type as PostgreSQL's cross-type operators
-- convert it never raises where they do not: out of range, it is left out.
CREATE TABLE dep_tz (ts timestamptz PRIMARY KEY, v int);
SELECT pgkvx.enable('dep_tz');
INSERT INTO dep_tz VALUES ('2024-01-01 00:00+00', 1);
SELECT * FROM dep_tz WHERE ts > '5874897-01-01'::date ORDER BY ts LIMIT 1;
SELECT count(*) FROM dep_tz WHERE ts > '2023-12-31'::date ORDER BY 1 LIMIT 1;

-- A unique key index whose column loses NOT NULL after enable: writes and
-- high_water refuse with a clear error, and no NULL key reaches the key's
-- output function.
CREATE TABLE dep_nullable (id int NOT NULL, name text COLLATE "C" NOT NULL, CONSTRAINT dep_nullable_name UNIQUE (name));
SELECT pgkvx.enable('dep_nullable', 'dep_nullable_name');
INSERT INTO dep_nullable VALUES (1, 'a'), (2, 'b');
ALTER TABLE dep_nullable ALTER COLUMN name DROP NOT NULL;
INSERT INTO dep_nullable VALUES (3, NULL);
SELECT pgkvx.high_water('dep_nullable');
DROP TABLE dep_nullable;
