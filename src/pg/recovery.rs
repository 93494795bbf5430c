//! What a hot standby's startup process is doing, for readers that wait
//! for it to replay a writer's end.

use pgrx::pg_sys;

/// Whether this is a hot standby that admits queries: it then tracks
/// every transaction running on the primary (in every process, the
/// startup process included).
pub fn hot_standby_active() -> bool {
    // SAFETY: reads recovery state in shared memory under its spinlock.
    unsafe { crate::pg::raw::RecoveryInProgress() && pg_sys::HotStandbyActive() }
}

/// The class bits of a wait event, and the buffer-pin class (named
/// PG_WAIT_BUFFER_PIN before PostgreSQL 17 and PG_WAIT_BUFFERPIN after,
/// with the same value, as every class keeps its value across majors).
const WAIT_CLASS_MASK: u32 = 0xFF00_0000;
const WAIT_CLASS_BUFFER_PIN: u32 = 0x0400_0000;

/// Whether replay -- the startup process, PGPROC number `procno` -- waits
/// on a recovery conflict that this backend is part of, so that neither
/// goes on while this backend waits for replay:
/// - for a lock this backend holds (a lock conflict);
/// - for queries whose snapshots a cleanup conflicts with, when this
///   backend's xmin is the oldest there is: the queries replay waits for
///   are those at or below the cleanup's horizon, so the oldest is always
///   among them (the others cannot tell, and wait their turn);
/// - for every query, to drop a tablespace.
///
/// A buffer pin is not ours: a waiting read holds none.
pub fn replay_waits_on_me(procno: i32) -> bool {
    // SAFETY: ProcGlobal and its PGPROC array live in shared memory for the
    // server's life; `procno` is bounds-checked; wait_event_info and
    // waitLock are single words their owner stores, read as
    // pg_stat_activity reads them.  The LOCK waitLock points at lives in
    // the shared lock table; its tag is copied, and a stale copy can only
    // make this answer wrong once, never fault.
    unsafe {
        let g = &*pg_sys::ProcGlobal;
        let Ok(i) = u32::try_from(procno) else { return false };
        if i >= g.allProcCount {
            return false;
        }
        let startup = g.allProcs.add(i as usize);
        let we = std::ptr::read_volatile(&(*startup).wait_event_info);
        if we & WAIT_CLASS_MASK == pg_sys::PG_WAIT_LOCK {
            let lock = std::ptr::read_volatile(&(*startup).waitLock);
            return !lock.is_null() && crate::pg::compat::holds_lock(&std::ptr::read_volatile(&(*lock).tag));
        }
        if we & WAIT_CLASS_MASK == WAIT_CLASS_BUFFER_PIN {
            return false;
        }
        if we == pg_sys::WaitEventIPC::WAIT_EVENT_RECOVERY_CONFLICT_TABLESPACE {
            return true;
        }
        we == pg_sys::WaitEventIPC::WAIT_EVENT_RECOVERY_CONFLICT_SNAPSHOT && holds_oldest_xmin(g)
    }
}

/// Whether no other process has an xmin older than this backend's.
///
/// # Safety
/// `g` is ProcGlobal.
unsafe fn holds_oldest_xmin(g: &pg_sys::PROC_HDR) -> bool {
    // SAFETY: per the caller's contract; xmins are single words read as
    // Postgres's own horizon code reads them.
    unsafe {
        let me = pg_sys::MyProc;
        if me.is_null() {
            return false;
        }
        let mine = std::ptr::read_volatile(&(*me).xmin).into_inner();
        if mine == 0 {
            return false;
        }
        let mine = pgkvx_latch::Xid(mine);
        (0..g.allProcCount as usize).all(|i| {
            let p = g.allProcs.add(i);
            let x = pgkvx_latch::Xid(std::ptr::read_volatile(&(*p).xmin).into_inner());
            p == me || !x.is_valid() || !x.precedes(mine)
        })
    }
}
