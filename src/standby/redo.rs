//! The standby's side: the startup process replays our records into the
//! latch table, where the standby's readers check them as a primary's
//! readers check its writers' latches.
//!
//! Each primary transaction that logged latches gets a backend slot of its
//! own from the replay slots (the latch table's slots past every PGPROC:
//! `shmem::replay_slots`), held until its end is replayed, so its latches
//! are released together as a backend's are.  A standby has at least as
//! many backends as its primary (hot standby refuses to start otherwise),
//! so the slots suffice; should one still be missing, or the table be
//! full, the transaction's latches are not dropped but turned into fog
//! (the latch core's `raise_fog`): every reader waits for it.

use super::record::{self, End, Record};
use crate::pg::wal;
use crate::shmem::{self, backend, table};
use pgkvx_latch::{AcquireError, Holder, Holdings, KeyBuf, Limits, RelId, Span, TxEnd, Xid};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;

/// A replayed transaction: its slot and what it holds there, and per
/// table the least start and greatest end of what it latched (its commit
/// wakes the `wait_for` callers whose cursor that passes).
struct Replayed {
    slot: u32,
    held: Holdings,
    written: Vec<(RelId, KeyBuf, KeyBuf)>,
}

#[derive(Default)]
struct Replay {
    by_xid: HashMap<u32, Replayed>,
    free: Option<Vec<u32>>,
    /// Records replayed since transactions were last looked at.
    since_sweep: u32,
}

thread_local! {
    static REPLAY: RefCell<Replay> = RefCell::new(Replay::default());
}

/// How often (in our records) the transactions holding replayed latches
/// are looked up: one whose end was never logged (its primary crashed
/// first) then lets go.
const SWEEP_EVERY: u32 = 64;

/// Replays one record (the resource manager's `rm_redo`).
///
/// # Safety
/// Called by recovery with the record being replayed.
#[pg_guard]
pub unsafe extern "C-unwind" fn redo(record: *mut pg_sys::XLogReaderState) {
    // Crash recovery ends with every writer it could see gone, and nobody
    // reads before it ends: nothing to keep.
    if wal::standby_state() == pg_sys::HotStandbyState::STANDBY_DISABLED {
        return;
    }
    // SAFETY: the record recovery hands us.
    let (kind, data) = unsafe { wal::record_parts(record) };
    match record::decode(kind, data) {
        Some(Record::Latch { rel, owner, xid, pid, spans }) => replay_latches(rel, owner, xid, pid, &spans),
        Some(Record::Release { xid, end: how }) => {
            REPLAY.with(|r| end(&mut r.borrow_mut(), xid, how == End::Committed));
        }
        None => {
            // Unreadable: whatever it said, it said about an xid below the
            // next one.
            let next = next_xid();
            pgrx::warning!(
                "pgkvx: unreadable WAL record of kind {kind:#x}; reads wait for every transaction before {}",
                next.0
            );
            table().raise_fog(next);
        }
    }
    REPLAY.with(|r| sweep_now_and_then(&mut r.borrow_mut()));
}

fn replay_latches(rel: RelId, owner: u32, xid: Xid, pid: i32, spans: &[Span]) {
    // The latch's holder must count as running for the standby's snapshots
    // before its latch can be found: PostgreSQL notes a record's own xid
    // so, and ours may carry a subtransaction's (or none).
    if wal::standby_state() >= pg_sys::HotStandbyState::STANDBY_INITIALIZED {
        // SAFETY: the startup process during redo, the one caller allowed.
        unsafe { pg_sys::RecordKnownAssignedTransactionIds(pg_sys::TransactionId::from(xid.0)) };
    }
    let t = table().writer();
    let h = Holder {
        xid,
        pid,
        // SAFETY: reading the clock.
        now_us: unsafe { pg_sys::GetCurrentTimestamp() },
        owner,
        role: owner,
    };
    let lost = REPLAY.with(|r| {
        let mut r = r.borrow_mut();
        let Some(rp) = slot_of(&mut r, xid) else { return true };
        note_written(&mut rp.written, rel, spans);
        spans.iter().any(|span| {
            let mut res = t.latch(rp.slot, &mut rp.held, rel, span, &h, &Limits::NONE);
            if res == Err(AcquireError::Full) {
                backend::refresh_horizon(true);
                t.relieve_pressure(rp.slot);
                res = t.latch(rp.slot, &mut rp.held, rel, span, &h, &Limits::NONE);
            }
            res.is_err()
        })
    });
    if lost {
        pgrx::log!(
            "pgkvx: no room to replay the latches of transaction {}; reads on this standby wait for every transaction up to it",
            xid.0
        );
        table().raise_fog(Xid(xid.0.wrapping_add(1)));
    }
}

fn note_written(written: &mut Vec<(RelId, KeyBuf, KeyBuf)>, rel: RelId, spans: &[Span]) {
    let i = match written.iter().position(|w| w.0 == rel) {
        Some(i) => i,
        None => {
            written.push((rel, KeyBuf::INFINITE, KeyBuf::EMPTY));
            written.len() - 1
        }
    };
    let w = &mut written[i];
    for s in spans {
        w.1 = w.1.min(s.start);
        w.2 = w.2.max(s.end);
    }
}

/// The replayed transaction `xid`, given a slot if it has none; None when
/// every replay slot is taken.
fn slot_of(r: &mut Replay, xid: Xid) -> Option<&mut Replayed> {
    if !r.by_xid.contains_key(&xid.0) {
        let free = r.free.get_or_insert_with(|| shmem::replay_slots().rev().collect());
        let slot = free.pop()?;
        r.by_xid.insert(xid.0, Replayed { slot, held: Holdings::new(), written: Vec::new() });
    }
    r.by_xid.get_mut(&xid.0)
}

/// Transaction `xid` ended: its latches become tombstones (committed) or
/// go (aborted), as a primary backend's do, and its slot is free again.
fn end(r: &mut Replay, xid: Xid, committed: bool) {
    let Some(rp) = r.by_xid.remove(&xid.0) else { return };
    let t = table().writer();
    t.release_all(rp.slot, if committed { TxEnd::Committed } else { TxEnd::Aborted });
    r.free.get_or_insert_with(Vec::new).push(rp.slot);
    shmem::wakeups::replayed_end();
    if committed {
        for (rel, lo, hi) in &rp.written {
            shmem::wakeups::replayed_commit(*rel, lo, hi);
        }
    }
    backend::wake_maintenance();
    backend::refresh_horizon(false);
}

/// Lets go of the latches of transactions the standby no longer sees
/// running, once it tracks them all (a snapshot is ready).
fn sweep_now_and_then(r: &mut Replay) {
    r.since_sweep += 1;
    if r.since_sweep < SWEEP_EVERY || wal::standby_state() != pg_sys::HotStandbyState::STANDBY_SNAPSHOT_READY {
        return;
    }
    r.since_sweep = 0;
    let gone: Vec<u32> = r
        .by_xid
        .keys()
        .copied()
        // SAFETY: procarray and clog lookups of xids the standby tracks.
        .filter(|&x| unsafe { !pg_sys::TransactionIdIsInProgress(pg_sys::TransactionId::from(x)) })
        .collect();
    for x in gone {
        // SAFETY: as above.
        let committed = unsafe { pg_sys::TransactionIdDidCommit(pg_sys::TransactionId::from(x)) };
        end(r, Xid(x), committed);
    }
}

/// The next xid to be assigned (during recovery: past every xid replayed).
fn next_xid() -> Xid {
    // SAFETY: reads the shared counter under its lock; cannot raise.
    Xid(unsafe { crate::pg::raw::ReadNextFullTransactionId() }.value as u32)
}

/// Recovery starts (`rm_startup`): transactions that began before the
/// point replay starts from may hold latches written before it, which it
/// will never see.  They all have xids below the checkpoint's next xid,
/// which the next xid is now: they become the fog.
#[pg_guard]
pub extern "C-unwind" fn startup() {
    table().raise_fog(next_xid());
    shmem::wakeups::note_startup_process();
}

/// Recovery ends (`rm_cleanup`: promotion, or the end of crash recovery):
/// the primary's transactions still in flight never end, their rows never
/// show, and the table is the new primary's.
#[pg_guard]
pub extern "C-unwind" fn cleanup() {
    let t = table().writer();
    REPLAY.with(|r| {
        let mut r = r.borrow_mut();
        for (_, rp) in r.by_xid.drain() {
            t.release_all(rp.slot, TxEnd::Aborted);
        }
        r.free = None;
    });
    table().clear_fog();
    shmem::wakeups::replayed_end();
}

/// Describes a record (`rm_desc`), for pg_walinspect.
///
/// # Safety
/// Called by Postgres with a description buffer and a decoded record.
#[pg_guard]
pub unsafe extern "C-unwind" fn desc(buf: pg_sys::StringInfo, record: *mut pg_sys::XLogReaderState) {
    // SAFETY: the record and buffer Postgres hands us.
    unsafe {
        let (kind, data) = wal::record_parts(record);
        let text =
            record::decode(kind, data).map_or_else(|| format!("unreadable ({} bytes)", data.len()), |r| r.to_string());
        wal::append_desc(buf, &text);
    }
}

/// Names a record kind (`rm_identify`).
#[pg_guard]
pub extern "C-unwind" fn identify(info: u8) -> *const std::ffi::c_char {
    record::kind_name(info & !(pg_sys::XLR_INFO_MASK as u8)).map_or(std::ptr::null(), |n| n.as_ptr())
}
