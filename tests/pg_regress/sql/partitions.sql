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
