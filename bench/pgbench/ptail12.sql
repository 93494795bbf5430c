-- ptail12: a consumer's poll of a table partitioned by created_at into 12
-- partitions (bench/ptail.py makes it, 100,000 rows): the next 100 rows
-- after a random cursor, through a MergeAppend of the partitions' scans.
--   pgbench -n -M prepared -c 8 -j 8 -T 15 -f bench/pgbench/ptail12.sql DBNAME
\set c random(0, 99900)
SELECT * FROM events WHERE id > :c ORDER BY id LIMIT 100;
