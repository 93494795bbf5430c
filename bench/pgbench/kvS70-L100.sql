-- kvS70-L100: 70% span reads of LIMIT 100 starting at a random key, 30% upserts.
-- CockroachDB `workload kv --span-percent 70 --span-limit 100` in Postgres terms.
\set k random(-4000000000000000000, 4000000000000000000)
\set op random(0, 99)
\if :op < 70
SELECT count(v) FROM (SELECT v FROM kv WHERE k >= :k ORDER BY k LIMIT 100) t;
\else
\set b random(0, 255)
INSERT INTO kv (k, v) VALUES (:k, set_byte('\x00'::bytea, 0, :b)) ON CONFLICT (k) DO UPDATE SET v = excluded.v;
\endif
