-- EXPLAIN output that reads the same on every supported PostgreSQL major,
-- for the regress and isolation suites (scripts/test loads it into each
-- suite's database).  Each major adds to the plain text: 18 prints row
-- counts as "rows=3.00", an "Index Searches" line, and buffers under
-- ANALYZE unless told not to; 17 names an init plan's output
-- "(InitPlan 2).col1" where 15 and 16 print "$2" and "InitPlan 2 (returns $2)".
-- What pgkvx adds to a plan is printed the same everywhere and left alone.
CREATE SCHEMA test_support;
CREATE FUNCTION test_support.explain(query text, run boolean DEFAULT true)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    line text;
BEGIN
    FOR line IN EXECUTE format('EXPLAIN (%s COSTS OFF) %s',
            CASE WHEN run THEN 'ANALYZE, TIMING OFF, SUMMARY OFF, BUFFERS OFF,' ELSE '' END, query) LOOP
        CONTINUE WHEN line ~ '^\s*Index Searches: ';
        line := regexp_replace(line, '(rows=\d+)\.00 ', '\1 ', 'g');
        line := regexp_replace(line, ' \(returns \$\d+(,\$\d+)*\)', '', 'g');
        line := regexp_replace(line, '\(InitPlan (\d+)\)\.col1', '$\1', 'g');
        RETURN NEXT line;
    END LOOP;
END
$$;
GRANT USAGE ON SCHEMA test_support TO PUBLIC;
