-- Nobody gets in through pgkvx.  A role that may create objects in a schema
-- the caller searches first plants operators and functions named like the
-- ones pgkvx's SQL would use; none of them may ever run, whoever calls.
SET client_min_messages = warning;
DROP ROLE IF EXISTS pgkvx_mallory;
DROP ROLE IF EXISTS pgkvx_alice;
CREATE ROLE pgkvx_mallory;
CREATE ROLE pgkvx_alice;
CREATE SCHEMA hostile AUTHORIZATION pgkvx_mallory;
GRANT USAGE ON SCHEMA hostile TO PUBLIC;
SET ROLE pgkvx_mallory;
CREATE TABLE hostile.fired (what text);
GRANT INSERT ON hostile.fired TO PUBLIC;
CREATE FUNCTION hostile.trap_rc(regclass, oid) RETURNS boolean LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO hostile.fired VALUES ('=(regclass, oid) as ' || current_user); RETURN $1::oid OPERATOR(pg_catalog.=) $2; END $$;
CREATE OPERATOR hostile.= (LEFTARG = regclass, RIGHTARG = oid, FUNCTION = hostile.trap_rc);
CREATE FUNCTION hostile.trap_oo(oid, oid) RETURNS boolean LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO hostile.fired VALUES ('=(oid, oid) as ' || current_user); RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
CREATE OPERATOR hostile.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = hostile.trap_oo);
CREATE FUNCTION hostile.pg_get_serial_sequence(text, text) RETURNS text LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO hostile.fired VALUES ('pg_get_serial_sequence as ' || current_user); RETURN NULL; END $$;
CREATE FUNCTION hostile.nextval(regclass) RETURNS bigint LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO hostile.fired VALUES ('nextval as ' || current_user); RETURN 1; END $$;
CREATE FUNCTION hostile.format(text, text) RETURNS text LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO hostile.fired VALUES ('format as ' || current_user); RETURN ''; END $$;
CREATE FUNCTION hostile.quote_ident(text) RETURNS text LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO hostile.fired VALUES ('quote_ident as ' || current_user); RETURN ''; END $$;
RESET ROLE;

-- Everyone below searches mallory's schema first.
SET search_path = hostile, pg_catalog, public;
CREATE TABLE public.sec (id bigserial PRIMARY KEY, v text);
SELECT pgkvx.enable('public.sec', gapless => true);
INSERT INTO public.sec (v) VALUES ('a'), ('b');
SELECT id FROM public.sec WHERE id > 0 ORDER BY id LIMIT 5;
SELECT count(*) FROM pgkvx.latches;
SELECT * FROM pgkvx.check();
SELECT pgkvx.disable('public.sec');
SELECT pgkvx.enable('public.sec', gapless => true);
CREATE TABLE public.sec2 (k int PRIMARY KEY);
SELECT pgkvx.enable('public.sec2');
DROP TABLE public.sec2;
-- the same as the table's owner, not a superuser
CREATE TABLE public.owned (id bigserial PRIMARY KEY, v text);
ALTER TABLE public.owned OWNER TO pgkvx_alice;
ALTER SEQUENCE public.owned_id_seq OWNER TO pgkvx_alice;
SET ROLE pgkvx_alice;
SET search_path = hostile, pg_catalog, public;
SELECT pgkvx.enable('public.owned', gapless => true);
INSERT INTO public.owned (v) VALUES ('x');
SELECT id FROM public.owned WHERE id > 0 ORDER BY id LIMIT 5;
SELECT pgkvx.disable('public.owned');
RESET ROLE;
RESET search_path;
SELECT * FROM hostile.fired;

-- Drawing a key latches it: it needs INSERT or UPDATE on the table, not
-- only USAGE on the sequence; a span latch needs UPDATE, DELETE or
-- TRUNCATE; nothing is latched or locked on refusal.
CREATE TABLE secret (id bigserial PRIMARY KEY, v text);
SELECT pgkvx.enable('secret', gapless => true);
GRANT USAGE ON SCHEMA pgkvx TO pgkvx_alice;
GRANT USAGE, SELECT, UPDATE ON SEQUENCE secret_id_seq TO pgkvx_alice;
SET ROLE pgkvx_alice;
BEGIN;
SELECT pgkvx.next_key('secret');
ROLLBACK;
BEGIN;
SELECT pgkvx.latch_span('secret', '1', '100');
ROLLBACK;
RESET ROLE;
SELECT count(*) AS latches FROM pgkvx.latch_list(true) WHERE relid = 'secret'::regclass;
-- a read-only transaction has nothing to latch
BEGIN READ ONLY;
SELECT pgkvx.latch_span('secret', '1', '100');
ROLLBACK;
BEGIN READ ONLY;
SELECT pgkvx.next_key('secret');
ROLLBACK;

-- Keys hidden by row level security are hidden in the latch views too.
CREATE TABLE tenants (id int PRIMARY KEY, tenant text NOT NULL);
SELECT pgkvx.enable('tenants');
ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
CREATE POLICY own ON tenants USING (tenant = current_user);
GRANT SELECT ON tenants TO pgkvx_alice;
BEGIN;
INSERT INTO tenants VALUES (42, 'someone else');
-- the owner (who bypasses its own policies) sees the key
SELECT span, state FROM pgkvx.latches WHERE relid = 'tenants'::regclass;
SET LOCAL ROLE pgkvx_alice;
SELECT span, state FROM pgkvx.latches WHERE relid = 'tenants'::regclass;
SELECT lower, upper FROM pgkvx.ranges WHERE relid = 'tenants'::regclass;
ROLLBACK;

-- One transaction holds a bounded number of latches: many points of one
-- table become one span; many tables beyond the budget fail cleanly.
SET pgkvx.max_latches_per_transaction = 32;
CREATE TABLE bulk (k int PRIMARY KEY);
SELECT pgkvx.enable('bulk');
BEGIN;
INSERT INTO bulk SELECT g FROM generate_series(1, 5000) g;
SELECT count(*) <= 32 AS bounded FROM pgkvx.latch_list(false) WHERE relid = 'bulk'::regclass;
COMMIT;
DO $$ BEGIN
  FOR i IN 1..40 LOOP
    EXECUTE format('CREATE TABLE many_%s (k int PRIMARY KEY)', i);
    PERFORM pgkvx.enable(format('many_%s', i)::regclass);
  END LOOP;
END $$;
DO $$ BEGIN
  FOR i IN 1..40 LOOP
    EXECUTE format('INSERT INTO many_%s SELECT g FROM generate_series(1, 3) g', i);
  END LOOP;
END $$;
RESET pgkvx.max_latches_per_transaction;
SET ROLE pgkvx_alice;
SET pgkvx.max_latches_per_transaction = 1000000;
RESET ROLE;

-- NULL and bad relation arguments are errors, not crashes.
SELECT pgkvx.enable(NULL);
SELECT pgkvx.enable(0::regclass);
SELECT pgkvx.disable(NULL);
SELECT pgkvx.latch_span(NULL, '1', '2');
SELECT pgkvx.next_key(NULL);
SELECT pgkvx.arrow_scan(NULL);
SELECT pgkvx.arrow_query(NULL);
-- A temporary table needs no latching: only its own session writes it.
CREATE TEMP TABLE tmp (k int PRIMARY KEY);
SELECT pgkvx.enable('tmp');

DO $$ BEGIN
  FOR i IN 1..40 LOOP
    EXECUTE format('DROP TABLE many_%s', i);
  END LOOP;
END $$;
DROP TABLE bulk, tenants, secret, public.sec, public.owned;
DROP SCHEMA hostile CASCADE;
REVOKE ALL ON SCHEMA pgkvx FROM pgkvx_alice;
DROP ROLE pgkvx_mallory;
DROP ROLE pgkvx_alice;
