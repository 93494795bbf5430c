//! The primary's side: each latch goes into WAL as it is published, and a
//! transaction that logged latches logs its end right after its commit or
//! abort record.

use super::record::{self, End};
use crate::pg::wal;
use pgkvx_latch::{RelId, Span, Xid};
use std::cell::{Cell, RefCell};

thread_local! {
    /// The transaction whose latches this backend has logged.
    static LOGGED: Cell<Option<Xid>> = const { Cell::new(None) };
    static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Whether latches published now must be logged: this server writes WAL
/// for standbys.
pub fn wanted() -> bool {
    wal::logs_for_standbys()
}

/// Logs latches of transaction `xid` (pid `pid`), just published on
/// `spans` of `rel` (owned by `owner`).  The caller calls it where the
/// latches are published, before the writes they cover: for a drawn key
/// right after the draw's section, whose ticket makes every later-drawn
/// key's commit wait for it (the standby's ordering argument,
/// src/latch/README.md).
pub fn latches<'a>(rel: RelId, owner: u32, xid: Xid, pid: i32, spans: impl ExactSizeIterator<Item = &'a Span>) {
    if spans.len() == 0 {
        return;
    }
    BUF.with(|b| {
        let mut b = b.borrow_mut();
        b.clear();
        record::encode_latch(rel, owner, xid, pid, spans, &mut b);
        wal::insert(record::LATCH, &b);
    });
    LOGGED.with(|l| l.set(Some(xid)));
}

/// Whether this transaction logged latches (its end must be logged too).
/// Panic-free: asked on every transaction's end.
pub fn logged() -> bool {
    LOGGED.try_with(|l| l.get().is_some()).unwrap_or(false)
}

/// The transaction ended (or prepared, holding no latches): if it logged
/// latches, logs that it did, so a standby drops them when it replays
/// this (just after the commit, abort or prepare record) and wakes whoever waits there; flushed soon, not waited
/// for, so a quiet primary still sends it promptly.  A release lost to a
/// crash costs a standby nothing but memory until it sees the
/// transaction gone (redo.rs).
pub fn transaction_ended(end: End) {
    let Some(xid) = LOGGED.with(|l| l.take()) else { return };
    if !wal::logs_for_standbys() {
        return;
    }
    let end = BUF.with(|b| {
        let mut b = b.borrow_mut();
        b.clear();
        record::encode_release(xid, end, &mut b);
        wal::insert(record::RELEASE, &b)
    });
    wal::flush_soon(end);
}
