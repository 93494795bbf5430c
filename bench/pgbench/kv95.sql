-- kv95: 95% point reads, 5% upserts, of random keys.
-- CockroachDB `workload kv --read-percent 95` in Postgres terms.  Keys are
-- drawn from the whole int64 range, so most point reads miss (an index
-- descent either way).
\set k random(-4000000000000000000, 4000000000000000000)
\set op random(0, 99)
\if :op < 95
SELECT k, v FROM kv WHERE k = :k;
\else
\set b random(0, 255)
INSERT INTO kv (k, v) VALUES (:k, set_byte('\x00'::bytea, 0, :b)) ON CONFLICT (k) DO UPDATE SET v = excluded.v;
\endif
