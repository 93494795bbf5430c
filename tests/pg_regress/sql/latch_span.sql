-- Explicit latches, how the views show keys of every supported type, and
-- what a held latch does at transaction end.
SET client_min_messages = warning;
CREATE TABLE kv (k bigint PRIMARY KEY, v text);
SELECT pgkvx.enable('kv');
-- cluster-wide counters: this file's own latches are the difference
CREATE TEMP TABLE stats_before AS SELECT stat, value FROM pgkvx.stats();
BEGIN;
SELECT pgkvx.latch_span('kv', '10', '20');
SELECT pgkvx.latch_span('kv', NULL, '-5');
SELECT pgkvx.latch_span('kv', '1000', NULL);
INSERT INTO kv VALUES (42, 'x');
UPDATE kv SET k = 43 WHERE k = 42;          -- old and new key
SELECT relid, span, state, holder_pid = pg_backend_pid() AS mine, holder_xid = txid_current() AS my_xid
  FROM pgkvx.latches ORDER BY span;
COMMIT;
SELECT count(*) AS live_after_commit FROM pgkvx.latches;
BEGIN;
DELETE FROM kv;
SELECT span FROM pgkvx.latches;
ROLLBACK;
SELECT count(*) AS live_after_rollback FROM pgkvx.latches;
BEGIN;
TRUNCATE kv;
SELECT span FROM pgkvx.latches;
ROLLBACK;

-- latches show only to roles that may SELECT the table (or pg_monitor);
-- the role is created inside the transaction so no run can leave it behind
BEGIN;
CREATE ROLE pgkvx_nosy;
INSERT INTO kv VALUES (500, 'secret');
SET LOCAL ROLE pgkvx_nosy;
SELECT count(*) AS seen_without_select FROM pgkvx.latches;
RESET ROLE;
GRANT pg_monitor TO pgkvx_nosy;
SET LOCAL ROLE pgkvx_nosy;
SELECT count(*) AS seen_with_pg_monitor FROM pgkvx.latches;
RESET ROLE;
ROLLBACK;

-- argument errors
SELECT pgkvx.latch_span('kv', 'twenty', NULL);
SELECT pgkvx.latch_span('kv', '20', '10');
SELECT pgkvx.latch_span('kv', '10', '10');
CREATE TABLE plain (k int PRIMARY KEY);
SELECT pgkvx.latch_span('plain', '1', '2');
CREATE ROLE pgkvx_reader;
GRANT SELECT ON kv TO pgkvx_reader;
SET ROLE pgkvx_reader;
SELECT pgkvx.latch_span('kv', '1', '2');
RESET ROLE;

-- composite keys: bounds are row literals of leading columns
CREATE TABLE comp (a int, b text COLLATE "C", c uuid, PRIMARY KEY (a, b, c));
SELECT pgkvx.enable('comp');
BEGIN;
SELECT pgkvx.latch_span('comp', '(1)', '(2)');
SELECT pgkvx.latch_span('comp', '(3,"x y")', '(3,z)');
INSERT INTO comp VALUES (7, 'it''s', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11');
SELECT span FROM pgkvx.latches ORDER BY span;
ROLLBACK;
SELECT pgkvx.latch_span('comp', '1', NULL);
SELECT pgkvx.latch_span('comp', '(1,a,a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,4)', NULL);

-- other key types as the views show them
CREATE TABLE ts (t timestamptz PRIMARY KEY);
SELECT pgkvx.enable('ts');
CREATE TABLE dk (d date PRIMARY KEY);
SELECT pgkvx.enable('dk');
CREATE TABLE descend (k int NOT NULL, b bytea NOT NULL);
CREATE UNIQUE INDEX descend_k ON descend (k DESC, b);
SELECT pgkvx.enable('descend', 'descend_k');
SET timezone = 'UTC';
BEGIN;
INSERT INTO ts VALUES ('2026-11-22 10:00:00+00'), ('infinity'), ('-infinity');
INSERT INTO dk VALUES ('2026-11-22'), ('infinity');
INSERT INTO descend VALUES (5, '\x00ff'), (-5, '');
SELECT relid, span FROM pgkvx.latches ORDER BY relid::text, span;
ROLLBACK;

-- PREPARE TRANSACTION cannot carry latches (they belong to the session)
BEGIN;
INSERT INTO kv VALUES (1, 'p');
PREPARE TRANSACTION 'pgkvx_prep';
SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'pgkvx_prep';
SELECT count(*) FROM pgkvx.latches;

SELECT stat FROM pgkvx.stats() ORDER BY stat;
SELECT s.value > b.value AS acquired FROM pgkvx.stats() s JOIN stats_before b USING (stat)
 WHERE stat = 'latches_acquired';

DROP TABLE kv, plain, comp, ts, dk, descend;
DROP ROLE pgkvx_reader;
