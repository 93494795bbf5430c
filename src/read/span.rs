//! Declared spans D, from quals on key columns, and touched spans T, from
//! where a scan stopped.
//!
//! D must contain every key the read could return.  Equality on leading key
//! columns narrows it to a prefix; the first column after them may bound it
//! from below and above.  A row comparison `(a, b) > ($1, $2)` over key
//! columns bounds its first column inclusively (`a >= $1`); a bound of
//! another type is converted to the column's type where PostgreSQL's own
//! cross-type comparison converts it the same way (a `timestamp` or `date`
//! against a `timestamptz` key).  Everything else (later columns, arrays,
//! cross-type quals without such a conversion) is ignored, which only widens
//! D.  Wider is always safe: more waiting, never a missed row -- but a
//! bound dropped for nothing makes a tail wait for writers anywhere in the
//! table, so every bound that can be kept is.

use crate::keys::codec::KeyWriter;
use crate::keys::datum::encode_value;
use crate::keys::KeyDesc;
use crate::latch::{KeyBuf, Span};
use pgrx::pg_sys;

/// One evaluated qual `key column <strategy> value`.
#[derive(Clone, Copy, Debug)]
pub struct KeyQual {
    /// Position in the key (0-based).
    pub col: usize,
    /// A btree strategy number (1 `<` … 5 `>`).
    pub strategy: u16,
    pub value: pg_sys::Datum,
    /// The value's type (InvalidOid: the column's own).
    pub typid: pg_sys::Oid,
    pub isnull: bool,
}

/// A bound on one key column: the value and whether it is included.
#[derive(Clone, Copy)]
struct ColumnBound {
    datum: pg_sys::Datum,
    typid: pg_sys::Oid,
    inclusive: bool,
}

#[derive(Clone, Copy, Default)]
struct ColumnBounds {
    eq: Option<ColumnBound>,
    lo: Option<ColumnBound>,
    hi: Option<ColumnBound>,
}

fn encode_one(desc: &KeyDesc, i: usize, b: &ColumnBound) -> KeyWriter {
    let mut w = KeyWriter::new();
    // SAFETY: the datum has type b.typid, checked compatible with column i.
    unsafe { encode_value(desc.cols[i].kind, desc.cols[i].desc, b.typid, b.datum, &mut w) };
    w
}

/// Keeps the tighter of two bounds in encoded order: the greater lower
/// bound, or the smaller upper bound (`upper`); ties go to the exclusive one.
fn tighter(desc: &KeyDesc, i: usize, cur: Option<ColumnBound>, new: ColumnBound, upper: bool) -> Option<ColumnBound> {
    let Some(cur) = cur else { return Some(new) };
    let (a, b) = (encode_one(desc, i, &cur), encode_one(desc, i, &new));
    let ord = b.bytes().cmp(a.bytes());
    let better = if upper { ord.is_lt() } else { ord.is_gt() };
    if better || (ord.is_eq() && !new.inclusive) {
        Some(new)
    } else {
        Some(cur)
    }
}

/// D from evaluated quals on key columns.
pub fn declared(desc: &KeyDesc, quals: impl IntoIterator<Item = KeyQual>) -> Span {
    // Most keys have a column or two: no allocation for them, on every
    // guarded statement's start.
    let mut few = [ColumnBounds::default(); 4];
    let mut many = Vec::new();
    let cols: &mut [ColumnBounds] = if desc.cols.len() <= few.len() {
        &mut few[..desc.cols.len()]
    } else {
        many.resize(desc.cols.len(), ColumnBounds::default());
        &mut many
    };
    for q in quals {
        if q.isnull {
            // `k op NULL` is never true: the read returns nothing.
            return Span::EMPTY;
        }
        let i = q.col;
        if i >= desc.cols.len() {
            continue;
        }
        // A btree scan key's subtype is "same as the column" when invalid.
        let typid = if q.typid == pg_sys::InvalidOid { desc.cols[i].typid } else { q.typid };
        let Some((datum, typid)) = as_column_type(desc, i, typid, q.value) else { continue };
        let b = |inclusive| ColumnBound { datum, typid, inclusive };
        // On a DESC column the encoding runs backwards: `>` bounds from above.
        let flip = desc.cols[i].desc;
        let c = &mut cols[i];
        match (u32::from(q.strategy), flip) {
            (pg_sys::BTEqualStrategyNumber, _) => c.eq = Some(b(true)),
            (pg_sys::BTGreaterStrategyNumber, false) | (pg_sys::BTLessStrategyNumber, true) => {
                c.lo = tighter(desc, i, c.lo, b(false), false)
            }
            (pg_sys::BTGreaterEqualStrategyNumber, false) | (pg_sys::BTLessEqualStrategyNumber, true) => {
                c.lo = tighter(desc, i, c.lo, b(true), false)
            }
            (pg_sys::BTLessStrategyNumber, false) | (pg_sys::BTGreaterStrategyNumber, true) => {
                c.hi = tighter(desc, i, c.hi, b(false), true)
            }
            (pg_sys::BTLessEqualStrategyNumber, false) | (pg_sys::BTGreaterEqualStrategyNumber, true) => {
                c.hi = tighter(desc, i, c.hi, b(true), true)
            }
            _ => {}
        }
    }
    assemble(desc, cols)
}

/// `value` (of type `typid`) as a value the codec can encode for key
/// column `i`: itself when the types are compatible, else converted where
/// PostgreSQL's cross-type comparison of the two types converts the same
/// way (date and timestamp to the column's timestamp type, under the
/// session's time zone, exactly as the operators do).
fn as_column_type(
    desc: &KeyDesc,
    i: usize,
    typid: pg_sys::Oid,
    value: pg_sys::Datum,
) -> Option<(pg_sys::Datum, pg_sys::Oid)> {
    if desc.compatible(i, typid) {
        return Some((value, typid));
    }
    let column = desc.cols[i].typid;
    let mut overflow = 0;
    // SAFETY: the conversions PostgreSQL's cross-type comparisons use, of
    // a non-null value of the argument type; out of range they report an
    // overflow (the operators compare it as an infinity) instead of
    // raising, and the bound is then left out.
    let converted = unsafe {
        match (column, typid) {
            (pg_sys::TIMESTAMPTZOID, pg_sys::TIMESTAMPOID) => {
                pg_sys::Datum::from(pg_sys::timestamp2timestamptz_opt_overflow(value.value() as i64, &mut overflow))
            }
            (pg_sys::TIMESTAMPTZOID, pg_sys::DATEOID) => {
                pg_sys::Datum::from(pg_sys::date2timestamptz_opt_overflow(value.value() as i32, &mut overflow))
            }
            (pg_sys::TIMESTAMPOID, pg_sys::DATEOID) => {
                pg_sys::Datum::from(pg_sys::date2timestamp_opt_overflow(value.value() as i32, &mut overflow))
            }
            _ => return None,
        }
    };
    (overflow == 0 && desc.compatible(i, column)).then_some((converted, column))
}

/// The key quals among a btree scan's keys, `key_col(index column)` giving
/// the key position of an index column.  Array, row-comparison and null
/// searches are left out (widening D); a plain comparison with NULL keeps
/// its null flag, so D comes out empty.
pub fn scan_key_quals<'a>(
    keys: &'a [pg_sys::ScanKeyData],
    key_col: impl Fn(usize) -> Option<usize> + 'a,
) -> impl Iterator<Item = KeyQual> + 'a {
    keys.iter().filter_map(move |sk| {
        let flags = sk.sk_flags as u32;
        if flags & (pg_sys::SK_ROW_HEADER | pg_sys::SK_SEARCHARRAY | pg_sys::SK_SEARCHNULL | pg_sys::SK_SEARCHNOTNULL)
            != 0
        {
            return None;
        }
        let col = key_col((sk.sk_attno as usize).checked_sub(1)?)?;
        Some(KeyQual {
            col,
            strategy: sk.sk_strategy,
            value: sk.sk_argument,
            typid: sk.sk_subtype,
            isnull: flags & pg_sys::SK_ISNULL != 0,
        })
    })
}

fn assemble(desc: &KeyDesc, cols: &[ColumnBounds]) -> Span {
    let mut prefix = KeyWriter::new();
    let mut j = 0;
    while j < cols.len() {
        let Some(eq) = cols[j].eq else { break };
        // SAFETY: bounds were checked compatible when collected.
        unsafe { encode_value(desc.cols[j].kind, desc.cols[j].desc, eq.typid, eq.datum, &mut prefix) };
        j += 1;
    }
    if j == cols.len() {
        return Span::point(prefix.bytes());
    }
    let with = |b: &ColumnBound| {
        let mut w = prefix;
        // SAFETY: as above.
        unsafe { encode_value(desc.cols[j].kind, desc.cols[j].desc, b.typid, b.datum, &mut w) };
        w
    };
    // A truncated encoding is a prefix of the exact one: starts round down,
    // ends round up, whatever the operator.
    let start = match &cols[j].lo {
        None => KeyBuf::floor(prefix.bytes()),
        Some(b) => {
            let w = with(b);
            if b.inclusive || w.truncated() {
                KeyBuf::floor(w.bytes())
            } else {
                KeyBuf::prefix_successor(w.bytes())
            }
        }
    };
    let end = match &cols[j].hi {
        None if prefix.bytes().is_empty() => KeyBuf::INFINITE,
        None => KeyBuf::prefix_successor(prefix.bytes()),
        Some(b) => {
            let w = with(b);
            if b.inclusive {
                KeyBuf::prefix_successor(w.bytes())
            } else {
                KeyBuf::ceil(w.bytes())
            }
        }
    };
    Span { start, end }
}

/// T: what a scan that stopped at `last` (having returned its full count)
/// looked at.  A scan that ran out of rows touched all of D.
pub fn touched(declared: &Span, last: Option<&KeyWriter>, forward: bool) -> Span {
    match last {
        None => *declared,
        Some(k) => {
            let p = Span::point(k.bytes());
            if forward {
                Span { start: declared.start, end: p.end }
            } else {
                Span { start: p.start, end: declared.end }
            }
        }
    }
}

#[cfg(feature = "pg_test")]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    fn key(tbl: &str) -> KeyDesc {
        let oid = Spi::get_one::<pg_sys::Oid>(&format!("SELECT '{tbl}'::regclass::oid")).unwrap().unwrap();
        KeyDesc::resolve(oid, None)
    }

    fn sk(attno: i16, strategy: u32, datum: pg_sys::Datum, subtype: pg_sys::Oid) -> pg_sys::ScanKeyData {
        pg_sys::ScanKeyData {
            sk_attno: attno,
            sk_strategy: strategy as u16,
            sk_subtype: subtype,
            sk_argument: datum,
            ..Default::default()
        }
    }

    /// D from scan keys of the key index itself (index column i = key column i).
    fn declared_keys(desc: &KeyDesc, keys: &[pg_sys::ScanKeyData]) -> Span {
        declared(desc, scan_key_quals(keys, Some))
    }

    fn enc(desc: &KeyDesc, text: &str) -> Vec<u8> {
        desc.parse_bound(text, "test").0.bytes().to_vec()
    }

    #[pg_test]
    fn declared_span_follows_the_quals() {
        Spi::run("CREATE TABLE ds (k bigint PRIMARY KEY)").unwrap();
        let d = key("ds");
        let five = pg_sys::Datum::from(5i64);
        let ten4 = pg_sys::Datum::from(10i32);
        let (gt, ge, lt, le, eq) = (
            pg_sys::BTGreaterStrategyNumber,
            pg_sys::BTGreaterEqualStrategyNumber,
            pg_sys::BTLessStrategyNumber,
            pg_sys::BTLessEqualStrategyNumber,
            pg_sys::BTEqualStrategyNumber,
        );
        let i8 = pg_sys::INT8OID;
        // k > 5: starts just past 5, open above
        let s = declared_keys(&d, &[sk(1, gt, five, i8)]);
        assert_eq!(s.start.as_bytes(), enc(&d, "6").as_slice());
        assert!(s.end.is_infinite());
        // k >= 5 AND k < 10::int4 (a cross-type qual encodes the same)
        let s = declared_keys(&d, &[sk(1, ge, five, i8), sk(1, lt, ten4, pg_sys::INT4OID)]);
        assert_eq!((s.start.as_bytes(), s.end.as_bytes()), (enc(&d, "5").as_slice(), enc(&d, "10").as_slice()));
        // k <= 10 is [.., 11)
        let s = declared_keys(&d, &[sk(1, le, ten4, pg_sys::INT4OID)]);
        assert_eq!(s.end.as_bytes(), enc(&d, "11").as_slice());
        // k = 5 is one key; two lower bounds keep the tighter
        assert_eq!(declared_keys(&d, &[sk(1, eq, five, i8)]), Span::point(&enc(&d, "5")));
        let s = declared_keys(&d, &[sk(1, gt, five, i8), sk(1, ge, ten4, pg_sys::INT4OID)]);
        assert_eq!(s.start.as_bytes(), enc(&d, "10").as_slice());
        // no quals: the whole table
        assert_eq!(declared(&d, std::iter::empty()), Span::ALL);
    }

    #[pg_test]
    fn declared_span_of_a_composite_prefix() {
        Spi::run("CREATE TABLE dc (a int, b text COLLATE \"C\", PRIMARY KEY (a, b))").unwrap();
        let d = key("dc");
        let one = pg_sys::Datum::from(1i32);
        let x = pgrx::varlena::rust_str_to_text_p("x").into_pg();
        let s = declared_keys(
            &d,
            &[
                sk(1, pg_sys::BTEqualStrategyNumber, one, pg_sys::INT4OID),
                sk(2, pg_sys::BTGreaterStrategyNumber, pg_sys::Datum::from(x), pg_sys::TEXTOID),
            ],
        );
        // (1, > 'x'): past every key starting with (1,'x'), up to the end of prefix (1)
        assert_eq!(s.start, KeyBuf::prefix_successor(&enc(&d, "(1,x)")));
        assert_eq!(s.end, KeyBuf::prefix_successor(&enc(&d, "(1)")));
        assert_eq!(d.format_span(&s), "((1,x), (2)…)");
        // a qual on the second column alone cannot narrow the span
        let s = declared_keys(&d, &[sk(2, pg_sys::BTEqualStrategyNumber, pg_sys::Datum::from(x), pg_sys::TEXTOID)]);
        assert_eq!(s, Span::ALL);
    }

    #[pg_test]
    fn declared_span_of_a_desc_column_flips_bounds() {
        Spi::run("CREATE TABLE dd (k int NOT NULL); CREATE UNIQUE INDEX dd_k ON dd (k DESC)").unwrap();
        let oid = Spi::get_one::<pg_sys::Oid>("SELECT 'dd'::regclass::oid").unwrap().unwrap();
        let idx = Spi::get_one::<pg_sys::Oid>("SELECT 'dd_k'::regclass::oid").unwrap().unwrap();
        let d = KeyDesc::resolve(oid, Some(idx));
        // k > 5 on a DESC index: everything before 5 in index order
        let s =
            declared_keys(&d, &[sk(1, pg_sys::BTGreaterStrategyNumber, pg_sys::Datum::from(5i32), pg_sys::INT4OID)]);
        assert!(s.start.as_bytes().is_empty());
        assert_eq!(s.end.as_bytes(), enc(&d, "5").as_slice());
        assert!(Span::point(&enc(&d, "6")).overlaps(&s) && !Span::point(&enc(&d, "5")).overlaps(&s));
    }
}
