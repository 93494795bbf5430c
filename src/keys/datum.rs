//! Between Postgres values and encoded keys: from tuples and slots (writes
//! and scans), from text bounds (`latch_span`, `arrow_scan`), and back to
//! text for the views.

use super::codec::{decode_col, KeyKind, KeyValue, KeyWriter};
use super::desc::KeyDesc;
use crate::errors;
use crate::latch::{KeyBuf, Span};
use crate::pg::{input_datum, varlena_bytes};
use pgrx::pg_sys::{self, Datum, Oid};
use pgrx::PgSqlErrorCode;
use std::ffi::CStr;

/// Appends a (non-null) value of type `typid`, encoded as a `kind` column.
///
/// # Safety
/// `d` is a non-null datum of type `typid`, and `typid` suits `kind`.
pub unsafe fn encode_value(kind: KeyKind, desc: bool, typid: Oid, d: Datum, w: &mut KeyWriter) {
    // SAFETY (whole match): the datum has type `typid`, per contract.
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
            // SAFETY: per the contract.
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
fn parse_row_literal(s: &str) -> Option<Vec<Option<String>>> {
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
mod tests {
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
