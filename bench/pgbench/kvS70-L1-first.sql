-- kvS70-L1-first: kvS70-L1 with every span read starting at the table's
-- first key (no WHERE clause), 30% upserts of random keys.  A span over the
-- whole table, so a latched scan's declared span overlaps every write.
\set k random(-4000000000000000000, 4000000000000000000)
\set op random(0, 99)
\if :op < 70
SELECT count(v) FROM (SELECT v FROM kv ORDER BY k LIMIT 1) t;
\else
\set b random(0, 255)
INSERT INTO kv (k, v) VALUES (:k, set_byte('\x00'::bytea, 0, :b)) ON CONFLICT (k) DO UPDATE SET v = excluded.v;
\endif
