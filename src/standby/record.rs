//! The two WAL records pgkvx writes, as bytes (no Postgres here, so the
//! format is tested with plain `cargo test`).
//!
//! - `LATCH`: transaction `xid` (pid `pid` on the primary) published write
//!   latches on `spans` of table `rel` in database `db`, owned by `owner`.
//!   Written when the latch is published, before the write it covers; for
//!   a drawn key right after the draw's section, before any later-drawn
//!   key's commit.
//! - `RELEASE`: transaction `xid` ended (committed, aborted, or prepared:
//!   a prepared transaction holds no latches); written just after its
//!   commit, abort or prepare record.
//!
//! All integers little-endian.  A span is its start (length byte, bytes)
//! and its end (length byte, bytes; length 0xFF for +∞).

use pgkvx_latch::{RelId, Span, Xid};
use std::fmt;

/// The record kinds, in the four bits of `xl_info` a resource manager owns.
pub const LATCH: u8 = 0x00;
pub const RELEASE: u8 = 0x10;
/// The bits of `xl_info` that are ours (XLR_RMGR_INFO_MASK).
pub const KIND_MASK: u8 = 0xF0;

const INFINITE_END: u8 = 0xFF;

/// How a transaction that logged latches ended, as its `RELEASE` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Aborted = 0,
    Committed = 1,
    /// PREPARE TRANSACTION: refused while latches are held, so whatever
    /// the standby still has of it (latches its rolled-back savepoints
    /// released on the primary) goes.
    Prepared = 2,
}

impl End {
    fn of(b: u8) -> Option<End> {
        [End::Aborted, End::Committed, End::Prepared].into_iter().find(|e| *e as u8 == b)
    }
}

/// One decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Latch { rel: RelId, owner: u32, xid: Xid, pid: i32, spans: Vec<Span> },
    Release { xid: Xid, end: End },
}

/// Appends a `LATCH` record's body for `spans` (not empty) to `out`.
pub fn encode_latch<'a>(
    rel: RelId,
    owner: u32,
    xid: Xid,
    pid: i32,
    spans: impl ExactSizeIterator<Item = &'a Span>,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(&rel.db().to_le_bytes());
    out.extend_from_slice(&rel.rel().to_le_bytes());
    out.extend_from_slice(&owner.to_le_bytes());
    out.extend_from_slice(&xid.0.to_le_bytes());
    out.extend_from_slice(&pid.to_le_bytes());
    out.extend_from_slice(&(spans.len() as u32).to_le_bytes());
    for s in spans {
        let start = s.start.as_bytes();
        out.push(start.len() as u8);
        out.extend_from_slice(start);
        if s.end.is_infinite() {
            out.push(INFINITE_END);
        } else {
            let end = s.end.as_bytes();
            out.push(end.len() as u8);
            out.extend_from_slice(end);
        }
    }
}

/// Appends a `RELEASE` record's body to `out`.
pub fn encode_release(xid: Xid, end: End, out: &mut Vec<u8>) {
    out.extend_from_slice(&xid.0.to_le_bytes());
    out.push(end as u8);
}

struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
}

/// Decodes a record of kind `kind` (the `xl_info` bits of [`KIND_MASK`]);
/// None for anything malformed.
pub fn decode(kind: u8, data: &[u8]) -> Option<Record> {
    let mut b = Bytes(data);
    let rec = match kind & KIND_MASK {
        LATCH => {
            let (db, rel, owner, xid) = (b.u32()?, b.u32()?, b.u32()?, Xid(b.u32()?));
            let pid = b.u32()? as i32;
            let n = b.u32()? as usize;
            let mut spans = Vec::with_capacity(n.min(data.len()));
            for _ in 0..n {
                let len = b.u8()? as usize;
                let start = b.take(len)?;
                let end = match b.u8()? {
                    INFINITE_END => None,
                    len => Some(b.take(len as usize)?),
                };
                spans.push(Span::new(start, end));
            }
            Record::Latch { rel: RelId::new(db, rel), owner, xid, pid, spans }
        }
        RELEASE => Record::Release { xid: Xid(b.u32()?), end: End::of(b.u8()?)? },
        _ => return None,
    };
    b.0.is_empty().then_some(rec)
}

/// The name `pg_walinspect` shows for a kind (`pg_waldump`, a program that
/// cannot load pgkvx, shows only the resource manager's number).
pub fn kind_name(kind: u8) -> Option<&'static std::ffi::CStr> {
    match kind & KIND_MASK {
        LATCH => Some(c"LATCH"),
        RELEASE => Some(c"RELEASE"),
        _ => None,
    }
}

fn hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
}

/// The description `pg_walinspect` shows.
impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Record::Latch { rel, owner, xid, pid, spans } => {
                write!(f, "xid {} pid {pid} rel {}/{} owner {owner} spans", xid.0, rel.db(), rel.rel())?;
                for s in spans {
                    f.write_str(" [")?;
                    hex(f, s.start.as_bytes())?;
                    f.write_str(", ")?;
                    if s.end.is_infinite() {
                        f.write_str("+inf")?;
                    } else {
                        hex(f, s.end.as_bytes())?;
                    }
                    f.write_str(")")?;
                }
                Ok(())
            }
            Record::Release { xid, end } => {
                let how = match end {
                    End::Aborted => "aborted",
                    End::Committed => "committed",
                    End::Prepared => "prepared",
                };
                write!(f, "xid {} {how}", xid.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_as_written() {
        let spans = [Span::point(&[0x80, 0, 0, 0, 0, 0, 0, 7]), Span::new(&[1, 2], None), Span::ALL];
        let rel = RelId::new(16384, 24576);
        let mut buf = Vec::new();
        encode_latch(rel, 10, Xid(745), 4242, spans.iter(), &mut buf);
        let rec = decode(LATCH, &buf).expect("decodes");
        assert_eq!(rec, Record::Latch { rel, owner: 10, xid: Xid(745), pid: 4242, spans: spans.to_vec() });
        assert_eq!(
            rec.to_string(),
            "xid 745 pid 4242 rel 16384/24576 owner 10 spans [8000000000000007, 800000000000000700) [0102, +inf) [, +inf)"
        );
        let mut buf = Vec::new();
        encode_release(Xid(745), End::Committed, &mut buf);
        assert_eq!(decode(RELEASE, &buf), Some(Record::Release { xid: Xid(745), end: End::Committed }));
        assert_eq!(decode(RELEASE | 0x01, &buf), decode(RELEASE, &buf), "the low bits are not ours");
        for end in [End::Aborted, End::Prepared] {
            let mut buf = Vec::new();
            encode_release(Xid(9), end, &mut buf);
            assert_eq!(decode(RELEASE, &buf), Some(Record::Release { xid: Xid(9), end }));
        }
        assert_eq!(decode(RELEASE, &[9, 0, 0, 0, 3]), None, "an unknown end");
    }

    #[test]
    fn malformed_records_decode_to_nothing() {
        let mut buf = Vec::new();
        encode_latch(RelId::new(1, 2), 3, Xid(4), 5, [Span::point(&[9])].iter(), &mut buf);
        for cut in 0..buf.len() {
            assert_eq!(decode(LATCH, &buf[..cut]), None, "cut at {cut}");
        }
        buf.push(0);
        assert_eq!(decode(LATCH, &buf), None, "trailing bytes");
        assert_eq!(decode(0x20, &[]), None, "an unknown kind");
        assert_eq!(kind_name(0x20), None);
        assert_eq!(kind_name(RELEASE), Some(c"RELEASE"));
    }
}
