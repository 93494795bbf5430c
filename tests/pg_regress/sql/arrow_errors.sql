-- pgkvx.arrow_scan / arrow_query refuse bad input with clear errors.
-- Only counts and sizes are shown: the Arrow bytes themselves are tested
-- end to end (tests/e2e/test_arrow.py).
\set VERBOSITY terse
CREATE TABLE ae (k int8 PRIMARY KEY, a int4, s text, d date);
INSERT INTO ae SELECT g, g, 's' || g, '2000-01-01'::date + g FROM generate_series(1, 10) g;
CREATE TABLE ae_nokey (a int);
CREATE TABLE ae_multi (a int, b int, PRIMARY KEY (a, b));
CREATE VIEW ae_view AS SELECT * FROM ae;

-- the happy path: 10 rows in batches of 4 → 3 values, the last with EOS
SELECT count(*) AS batches, sum(length(b)) > 0 AS has_bytes
  FROM (SELECT pgkvx.arrow_scan('ae', batch_rows => 4) AS b) s;
SELECT count(*) AS batches FROM (SELECT pgkvx.arrow_scan('ae', '{k}', '3', '5')) s;
SELECT count(*) AS batches FROM (SELECT pgkvx.arrow_query('SELECT * FROM ae', 3)) s;

-- columns
SELECT pgkvx.arrow_scan('ae', '{k,nope}');
SELECT pgkvx.arrow_scan('ae', '{k,k}');
SELECT pgkvx.arrow_scan('ae', '{}');
SELECT pgkvx.arrow_scan('ae', ARRAY['k', NULL]);
SELECT pgkvx.arrow_scan('ae', '{ctid}');

-- bounds
SELECT pgkvx.arrow_scan('ae', lower => 'ten');
SELECT pgkvx.arrow_scan('ae', upper => '1e40');
SELECT pgkvx.arrow_scan('ae_nokey', lower => '1');
SELECT pgkvx.arrow_scan('ae_multi', upper => '1');

-- limits
SELECT pgkvx.arrow_scan('ae', batch_rows => 0);
SELECT pgkvx.arrow_scan('ae', max_rows => -1);
SELECT pgkvx.arrow_query('SELECT 1', batch_rows => -5);

-- relation kinds
SELECT pgkvx.arrow_scan('ae_view');
SELECT pgkvx.arrow_scan('no_such_table');

-- values Arrow cannot hold
INSERT INTO ae VALUES (11, 11, 's11', 'infinity');
SELECT pgkvx.arrow_scan('ae', '{k,d}');
SELECT count(*) FROM (SELECT pgkvx.arrow_scan('ae', '{k,d}', upper => '11')) s;

-- arrow_query is for read-only SELECTs
SELECT pgkvx.arrow_query('DELETE FROM ae RETURNING k');
SELECT pgkvx.arrow_query('WITH x AS (DELETE FROM ae RETURNING k) SELECT * FROM x');
SELECT pgkvx.arrow_query('SELECT * FROM ae FOR SHARE');
SELECT pgkvx.arrow_query('SELECT 1; SELECT 2');
SELECT pgkvx.arrow_query('SELEC 1');
SELECT count(*) FROM ae;

-- privileges
SET client_min_messages = warning;
DROP ROLE IF EXISTS pgkvx_ae_reader;  -- left over by an interrupted run
RESET client_min_messages;
CREATE ROLE pgkvx_ae_reader;
GRANT USAGE ON SCHEMA pgkvx TO pgkvx_ae_reader;
GRANT SELECT (k, a) ON ae TO pgkvx_ae_reader;
SET ROLE pgkvx_ae_reader;
SELECT count(*) AS batches FROM (SELECT pgkvx.arrow_scan('ae', '{a,k}')) s;
SELECT pgkvx.arrow_scan('ae', '{a,s}');
SELECT pgkvx.arrow_scan('ae');
SELECT pgkvx.arrow_scan('ae_nokey');
SELECT pgkvx.arrow_query('SELECT s FROM ae');
RESET ROLE;

-- row level security
ALTER TABLE ae ENABLE ROW LEVEL SECURITY;
CREATE POLICY small_keys ON ae FOR SELECT USING (k < 5);
GRANT SELECT ON ae TO pgkvx_ae_reader;
SET ROLE pgkvx_ae_reader;
SELECT pgkvx.arrow_scan('ae', '{k}');
SELECT count(*) AS batches FROM (SELECT pgkvx.arrow_query('SELECT k FROM ae')) s;
RESET ROLE;
DROP OWNED BY pgkvx_ae_reader;
DROP ROLE pgkvx_ae_reader;
