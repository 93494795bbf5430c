-- A read through a partitioned table reads every partition: one that is
-- not latched cannot be protected, and pgkvx says so (check(), and the
-- read itself as pgkvx.unprotected_reads asks).
CREATE TABLE pe (id bigint NOT NULL, v text) PARTITION BY RANGE (id);
CREATE TABLE pe_1 PARTITION OF pe FOR VALUES FROM (0) TO (100);
ALTER TABLE pe_1 ADD PRIMARY KEY (id);
SELECT pgkvx.enable('pe_1');
SELECT * FROM pgkvx.check();
-- A partition added later, not latched.
CREATE TABLE pe_2 PARTITION OF pe FOR VALUES FROM (100) TO (200);
ALTER TABLE pe_2 ADD PRIMARY KEY (id);
SELECT * FROM pgkvx.check();
SELECT id FROM pe WHERE id > 50 ORDER BY id LIMIT 1;
SET pgkvx.unprotected_reads = error;
SELECT id FROM pe WHERE id > 50 ORDER BY id LIMIT 1;
RESET pgkvx.unprotected_reads;
-- Latched too: nothing left to report, the read is quiet.
SELECT pgkvx.enable('pe_2');
SELECT * FROM pgkvx.check();
SELECT id FROM pe WHERE id > 50 ORDER BY id LIMIT 1;
-- Two levels: a leaf of a sub-partition is read with the other leaves.
CREATE TABLE sp (id bigint NOT NULL, v text, PRIMARY KEY (id)) PARTITION BY RANGE (id);
CREATE TABLE sp_lo PARTITION OF sp FOR VALUES FROM (0) TO (100);
CREATE TABLE sp_hi PARTITION OF sp FOR VALUES FROM (100) TO (1000) PARTITION BY RANGE (id);
CREATE TABLE sp_hi_a PARTITION OF sp_hi FOR VALUES FROM (100) TO (1000);
SELECT pgkvx.enable('sp_lo');
SELECT id FROM sp WHERE id > 0 ORDER BY id LIMIT 1;
SET pgkvx.unprotected_reads = error;
SELECT id FROM sp WHERE id > 0 ORDER BY id LIMIT 1;
RESET pgkvx.unprotected_reads;
-- A UNION ALL of a latched and a plain table is two reads, not one tree.
CREATE TABLE plain_t (id bigint PRIMARY KEY);
SELECT id FROM (SELECT id FROM sp_lo UNION ALL SELECT id FROM plain_t) u WHERE id > 0 ORDER BY id LIMIT 1;
DROP TABLE sp, plain_t;
-- Inheritance: a latched parent whose child is not latched.
CREATE TABLE ih (id bigint PRIMARY KEY, v text);
CREATE TABLE ih_child () INHERITS (ih);
SELECT pgkvx.enable('ih');
SELECT * FROM pgkvx.check();
DROP TABLE pe, ih CASCADE;
-- A latched partitioned table: the parent is registered, its partitions
-- latch under it (one latch identity, one draw lock, one sequence).
CREATE TABLE ev (id bigserial, created_at timestamptz NOT NULL, cat int NOT NULL DEFAULT 0, v text,
                 PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
-- Enabled before it has partitions: those created later latch too.
SELECT pgkvx.enable('ev', gapless => true);
CREATE TABLE ev_2025 PARTITION OF ev FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
CREATE TABLE ev_2026 PARTITION OF ev FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
CREATE INDEX ev_cat ON ev (cat, id);
-- The tail key is id, one column of the primary key (id, created_at);
-- enabling again changes nothing.
SELECT pgkvx.enable('ev', gapless => true);
SELECT relid, key_index, gapless, key_columns FROM pgkvx.tables WHERE relid = 'ev'::regclass;
SELECT c.relname, t.tgname, t.tgenabled, t.tgparentid <> 0 AS cloned
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relname LIKE 'ev%' AND t.tgname LIKE 'zz_pgkvx%' ORDER BY 1, 2;
SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d WHERE d.adrelid = 'ev_2026'::regclass AND d.adnum = 1;
-- Latched already through the parent; a partition is disabled with it.
SELECT pgkvx.enable('ev_2025');
SELECT pgkvx.disable('ev_2025');
-- Writes through the parent and into a partition latch (parent, key).
BEGIN;
INSERT INTO ev (created_at, v) VALUES ('2025-06-01', 'a'), ('2026-06-01', 'b');
INSERT INTO ev_2025 (created_at, v) VALUES ('2025-07-01', 'c');
SELECT relid, span, state FROM pgkvx.latches ORDER BY span;
COMMIT;
-- Keys not drawn by next_key are refused, in any partition.
INSERT INTO ev (id, created_at) VALUES (100, '2025-01-02');
INSERT INTO ev_2026 (id, created_at) VALUES (nextval('ev_id_seq'), '2026-01-02');
-- A row moved to another partition keeps its key; a new key is drawn.
UPDATE ev SET created_at = '2026-02-01' WHERE id = 1;
UPDATE ev SET id = pgkvx.next_key('ev'), created_at = '2025-02-01' WHERE id = 2;
UPDATE ev SET id = 200, created_at = '2026-03-01' WHERE id = 3;
SELECT tableoid::regclass, id, v FROM ev ORDER BY id;
-- Drawing through a partition draws from the parent.
BEGIN;
SELECT pgkvx.next_key('ev_2025') > 0 AS drawn;
SELECT relid FROM pgkvx.latches;
ROLLBACK;
-- TRUNCATE of one partition latches the parent's whole key space.
BEGIN;
TRUNCATE ev_2026;
SELECT relid, span FROM pgkvx.latches;
ROLLBACK;
-- latch_span on a partition latches under the parent.
BEGIN;
SELECT pgkvx.latch_span('ev_2025', '10', '20');
SELECT relid, span FROM pgkvx.latches;
ROLLBACK;
-- Tails on the parent: each partition's scan is guarded, named by both.
EXPLAIN (COSTS OFF) SELECT id FROM ev WHERE id > 1 ORDER BY id LIMIT 10;
-- One guard over the MergeAppend, naming the parent's columns; descending
-- too; and over partitions that compute the query's expressions (EXPLAIN
-- shows them as the first partition computes them).  An Append, below,
-- keeps a guard per partition.
EXPLAIN (COSTS OFF, VERBOSE) SELECT id, v FROM ev WHERE id > 1 ORDER BY id LIMIT 10;
EXPLAIN (COSTS OFF) SELECT id FROM ev WHERE id < 9000000000 ORDER BY id DESC LIMIT 10;
EXPLAIN (COSTS OFF, VERBOSE) SELECT id, upper(v) FROM ev WHERE id > 1 ORDER BY id LIMIT 10;
SELECT id, upper(v) FROM ev WHERE id > 1 ORDER BY id LIMIT 3;
EXPLAIN (COSTS OFF) SELECT id FROM ev WHERE cat = 0 AND id > 1 ORDER BY id LIMIT 10;
EXPLAIN (COSTS OFF) SELECT id FROM ev WHERE created_at >= '2026-01-01' AND id > 1 ORDER BY id LIMIT 10;
SELECT id FROM ev WHERE id > 0 ORDER BY id LIMIT 10;
SELECT pgkvx.key_bytes('ev', '5') = pgkvx.key_bytes('ev_2025', '5') AS same_encoding;
-- Partitions created or attached later are latched too.
CREATE TABLE ev_2027 PARTITION OF ev FOR VALUES FROM ('2027-01-01') TO ('2028-01-01');
-- A table holding rows is refused: its keys were never drawn, and may
-- repeat the tree's.
CREATE TABLE ev_2029 (LIKE ev);
INSERT INTO ev_2029 (id, created_at, cat, v) VALUES (1, '2029-06-01', 0, 'a key the tree has drawn');
ALTER TABLE ev ATTACH PARTITION ev_2029 FOR VALUES FROM ('2029-01-01') TO ('2030-01-01');
DROP TABLE ev_2029;
CREATE TABLE ev_2028 (LIKE ev INCLUDING DEFAULTS);
ALTER TABLE ev ATTACH PARTITION ev_2028 FOR VALUES FROM ('2028-01-01') TO ('2029-01-01');
SELECT c.relname, t.tgname, t.tgenabled FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relname IN ('ev_2027', 'ev_2028') AND t.tgname LIKE 'zz_pgkvx%' ORDER BY 1, 2;
INSERT INTO ev (created_at, v) VALUES ('2028-06-01', 'attached');
SELECT * FROM pgkvx.check();
-- check() names the partition whose trigger lets writes through.
DROP TRIGGER zz_pgkvx_latch_truncate ON ev_2027;
SELECT * FROM pgkvx.check();
SET pgkvx.unprotected_reads = error;
SELECT id FROM ev WHERE id > 0 ORDER BY id LIMIT 1;
-- A read that prunes that partition away reads only protected ones.
EXPLAIN (COSTS OFF) SELECT id FROM ev WHERE created_at < '2027-01-01' AND id > 0 ORDER BY id LIMIT 1;
SELECT id FROM ev WHERE created_at < '2027-01-01' AND id > 0 ORDER BY id LIMIT 1;
RESET pgkvx.unprotected_reads;
-- Other DDL on the tree repairs nothing behind its owner's back: a trigger
-- disabled stays disabled (check() reports it), a dropped one stays dropped.
ALTER TABLE ev_2028 DISABLE TRIGGER zz_pgkvx_latch;
ALTER TABLE ev ADD COLUMN note text;
SELECT c.relname, t.tgname, t.tgenabled FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relname IN ('ev_2027', 'ev_2028') AND t.tgname LIKE 'zz_pgkvx%' ORDER BY 1, 2;
SELECT pgkvx.enable('ev', gapless => true);
SELECT * FROM pgkvx.check();
-- A detached partition is a plain table again.
ALTER TABLE ev DETACH PARTITION ev_2028;
INSERT INTO ev_2028 (id, created_at) VALUES (1000, '2028-01-01');
SELECT * FROM pgkvx.check();
DROP TABLE ev_2028;
-- arrow_scan over the parent: bounds on the tail key.
SELECT count(*) > 0 AS batches FROM pgkvx.arrow_scan('ev', '{id}', '1', '100');
SELECT pgkvx.arrow_scan('ev', '{nope}');
-- LIST and HASH partitioning, partitioned by the key itself; two levels.
CREATE TABLE ls (id bigint PRIMARY KEY, region text NOT NULL DEFAULT 'eu') PARTITION BY HASH (id);
CREATE TABLE ls_0 PARTITION OF ls FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE ls_1 PARTITION OF ls FOR VALUES WITH (MODULUS 2, REMAINDER 1) PARTITION BY LIST (id);
CREATE TABLE ls_1a PARTITION OF ls_1 FOR VALUES IN (1, 3, 5);
CREATE TABLE ls_1b PARTITION OF ls_1 DEFAULT;
SELECT pgkvx.enable('ls');
SELECT pgkvx.enable('ls_1');
BEGIN;
INSERT INTO ls SELECT g FROM generate_series(1, 6) g;
SELECT relid, count(*) FROM pgkvx.latches GROUP BY relid;
COMMIT;
SELECT id FROM ls WHERE id > 2 ORDER BY id LIMIT 3;
-- A partition latched on its own keeps its parent from being latched.
CREATE TABLE lp (id bigint PRIMARY KEY) PARTITION BY RANGE (id);
CREATE TABLE lp_1 PARTITION OF lp FOR VALUES FROM (0) TO (10);
SELECT pgkvx.enable('lp_1');
SELECT pgkvx.enable('lp');
-- A composite key with no sequence-fed column cannot be gapless.
CREATE TABLE nk (id bigint, created_at date, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
SELECT pgkvx.enable('nk', gapless => true);
-- disable takes the triggers off every partition.
SELECT pgkvx.disable('ev');
SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relname LIKE 'ev%' AND t.tgname LIKE 'zz_pgkvx%';
SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d WHERE d.adrelid = 'ev_2026'::regclass AND d.adnum = 1;
DROP TABLE ev, ls, lp, nk;
SELECT relid FROM pgkvx.tables WHERE relid::text IN ('ev', 'ls', 'lp', 'lp_1', 'nk');
-- A partitioned table's own latch trigger never fires for a row (its
-- clones on the partitions do): disabled on the parent alone, check()
-- names it, and reads, whose partitions still latch, are not refused.
CREATE TABLE pd (id bigserial, created_at timestamptz NOT NULL, PRIMARY KEY (id, created_at))
  PARTITION BY RANGE (created_at);
CREATE TABLE pd_a PARTITION OF pd FOR VALUES FROM ('2020-01-01') TO ('2030-01-01');
CREATE TABLE pd_b PARTITION OF pd FOR VALUES FROM ('2030-01-01') TO ('2040-01-01');
SELECT pgkvx.enable('pd', gapless => true);
ALTER TABLE ONLY pd DISABLE TRIGGER zz_pgkvx_latch;
SELECT c.relname, t.tgenabled FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relname LIKE 'pd%' AND t.tgname = 'zz_pgkvx_latch' ORDER BY 1;
SELECT * FROM pgkvx.check() WHERE relid::text = 'pd';
INSERT INTO pd (created_at) VALUES ('2025-01-01'), ('2035-01-01');
SET pgkvx.unprotected_reads = error;
SELECT id FROM pd WHERE id > 0 ORDER BY id LIMIT 2;
RESET pgkvx.unprotected_reads;
DROP TABLE pd;

-- A node of another executor of the same plan, begun while this one
-- starts (run-time pruning calls g(), which runs f()'s cached plan, whose
-- optimistic read overflows into a second executor), is not taken for one
-- of this statement's: each level returns every row.
CREATE TABLE nested_p (id bigint PRIMARY KEY, v text) PARTITION BY RANGE (id);
CREATE TABLE nested_p1 PARTITION OF nested_p FOR VALUES FROM (0) TO (500);
CREATE TABLE nested_p2 PARTITION OF nested_p FOR VALUES FROM (500) TO (100000);
SELECT pgkvx.enable('nested_p') IS NOT NULL AS enabled;
INSERT INTO nested_p SELECT g, 'x' FROM generate_series(1, 900) g;
ANALYZE nested_p;
CREATE FUNCTION nested_g(d int) RETURNS bigint STABLE LANGUAGE plpgsql AS
  $$BEGIN IF d > 0 THEN PERFORM count(*) FROM nested_f(d - 1); END IF; RETURN 0; END$$;
CREATE FUNCTION nested_f(d int) RETURNS SETOF bigint LANGUAGE plpgsql AS
  $$BEGIN RETURN QUERY SELECT id FROM nested_p WHERE id >= nested_g(d) AND (v || '') = 'x' ORDER BY id; END$$;
SET plan_cache_mode = force_generic_plan;
SET pgkvx.max_optimistic_rows = 10;
SELECT count(*) FROM nested_f(2);
SET pgkvx.scan_mode = fenced;
SELECT count(*) FROM nested_f(2);
RESET pgkvx.scan_mode;
RESET pgkvx.max_optimistic_rows;
RESET plan_cache_mode;
DROP FUNCTION nested_f(int), nested_g(int);
DROP TABLE nested_p;
