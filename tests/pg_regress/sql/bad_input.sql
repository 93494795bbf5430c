-- Bad input gets a clear error with a proper SQLSTATE, from any role, and
-- never takes a backend down.
\set VERBOSITY sqlstate
CREATE ROLE pgkvx_nobody LOGIN;
SET ROLE pgkvx_nobody;
-- Oids that name no relation.
SELECT pgkvx.key_bytes(0, '1');
SELECT pgkvx.key_bytes(123456789, '1');
SELECT pgkvx.key_bytes('pg_class', '1');
RESET ROLE;
SELECT 1 AS still_connected;
-- NULL where a value is required, in functions that take optional ones.
CREATE TABLE bi (k int PRIMARY KEY, v text);
SELECT pgkvx.enable('bi', NULL, NULL);
SELECT pgkvx.enable(NULL);
SELECT pgkvx.enable(0::regclass);
SELECT pgkvx.enable('bi');
SELECT count(*) FROM pgkvx.arrow_scan('bi', NULL, NULL, NULL, NULL, NULL);
SELECT count(*) FROM pgkvx.arrow_query('SELECT 1', NULL);
SELECT count(*) FROM pgkvx.arrow_query(NULL);
SELECT pgkvx.disable('bi');
-- A key on a generated column is refused: such columns are computed after
-- the latch trigger runs, which would latch the old key.
CREATE TABLE gk (x int NOT NULL, k int GENERATED ALWAYS AS (x * 10) STORED PRIMARY KEY, v text);
\set VERBOSITY default
SELECT pgkvx.enable('gk');
DROP TABLE bi, gk;
DROP ROLE pgkvx_nobody;
