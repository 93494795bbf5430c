//! Order-preserving ("memcomparable") key encoding, pure Rust.
//!
//! `memcmp` order of the encoded bytes equals the key index's order.  Each
//! column's encoding is prefix-free (fixed width or terminated), so composite
//! keys are just concatenations and a key prefix encodes to a byte prefix.
//!
//! - integers (int2/int4/int8 alike, so cross-type quals encode the same):
//!   8 bytes big-endian with the sign bit flipped;
//! - bool: one byte; uuid: its 16 bytes (Postgres compares uuids bytewise);
//! - date: 4 bytes like integers; timestamp(tz): 8 bytes like integers
//!   (±infinity are the extreme values, so they sort where Postgres puts them);
//! - bytea and text under a byte-order collation: bytes with 0x00 escaped as
//!   0x00 0xFF, terminated by 0x00 0x01; bpchar drops trailing spaces first,
//!   as its comparison does;
//! - a DESC index column: every byte of that column inverted.
//!
//! Encoding writes into a fixed buffer one byte longer than a latch keeps
//! (`KEY_MAX`), so an over-long key is detectably truncated and never costs
//! an allocation.

use pgkvx_latch::KEY_MAX;

/// How one key column is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Int,
    Bool,
    Uuid,
    Bytes,
    /// text/varchar under a byte-order collation (or pattern ops).
    Text,
    /// bpchar: trailing spaces are insignificant.
    BpChar,
    Date,
    Timestamp,
}

/// A decoded column value (for display).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyValue {
    Int(i64),
    Bool(bool),
    Uuid([u8; 16]),
    Bytes(Vec<u8>),
    Date(i32),
    Timestamp(i64),
}

/// Capacity of an encoding buffer: one past what a latch keeps.
pub const BUF: usize = KEY_MAX + 1;

/// A key being encoded; silently stops at [`BUF`] bytes.
#[derive(Clone, Copy)]
pub struct KeyWriter {
    len: usize,
    buf: [u8; BUF],
    truncated: bool,
}

impl Default for KeyWriter {
    fn default() -> Self {
        KeyWriter { len: 0, buf: [0; BUF], truncated: false }
    }
}

impl std::fmt::Debug for KeyWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:02x?}{}", self.bytes(), if self.truncated { "…" } else { "" })
    }
}

impl KeyWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// The bytes written (at most [`BUF`]).
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Whether the full encoding did not fit.  A truncated key is a prefix
    /// of the exact one, so bounds built from it must round outward.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    fn push(&mut self, b: u8) {
        if self.len < BUF {
            self.buf[self.len] = b;
            self.len += 1;
        } else {
            self.truncated = true;
        }
    }

    fn push_all(&mut self, bs: &[u8]) {
        for &b in bs {
            self.push(b);
        }
    }

    /// Inverts the bytes written since `from` (a DESC column).
    fn invert_from(&mut self, from: usize) {
        for b in &mut self.buf[from..self.len] {
            *b = !*b;
        }
    }

    pub fn int(&mut self, v: i64, desc: bool) {
        let at = self.len;
        self.push_all(&((v as u64) ^ (1 << 63)).to_be_bytes());
        self.finish(at, desc);
    }

    pub fn bool(&mut self, v: bool, desc: bool) {
        let at = self.len;
        self.push(u8::from(v));
        self.finish(at, desc);
    }

    pub fn uuid(&mut self, v: &[u8; 16], desc: bool) {
        let at = self.len;
        self.push_all(v);
        self.finish(at, desc);
    }

    pub fn date(&mut self, days: i32, desc: bool) {
        let at = self.len;
        self.push_all(&((days as u32) ^ (1 << 31)).to_be_bytes());
        self.finish(at, desc);
    }

    pub fn timestamp(&mut self, micros: i64, desc: bool) {
        self.int(micros, desc);
    }

    /// bytea, or text in byte order.
    pub fn bytes_col(&mut self, v: &[u8], desc: bool) {
        let at = self.len;
        for &b in v {
            if self.len >= BUF {
                self.truncated = true;
                break;
            }
            self.push(b);
            if b == 0 {
                self.push(0xFF);
            }
        }
        self.push(0x00);
        self.push(0x01);
        self.finish(at, desc);
    }

    /// bpchar: trailing spaces do not take part in comparisons.
    pub fn bpchar(&mut self, v: &[u8], desc: bool) {
        let end = v.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
        self.bytes_col(&v[..end], desc);
    }

    fn finish(&mut self, at: usize, desc: bool) {
        if desc {
            self.invert_from(at);
        }
    }
}

/// Decodes one column starting at `*pos`; `None` when the bytes end early
/// (a truncated key).  Advances `*pos` past the column.
pub fn decode_col(kind: KeyKind, desc: bool, bytes: &[u8], pos: &mut usize) -> Option<KeyValue> {
    let get = |i: usize| bytes.get(i).map(|&b| if desc { !b } else { b });
    let fixed = |pos: &mut usize, n: usize| -> Option<Vec<u8>> {
        let v: Option<Vec<u8>> = (*pos..*pos + n).map(get).collect();
        *pos += n;
        v
    };
    Some(match kind {
        KeyKind::Int | KeyKind::Timestamp => {
            let b: [u8; 8] = fixed(pos, 8)?.try_into().ok()?;
            let v = (u64::from_be_bytes(b) ^ (1 << 63)) as i64;
            if kind == KeyKind::Int {
                KeyValue::Int(v)
            } else {
                KeyValue::Timestamp(v)
            }
        }
        KeyKind::Date => {
            let b: [u8; 4] = fixed(pos, 4)?.try_into().ok()?;
            KeyValue::Date((u32::from_be_bytes(b) ^ (1 << 31)) as i32)
        }
        KeyKind::Bool => KeyValue::Bool(fixed(pos, 1)?[0] != 0),
        KeyKind::Uuid => KeyValue::Uuid(fixed(pos, 16)?.try_into().ok()?),
        KeyKind::Bytes | KeyKind::Text | KeyKind::BpChar => {
            let mut out = Vec::new();
            loop {
                let b = get(*pos)?;
                *pos += 1;
                if b != 0 {
                    out.push(b);
                    continue;
                }
                let n = get(*pos)?;
                *pos += 1;
                match n {
                    0xFF => out.push(0),
                    0x01 => break,
                    _ => return None,
                }
            }
            KeyValue::Bytes(out)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum V {
        Int(i64),
        Bool(bool),
        Uuid([u8; 16]),
        Bytes(Vec<u8>),
        BpChar(Vec<u8>),
        Date(i32),
        Ts(i64),
    }

    fn encode(vals: &[(V, bool)]) -> KeyWriter {
        let mut w = KeyWriter::new();
        for (v, desc) in vals {
            match v {
                V::Int(x) => w.int(*x, *desc),
                V::Bool(x) => w.bool(*x, *desc),
                V::Uuid(x) => w.uuid(x, *desc),
                V::Bytes(x) => w.bytes_col(x, *desc),
                V::BpChar(x) => w.bpchar(x, *desc),
                V::Date(x) => w.date(*x, *desc),
                V::Ts(x) => w.timestamp(*x, *desc),
            }
        }
        w
    }

    /// The order Postgres's btree gives the same values.
    fn cmp(a: &V, b: &V) -> std::cmp::Ordering {
        fn trim(v: &[u8]) -> &[u8] {
            &v[..v.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1)]
        }
        match (a, b) {
            (V::Int(x), V::Int(y)) | (V::Ts(x), V::Ts(y)) => x.cmp(y),
            (V::Bool(x), V::Bool(y)) => x.cmp(y),
            (V::Uuid(x), V::Uuid(y)) => x.cmp(y),
            (V::Bytes(x), V::Bytes(y)) => x.cmp(y),
            (V::BpChar(x), V::BpChar(y)) => trim(x).cmp(trim(y)),
            (V::Date(x), V::Date(y)) => x.cmp(y),
            _ => unreachable!("same column, same type"),
        }
    }

    fn tuple_cmp(a: &[(V, bool)], b: &[(V, bool)]) -> std::cmp::Ordering {
        for ((x, desc), (y, _)) in a.iter().zip(b) {
            let o = cmp(x, y);
            let o = if *desc { o.reverse() } else { o };
            if o != std::cmp::Ordering::Equal {
                return o;
            }
        }
        std::cmp::Ordering::Equal
    }

    // Strings over a small alphabet with NULs and 0xFF so escapes and shared
    // prefixes occur often; short enough to usually fit untruncated.
    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(prop_oneof![Just(0u8), Just(1u8), Just(b' '), Just(b'a'), Just(0xFFu8)], 0..6)
    }

    /// A value generator per column type, with the type's extremes.
    fn col(kind: u8) -> BoxedStrategy<V> {
        match kind {
            0 => prop_oneof![any::<i64>(), Just(i64::MIN), Just(i64::MAX), -3i64..3].prop_map(V::Int).boxed(),
            1 => any::<bool>().prop_map(V::Bool).boxed(),
            2 => proptest::array::uniform16(prop_oneof![Just(0u8), Just(0x7F), Just(0xFF)]).prop_map(V::Uuid).boxed(),
            3 => bytes().prop_map(V::Bytes).boxed(),
            4 => bytes().prop_map(V::BpChar).boxed(),
            5 => prop_oneof![any::<i32>(), Just(i32::MIN), Just(i32::MAX)].prop_map(V::Date).boxed(),
            _ => prop_oneof![any::<i64>(), Just(i64::MIN), Just(i64::MAX)].prop_map(V::Ts).boxed(),
        }
    }

    fn tuple(kinds: Vec<(u8, bool)>) -> impl Strategy<Value = Tuple> {
        kinds.into_iter().map(|(k, desc)| col(k).prop_map(move |v| (v, desc))).collect::<Vec<_>>()
    }

    type Tuple = Vec<(V, bool)>;

    fn pair() -> impl Strategy<Value = (Tuple, Tuple)> {
        proptest::collection::vec((0u8..7, any::<bool>()), 1..4)
            .prop_flat_map(|kinds| (tuple(kinds.clone()), tuple(kinds)))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        /// Encoded order equals the index order, for single and composite
        /// keys of every type, ASC and DESC; a truncated encoding keeps a
        /// prefix, so it can tie but never invert the order.
        #[test]
        fn encoded_order_is_index_order((a, b) in pair()) {
            let (ea, eb) = (encode(&a), encode(&b));
            let want = tuple_cmp(&a, &b);
            let got = ea.bytes().cmp(eb.bytes());
            if ea.truncated() || eb.truncated() {
                prop_assert!(got == want || got == std::cmp::Ordering::Equal, "{:?} vs {:?}", ea, eb);
            } else {
                prop_assert_eq!(got, want, "{:?} vs {:?}", ea, eb);
            }
        }

        /// Every value decodes back from its encoding.
        #[test]
        fn decode_inverts_encode(t in proptest::collection::vec((0u8..7, any::<bool>()), 1..4).prop_flat_map(tuple)) {
            let w = encode(&t);
            prop_assume!(!w.truncated());
            let mut pos = 0;
            for (v, desc) in &t {
                let kind = match v {
                    V::Int(_) => KeyKind::Int, V::Bool(_) => KeyKind::Bool, V::Uuid(_) => KeyKind::Uuid,
                    V::Bytes(_) => KeyKind::Bytes, V::BpChar(_) => KeyKind::BpChar,
                    V::Date(_) => KeyKind::Date, V::Ts(_) => KeyKind::Timestamp,
                };
                let got = decode_col(kind, *desc, w.bytes(), &mut pos).expect("decodes");
                let want = match v {
                    V::Int(x) => KeyValue::Int(*x), V::Bool(x) => KeyValue::Bool(*x),
                    V::Uuid(x) => KeyValue::Uuid(*x), V::Bytes(x) => KeyValue::Bytes(x.clone()),
                    V::BpChar(x) => KeyValue::Bytes(x[..x.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1)].to_vec()),
                    V::Date(x) => KeyValue::Date(*x), V::Ts(x) => KeyValue::Timestamp(*x),
                };
                prop_assert_eq!(got, want);
            }
            prop_assert_eq!(pos, w.bytes().len());
        }
    }

    #[test]
    fn composite_prefix_is_a_byte_prefix() {
        let mut a = KeyWriter::new();
        a.int(7, false);
        let mut b = a;
        b.bytes_col(b"x", false);
        assert!(b.bytes().starts_with(a.bytes()));
    }

    #[test]
    fn over_long_keys_truncate_and_say_so() {
        let mut w = KeyWriter::new();
        w.bytes_col(&[b'a'; 100], false);
        assert!(w.truncated());
        assert_eq!(w.bytes().len(), BUF);
        let mut pos = 0;
        assert_eq!(decode_col(KeyKind::Text, false, w.bytes(), &mut pos), None);
    }

    #[test]
    fn int_widths_encode_alike() {
        // int2 5, int4 5 and int8 5 must be the same key (cross-type quals).
        let (mut a, mut b) = (KeyWriter::new(), KeyWriter::new());
        a.int(i64::from(5i16), false);
        b.int(5i64, false);
        assert_eq!(a.bytes(), b.bytes());
    }
}
