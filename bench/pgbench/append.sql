-- append: one single-row insert per transaction into events, its key left
-- to the table's DEFAULT: nextval on a plain table, pgkvx.next_key after
-- pgkvx.enable('events', gapless => true).  bench/run --paired pairs the two
-- (pair append:gapless); events is made by bench/append.py.
--   pgbench -n -M prepared -c 16 -j 2 -T 20 -f bench/pgbench/append.sql DBNAME
\set p random(1, 1000000000)
INSERT INTO events (payload) VALUES ('event ' || :p);
