-- The key encoding sorts exactly as the key index: for every supported type,
-- its extremes, infinities, byte-order collation edge cases, bpchar's
-- trailing spaces, composite keys and DESC columns, ORDER BY key and ORDER
-- BY encoded key agree.
SET client_min_messages = warning;  -- (the NOTICEs of a mismatch are hidden too)
-- same_order(t, key, order): ORDER BY `order` (the index order) and ORDER BY
-- the encoded key give the same sequence of keys.
CREATE FUNCTION same_order(tbl regclass, keyexpr text, orderby text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE by_index text[]; by_bytes text[];
BEGIN
  EXECUTE format('SELECT array_agg(%s ORDER BY %s) FROM %s', keyexpr, orderby, tbl) INTO by_index;
  EXECUTE format('SELECT array_agg(%s ORDER BY pgkvx.key_bytes(%L, %s)) FROM %s', keyexpr, tbl, keyexpr, tbl) INTO by_bytes;
  IF by_index IS DISTINCT FROM by_bytes THEN
    RAISE NOTICE 'index order %', by_index;
    RAISE NOTICE 'bytes order %', by_bytes;
  END IF;
  RETURN by_index IS NOT DISTINCT FROM by_bytes AND cardinality(by_index) > 1;
END $$;

CREATE TABLE i2 (k int2 PRIMARY KEY); SELECT pgkvx.enable('i2');
INSERT INTO i2 VALUES (-32768), (-1), (0), (1), (255), (256), (32767);
SELECT same_order('i2', 'k::text', 'k');
CREATE TABLE i8 (k int8 PRIMARY KEY); SELECT pgkvx.enable('i8');
INSERT INTO i8 VALUES (-9223372036854775808), (-4294967296), (-1), (0), (1), (4294967296), (9223372036854775807);
SELECT same_order('i8', 'k::text', 'k');
-- the check can fail: a different order is caught
SELECT same_order('i8', 'k::text', 'k DESC') AS reversed_is_caught;
CREATE TABLE b (k bool PRIMARY KEY); SELECT pgkvx.enable('b');
INSERT INTO b VALUES (true), (false);
SELECT same_order('b', 'k::text', 'k');
CREATE TABLE u (k uuid PRIMARY KEY); SELECT pgkvx.enable('u');
INSERT INTO u VALUES ('00000000-0000-0000-0000-000000000000'), ('ffffffff-ffff-ffff-ffff-ffffffffffff'),
  ('7fffffff-0000-0000-0000-000000000000'), ('80000000-0000-0000-0000-000000000000'), ('00000000-0000-0000-0000-000000000001');
SELECT same_order('u', 'k::text', 'k');
CREATE TABLE by (k bytea PRIMARY KEY); SELECT pgkvx.enable('by');
INSERT INTO by VALUES (''), ('\x00'), ('\x0000'), ('\x0001'), ('\x01'), ('\xff'), ('\xff00'), ('\x00ff');
SELECT same_order('by', 'k::text', 'k');
CREATE TABLE tc (k text COLLATE "C" PRIMARY KEY); SELECT pgkvx.enable('tc');
INSERT INTO tc VALUES (''), (' '), ('a'), ('A'), ('a '), ('ab'), ('a b'), ('b'), (E'\x01'), ('é'), ('z'), ('Ω'), ('😀'), ('~');
SELECT same_order('tc', 'k', 'k');
CREATE TABLE vc (k varchar(20) COLLATE "POSIX" PRIMARY KEY); SELECT pgkvx.enable('vc');
INSERT INTO vc VALUES (''), ('a'), ('ab'), ('b'), ('B');
SELECT same_order('vc', 'k', 'k');
CREATE TABLE bp (k char(5) COLLATE "C" PRIMARY KEY); SELECT pgkvx.enable('bp');
INSERT INTO bp VALUES (''), ('a'), ('a b'), ('ab'), (' a'), ('b');
SELECT same_order('bp', 'k', 'k');
CREATE TABLE d (k date PRIMARY KEY); SELECT pgkvx.enable('d');
INSERT INTO d VALUES ('-infinity'), ('4713-01-01 BC'), ('1999-12-31'), ('2000-01-01'), ('2026-11-22'), ('5874897-12-31'), ('infinity');
SELECT same_order('d', 'k::text', 'k');
CREATE TABLE t (k timestamp PRIMARY KEY); SELECT pgkvx.enable('t');
INSERT INTO t VALUES ('-infinity'), ('4713-01-01 00:00 BC'), ('1999-12-31 23:59:59.999999'), ('2000-01-01'), ('294276-12-31 23:59:59'), ('infinity');
SELECT same_order('t', 'k::text', 'k');
CREATE TABLE tz (k timestamptz PRIMARY KEY); SELECT pgkvx.enable('tz');
INSERT INTO tz VALUES ('-infinity'), ('1970-01-01 00:00+00'), ('1970-01-01 00:00+05'), ('2026-11-22 12:00+00'), ('infinity');
SELECT same_order('tz', 'k::text', 'k');
-- composite and DESC
CREATE TABLE comp (a int NOT NULL, b text COLLATE "C" NOT NULL, c date NOT NULL);
CREATE UNIQUE INDEX comp_k ON comp (a, b DESC, c);
SELECT pgkvx.enable('comp', 'comp_k');
INSERT INTO comp SELECT a, b, c FROM unnest(ARRAY[-1, 0, 1]) a, unnest(ARRAY['', 'a', 'ab', 'b']) b,
  unnest(ARRAY['-infinity', '2020-01-01', 'infinity']::date[]) c;
SELECT same_order('comp', 'format(''(%s,"%s",%s)'', a, b, c)', 'a, b DESC, c');
-- a key longer than a latch keeps is truncated (shown with …) — conservatively
SELECT length(pgkvx.key_bytes('tc', repeat('x', 100))) AS truncated_len;
SELECT pgkvx.key_bytes('tc', 'abc') < pgkvx.key_bytes('tc', 'abd') AS ordered;
DROP TABLE i2, i8, b, u, by, tc, vc, bp, d, t, tz, comp;
DROP FUNCTION same_order;
