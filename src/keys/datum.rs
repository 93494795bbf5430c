//! Between Postgres values and encoded keys: from tuples and slots (writes
//! and scans), from text bounds (`latch_span`, `arrow_scan`), and back to
//! text for the views.

use super::codec::{decode_col, KeyKind, KeyValue, KeyWriter};
use super::desc::KeyDesc;
use crate::errors;
use crate::pg::{input_datum, varlena_bytes};
use pgkvx_latch::{KeyBuf, Span};
use pgrx::pg_sys::{self, Datum, Oid};
use pgrx::PgSqlErrorCode;
use std::ffi::CStr;

/// Appends a (non-null) value of type `typid`, encoded as a `kind` column.
///
/// # Safety
/// `d` is a non-null datum of type `typid`, and `typid` suits `kind`.
pub unsafe fn encode_value(kind: KeyKind, desc: bool, typid: Oid, d: Datum, w: &mut KeyWriter) {
    // SAFETY (whole match): the caller passes a non-null datum of type `typid`, which suits `kind`: the
    // integer, bool, date and timestamp kinds are by value, a uuid points to 16 bytes, the rest are
    // varlenas.
    match kind {
        KeyKind::Int => {
            let v = match typid {
                pg_sys::INT2OID => i64::from(d.value() as i16),
                pg_sys::INT4OID => i64::from(d.value() as i32),
                _ => d.value() as i64,
            };
            w.int(v, desc)
        }
        KeyKind::Bool => w.bool(d.value() != 0, desc),
        KeyKind::Uuid => {
            // SAFETY: a uuid datum points to 16 bytes.
            let b = unsafe { &*(d.cast_mut_ptr::<u8>() as *const [u8; 16]) };
            w.uuid(b, desc)
        }
        // SAFETY: these kinds are varlena types.
        KeyKind::Bytes | KeyKind::Text => w.bytes_col(unsafe { varlena_bytes(d) }, desc),
        // SAFETY: as above.
        KeyKind::BpChar => w.bpchar(unsafe { varlena_bytes(d) }, desc),
        KeyKind::Date => w.date(d.value() as i32, desc),
        KeyKind::Timestamp => w.timestamp(d.value() as i64, desc),
    }
}

impl KeyDesc {
    /// Appends column `i`'s (non-null) value to `w`.
    ///
    /// # Safety
    /// `d` is a non-null datum of column `i`'s type.
    pub unsafe fn encode_datum(&self, i: usize, d: Datum, w: &mut KeyWriter) {
        let c = &self.cols[i];
        // SAFETY: forwarded contract.
        unsafe { encode_value(c.kind, c.desc, c.typid, d, w) }
    }

    /// Whether a value of type `typid` can be compared with column `i` by
    /// its encoding (cross-type integer quals, varchar against text).
    /// Others, e.g. timestamp against timestamptz (which goes through the
    /// session time zone), cannot.
    pub fn compatible(&self, i: usize, typid: Oid) -> bool {
        let c = &self.cols[i];
        typid == c.typid
            || match c.kind {
                KeyKind::Int => {
                    matches!(typid, pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID)
                }
                KeyKind::Text => matches!(typid, pg_sys::TEXTOID | pg_sys::VARCHAROID),
                _ => false,
            }
    }

    /// Encodes the key of a heap tuple of this table.
    ///
    /// # Safety
    /// `tup` is a valid tuple of the table and `tupdesc` its descriptor.
    pub unsafe fn encode_heap_tuple(&self, tup: pg_sys::HeapTuple, tupdesc: pg_sys::TupleDesc) -> KeyWriter {
        let mut w = KeyWriter::new();
        for (i, c) in self.cols.iter().enumerate() {
            let mut isnull = false;
            // SAFETY: per the contract; attnum is a user column.
            let d = unsafe { pg_sys::heap_getattr(tup, i32::from(c.attnum), tupdesc, &mut isnull) };
            if isnull {
                // NOT NULL was checked at enable; a NULL here means the
                // column changed since: refuse rather than mis-latch.
                errors::raise(
                    PgSqlErrorCode::ERRCODE_NOT_NULL_VIOLATION,
                    format!("pgkvx: key column \"{}\" of \"{}\" is NULL", c.name, self.relname),
                );
            }
            // SAFETY: non-null datum of the column's type.
            unsafe { self.encode_datum(i, d, &mut w) };
        }
        w
    }

    /// Encodes the key held in a scan slot.
    ///
    /// # Safety
    /// `slot` holds a tuple of this table.
    pub unsafe fn encode_slot(&self, slot: *mut pg_sys::TupleTableSlot) -> KeyWriter {
        let attnos: Vec<i32> = self.cols.iter().map(|c| i32::from(c.attnum)).collect();
        // SAFETY: per the contract, the key columns are at their attnums.
        unsafe { self.encode_slot_at(slot, &attnos) }
    }

    /// Encodes the key held in a slot whose key columns are at `attnos`
    /// (an index-only scan's slot holds the index's columns).
    ///
    /// # Safety
    /// `slot` holds a row whose attribute `attnos[i]` is key column `i`.
    pub unsafe fn encode_slot_at(&self, slot: *mut pg_sys::TupleTableSlot, attnos: &[i32]) -> KeyWriter {
        let mut w = KeyWriter::new();
        for (i, &a) in attnos.iter().enumerate().take(self.cols.len()) {
            let mut isnull = false;
            // SAFETY: `slot` holds a row whose attribute `a` is key column `i` (the caller's
            // contract); slot_getattr deforms up to it.
            let d = unsafe { pg_sys::slot_getattr(slot, a, &mut isnull) };
            if isnull {
                break; // cannot happen for a NOT NULL key; a prefix is conservative
            }
            // SAFETY: non-null datum of the column's type.
            unsafe { self.encode_datum(i, d, &mut w) };
        }
        w
    }

    /// Parses a bound given as text: the key's value for a one-column key,
    /// or a row literal of the leading 1..n columns (`(1,abc)`) for a
    /// composite key.  Returns the encoding and how many columns it has.
    pub fn parse_bound(&self, text: &str, what: &str) -> (KeyWriter, usize) {
        let fields: Vec<Option<String>> = if self.cols.len() == 1 {
            vec![Some(text.to_string())]
        } else {
            parse_row_literal(text).unwrap_or_else(|| {
                errors::raise_hint(
                    PgSqlErrorCode::ERRCODE_INVALID_TEXT_REPRESENTATION,
                    format!("invalid {what} bound \"{text}\" for the key of \"{}\"", self.relname),
                    format!(
                        "The key has columns ({}); write a row literal of its leading columns, e.g. '(1)' or '(1,abc)'.",
                        self.cols.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                )
            })
        };
        if fields.is_empty() || fields.len() > self.cols.len() {
            errors::raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!(
                    "{what} bound \"{text}\" has {} fields; the key of \"{}\" has {}",
                    fields.len(),
                    self.relname,
                    self.cols.len()
                ),
            );
        }
        let mut w = KeyWriter::new();
        for (i, f) in fields.iter().enumerate() {
            let Some(f) = f else {
                errors::raise(
                    PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                    format!("{what} bound of \"{}\" has a NULL key column", self.relname),
                );
            };
            let d = input_datum(self.cols[i].typid, -1, f);
            // SAFETY: input functions return a value of their type.
            unsafe { self.encode_datum(i, d, &mut w) };
        }
        (w, fields.len())
    }

    /// Text of an encoded key (or key prefix), one value per column, with
    /// `…` where the bytes run out (a truncated or partial key).
    pub fn format_key(&self, bytes: &[u8]) -> String {
        self.decode_text(bytes).map_or_else(|| format!("{bytes:02x?}"), |(s, _)| s)
    }

    /// The text of each whole column `bytes` encode (a key or a prefix of
    /// its columns), as `parse_bound` takes them back; `None` when the
    /// bytes end inside a column or hold none.
    pub fn key_fields(&self, bytes: &[u8]) -> Option<Vec<String>> {
        let mut pos = 0;
        let mut fields = Vec::new();
        for c in &self.cols {
            if pos == bytes.len() {
                break;
            }
            fields.push(output_value(c.typid, &decode_col(c.kind, c.desc, bytes, &mut pos)?));
        }
        (pos == bytes.len() && !fields.is_empty()).then_some(fields)
    }

    /// Decodes `bytes` as a key or a prefix of whole columns; `None` when
    /// they end inside a column (e.g. a bound that was incremented).
    fn decode_text(&self, bytes: &[u8]) -> Option<(String, bool)> {
        let mut pos = 0;
        let mut parts = Vec::new();
        for c in &self.cols {
            if pos == bytes.len() {
                break;
            }
            let v = decode_col(c.kind, c.desc, bytes, &mut pos)?;
            parts.push(output_value(c.typid, &v));
        }
        if pos != bytes.len() {
            return None;
        }
        let complete = parts.len() == self.cols.len();
        let mut s = if self.cols.len() == 1 && parts.len() == 1 {
            parts.pop().unwrap_or_default()
        } else {
            format!("({})", parts.join(","))
        };
        if !complete {
            s.push('…');
        }
        Some((s, complete))
    }

    /// A bound that is "just past every key starting with p" (an exclusive
    /// lower or inclusive upper bound): the text of p, if that is what it is.
    fn successor_of(&self, bytes: &[u8]) -> Option<String> {
        let (&last, head) = bytes.split_last()?;
        let mut p = head.to_vec();
        p.push(last.checked_sub(1)?);
        let (s, complete) = self.decode_text(&p)?;
        (KeyBuf::prefix_successor(&p).as_bytes() == bytes).then(|| {
            if complete {
                s
            } else {
                s.trim_end_matches('…').to_string() + "…"
            }
        })
    }

    /// A span for people, in interval notation: `[k]` for one key, `[p…]`
    /// for every key starting with a prefix, `-∞`/`+∞` for open ends, `(`
    /// and `]` where a bound excludes or includes a key (and with `…`,
    /// everything starting with it).
    pub fn format_span(&self, span: &Span) -> String {
        let lo = span.start.as_bytes();
        if span.end == Span::point(lo).end && !lo.is_empty() {
            return format!("[{}]", self.format_key(lo));
        }
        if span.end == KeyBuf::prefix_successor(lo) && !lo.is_empty() {
            let k = self.format_key(lo);
            return format!("[{}]", if k.ends_with('…') { k } else { format!("{k}…") });
        }
        let lo_s = if lo.is_empty() {
            "[-∞".to_string()
        } else if let Some((s, _)) = self.decode_text(lo) {
            format!("[{s}")
        } else if let Some(s) = self.successor_of(lo) {
            format!("({s}")
        } else {
            format!("[{lo:02x?}")
        };
        if span.end.is_infinite() {
            return format!("{lo_s}, +∞)");
        }
        let hi = span.end.as_bytes();
        // [.., k ++ 0x00) ends right after key k: show it as inclusive.
        if let Some(k) = hi.strip_suffix(&[0]) {
            if let Some((k_s, true)) = self.decode_text(k) {
                return format!("{lo_s}, {k_s}]");
            }
        }
        if let Some((s, _)) = self.decode_text(hi) {
            format!("{lo_s}, {s})")
        } else if let Some(s) = self.successor_of(hi) {
            format!("{lo_s}, {s}]")
        } else {
            format!("{lo_s}, {hi:02x?})")
        }
    }
}

/// Text of a decoded value through its type's output function.
fn output_value(typid: Oid, v: &KeyValue) -> String {
    let d: Datum = match v {
        KeyValue::Int(i) => match typid {
            pg_sys::INT2OID => Datum::from(*i as i16),
            pg_sys::INT4OID => Datum::from(*i as i32),
            _ => Datum::from(*i),
        },
        KeyValue::Bool(b) => Datum::from(*b),
        KeyValue::Date(d) => Datum::from(*d),
        KeyValue::Timestamp(t) => Datum::from(*t),
        KeyValue::Uuid(u) => {
            // SAFETY: palloc'd copy that outlives the output call.
            let p = unsafe { pg_sys::palloc(16) } as *mut u8;
            // SAFETY: 16 bytes each way.
            unsafe { std::ptr::copy_nonoverlapping(u.as_ptr(), p, 16) };
            Datum::from(p)
        }
        KeyValue::Bytes(b) => {
            if typid == pg_sys::BYTEAOID {
                Datum::from(pgrx::varlena::rust_byte_slice_to_bytea(b).into_pg())
            } else {
                // Text keys are valid in the database encoding by construction;
                // a truncated one may end mid-character, so show it lossily.
                let s = String::from_utf8_lossy(b);
                Datum::from(pgrx::varlena::rust_str_to_text_p(&s).into_pg())
            }
        }
    };
    let mut out = pg_sys::InvalidOid;
    let mut varlena = false;
    // SAFETY: the datum has the type the output function expects.
    unsafe {
        pg_sys::getTypeOutputInfo(typid, &mut out, &mut varlena);
        CStr::from_ptr(pg_sys::OidOutputFunctionCall(out, d)).to_string_lossy().into_owned()
    }
}

/// Splits a row literal `(a,"b c",)` into fields (`None` for an empty,
/// unquoted field, i.e. NULL), following record_in's quoting rules.
pub fn parse_row_literal(s: &str) -> Option<Vec<Option<String>>> {
    let s = s.trim();
    let inner = s.strip_prefix('(')?.strip_suffix(')')?;
    let mut fields = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut any_quote) = (false, false);
    let mut chars = inner.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '\\' => cur.push(chars.next()?),
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                cur.push('"');
            }
            '"' => {
                quoted = !quoted;
                any_quote = true;
            }
            ',' if !quoted => {
                fields.push((any_quote || !cur.is_empty()).then(|| std::mem::take(&mut cur)));
                any_quote = false;
            }
            c => cur.push(c),
        }
    }
    if quoted {
        return None;
    }
    fields.push((any_quote || !cur.is_empty()).then_some(cur));
    Some(fields)
}

#[cfg(test)]
mod row_literal_tests {
    use super::parse_row_literal;

    #[test]
    fn row_literals_split_like_record_in() {
        let cases: &[(&str, Option<Vec<Option<&str>>>)] = &[
            ("(1)", Some(vec![Some("1")])),
            ("(1,abc)", Some(vec![Some("1"), Some("abc")])),
            ("(1,\"a,b\")", Some(vec![Some("1"), Some("a,b")])),
            ("(1,\"say \"\"hi\"\"\")", Some(vec![Some("1"), Some("say \"hi\"")])),
            ("(1,)", Some(vec![Some("1"), None])),
            ("(1,\"\")", Some(vec![Some("1"), Some("")])),
            ("(a\\,b)", Some(vec![Some("a,b")])),
            ("1,2", None),
            ("(\"open)", None),
        ];
        for (text, want) in cases {
            let got = parse_row_literal(text);
            let want: Option<Vec<Option<String>>> =
                want.as_ref().map(|v| v.iter().map(|f| f.map(str::to_string)).collect());
            assert_eq!(got, want, "{text}");
        }
    }
}

/// The codec against values Postgres produces: for each key type, the keys
/// of a generated set (edge values included) are encoded from the datums a
/// query returns `ORDER BY` the key, and their bytes must come out strictly
/// increasing in that order.  One-column keys also go through their text
/// form both ways.
#[cfg(feature = "pg_test")]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use crate::pg::{quote_ident, quote_literal};
    use pgrx::prelude::*;

    fn oid_of(name: &str) -> Oid {
        Spi::get_one::<Oid>(&format!("SELECT {}::pg_catalog.regclass::pg_catalog.oid", quote_literal(name)))
            .unwrap()
            .unwrap()
    }

    fn key_of(table: &str, index: Option<&str>) -> KeyDesc {
        KeyDesc::resolve(oid_of(table), index.map(oid_of))
    }

    /// The key of every row, encoded from the datums of
    /// `SELECT <key columns> FROM table ORDER BY order_by`, in that order.
    fn encoded_in_order(key: &KeyDesc, table: &str, order_by: &str) -> Vec<KeyWriter> {
        let cols: Vec<String> = key.cols.iter().map(|c| quote_ident(&c.name)).collect();
        let sql = format!("SELECT {} FROM {table} ORDER BY {order_by}", cols.join(", "));
        Spi::connect(|client| {
            let mut rows = client.select(&sql, None, &[]).unwrap();
            let mut out = Vec::new();
            while rows.next().is_some() {
                let mut w = KeyWriter::new();
                for i in 0..key.cols.len() {
                    let d = rows.get_datum_by_ordinal(i + 1).unwrap().expect("key columns are NOT NULL");
                    // SAFETY: result column i is key column i, of its type,
                    // and lives until the SPI connection closes.
                    unsafe { key.encode_datum(i, d, &mut w) };
                }
                out.push(w);
            }
            out
        })
    }

    /// Each key's bytes sort strictly above the previous key's (or tie, when
    /// one was truncated: a truncated key is a prefix of the exact one).
    fn assert_byte_order(keys: &[KeyWriter], what: &str, min_rows: usize) {
        assert!(keys.len() >= min_rows, "{what}: only {} rows", keys.len());
        for (i, w) in keys.windows(2).enumerate() {
            let (a, b) = (w[0].bytes(), w[1].bytes());
            let ok = if w[0].truncated() || w[1].truncated() { a <= b } else { a < b };
            assert!(ok, "{what}: row {} encodes {:?}, row {} {:?}", i + 1, w[0], i + 2, w[1]);
        }
    }

    /// Each key of a one-column table, as Postgres prints it, parses to its
    /// encoding, and its encoding formats back to that text.
    fn assert_text_round_trip(key: &KeyDesc, table: &str, keys: &[KeyWriter]) {
        let col = quote_ident(&key.cols[0].name);
        let texts: Vec<String> = Spi::connect(|c| {
            c.select(&format!("SELECT {col}::text AS key_text FROM {table} ORDER BY {col}"), None, &[])
                .unwrap()
                .map(|r| r.get::<String>(1).unwrap().unwrap())
                .collect()
        });
        assert_eq!(texts.len(), keys.len());
        for (text, w) in texts.iter().zip(keys) {
            assert_eq!(key.parse_bound(text, "test").0.bytes(), w.bytes(), "{table}: {text}");
            assert_eq!(key.format_key(w.bytes()), *text, "{table}");
        }
    }

    fn check_one_column(table: &str, min_rows: usize) {
        let key = key_of(table, None);
        let keys = encoded_in_order(&key, table, &quote_ident(&key.cols[0].name));
        assert_byte_order(&keys, table, min_rows);
        assert_text_round_trip(&key, table, &keys);
    }

    #[pg_test]
    fn integer_keys_sort_as_order_by() {
        Spi::run(
            "SELECT pg_catalog.setseed(0.25);
             CREATE TABLE k_i2 (k int2 PRIMARY KEY);
             INSERT INTO k_i2 SELECT g FROM generate_series(-32768, 32767, 331) g;
             INSERT INTO k_i2 VALUES (-32768), (32767), (-1), (0), (1) ON CONFLICT DO NOTHING;
             CREATE TABLE k_i4 (k int4 PRIMARY KEY);
             INSERT INTO k_i4 SELECT g FROM generate_series(-2147483648, 2147483647, 16777259) g;
             INSERT INTO k_i4 SELECT (random() * 4294967295 - 2147483648)::int4 FROM generate_series(1, 200)
                 ON CONFLICT DO NOTHING;
             INSERT INTO k_i4 VALUES (-2147483648), (2147483647), (-1), (0), (1) ON CONFLICT DO NOTHING;
             CREATE TABLE k_i8 (k int8 PRIMARY KEY);
             INSERT INTO k_i8 SELECT g FROM generate_series(-9223372036854775808, 9223372036854775807, 36028797018963971) g;
             INSERT INTO k_i8 VALUES (-9223372036854775808), (9223372036854775807), (-1), (0), (1), (4294967296), (-4294967297)
                 ON CONFLICT DO NOTHING;",
        )
        .unwrap();
        check_one_column("k_i2", 200);
        check_one_column("k_i4", 400);
        check_one_column("k_i8", 500);
    }

    #[pg_test]
    fn text_keys_under_c_sort_as_order_by() {
        Spi::run(
            "CREATE TABLE k_text (k text COLLATE \"C\" PRIMARY KEY);
             INSERT INTO k_text VALUES (''), (' '), ('a'), ('a '), ('a b'), ('ab'), ('A'), ('Z'), ('b'), ('e'),
                 ('é'), ('€'), ('😀'), (E'\\x01'), (E'a\\x01'), (E'\\x7f'), ('~'), (repeat('z', 36));
             INSERT INTO k_text SELECT md5(g::text) FROM generate_series(1, 200) g;
             INSERT INTO k_text SELECT upper(substr(md5(g::text), 1, g % 9)) FROM generate_series(1, 200) g
                 ON CONFLICT DO NOTHING;
             CREATE TABLE k_varchar (k varchar(40) COLLATE \"C\" PRIMARY KEY);
             INSERT INTO k_varchar SELECT k FROM k_text;",
        )
        .unwrap();
        check_one_column("k_text", 300);
        check_one_column("k_varchar", 300);
        // Keys too long to latch in full sort no worse than tied.
        Spi::run(
            "CREATE TABLE k_long (k text COLLATE \"C\" PRIMARY KEY);
             INSERT INTO k_long SELECT repeat('x', 40) || g FROM generate_series(1, 20) g;
             INSERT INTO k_long VALUES (repeat('x', 39)), (repeat('x', 39) || 'w'), (repeat('x', 39) || 'y');",
        )
        .unwrap();
        let key = key_of("k_long", None);
        let keys = encoded_in_order(&key, "k_long", "k");
        assert!(keys.iter().any(|k| k.truncated()), "no key was long enough to truncate");
        assert_byte_order(&keys, "k_long", 23);
    }

    /// A non-C collation does not sort by bytes, but its pattern operator
    /// class does, and the codec follows the index, not the collation.
    /// Only ICU gives a collation that sorts otherwise on every machine
    /// (libc's linguistic locales may not be installed); a PostgreSQL built
    /// without ICU has nothing to test here, and scripts/test says so.
    #[pg_test]
    fn text_pattern_ops_under_a_non_c_collation_sort_as_the_index() {
        let icu = Spi::get_one::<bool>("SELECT EXISTS (SELECT FROM pg_collation WHERE collname = 'und-x-icu')");
        if icu.unwrap() != Some(true) {
            return;
        }
        Spi::run(
            "CREATE TABLE k_icu (k text COLLATE \"und-x-icu\" NOT NULL);
             CREATE UNIQUE INDEX k_icu_key ON k_icu (k text_pattern_ops);
             INSERT INTO k_icu VALUES (''), ('a'), ('A'), ('b'), ('B'), ('e'), ('é'), ('f'), ('a-b'), ('ab'), ('a b'),
                 ('Ab'), ('1'), ('10'), ('9');
             INSERT INTO k_icu SELECT md5(g::text) FROM generate_series(1, 100) g;",
        )
        .unwrap();
        let differs = Spi::get_one::<bool>(
            "SELECT array_agg(k ORDER BY k) <> array_agg(k ORDER BY k USING OPERATOR(pg_catalog.~<~)) FROM k_icu",
        )
        .unwrap();
        assert_eq!(differs, Some(true), "the collation should not sort by bytes");
        let key = key_of("k_icu", Some("k_icu_key"));
        let keys = encoded_in_order(&key, "k_icu", "k USING OPERATOR(pg_catalog.~<~)");
        assert_byte_order(&keys, "k_icu", 100);
    }

    /// libc's C.UTF-8 sorts by code point, but PostgreSQL knows byte order
    /// only of "C" and "POSIX" among libc collations: it is refused rather
    /// than trusted.
    #[pg_test(error = "key column \"k\" of \"k_coll\" (text, collation \"c_utf8\") does not sort in byte order")]
    fn text_keys_under_a_non_c_collation_are_refused() {
        Spi::run(
            "CREATE COLLATION c_utf8 (provider = libc, locale = 'C.UTF-8');
             CREATE TABLE k_coll (k text COLLATE c_utf8 PRIMARY KEY)",
        )
        .unwrap();
        key_of("k_coll", None);
    }

    /// The codec has no encoding for NULL: a key that could hold one is
    /// refused up front.
    #[pg_test(error = "key column \"k\" of \"k_null\" may be NULL")]
    fn nullable_keys_are_refused() {
        Spi::run("CREATE TABLE k_null (k int); CREATE UNIQUE INDEX k_null_key ON k_null (k)").unwrap();
        key_of("k_null", Some("k_null_key"));
    }

    /// PostgreSQL 18's NOT VALID not-null constraint leaves old NULLs in
    /// place though it sets attnotnull: the key is still nullable.
    #[cfg(not_valid_not_null)]
    #[pg_test(error = "key column \"k\" of \"k_nv\" may be NULL")]
    fn keys_under_a_not_valid_not_null_are_refused() {
        Spi::run(
            "CREATE TABLE k_nv (k int); INSERT INTO k_nv VALUES (1), (NULL);
             CREATE UNIQUE INDEX k_nv_key ON k_nv (k);
             ALTER TABLE k_nv ADD CONSTRAINT k_nv_nn NOT NULL k NOT VALID",
        )
        .unwrap();
        key_of("k_nv", Some("k_nv_key"));
    }

    /// ... and once validated, it is not.
    #[cfg(not_valid_not_null)]
    #[pg_test]
    fn keys_under_a_validated_not_null_are_taken() {
        Spi::run(
            "CREATE TABLE k_v (k int); INSERT INTO k_v VALUES (1), (2);
             CREATE UNIQUE INDEX k_v_key ON k_v (k);
             ALTER TABLE k_v ADD CONSTRAINT k_v_nn NOT NULL k NOT VALID;
             ALTER TABLE k_v VALIDATE CONSTRAINT k_v_nn",
        )
        .unwrap();
        key_of("k_v", Some("k_v_key"));
    }

    #[pg_test]
    fn uuid_and_timestamptz_keys_sort_as_order_by() {
        Spi::run(
            "SELECT pg_catalog.setseed(0.5);
             CREATE TABLE k_uuid (k uuid PRIMARY KEY);
             INSERT INTO k_uuid VALUES ('00000000-0000-0000-0000-000000000000'), ('00000000-0000-0000-0000-000000000001'),
                 ('00000000-0000-0000-0000-000000000100'), ('7fffffff-ffff-ffff-ffff-ffffffffffff'),
                 ('80000000-0000-0000-0000-000000000000'), ('ffffffff-ffff-ffff-ffff-ffffffffffff');
             INSERT INTO k_uuid SELECT gen_random_uuid() FROM generate_series(1, 300) ON CONFLICT DO NOTHING;
             CREATE TABLE k_tstz (k timestamptz PRIMARY KEY);
             INSERT INTO k_tstz VALUES ('-infinity'), ('infinity'), ('4713-01-01 00:00:00+00 BC'),
                 ('294276-12-31 23:59:59.999999+00'), ('1970-01-01 00:00:00+00'), ('1999-12-31 23:59:59.999999+00'),
                 ('2000-01-01 00:00:00+00'), ('2000-01-01 00:00:00.000001+00');
             INSERT INTO k_tstz SELECT timestamptz '2000-01-01 00:00:00+00' + (random() - 0.5) * interval '800 years'
                 FROM generate_series(1, 300) ON CONFLICT DO NOTHING;",
        )
        .unwrap();
        check_one_column("k_uuid", 300);
        check_one_column("k_tstz", 300);
    }

    #[pg_test]
    fn other_key_types_sort_as_order_by() {
        Spi::run(
            "CREATE TABLE k_bytea (k bytea PRIMARY KEY);
             INSERT INTO k_bytea VALUES ('\\x'), ('\\x00'), ('\\x0000'), ('\\x0001'), ('\\x00ff'), ('\\x01'), ('\\xff'),
                 ('\\xff00'), ('\\xffff');
             INSERT INTO k_bytea SELECT decode(substr(md5(g::text), 1, 2 * (g % 12)), 'hex') FROM generate_series(1, 200) g
                 ON CONFLICT DO NOTHING;
             CREATE TABLE k_date (k date PRIMARY KEY);
             INSERT INTO k_date VALUES ('-infinity'), ('infinity'), ('4713-01-01 BC'), ('5874897-12-31'), ('2000-01-01'),
                 ('1999-12-31');
             INSERT INTO k_date SELECT date '2000-01-01' + g * 7919 FROM generate_series(-300, 300) g ON CONFLICT DO NOTHING;
             CREATE TABLE k_bool (k bool PRIMARY KEY);
             INSERT INTO k_bool VALUES (true), (false);
             CREATE TABLE k_char (k char(4) COLLATE \"C\" PRIMARY KEY);
             INSERT INTO k_char VALUES (''), ('a'), (' a'), ('a a'), ('ab'), ('b'), ('abcd'), ('A');",
        )
        .unwrap();
        check_one_column("k_bytea", 100);
        check_one_column("k_date", 500);
        // bool prints as t/f but casts to text as true/false: order only.
        let key = key_of("k_bool", None);
        assert_byte_order(&encoded_in_order(&key, "k_bool", "k"), "k_bool", 2);
        // bpchar prints with its padding but compares without it: order only.
        let key = key_of("k_char", None);
        assert_byte_order(&encoded_in_order(&key, "k_char", "k"), "k_char", 8);
    }

    #[pg_test]
    fn composite_keys_with_desc_columns_sort_as_order_by() {
        Spi::run(
            "CREATE TABLE k_comp (a int8 NOT NULL, b text COLLATE \"C\" NOT NULL, c timestamptz NOT NULL);
             INSERT INTO k_comp
                 SELECT a, b, c
                   FROM (VALUES (-9223372036854775808), (-1), (0), (1), (9223372036854775807)) x(a),
                        (VALUES (''), ('a'), ('a '), ('ab'), ('b'), ('é')) y(b),
                        (VALUES ('-infinity'::timestamptz), ('2000-01-01 00:00:00+00'), ('infinity')) z(c);
             CREATE UNIQUE INDEX k_comp_mixed ON k_comp (a, b DESC, c);
             CREATE UNIQUE INDEX k_comp_desc_first ON k_comp (c DESC, a, b);",
        )
        .unwrap();
        for (index, order_by) in [("k_comp_mixed", "a, b DESC, c"), ("k_comp_desc_first", "c DESC, a, b")] {
            let key = key_of("k_comp", Some(index));
            assert_eq!(key.cols.iter().filter(|c| c.desc).count(), 1, "{index}");
            let keys = encoded_in_order(&key, "k_comp", order_by);
            assert_byte_order(&keys, index, 90);
            // The row literal of each key parses to its encoding.
            let cols = key.cols.iter().map(|c| quote_ident(&c.name)).collect::<Vec<_>>().join(", ");
            let rows: Vec<String> = Spi::connect(|c| {
                c.select(&format!("SELECT ROW({cols})::text FROM k_comp ORDER BY {order_by}"), None, &[])
                    .unwrap()
                    .map(|r| r.get::<String>(1).unwrap().unwrap())
                    .collect()
            });
            for (text, w) in rows.iter().zip(&keys) {
                assert_eq!(key.parse_bound(text, "test").0.bytes(), w.bytes(), "{index}: {text}");
            }
        }
    }
}
