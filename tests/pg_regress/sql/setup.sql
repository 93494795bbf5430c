-- The extension loads, lives in its own schema and reports its version.
SELECT extname, extversion, nspname
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
 WHERE extname = 'pgkvx';
SELECT pgkvx.version() = (SELECT extversion FROM pg_extension WHERE extname = 'pgkvx') AS version_matches;
-- Every database of the cluster can have it.
CREATE DATABASE pgkvx_regress_other;
\c pgkvx_regress_other
CREATE EXTENSION pgkvx;
SELECT pgkvx.version() IS NOT NULL AS loaded_in_other_db;
\c pgkvx_regress
DROP DATABASE pgkvx_regress_other;
