//! Declared spans D, from quals on key columns, and touched spans T, from
//! where a scan stopped.
//!
//! D is a set of intervals that must contain every key the read could
//! return.  Equality on leading key columns narrows it to a prefix, one
//! per value of an `= ANY(array)` or `IN (…)`; the first column after them
//! may bound it from below and above.  An `OR` whose every branch bounds
//! the key is the union of its branches' intervals.  A row comparison
//! `(a, b) > ($1, $2)` over key columns bounds its first column
//! inclusively (`a >= $1`); a bound of another type is converted to the
//! column's type where PostgreSQL's own cross-type comparison converts it
//! the same way (a `timestamp` or `date` against a `timestamptz` key).
//! Everything else
//! (later columns, cross-type quals without such a conversion) is ignored,
//! which only widens D.  Past [`MAX_INTERVALS`] intervals the values of a
//! column are taken as one range from the least to the greatest, and the
//! intervals as one covering interval: wider, never the whole table.  Wider
//! is always safe: more waiting, never a missed row -- but a bound dropped
//! for nothing makes a read wait for writers anywhere in the table, so
//! every bound that can be kept is.

use crate::keys::codec::KeyWriter;
use crate::keys::datum::encode_value;
use crate::keys::KeyDesc;
use pgkvx_latch::{KeyBuf, Span};
use pgrx::pg_sys;
use smallvec::{smallvec, SmallVec};

/// A few spans, inline: a read's D and T are one or two intervals nearly
/// always, and are computed afresh every statement.
pub type Spans = SmallVec<[Span; 2]>;

/// Pieces on their way into a [`Declared`].
type Pieces = SmallVec<[Piece; 2]>;

/// The most intervals a declared span keeps apart; past it, one interval
/// covers them all.
pub const MAX_INTERVALS: usize = 64;

/// One evaluated qual `key column <strategy> value`.
#[derive(Clone, Copy, Debug)]
pub struct KeyQual {
    /// Position in the key (0-based).
    pub col: usize,
    /// A btree strategy number (1 `<` … 5 `>`).
    pub strategy: u16,
    /// An array of values (`= ANY`), or one value.
    pub value: pg_sys::Datum,
    /// The value's type, or the array's element type (InvalidOid: the
    /// column's own).
    pub typid: pg_sys::Oid,
    pub isnull: bool,
    /// `col = ANY(value)`.
    pub array: bool,
    /// 0: ANDed with the read's other quals; n > 0: a branch of the n-th
    /// OR, ANDed with the quals of the same `group` and `branch`.
    pub group: u16,
    pub branch: u16,
}

impl KeyQual {
    /// A qual whose value is not known yet (an init plan's result, a
    /// CTE's): it bounds nothing, but it keeps its OR branch.  Left out,
    /// a branch of nothing else but it would drop out of the union and
    /// narrow D to the other branches (`k > (SELECT …) OR k = 100` to
    /// `{100}`), where leaving out an ANDed qual only widens it.
    pub fn unknown(group: u16, branch: u16) -> KeyQual {
        KeyQual {
            col: usize::MAX,
            strategy: 0,
            value: pg_sys::Datum::from(0),
            typid: pg_sys::InvalidOid,
            isnull: false,
            array: false,
            group,
            branch,
        }
    }

    /// A plain comparison ANDed with the others.
    pub fn plain(col: usize, strategy: u16, value: pg_sys::Datum, typid: pg_sys::Oid, isnull: bool) -> KeyQual {
        KeyQual { col, strategy, value, typid, isnull, array: false, group: 0, branch: 0 }
    }
}

/// A declared span: sorted, disjoint intervals, and whether the read's
/// quals leave its far ends open: the last interval's end (no upper bound:
/// a tail) and the first one's start.  Every other end is a bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    pub spans: Spans,
    pub open_above: bool,
    pub open_below: bool,
}

/// One interval on its way into a [`Declared`], with whether each of its
/// ends is left open by the quals.
#[derive(Clone, Copy)]
struct Piece {
    span: Span,
    lo_open: bool,
    hi_open: bool,
}

impl Declared {
    /// Every key.
    pub fn all() -> Declared {
        Declared { spans: smallvec![Span::ALL], open_above: true, open_below: true }
    }

    /// No key at all (`k = NULL`).
    pub fn none() -> Declared {
        Declared { spans: Spans::new(), open_above: false, open_below: false }
    }

    /// One interval.
    pub fn one(span: Span, open_above: bool, open_below: bool) -> Declared {
        normalized(smallvec![Piece { span, lo_open: open_below, hi_open: open_above }])
    }

    /// Whether the quals leave the keys open in a scan's direction.
    pub fn open_toward(&self, up: bool) -> bool {
        if up {
            self.open_above
        } else {
            self.open_below
        }
    }

    /// The least interval covering all of it.
    pub fn hull(&self) -> Span {
        self.spans.iter().fold(Span::EMPTY, |a, s| a.hull(s))
    }

    fn pieces(&self) -> impl Iterator<Item = Piece> + '_ {
        let n = self.spans.len();
        self.spans.iter().enumerate().map(move |(i, &span)| Piece {
            span,
            lo_open: i == 0 && self.open_below,
            hi_open: i + 1 == n && self.open_above,
        })
    }

    /// The keys in both.  Each end of a piece is open as the end it comes
    /// from is (both, where they meet): a bound of either caps the other.
    pub fn intersect(&self, other: &Declared) -> Declared {
        let mut out = Pieces::new();
        for a in self.pieces() {
            for b in other.pieces() {
                let span = a.span.intersect(&b.span);
                if span.is_empty() {
                    continue;
                }
                let lo_open = match a.span.start.cmp(&b.span.start) {
                    std::cmp::Ordering::Greater => a.lo_open,
                    std::cmp::Ordering::Less => b.lo_open,
                    std::cmp::Ordering::Equal => a.lo_open && b.lo_open,
                };
                let hi_open = match a.span.end.cmp(&b.span.end) {
                    std::cmp::Ordering::Less => a.hi_open,
                    std::cmp::Ordering::Greater => b.hi_open,
                    std::cmp::Ordering::Equal => a.hi_open && b.hi_open,
                };
                out.push(Piece { span, lo_open, hi_open });
            }
        }
        normalized(out)
    }

    /// The keys in either.
    pub fn union(&self, other: &Declared) -> Declared {
        normalized(self.pieces().chain(other.pieces()).collect())
    }

    /// T of a read of it that ran out of rows moving up the key
    /// (`forward`) or down, having examined `last` last (None: no row).
    /// Where it is open that way, its far interval -- the open one, a
    /// tail -- only up to `last` (none of it when `last` lies before it);
    /// every other interval whole: a range or a list in an OR beside the
    /// tail was read to its bound.  Where it is bounded, all of it.
    pub fn ran_out(&self, last: Option<&KeyWriter>, forward: bool) -> Spans {
        if !self.open_toward(forward) {
            return self.spans.clone();
        }
        self.up_to_last(last, forward)
    }

    /// What a read of it up the key (`forward`) or down returns rows from
    /// when its last row is `last` (None: no row): its far interval only
    /// up to `last`, bounded or not; every other interval whole.
    pub fn up_to_last(&self, last: Option<&KeyWriter>, forward: bool) -> Spans {
        if self.spans.is_empty() {
            return Spans::new();
        }
        let far = if forward { self.spans.len() - 1 } else { 0 };
        let mut out = Spans::with_capacity(self.spans.len());
        for (i, s) in self.spans.iter().enumerate() {
            if i != far {
                out.push(*s);
            } else if let Some(k) = last {
                let t = s.intersect(&up_to(k, forward));
                if !t.is_empty() {
                    out.push(t);
                }
            }
        }
        out
    }

    /// Its intervals within `t`.
    pub fn within(&self, t: &Span) -> impl Iterator<Item = Span> + '_ {
        let t = *t;
        self.spans.iter().map(move |s| s.intersect(&t)).filter(|s| !s.is_empty())
    }
}

/// The pieces sorted, overlapping and touching ones merged (an end is
/// open where the piece reaching furthest there is open; where two reach
/// as far, only if both are), and at most [`MAX_INTERVALS`] of them: past
/// that, one bounded interval covers all but an open first or last one,
/// which stays apart -- a list folded into a tail would be cut with it.
fn normalized(mut ps: Pieces) -> Declared {
    // One piece, a tail's D nearly always: nothing to sort or merge.
    if ps.len() <= 1 {
        return match ps.pop() {
            Some(p) if !p.span.is_empty() => {
                Declared { spans: smallvec![p.span], open_above: p.hi_open, open_below: p.lo_open }
            }
            _ => Declared::none(),
        };
    }
    ps.retain(|p| !p.span.is_empty());
    ps.sort_unstable_by_key(|p| p.span.start);
    let mut out = Pieces::with_capacity(ps.len());
    for p in ps {
        match out.last_mut() {
            Some(last) if p.span.start <= last.span.end => {
                if p.span.start == last.span.start {
                    last.lo_open &= p.lo_open;
                }
                match p.span.end.cmp(&last.span.end) {
                    std::cmp::Ordering::Greater => {
                        last.span.end = p.span.end;
                        last.hi_open = p.hi_open;
                    }
                    std::cmp::Ordering::Equal => last.hi_open &= p.hi_open,
                    std::cmp::Ordering::Less => {}
                }
            }
            _ => out.push(p),
        }
    }
    if out.len() > MAX_INTERVALS {
        let n = out.len();
        let (first, last) = (out[0], out[n - 1]);
        let lo = usize::from(first.lo_open);
        let hi = n - usize::from(last.hi_open);
        let middle = out[lo..hi].iter().fold(Span::EMPTY, |a, p| a.hull(&p.span));
        let mut folded = Pieces::new();
        if first.lo_open {
            folded.push(first);
        }
        folded.push(Piece { span: middle, lo_open: false, hi_open: false });
        if last.hi_open {
            folded.push(last);
        }
        out = folded;
    }
    Declared {
        open_above: out.last().is_some_and(|p| p.hi_open),
        open_below: out.first().is_some_and(|p| p.lo_open),
        spans: out.into_iter().map(|p| p.span).collect(),
    }
}

/// A bound on one key column: the value and whether it is included.
#[derive(Clone, Copy)]
struct ColumnBound {
    datum: pg_sys::Datum,
    typid: pg_sys::Oid,
    inclusive: bool,
}

#[derive(Clone, Default)]
struct ColumnBounds {
    /// The values an equality allows (one for `=`, each element of an
    /// `= ANY`); None: no equality.
    eq: Option<Vec<ColumnBound>>,
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

/// D from evaluated quals on key columns: the quals of group 0, ANDed with
/// each OR group's union of its branches.
pub fn declared(desc: &KeyDesc, quals: impl IntoIterator<Item = KeyQual>) -> Declared {
    let quals: SmallVec<[KeyQual; 4]> = quals.into_iter().collect();
    let mut d = conjunction(desc, quals.iter().filter(|q| q.group == 0));
    let mut groups: Vec<(u16, u16)> = quals.iter().filter(|q| q.group != 0).map(|q| (q.group, q.branch)).collect();
    groups.sort_unstable();
    groups.dedup();
    let mut i = 0;
    while i < groups.len() {
        let g = groups[i].0;
        let mut any = Declared::none();
        while i < groups.len() && groups[i].0 == g {
            let b = groups[i].1;
            // With the quals ANDed to the OR (a prefix equality outside it):
            // a branch alone may bound nothing, or another prefix.
            let branch = quals.iter().filter(|q| q.group == 0 || (q.group == g && q.branch == b));
            any = any.union(&conjunction(desc, branch));
            i += 1;
        }
        d = d.intersect(&any);
    }
    d
}

/// D of quals that all hold at once.
fn conjunction<'a>(desc: &KeyDesc, quals: impl Iterator<Item = &'a KeyQual>) -> Declared {
    let mut cols: SmallVec<[ColumnBounds; 4]> = smallvec![ColumnBounds::default(); desc.cols.len()];
    for q in quals {
        if q.isnull {
            // `k op NULL` is never true: the read returns nothing.
            return Declared::none();
        }
        let i = q.col;
        // Also a qual not known yet (`KeyQual::unknown`).
        if i >= desc.cols.len() {
            continue;
        }
        // A btree scan key's subtype is "same as the column" when invalid.
        let typid = if q.typid == pg_sys::InvalidOid { desc.cols[i].typid } else { q.typid };
        if q.array {
            if u32::from(q.strategy) != pg_sys::BTEqualStrategyNumber {
                continue;
            }
            // SAFETY: a non-null array of `typid` elements.
            let raw = unsafe { array_values(q.value, typid) };
            let values: Vec<ColumnBound> = raw
                .iter()
                .filter_map(|&v| as_column_type(desc, i, typid, v))
                .map(|(datum, typid)| ColumnBound { datum, typid, inclusive: true })
                .collect();
            // A value the codec cannot encode as the column's is a key
            // this qual does not rule out: the qual bounds nothing.
            if values.len() != raw.len() {
                continue;
            }
            // Of two equalities on one column, either holds every key.
            let c = &mut cols[i];
            if c.eq.as_ref().is_none_or(|e| e.len() > values.len()) {
                c.eq = Some(values);
            }
            continue;
        }
        let Some((datum, typid)) = as_column_type(desc, i, typid, q.value) else { continue };
        let b = |inclusive| ColumnBound { datum, typid, inclusive };
        // On a DESC column the encoding runs backwards: `>` bounds from above.
        let flip = desc.cols[i].desc;
        let c = &mut cols[i];
        match (u32::from(q.strategy), flip) {
            (pg_sys::BTEqualStrategyNumber, _) => c.eq = Some(vec![b(true)]),
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
    assemble(desc, &mut cols)
}

/// The elements of a one-dimensional array of `elem` values, NULLs left
/// out (they equal nothing).
///
/// # Safety
/// `array` is a non-null array datum of `elem` elements.
unsafe fn array_values(array: pg_sys::Datum, elem: pg_sys::Oid) -> Vec<pg_sys::Datum> {
    // SAFETY: the caller passes a non-null array datum of `elem` elements, detoasted first;
    // deconstruct_array pallocs `values` and `nulls` (n entries each) in the current context, read here
    // and left to it.
    unsafe {
        let arr = pg_sys::pg_detoast_datum(array.cast_mut_ptr()) as *mut pg_sys::ArrayType;
        let (mut len, mut byval, mut align) = (0i16, false, 0 as std::ffi::c_char);
        pg_sys::get_typlenbyvalalign(elem, &mut len, &mut byval, &mut align);
        let mut values: *mut pg_sys::Datum = std::ptr::null_mut();
        let mut nulls: *mut bool = std::ptr::null_mut();
        let mut n = 0;
        pg_sys::deconstruct_array(arr, elem, i32::from(len), byval, align, &mut values, &mut nulls, &mut n);
        (0..n.max(0) as usize).filter(|&k| !*nulls.add(k)).map(|k| *values.add(k)).collect()
    }
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
        Some(KeyQual::plain(col, sk.sk_strategy, sk.sk_argument, sk.sk_subtype, flags & pg_sys::SK_ISNULL != 0))
    })
}

/// Whether a btree scan's keys bound the key from above (`up`) or below
/// in encoded order, counting what [`scan_key_quals`] leaves out: an array
/// of equalities, a row comparison.  The scan's rows then end short of
/// the open end whatever D says.
pub fn scan_keys_cap(
    keys: &[pg_sys::ScanKeyData],
    key_col: impl Fn(usize) -> Option<usize>,
    desc: &KeyDesc,
    up: bool,
) -> bool {
    let ncols = desc.cols.len();
    let mut fixed: SmallVec<[bool; 8]> = smallvec![false; ncols];
    let caps = keys.iter().any(|sk| {
        let flags = sk.sk_flags as u32;
        if flags & (pg_sys::SK_SEARCHNULL | pg_sys::SK_SEARCHNOTNULL) != 0 {
            return false;
        }
        let Some(col) = (sk.sk_attno as usize).checked_sub(1).and_then(&key_col) else { return false };
        let s = u32::from(sk.sk_strategy);
        if s == pg_sys::BTEqualStrategyNumber {
            // One value, or one of a few: either way not open.
            if let Some(f) = fixed.get_mut(col) {
                *f = true;
            }
            return false;
        }
        strategy_caps(s, desc.cols.get(col).is_some_and(|c| c.desc), up)
    });
    caps || fixed.iter().all(|&f| f)
}

/// Whether a comparison of btree `strategy` with a key column (`desc`:
/// descending in the key) caps the key from above in its encoded order
/// (`up`), or from below: `<` caps an ascending column from above, a DESC
/// one from below; `=` neither.
pub fn strategy_caps(strategy: u32, desc: bool, up: bool) -> bool {
    let below = matches!(strategy, pg_sys::BTLessStrategyNumber | pg_sys::BTLessEqualStrategyNumber);
    let above = matches!(strategy, pg_sys::BTGreaterStrategyNumber | pg_sys::BTGreaterEqualStrategyNumber);
    (below || above) && (below != desc) == up
}

fn assemble(desc: &KeyDesc, cols: &mut [ColumnBounds]) -> Declared {
    // The prefixes equalities fix: one per combination of their values,
    // while that stays within MAX_INTERVALS; the column where it would not
    // is bounded by its least and greatest value instead.
    let mut prefixes: SmallVec<[KeyWriter; 1]> = smallvec![KeyWriter::new()];
    let mut j = 0;
    while j < cols.len() {
        let Some(mut values) = cols[j].eq.take() else { break };
        // A range on the same column leaves out the values outside it.
        let (lo, hi) = (cols[j].lo, cols[j].hi);
        values.retain(|v| within(desc, j, v, lo.as_ref(), hi.as_ref()));
        if values.is_empty() {
            return Declared::none();
        }
        if prefixes.len() * values.len() > MAX_INTERVALS {
            for v in values {
                cols[j].lo = tighter_or_wider(desc, j, cols[j].lo, v, false);
                cols[j].hi = tighter_or_wider(desc, j, cols[j].hi, v, true);
            }
            break;
        }
        prefixes = prefixes
            .iter()
            .flat_map(|p| {
                values.iter().map(move |v| {
                    let mut w = *p;
                    // SAFETY: bounds were checked compatible when collected.
                    unsafe { encode_value(desc.cols[j].kind, desc.cols[j].desc, v.typid, v.datum, &mut w) };
                    w
                })
            })
            .collect();
        j += 1;
    }
    if j == cols.len() {
        let point = |p: &KeyWriter| Piece { span: Span::point(p.bytes()), lo_open: false, hi_open: false };
        return normalized(prefixes.iter().map(point).collect());
    }
    let c = &cols[j];
    let (lo_open, hi_open) = (c.lo.is_none(), c.hi.is_none());
    normalized(
        prefixes.iter().map(|prefix| Piece { span: column_span(desc, j, prefix, c), lo_open, hi_open }).collect(),
    )
}

/// Whether value `v` of column `i` lies within the bounds `lo` and `hi`.
fn within(desc: &KeyDesc, i: usize, v: &ColumnBound, lo: Option<&ColumnBound>, hi: Option<&ColumnBound>) -> bool {
    let k = encode_one(desc, i, v);
    // A truncated encoding compares as its prefix: kept when in doubt.
    let ok = |b: &ColumnBound, upper: bool| {
        let e = encode_one(desc, i, b);
        if k.truncated() || e.truncated() {
            return true;
        }
        let ord = k.bytes().cmp(e.bytes());
        match (upper, b.inclusive) {
            (false, true) => ord.is_ge(),
            (false, false) => ord.is_gt(),
            (true, true) => ord.is_le(),
            (true, false) => ord.is_lt(),
        }
    };
    lo.is_none_or(|b| ok(b, false)) && hi.is_none_or(|b| ok(b, true))
}

/// Widens a bound taken from an equality's values to include `v`: the
/// least value as lower bound, the greatest as upper (inclusive).
fn tighter_or_wider(
    desc: &KeyDesc,
    i: usize,
    cur: Option<ColumnBound>,
    v: ColumnBound,
    upper: bool,
) -> Option<ColumnBound> {
    let Some(cur) = cur else { return Some(v) };
    let ord = encode_one(desc, i, &v).bytes().cmp(encode_one(desc, i, &cur).bytes());
    let wider = if upper { ord.is_gt() } else { ord.is_lt() };
    Some(if wider { v } else { cur })
}

/// The interval of keys starting with `prefix` whose column `j` lies within
/// `c`'s bounds.
fn column_span(desc: &KeyDesc, j: usize, prefix: &KeyWriter, c: &ColumnBounds) -> Span {
    let with = |b: &ColumnBound| {
        let mut w = *prefix;
        // SAFETY: bounds were checked compatible when collected.
        unsafe { encode_value(desc.cols[j].kind, desc.cols[j].desc, b.typid, b.datum, &mut w) };
        w
    };
    // A truncated encoding is a prefix of the exact one: starts round down,
    // ends round up, whatever the operator.
    let start = match &c.lo {
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
    let end = match &c.hi {
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

/// The keys a scan in key order looked at when it stopped at `last`: from
/// where it started up to `last` (down to it, moving `backward`).
pub fn up_to(last: &KeyWriter, forward: bool) -> Span {
    let p = Span::point(last.bytes());
    if forward {
        Span { start: Span::ALL.start, end: p.end }
    } else {
        Span { start: p.start, end: Span::ALL.end }
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    fn key(v: i64) -> KeyWriter {
        let mut w = KeyWriter::new();
        w.int(v, false);
        w
    }

    /// [a, b) of int keys; None: +∞.
    fn iv(a: i64, b: Option<i64>) -> Span {
        Span {
            start: KeyBuf::floor(key(a).bytes()),
            end: b.map_or(KeyBuf::INFINITE, |b| KeyBuf::floor(key(b).bytes())),
        }
    }

    /// [a, last]: up to and including key `last`.
    fn upto(a: i64, last: i64) -> Span {
        Span { start: KeyBuf::floor(key(a).bytes()), end: Span::point(key(last).bytes()).end }
    }

    #[test]
    fn a_read_that_ran_out_cuts_only_the_open_interval() {
        // (12, 20) OR k > 100: the range is read whole, the tail to the last key.
        let range = Declared::one(iv(13, Some(20)), false, false);
        let tail = Declared::one(iv(101, None), true, false);
        let d = range.union(&tail);
        assert!(d.open_above && !d.open_below);
        assert_eq!(d.ran_out(Some(&key(15)), true).to_vec(), vec![iv(13, Some(20))]);
        assert_eq!(d.ran_out(None, true).to_vec(), vec![iv(13, Some(20))]);
        assert_eq!(d.ran_out(Some(&key(150)), true).to_vec(), vec![iv(13, Some(20)), upto(101, 150)]);
        // Bounded the way it read: all of it.
        assert_eq!(range.ran_out(Some(&key(15)), true).to_vec(), vec![iv(13, Some(20))]);
        assert_eq!(d.ran_out(Some(&key(15)), false), d.spans);
        // A tail alone: up to the last key, none of it without a row.
        assert_eq!(tail.ran_out(Some(&key(120)), true).to_vec(), vec![upto(101, 120)]);
        assert_eq!(tail.ran_out(None, true), Spans::new());
        // Up to the last row, bounded or not.
        assert_eq!(range.up_to_last(Some(&key(15)), true).to_vec(), vec![upto(13, 15)]);
        assert_eq!(range.up_to_last(None, true), Spans::new());
        assert_eq!(d.up_to_last(Some(&key(15)), true).to_vec(), vec![iv(13, Some(20))]);
    }

    #[test]
    fn comparisons_cap_the_key_in_its_encoded_order() {
        let (lt, le, eq, ge, gt) = (
            pg_sys::BTLessStrategyNumber,
            pg_sys::BTLessEqualStrategyNumber,
            pg_sys::BTEqualStrategyNumber,
            pg_sys::BTGreaterEqualStrategyNumber,
            pg_sys::BTGreaterStrategyNumber,
        );
        for s in [lt, le] {
            assert!(strategy_caps(s, false, true) && !strategy_caps(s, false, false));
            assert!(!strategy_caps(s, true, true) && strategy_caps(s, true, false));
        }
        for s in [gt, ge] {
            assert!(!strategy_caps(s, false, true) && strategy_caps(s, false, false));
            assert!(strategy_caps(s, true, true) && !strategy_caps(s, true, false));
        }
        assert!([true, false].iter().all(|&d| !strategy_caps(eq, d, true) && !strategy_caps(eq, d, false)));
    }

    #[test]
    fn sets_intersect_and_unite_with_their_bounds() {
        let point = |a: i64| Declared::one(iv(a, Some(a + 1)), false, false);
        let points = point(30).union(&point(10)).union(&point(10));
        assert_eq!(points.spans.to_vec(), vec![iv(10, Some(11)), iv(30, Some(31))]);
        let above = Declared::one(iv(20, None), true, false);
        let both = points.intersect(&above);
        assert_eq!((both.spans.to_vec(), both.open_above), (vec![iv(30, Some(31))], false));
        // Past MAX_INTERVALS, one bounded interval covers them, beside an
        // open tail, which stays apart.
        let n = MAX_INTERVALS as i64 + 1;
        let many = (0..n).fold(Declared::none(), |d, i| d.union(&point(i * 2)));
        assert_eq!(many.spans.to_vec(), vec![iv(0, Some(n * 2 - 1))]);
        let with_tail = many.union(&Declared::one(iv(1000, None), true, false));
        assert_eq!(
            (with_tail.spans.to_vec(), with_tail.open_above),
            (vec![iv(0, Some(n * 2 - 1)), iv(1000, None)], true)
        );
        assert_eq!(with_tail.ran_out(None, true).to_vec(), vec![iv(0, Some(n * 2 - 1))]);
        // Intersected, a bounded piece of an open operand is bounded.
        let prefix = Declared::one(iv(0, Some(100)), true, true);
        let cut = prefix.intersect(&Declared::one(iv(0, Some(50)), false, true));
        assert_eq!((cut.spans.to_vec(), cut.open_above), (vec![iv(0, Some(50))], false));
        assert_eq!(Declared::none().union(&above), above);
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
        declared(desc, scan_key_quals(keys, Some)).hull()
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
        assert_eq!(declared(&d, std::iter::empty()), Declared::all());
    }

    #[pg_test]
    fn a_bound_not_known_yet_keeps_its_or_branch() {
        Spi::run("CREATE TABLE du (k bigint PRIMARY KEY)").unwrap();
        let d = key("du");
        let (gt, eq, i8) = (pg_sys::BTGreaterStrategyNumber, pg_sys::BTEqualStrategyNumber, pg_sys::INT8OID);
        let in_branch = |strategy: u32, v: i64, branch: u16| KeyQual {
            group: 1,
            branch,
            ..KeyQual::plain(0, strategy as u16, pg_sys::Datum::from(v), i8, false)
        };
        // k > 5 OR k = 100: both branches
        let both = declared(&d, [in_branch(gt, 5, 1), in_branch(eq, 100, 2)]);
        assert_eq!(both.hull().start.as_bytes(), enc(&d, "6").as_slice());
        // k > (SELECT …) OR k = 100, the init plan not run yet: anything,
        // not just {100}
        let unknown = declared(&d, [KeyQual::unknown(1, 1), in_branch(eq, 100, 2)]);
        assert_eq!(unknown, Declared::all());
        // ANDed with a known bound, it is that bound
        let anded = declared(
            &d,
            [
                KeyQual::plain(0, gt as u16, pg_sys::Datum::from(5i64), i8, false),
                KeyQual::unknown(1, 1),
                in_branch(eq, 100, 2),
            ],
        );
        assert_eq!(anded.hull().start.as_bytes(), enc(&d, "6").as_slice());
        assert!(anded.hull().end.is_infinite());
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
