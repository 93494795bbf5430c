-- The extension loads and reports its version; every object it makes
-- lives in the pgkvx schema, which belongs to the extension.
SELECT extname, extversion FROM pg_extension WHERE extname = 'pgkvx';
SELECT pgkvx.version() = (SELECT extversion FROM pg_extension WHERE extname = 'pgkvx') AS version_matches;
SELECT count(*) AS objects_elsewhere
  FROM pg_depend d
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pgkvx'
  LEFT JOIN pg_proc p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
  LEFT JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid
 WHERE d.deptype = 'e'
   AND coalesce(p.pronamespace, c.relnamespace, 'pgkvx'::regnamespace) <> 'pgkvx'::regnamespace;
SELECT count(*) AS schema_is_a_member
  FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pgkvx'
 WHERE d.classid = 'pg_namespace'::regclass AND d.objid = 'pgkvx'::regnamespace AND d.deptype = 'e';
-- Every database of the cluster can have it.
CREATE DATABASE pgkvx_regress_other;
\c pgkvx_regress_other
CREATE EXTENSION pgkvx;
SELECT pgkvx.version() IS NOT NULL AS loaded_in_other_db;
\c pgkvx_regress
DROP DATABASE pgkvx_regress_other;
