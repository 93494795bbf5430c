//! Transaction ids as Postgres compares them: 32 bits, modulo 2^32.
//!
//! Every xid the latch table holds belongs to a running transaction or to a
//! tombstone kept only while some snapshot could still consider its holder in
//! progress, so all live xids sit well inside one 2^31 window and the modular
//! comparison is exact (the same argument Postgres itself relies on).

/// A normal 32-bit transaction id (0 = invalid).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
#[repr(transparent)]
pub struct Xid(pub u32);

impl Xid {
    pub const INVALID: Xid = Xid(0);
    /// The first normal xid; 1 and 2 are bootstrap/frozen in Postgres.
    pub const FIRST_NORMAL: u32 = 3;

    pub fn is_valid(self) -> bool {
        self.0 != 0
    }

    /// `self < other` in modulo-2^32 order (Postgres `TransactionIdPrecedes`).
    pub fn precedes(self, other: Xid) -> bool {
        (self.0.wrapping_sub(other.0) as i32) < 0
    }

    /// `self >= other` in modulo-2^32 order.
    pub fn follows_or_equals(self, other: Xid) -> bool {
        !self.precedes(other)
    }

    /// The later of two xids in modulo order.
    pub fn max(self, other: Xid) -> Xid {
        if self.precedes(other) {
            other
        } else {
            self
        }
    }

    /// The earlier of two xids in modulo order.
    pub fn min(self, other: Xid) -> Xid {
        if self.precedes(other) {
            self
        } else {
            other
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Xid;

    #[test]
    fn precedes_is_modular() {
        let cases = [
            (10, 11, true),
            (11, 10, false),
            (10, 10, false),
            (u32::MAX - 5, 4, true), // across the wrap
            (4, u32::MAX - 5, false),
        ];
        for (a, b, want) in cases {
            assert_eq!(Xid(a).precedes(Xid(b)), want, "{a} < {b}");
            assert_eq!(Xid(a).follows_or_equals(Xid(b)), !want, "{a} >= {b}");
        }
    }

    #[test]
    fn min_max_follow_modular_order() {
        assert_eq!(Xid(u32::MAX - 1).max(Xid(5)), Xid(5));
        assert_eq!(Xid(u32::MAX - 1).min(Xid(5)), Xid(u32::MAX - 1));
    }
}
