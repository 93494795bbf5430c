-- Which queries get a PgkvxLimitScan, what EXPLAIN shows, and that results
-- equal plain Postgres's.  No concurrency here: validations are all clean.
SET client_min_messages = warning;
CREATE TABLE kv (k bigint PRIMARY KEY, v int NOT NULL);
INSERT INTO kv SELECT g * 10, g % 7 FROM generate_series(1, 200) g;
CREATE TABLE comp (a int, b text COLLATE "C", v int, PRIMARY KEY (a, b));
INSERT INTO comp SELECT g % 5, 'b' || (g / 5), g FROM generate_series(0, 99) g;
CREATE TABLE plain (k bigint PRIMARY KEY, v int);
INSERT INTO plain SELECT k, v FROM kv;
SELECT pgkvx.enable('kv'), pgkvx.enable('comp');
ANALYZE kv, comp, plain;
-- pgkvx.stats() counts for the whole cluster since it started: compare with
-- the counts now, not with zero, so the file passes on a cluster that has
-- run other tests
CREATE TEMP TABLE stats_before AS SELECT stat, value FROM pgkvx.stats();

-- the shapes it serves
EXPLAIN (COSTS OFF) SELECT * FROM kv WHERE k > 100 ORDER BY k LIMIT 3;
EXPLAIN (COSTS OFF) SELECT * FROM kv WHERE k >= 100 AND k < 500 ORDER BY k DESC LIMIT 3 OFFSET 2;
EXPLAIN (COSTS OFF) SELECT k FROM kv WHERE k BETWEEN 100 AND 200 AND v = 3 ORDER BY k LIMIT 5;
EXPLAIN (COSTS OFF) SELECT * FROM kv ORDER BY k LIMIT 1;
EXPLAIN (COSTS OFF) SELECT * FROM kv WHERE k = 50 ORDER BY k LIMIT 1;
EXPLAIN (COSTS OFF) SELECT * FROM comp WHERE a = 2 AND b > 'b1' ORDER BY a, b LIMIT 4;
EXPLAIN (COSTS OFF) SELECT count(v) FROM (SELECT v FROM kv WHERE k >= 1000 ORDER BY k LIMIT 10) t;
EXPLAIN (COSTS OFF) WITH w AS (SELECT * FROM kv WHERE k > 1900 ORDER BY k LIMIT 5) SELECT sum(v) FROM w;
EXPLAIN (COSTS OFF) SELECT p.k, x.k FROM plain p, LATERAL (SELECT k FROM kv WHERE kv.k > p.k ORDER BY k LIMIT 1) x WHERE p.k < 40;
-- parameters and generic plans (pgbench -M prepared)
PREPARE span(bigint, int) AS SELECT count(v) FROM (SELECT v FROM kv WHERE k >= $1 ORDER BY k LIMIT $2) t;
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE span(100, 10);
EXECUTE span(100, 10);
EXECUTE span(1995, 10);
EXECUTE span(100, NULL);
RESET plan_cache_mode;

-- whatever plan Postgres picks for a read in key order under a LIMIT runs
-- under the node: other indexes, joins, row locks (those read fenced),
-- WITH TIES, LIMITs only known as it runs, a security-barrier view, a
-- subquery whose order the outer query keeps
CREATE INDEX kv_v_k ON kv (v, k);
EXPLAIN (COSTS OFF) SELECT * FROM kv WHERE v = 3 AND k > 100 ORDER BY k LIMIT 3;
EXPLAIN (COSTS OFF) SELECT kv.k FROM kv JOIN plain USING (k) ORDER BY kv.k LIMIT 3;
EXPLAIN (COSTS OFF) SELECT k FROM kv WHERE k > 100 AND v IN (SELECT v FROM plain WHERE k < 50) ORDER BY k LIMIT 3;
EXPLAIN (COSTS OFF) SELECT * FROM kv WHERE k > 100 ORDER BY k LIMIT 3 FOR UPDATE;
EXPLAIN (COSTS OFF) SELECT * FROM kv WHERE k > 100 ORDER BY k FETCH FIRST 3 ROWS WITH TIES;
EXPLAIN (COSTS OFF) SELECT * FROM kv WHERE k > 100 ORDER BY k LIMIT (random() * 3)::int + 1;
CREATE VIEW kv_odd WITH (security_barrier) AS SELECT * FROM kv WHERE v % 2 = 1;
EXPLAIN (COSTS OFF) SELECT * FROM kv_odd WHERE k > 100 ORDER BY k LIMIT 3;
EXPLAIN (COSTS OFF) SELECT * FROM (SELECT DISTINCT ON (k) k, v FROM kv ORDER BY k) d WHERE k > 100 ORDER BY k LIMIT 3;
DROP VIEW kv_odd;
DROP INDEX kv_v_k;
-- shapes that are no tail read keep plain Postgres plans
EXPLAIN (COSTS OFF) SELECT * FROM kv WHERE k > 100 LIMIT 3;                       -- no ORDER BY
EXPLAIN (COSTS OFF) SELECT * FROM kv WHERE k > 100 ORDER BY v LIMIT 3;            -- not the key order
EXPLAIN (COSTS OFF) SELECT * FROM kv WHERE k > 100 ORDER BY k;                    -- no LIMIT: still in key order
EXPLAIN (COSTS OFF) SELECT v, count(*) FROM kv GROUP BY v ORDER BY v LIMIT 3;     -- grouping
EXPLAIN (COSTS OFF) SELECT * FROM plain WHERE k > 100 ORDER BY k LIMIT 3;         -- not latched
-- reads no consumer moves a cursor with are no tail and keep plain plans:
-- newest first from the open end, MIN and MAX, a count beside a max, the
-- newest rows joined, the newest of a prefix
EXPLAIN (COSTS OFF) SELECT * FROM kv ORDER BY k DESC LIMIT 20;
SELECT q, bool_or(line ~ 'PgkvxLimitScan') AS guarded
  FROM (VALUES ('SELECT max(k) FROM kv'), ('SELECT min(k) FROM kv'),
               ('SELECT count(*) FROM kv WHERE k > (SELECT max(k) - 100 FROM kv)'),
               ('SELECT * FROM (SELECT v, count(*) n FROM kv WHERE k > 1 GROUP BY v) s ORDER BY n'),
               ('SELECT kv.k FROM kv JOIN plain USING (k) ORDER BY kv.k DESC LIMIT 3'),
               ('SELECT * FROM comp WHERE a = 2 ORDER BY a, b DESC LIMIT 3'),
               ('SELECT * FROM (SELECT k FROM kv UNION ALL SELECT k FROM plain) u ORDER BY k DESC LIMIT 3')) t(q),
       LATERAL test_support.explain(q, false) line
 GROUP BY q ORDER BY q;
-- while a read down the key within a bound is a tail (since a cursor,
-- newest first, too), and so are a MIN past a cursor and a MAX over a tail
EXPLAIN (COSTS OFF) SELECT * FROM kv WHERE k < 500 ORDER BY k DESC LIMIT 3;
EXPLAIN (COSTS OFF) SELECT * FROM kv WHERE k > 100 ORDER BY k DESC LIMIT 20;
SELECT bool_or(line ~ 'PgkvxLimitScan') AS guarded
  FROM test_support.explain('SELECT min(k) FROM kv WHERE k > 100', false) line;
EXPLAIN (COSTS OFF) SELECT p.k, x.k FROM plain p, LATERAL (SELECT k FROM kv WHERE kv.k < p.k ORDER BY k DESC LIMIT 1) x WHERE p.k < 40;
EXPLAIN (COSTS OFF) SELECT max(k) FROM (SELECT k FROM kv WHERE k > 100 ORDER BY k LIMIT 10) t;
EXPLAIN (COSTS OFF) SELECT * FROM (SELECT k FROM kv UNION ALL SELECT k FROM plain) u ORDER BY k LIMIT 3;
-- the planner does not look at pgkvx.scan_mode: a plan made while it is
-- off protects once it is on
SET pgkvx.scan_mode = off;
EXPLAIN (COSTS OFF) SELECT * FROM kv WHERE k > 100 ORDER BY k LIMIT 3;
RESET pgkvx.scan_mode;

-- EXPLAIN ANALYZE: the touched span and the validation
SELECT * FROM test_support.explain($$SELECT * FROM kv WHERE k > 100 ORDER BY k LIMIT 3$$);
SELECT * FROM test_support.explain($$SELECT * FROM kv WHERE k > 1950 ORDER BY k LIMIT 30$$);
SELECT * FROM test_support.explain($$SELECT * FROM kv WHERE k < 100 ORDER BY k DESC LIMIT 2$$);
-- more than 64 rows wanted: the declared span is checked first; clean, so it streams
SELECT * FROM test_support.explain($$SELECT * FROM kv WHERE k > 100 ORDER BY k LIMIT 100$$);
SET pgkvx.scan_mode = fenced;
SELECT * FROM test_support.explain($$SELECT * FROM kv WHERE k > 100 ORDER BY k LIMIT 3$$);
SET pgkvx.scan_mode = optimistic;
SET pgkvx.max_optimistic_rows = 2;
SELECT * FROM test_support.explain($$SELECT * FROM kv WHERE k > 100 ORDER BY k LIMIT 3$$);
RESET pgkvx.max_optimistic_rows;
SELECT * FROM test_support.explain($$SELECT p.k, x.k FROM plain p, LATERAL (SELECT k FROM kv WHERE kv.k > p.k ORDER BY k LIMIT 1) x WHERE p.k < 40$$);

-- declared spans are sets of intervals: = ANY and IN lists (sorted, each
-- value once), an OR of a range and points, a prefix IN list with a range
-- on the next column; a range on the listed column itself leaves values
-- out; an OR with a branch that bounds nothing narrows nothing; past 64
-- values one interval covers them; EXPLAIN names 8.  (Only the span: how
-- PostgreSQL reads = ANY differs between majors.)
CREATE FUNCTION declared(q text) RETURNS text LANGUAGE sql AS $$
  SELECT string_agg(trim(l), '; ') FROM test_support.explain(q, false) l WHERE l ~ 'Declared Span' $$;
SELECT declared($$SELECT * FROM kv WHERE k = ANY('{300,100,200,100}') ORDER BY k LIMIT 10$$);
SELECT declared($$SELECT * FROM kv WHERE (k > 500 AND k <= 600) OR k IN (10, 20) ORDER BY k LIMIT 10$$);
SELECT declared($$SELECT * FROM comp WHERE a IN (1, 3) AND b > 'b1' ORDER BY a, b LIMIT 4$$);
SELECT declared($$SELECT * FROM kv WHERE k > 15 AND k IN (10, 20, 30) ORDER BY k LIMIT 10$$);
SELECT declared($$SELECT * FROM kv WHERE k > 1000 AND k IN (10, 20) ORDER BY k LIMIT 10$$);
SELECT declared($$SELECT * FROM kv WHERE k = 5 OR v = 3 ORDER BY k LIMIT 10$$);
-- values of another type that the key's encoding cannot take (timestamptz
-- for a timestamp key: the cast depends on the session): no bound, never none
CREATE TABLE tsk (ts timestamp PRIMARY KEY);
SELECT pgkvx.enable('tsk');
SELECT declared($$SELECT * FROM tsk WHERE ts = ANY(ARRAY['2024-01-02'::timestamptz]) ORDER BY ts LIMIT 10$$);
SELECT declared($$SELECT * FROM tsk WHERE ts = ANY(ARRAY['2024-01-02'::timestamp]) ORDER BY ts LIMIT 10$$);
DROP TABLE tsk;
SELECT declared(format($$SELECT * FROM kv WHERE k = ANY(%L::bigint[]) ORDER BY k LIMIT 10$$,
  (SELECT array_agg(g * 2)::text FROM generate_series(1, 20) g)));
SELECT declared(format($$SELECT * FROM kv WHERE k = ANY(%L::bigint[]) ORDER BY k LIMIT 10$$,
  (SELECT array_agg(g * 2)::text FROM generate_series(1, 100) g)));
-- a parameter array in a generic plan: known when the statement runs
PREPARE anyk(bigint[]) AS SELECT * FROM kv WHERE k = ANY($1) ORDER BY k LIMIT 10;
SET plan_cache_mode = force_generic_plan;
SELECT trim(l) FROM test_support.explain($$EXECUTE anyk('{30,10}')$$) l WHERE l ~ 'Declared Span|Touched Span';
RESET plan_cache_mode;
DEALLOCATE anyk;
DROP FUNCTION declared;
-- results equal plain Postgres for every mode
CREATE FUNCTION results(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE r text;
BEGIN
  EXECUTE format('SELECT string_agg(x::text, '' '') FROM (%s) x', q) INTO r;
  RETURN r;
END $$;
CREATE FUNCTION same_everywhere(q text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE a text; b text; c text;
BEGIN
  SET LOCAL pgkvx.scan_mode = off;        a := results(q);
  SET LOCAL pgkvx.scan_mode = fenced;     b := results(q);
  SET LOCAL pgkvx.scan_mode = optimistic; c := results(q);
  RETURN a IS NOT DISTINCT FROM b AND b IS NOT DISTINCT FROM c;
END $$;
SELECT q, same_everywhere(q) FROM (VALUES
  ('SELECT * FROM kv WHERE k > 100 ORDER BY k LIMIT 3'),
  ('SELECT * FROM kv WHERE k >= 100 AND k < 500 ORDER BY k DESC LIMIT 3 OFFSET 2'),
  ('SELECT k FROM kv WHERE k BETWEEN 100 AND 900 AND v = 3 ORDER BY k LIMIT 5'),
  ('SELECT * FROM kv ORDER BY k DESC LIMIT 7'),
  ('SELECT * FROM comp WHERE a = 2 AND b > ''b1'' ORDER BY a, b LIMIT 4'),
  ('SELECT * FROM comp WHERE a >= 3 ORDER BY a DESC, b DESC LIMIT 6'),
  ('SELECT p.k, x.k FROM plain p, LATERAL (SELECT k FROM kv WHERE kv.k > p.k ORDER BY k LIMIT 1) x WHERE p.k < 80'),
  ('SELECT kv.k, (SELECT p.v FROM plain p WHERE p.k = kv.k) FROM kv WHERE k > 100 ORDER BY k LIMIT 5'),
  ('SELECT k FROM kv WHERE k > 100 AND v IN (SELECT v FROM plain WHERE k < 50) ORDER BY k LIMIT 6'),
  ('SELECT k FROM kv WHERE k = ANY(''{300,100,200,5}'') ORDER BY k LIMIT 10'),
  ('SELECT k FROM kv WHERE (k > 500 AND k <= 600) OR k IN (10, 20) ORDER BY k LIMIT 100'),
  ('SELECT * FROM comp WHERE a IN (1, 3) AND b > ''b1'' ORDER BY a, b LIMIT 40'),
  ('SELECT k FROM kv WHERE k = 5 OR v = 3 ORDER BY k LIMIT 10')
) t(q);
-- and equal to a table that is not latched at all
SELECT a.r IS NOT DISTINCT FROM b.r AS same_as_unlatched FROM
  (SELECT results('SELECT kv.k, (SELECT p.v FROM plain p WHERE p.k = kv.k) FROM kv WHERE k > 100 ORDER BY k LIMIT 5') r) a,
  (SELECT results('SELECT p1.k, (SELECT p.v FROM plain p WHERE p.k = p1.k) FROM plain p1 WHERE k > 100 ORDER BY k LIMIT 5') r) b;
SELECT * FROM kv WHERE k > 100 ORDER BY k LIMIT 3;
SELECT * FROM comp WHERE a = 2 AND b > 'b1' ORDER BY a, b LIMIT 4;
SELECT stat, s.value > b.value AS counted FROM pgkvx.stats() s JOIN stats_before b USING (stat)
 WHERE stat IN ('scans_optimistic', 'scans_fenced', 'scans_off', 'validations') ORDER BY stat;
-- enable_* settings steer the plan under the guard as they steer an
-- unlatched table's (PostgreSQL 18 weighs disabled nodes before cost)
SET enable_indexscan = off; SET enable_indexonlyscan = off; SET enable_bitmapscan = off;
SELECT bool_and(line !~ 'Index|Disabled') AS no_disabled_scan, bool_or(line ~ 'Seq Scan') AS seq_scan,
       bool_or(line ~ 'PgkvxLimitScan') AS guarded
  FROM test_support.explain('SELECT * FROM kv WHERE k > 100 ORDER BY k LIMIT 3', false) line;
RESET enable_indexscan; RESET enable_indexonlyscan; RESET enable_bitmapscan;
-- a cursor a tail joins to from a CTE that locks its rows is a bound: the
-- scan starts at it, through an init plan over the same CTE; a plain CTE
-- (inlined, or MATERIALIZED and read only as far as the statement fetches
-- it) keeps its plan.  Each answer equals the same statement's over a
-- table that is not latched
CREATE TABLE offs (name text PRIMARY KEY, c bigint);
INSERT INTO offs VALUES ('a', 1900), ('b', 1500), ('n', NULL);
SELECT bool_or(line ~ 'Index Cond: \(k > ') AS bounded, bool_or(line ~ 'PgkvxLimitScan') AS guarded,
       bool_or(line ~ 'InitPlan') AS init_plan
  FROM test_support.explain('WITH o AS (SELECT c FROM offs WHERE name = ''a'' FOR UPDATE) '
                            'SELECT kv.k FROM kv, o WHERE kv.k > o.c ORDER BY kv.k LIMIT 3', false) line;
SELECT q, bool_or(line ~ 'Index Cond: \(k > ') AS bounded, bool_or(line ~ 'InitPlan') AS init_plan
  FROM (VALUES ('WITH o AS (SELECT c FROM offs WHERE name = ''a'') '
                'SELECT kv.k FROM kv, o WHERE kv.k > o.c ORDER BY kv.k LIMIT 3'),
               ('WITH o AS MATERIALIZED (SELECT c FROM offs WHERE name = ''a'') '
                'SELECT kv.k FROM kv, o WHERE kv.k > o.c ORDER BY kv.k LIMIT 3'),
               ('WITH RECURSIVE o(c) AS (SELECT 1900::bigint UNION ALL SELECT c + 1 FROM o) '
                'SELECT kv.k FROM kv, o WHERE kv.k > o.c ORDER BY kv.k LIMIT 3')) t(q),
       test_support.explain(q, false) line
 GROUP BY q ORDER BY q;
-- a plain CTE is read only when the join needs it: one that never ends is
-- never read when the tail's other quals leave no row (no bound reads it
-- when the scan starts)
SET statement_timeout = '10s';
WITH RECURSIVE o(c) AS (SELECT 1900::bigint UNION ALL SELECT c + 1 FROM o)
SELECT kv.k FROM kv, o WHERE kv.k > o.c AND kv.v < 0 ORDER BY kv.k LIMIT 3;
RESET statement_timeout;
SELECT q, results(q) IS NOT DISTINCT FROM results(replace(q, 'kv', 'plain')) AS same_as_unlatched,
       same_everywhere(q), results(q) AS answer
FROM (VALUES
  ('WITH o AS (SELECT c FROM offs WHERE name = ''a'' FOR UPDATE) SELECT kv.k FROM kv, o WHERE kv.k > o.c ORDER BY kv.k LIMIT 3'),
  ('WITH o AS (SELECT c FROM offs WHERE name = ''a'' FOR UPDATE) SELECT kv.k FROM o JOIN kv ON o.c < kv.k ORDER BY kv.k LIMIT 3'),
  ('WITH o AS (SELECT c FROM offs WHERE name = ''a'' FOR SHARE) SELECT kv.k FROM kv, o WHERE kv.k >= o.c AND kv.v >= 0 ORDER BY kv.k LIMIT 3'),
  ('WITH o AS (SELECT c FROM offs WHERE name IN (''a'', ''b'') FOR UPDATE) SELECT kv.k, o.c FROM kv, o WHERE kv.k > o.c ORDER BY kv.k, o.c LIMIT 8'),
  ('WITH o AS (SELECT c FROM offs WHERE name = ''n'' FOR UPDATE) SELECT kv.k FROM kv, o WHERE kv.k > o.c ORDER BY kv.k LIMIT 3'),
  ('WITH o AS (SELECT c FROM offs WHERE name = ''none'' FOR UPDATE) SELECT kv.k FROM kv, o WHERE kv.k > o.c ORDER BY kv.k LIMIT 3'),
  ('WITH o AS (SELECT c FROM offs WHERE name = ''a'' FOR UPDATE) SELECT kv.k, o.c FROM kv LEFT JOIN o ON kv.k > o.c ORDER BY kv.k LIMIT 3'),
  ('WITH o AS (SELECT c FROM offs WHERE name = ''a'' FOR UPDATE) SELECT kv.k FROM kv, o WHERE kv.k > o.c OR kv.k = 10 ORDER BY kv.k LIMIT 3')
) t(q);
-- a data-modifying CTE (only at a statement's top level)
SELECT bool_or(line ~ 'Index Cond: \(k > ') AS bounded
  FROM test_support.explain('WITH o AS (UPDATE offs SET c = c WHERE name = ''b'' RETURNING c) '
                            'SELECT kv.k FROM kv, o WHERE kv.k > o.c ORDER BY kv.k LIMIT 3', false) line;
WITH o AS (UPDATE offs SET c = c WHERE name = 'b' RETURNING c) SELECT kv.k FROM kv, o WHERE kv.k > o.c ORDER BY kv.k LIMIT 3;
WITH o AS (UPDATE offs SET c = c WHERE name = 'b' RETURNING c) SELECT p.k FROM plain p, o WHERE p.k > o.c ORDER BY p.k LIMIT 3;
DROP TABLE offs;
-- a bound that would raise is evaluated only where PostgreSQL evaluates
-- it: EXPLAIN computes no span from it, and where a condition on the
-- parameters alone leaves no row (the plan's one-time filter) the
-- statement raises nothing, in every mode; where the scan runs, its error
-- is PostgreSQL's
PREPARE gated(int) AS SELECT k FROM kv WHERE $1 <> 0 AND k > 1000 / $1 ORDER BY k LIMIT 3;
PREPARE ungated(int) AS SELECT k FROM kv WHERE k > 1000 / $1 ORDER BY k LIMIT 3;
SET plan_cache_mode = force_generic_plan;
SELECT trim(l) FROM test_support.explain('EXECUTE gated(0)', false) l WHERE l ~ 'One-Time|Declared Span';
SET pgkvx.scan_mode = off;
EXECUTE gated(0);
EXECUTE gated(2);
SET pgkvx.scan_mode = fenced;
EXECUTE gated(0);
EXECUTE gated(2);
SELECT trim(l) FROM test_support.explain('EXECUTE gated(0)') l WHERE l ~ 'Mode|Declared Span|PgkvxLimitScan';
SET pgkvx.scan_mode = optimistic;
EXECUTE gated(0);
EXECUTE gated(2);
EXECUTE ungated(0);
RESET pgkvx.scan_mode;
DEALLOCATE gated;
DEALLOCATE ungated;
-- in parallel mode, where no subtransaction starts, such a bound is left
-- unevaluated: a tail read by a function that a parallel query's leader
-- calls raises nothing either
CREATE TABLE par AS SELECT g FROM generate_series(1, 20000) g;
ANALYZE par;
CREATE FUNCTION gated_tail(n int) RETURNS bigint LANGUAGE plpgsql PARALLEL RESTRICTED AS $$
DECLARE s bigint;
BEGIN
  SELECT sum(k) INTO s FROM (SELECT k FROM kv WHERE n <> 0 AND k > 1000 / n ORDER BY k LIMIT 2) q;
  RETURN s;
END $$;
SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
SELECT bool_or(l ~ 'Gather') AS parallel
  FROM test_support.explain('SELECT gated_tail(c::int - c::int) FROM (SELECT count(*) c FROM par) s', false) l;
SELECT gated_tail(c::int - c::int) FROM (SELECT count(*) c FROM par) s;
SELECT gated_tail(c::int - c::int + 2) FROM (SELECT count(*) c FROM par) s;
RESET parallel_setup_cost; RESET parallel_tuple_cost; RESET min_parallel_table_scan_size;
RESET max_parallel_workers_per_gather;
RESET plan_cache_mode;
DROP FUNCTION gated_tail;
DROP TABLE par;
DROP TABLE kv, comp, plain;
DROP FUNCTION same_everywhere, results;
