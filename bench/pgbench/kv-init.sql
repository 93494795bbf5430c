-- The kv table of CockroachDB's `workload kv`, preloaded with random keys.
--
--   psql -v keys=100000 -f bench/pgbench/kv-init.sql DBNAME
--
-- Keys are spread over the same range the workload scripts draw from, so
-- reads and writes land all over the key space.  Drops an existing kv.
\set ON_ERROR_STOP on
\if :{?keys}
\else
\set keys 100000
\endif
SET client_min_messages = warning;
DROP TABLE IF EXISTS kv;
CREATE TABLE kv (k bigint PRIMARY KEY, v bytea NOT NULL);
INSERT INTO kv (k, v)
SELECT (random() * 8e18 - 4e18)::bigint, set_byte('\x00'::bytea, 0, (random() * 255)::int)
FROM generate_series(1, :keys)
ON CONFLICT (k) DO NOTHING;
VACUUM (ANALYZE) kv;
