-- Gapless tables take new keys only from pgkvx.next_key in the writing
-- transaction: a key drawn any other way would be latched only when its
-- row is written, after the key exists, and could commit behind a reader.
SET client_min_messages = warning;
CREATE TABLE g (id bigserial PRIMARY KEY, v text);
SELECT pgkvx.enable('g', gapless => true);
-- the default draws and latches: accepted
INSERT INTO g (v) VALUES ('default');
INSERT INTO g (v) SELECT 'bulk ' || n FROM generate_series(1, 3) n;
SELECT id, v FROM g ORDER BY id;
-- an explicit key
INSERT INTO g (id, v) VALUES (100, 'explicit');
-- a key the client drew itself (an ORM prefetching ids)
SELECT nextval('g_id_seq') AS prefetched \gset
INSERT INTO g (id, v) VALUES (:prefetched, 'prefetched');
-- explicit keys through INSERT ... SELECT and COPY
INSERT INTO g (id, v) SELECT 200 + n, 'selected' FROM generate_series(1, 2) n;
COPY g (id, v) FROM stdin;
300	copied
\.
-- moving a row to a key it did not draw
UPDATE g SET id = 400 WHERE id = 1;
-- a key drawn with next_key in the same transaction is fine, also for an
-- update that moves a row, and once more after a savepoint rolled back
BEGIN;
SELECT pgkvx.next_key('g') AS k \gset
INSERT INTO g (id, v) VALUES (:k, 'drawn first');
UPDATE g SET id = pgkvx.next_key('g') WHERE v = 'default' RETURNING v;
SELECT pgkvx.next_key('g') AS k2 \gset
SAVEPOINT s;
INSERT INTO g (id, v) VALUES (:k2, 'in a savepoint');
ROLLBACK TO SAVEPOINT s;
INSERT INTO g (id, v) VALUES (:k2, 'again after the rollback');
-- but a drawn key is written once
INSERT INTO g (id, v) VALUES (:k2, 'twice');
ROLLBACK;
-- a key drawn in another transaction is not this one's
SELECT pgkvx.next_key('g') AS other \gset
INSERT INTO g (id, v) VALUES (:other, 'drawn elsewhere');
-- logical replication apply (session_replication_role = replica) writes
-- the publisher's keys; they are latched at row time
SET session_replication_role = replica;
INSERT INTO g (id, v) VALUES (500, 'replicated');
RESET session_replication_role;
SELECT id, v FROM g WHERE id >= 100 ORDER BY id;
-- a default replaced by hand is reported
ALTER TABLE g ALTER COLUMN id SET DEFAULT nextval('g_id_seq');
SELECT relid, problem FROM pgkvx.check();
INSERT INTO g (v) VALUES ('plain nextval');
SELECT pgkvx.enable('g', gapless => true);
SELECT relid, problem FROM pgkvx.check();
DROP TABLE g;
