-- pgkvx reserves its setting prefix: a misspelt setting is an error instead
-- of a placeholder that silently does nothing.
SET pgkvx.scan_mod = 'off';
SELECT pg_catalog.set_config('pgkvx.arrow_numerik', 'text', false);
SHOW pgkvx.scan_mod;
-- The real settings take their values as usual.
SET pgkvx.scan_mode = 'off';
SHOW pgkvx.scan_mode;
SET pgkvx.arrow_numeric = 'float64';
SHOW pgkvx.arrow_numeric;
RESET pgkvx.scan_mode;
RESET pgkvx.arrow_numeric;
-- Other prefixes still take placeholders.
SET pgkvx_app.note = 'free-form';
SHOW pgkvx_app.note;
RESET pgkvx_app.note;
-- Every setting of pgkvx, the Arrow ones included, is defined at load.
SELECT name, context FROM pg_catalog.pg_settings WHERE name LIKE 'pgkvx.%' ORDER BY name;
