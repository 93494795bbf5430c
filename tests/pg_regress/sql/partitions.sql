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
-- Inheritance: a latched parent whose child is not latched.
CREATE TABLE ih (id bigint PRIMARY KEY, v text);
CREATE TABLE ih_child () INHERITS (ih);
SELECT pgkvx.enable('ih');
SELECT * FROM pgkvx.check();
DROP TABLE pe, ih CASCADE;
