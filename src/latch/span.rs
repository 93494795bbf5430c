//! Spans: half-open byte ranges `[start, end)` over order-preserving keys.
//!
//! Keys live in fixed-size buffers so a span fits in shared memory without
//! allocation.  A key longer than [`KEY_MAX`] is truncated *conservatively*:
//! starts round down and ends round up, so a truncated span always contains
//! the exact one.  The price is extra conflicts, never a missed one.

use std::cmp::Ordering;

/// Longest key prefix kept in a latch.  An int8 key encodes to 8 bytes, a
/// uuid to 16, a (bigint, bigint) pair to 16; longer keys are truncated.
pub const KEY_MAX: usize = 40;

/// `len` value marking the +∞ end bound.
const INFINITE: u8 = u8::MAX;

/// A bounded key: up to [`KEY_MAX`] bytes, or +∞ (only meaningful as an end).
///
/// `head` caches the first eight bytes as a big-endian number: almost every
/// comparison in the tree is decided by it alone.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct KeyBuf {
    head: u64,
    len: u8,
    bytes: [u8; KEY_MAX],
}

impl KeyBuf {
    /// The smallest key: the start of an unbounded-below span.
    pub const EMPTY: KeyBuf = KeyBuf { head: 0, len: 0, bytes: [0; KEY_MAX] };
    /// +∞: the end of an unbounded-above span.  All bytes 0xFF and a length
    /// no key has: the plain word-by-word comparison then puts it after
    /// every key, with no special case.
    pub const INFINITE: KeyBuf = KeyBuf { head: u64::MAX, len: INFINITE, bytes: [0xFF; KEY_MAX] };

    /// The leading eight bytes as a big-endian number.  Keys whose heads
    /// differ compare as their heads do.
    #[inline]
    pub fn head(&self) -> u64 {
        self.head
    }

    #[inline]
    pub fn is_infinite(&self) -> bool {
        self.len == INFINITE
    }

    /// The key bytes; empty for +∞ (check [`Self::is_infinite`] first).
    pub fn as_bytes(&self) -> &[u8] {
        if self.is_infinite() {
            &[]
        } else {
            &self.bytes[..self.len as usize]
        }
    }

    fn word(&self, i: usize) -> u64 {
        u64::from_be_bytes(self.bytes[8 * i..8 * i + 8].try_into().expect("8 bytes"))
    }

    /// Recomputes `head` after the bytes changed.
    fn seal(mut self) -> KeyBuf {
        self.head = self.word(0);
        self
    }

    /// Exact copy, or `None` when `bytes` does not fit.
    pub fn exact(bytes: &[u8]) -> Option<KeyBuf> {
        if bytes.len() > KEY_MAX {
            return None;
        }
        let mut k = KeyBuf::EMPTY;
        k.bytes[..bytes.len()].copy_from_slice(bytes);
        k.len = bytes.len() as u8;
        Some(k.seal())
    }

    /// The largest representable key `<= bytes` (truncation rounds down).
    pub fn floor(bytes: &[u8]) -> KeyBuf {
        KeyBuf::exact(&bytes[..bytes.len().min(KEY_MAX)]).expect("fits")
    }

    /// The smallest representable key `>= bytes` (truncation rounds up).
    pub fn ceil(bytes: &[u8]) -> KeyBuf {
        match KeyBuf::exact(bytes) {
            Some(k) => k,
            None => KeyBuf::prefix_successor(&bytes[..KEY_MAX]),
        }
    }

    /// The smallest key greater than every key that starts with `prefix`;
    /// +∞ when there is none (empty prefix or all 0xFF).
    pub fn prefix_successor(prefix: &[u8]) -> KeyBuf {
        let p = &prefix[..prefix.len().min(KEY_MAX)];
        match p.iter().rposition(|&b| b != 0xFF) {
            None => KeyBuf::INFINITE,
            Some(i) => {
                let mut k = KeyBuf::exact(&p[..=i]).expect("fits");
                k.bytes[i] += 1;
                k.seal()
            }
        }
    }
}

impl PartialEq for KeyBuf {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for KeyBuf {}

impl PartialOrd for KeyBuf {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for KeyBuf {
    /// Lexicographic byte order, +∞ last.  Every constructor leaves the bytes
    /// past `len` zero (and +∞ is all 0xFF with the largest length), so
    /// comparing the whole buffers word by word and then the lengths is the
    /// same as comparing the keys — and, unlike a memcmp call per
    /// comparison, cheap enough for the tree's inner loops.
    #[inline]
    fn cmp(&self, other: &Self) -> Ordering {
        if self.head != other.head {
            return self.head.cmp(&other.head);
        }
        for i in 1..KEY_MAX / 8 {
            let (x, y) = (self.word(i), other.word(i));
            if x != y {
                return x.cmp(&y);
            }
        }
        self.len.cmp(&other.len)
    }
}

impl std::fmt::Debug for KeyBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_infinite() {
            write!(f, "+inf")
        } else {
            write!(f, "{:02x?}", self.as_bytes())
        }
    }
}

/// `[start, end)`; empty when `start >= end`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(C)]
pub struct Span {
    pub start: KeyBuf,
    pub end: KeyBuf,
}

impl Span {
    /// Every key of a relation.
    pub const ALL: Span = Span { start: KeyBuf::EMPTY, end: KeyBuf::INFINITE };

    /// No key at all.
    pub const EMPTY: Span = Span { start: KeyBuf::EMPTY, end: KeyBuf::EMPTY };

    /// `[start, end)` from raw bounds; `end = None` is +∞.  Over-long bounds
    /// widen the span, never narrow it.
    pub fn new(start: &[u8], end: Option<&[u8]>) -> Span {
        Span { start: KeyBuf::floor(start), end: end.map_or(KeyBuf::INFINITE, KeyBuf::ceil) }
    }

    /// The span holding exactly one complete key.  Encoded keys are
    /// prefix-free, so `[k, k ++ 0x00)` contains `k` and no other key.
    pub fn point(key: &[u8]) -> Span {
        let end = if key.len() < KEY_MAX {
            let mut e = KeyBuf::exact(key).expect("fits");
            e.bytes[key.len()] = 0;
            e.len += 1;
            e.seal()
        } else {
            KeyBuf::prefix_successor(key)
        };
        Span { start: KeyBuf::floor(key), end }
    }

    /// Every key that starts with `prefix` (e.g. equality on the leading
    /// columns of a composite key).
    pub fn prefix(prefix: &[u8]) -> Span {
        Span { start: KeyBuf::floor(prefix), end: KeyBuf::prefix_successor(prefix) }
    }

    pub fn is_empty(&self) -> bool {
        self.start >= self.end
    }

    /// Whether this is exactly one complete key ([`Span::point`] of a key
    /// short enough not to be truncated).
    pub fn is_point(&self) -> bool {
        let (s, e) = (self.start.as_bytes(), self.end.as_bytes());
        !self.end.is_infinite() && e.len() == s.len() + 1 && e[s.len()] == 0 && &e[..s.len()] == s
    }

    /// Half-open overlap: spans that merely touch do not overlap.
    pub fn overlaps(&self, other: &Span) -> bool {
        self.start < other.end && other.start < self.end && !self.is_empty() && !other.is_empty()
    }

    /// True when every key of `other` is inside `self`.
    pub fn covers(&self, other: &Span) -> bool {
        other.is_empty() || (self.start <= other.start && other.end <= self.end)
    }

    /// The smallest span containing both.
    pub fn union(&self, other: &Span) -> Span {
        Span { start: self.start.min(other.start), end: self.end.max(other.end) }
    }

    /// [`Span::union`] where an empty span adds nothing.
    pub fn hull(&self, other: &Span) -> Span {
        match (self.is_empty(), other.is_empty()) {
            (true, _) => *other,
            (_, true) => *self,
            _ => self.union(other),
        }
    }

    /// The keys in both.
    pub fn intersect(&self, other: &Span) -> Span {
        Span { start: self.start.max(other.start), end: self.end.min(other.end) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(a: &[u8], b: Option<&[u8]>) -> Span {
        Span::new(a, b)
    }

    #[test]
    fn overlap_table_both_orders() {
        // (name, a, b, overlaps)
        let cases: &[(&str, Span, Span, bool)] = &[
            ("crossing", s(b"a", Some(b"c")), s(b"b", Some(b"d")), true),
            ("adjacent, half-open", s(b"a", Some(b"b")), s(b"b", Some(b"c")), false),
            ("equal", s(b"a", Some(b"c")), s(b"a", Some(b"c")), true),
            ("unbounded above", s(b"a", None), s(b"zzz", Some(b"zzzz")), true),
            ("everything", s(b"", None), s(b"x", Some(b"y")), true),
            ("empty span", s(b"b", Some(b"b")), s(b"a", Some(b"z")), false),
            ("point and its one-key span", Span::point(b"k"), s(b"k", Some(b"k\x00")), true),
            ("point and its successor", Span::point(b"k"), Span::point(b"k\x00"), false),
            ("prefix and a key under it", Span::prefix(b"\x01"), Span::point(b"\x01\x02"), true),
            ("prefix and a key past it", Span::prefix(b"\x01"), Span::point(b"\x02"), false),
        ];
        for (name, a, b, want) in cases {
            assert_eq!(a.overlaps(b), *want, "{name}: {a:?} vs {b:?}");
            assert_eq!(b.overlaps(a), *want, "{name}, reversed");
        }
    }

    #[test]
    fn points_are_told_from_spans() {
        assert!(Span::point(b"k").is_point());
        assert!(Span::point(b"").is_point());
        assert!(!Span::prefix(b"k").is_point());
        assert!(!Span::ALL.is_point());
        assert!(!s(b"k", Some(b"k\x00\x00")).is_point());
        // A truncated key stands for every key with its prefix: not a point.
        assert!(!Span::point(&[7; KEY_MAX + 3]).is_point());
        assert_eq!(Span::EMPTY.hull(&Span::point(b"k")), Span::point(b"k"));
        assert_eq!(Span::point(b"a").hull(&Span::point(b"c")), s(b"a", Some(b"c\x00")));
    }

    #[test]
    fn prefix_successor_rolls_over_ff() {
        assert_eq!(KeyBuf::prefix_successor(b"\x01\xff\xff").as_bytes(), b"\x02");
        assert!(KeyBuf::prefix_successor(b"\xff\xff").is_infinite());
        assert!(KeyBuf::prefix_successor(b"").is_infinite());
    }

    #[test]
    fn truncation_only_widens() {
        let long: Vec<u8> = (0..100u8).collect();
        let mut longer = long.clone();
        longer.push(7);
        let p = Span::point(&long);
        // The exact point span [long, long++0) lies inside the truncated one.
        assert!(p.start.as_bytes() <= long.as_slice());
        assert!(p.end > KeyBuf::floor(&long));
        assert!(p.end.is_infinite() || p.end.as_bytes() > longer.as_slice());
        // Two long keys sharing the kept prefix conflict (conservative).
        assert!(Span::point(&long).overlaps(&Span::point(&longer)));
        // An over-long end rounds up.
        let sp = Span::new(b"", Some(&long));
        assert!(sp.end.as_bytes() > &long[..KEY_MAX]);
    }

    #[test]
    fn word_compare_equals_byte_compare() {
        // Keys differing anywhere, including in length only and in padding
        // positions, compare as their bytes do.
        let keys: Vec<Vec<u8>> = vec![
            vec![],
            vec![0],
            vec![0, 0],
            vec![0, 1],
            vec![1],
            vec![0xff; 8],
            vec![0xff; 9],
            [vec![7; 8], vec![0]].concat(),
            [vec![7; 8], vec![1]].concat(),
            vec![9; KEY_MAX],
            [vec![9; KEY_MAX - 1], vec![0]].concat(),
        ];
        for a in &keys {
            for b in &keys {
                let (ka, kb) = (KeyBuf::exact(a).unwrap(), KeyBuf::exact(b).unwrap());
                assert_eq!(ka.cmp(&kb), a.cmp(b), "{a:?} vs {b:?}");
            }
        }
        let succ = KeyBuf::prefix_successor(&[1, 0xff]);
        assert!(succ > KeyBuf::exact(&[1, 0xff, 0xff]).unwrap() && succ.as_bytes() == [2]);
    }

    #[test]
    fn infinite_orders_last() {
        assert!(KeyBuf::INFINITE > KeyBuf::exact(&[0xff; KEY_MAX]).unwrap());
        assert!(KeyBuf::EMPTY < KeyBuf::exact(&[0]).unwrap());
    }
}
