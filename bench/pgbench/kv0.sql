-- kv0: writes only (upsert of a random key).
-- CockroachDB `workload kv --read-percent 0` in Postgres terms.
--   pgbench -n -M prepared -c 16 -j 2 -T 20 -f bench/pgbench/kv0.sql DBNAME
\set k random(-4000000000000000000, 4000000000000000000)
\set b random(0, 255)
INSERT INTO kv (k, v) VALUES (:k, set_byte('\x00'::bytea, 0, :b)) ON CONFLICT (k) DO UPDATE SET v = excluded.v;
