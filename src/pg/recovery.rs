//! What a hot standby's startup process is doing, for readers that wait
//! for it to replay a writer's end.

use pgrx::pg_sys;

/// Whether this process is recovery's startup process.
pub fn in_startup_process() -> bool {
    // SAFETY: plain read of a process global set at process start.
    unsafe { pg_sys::MyBackendType == pg_sys::BackendType::B_STARTUP }
}

/// The class bits of a wait event, and the buffer-pin class (named
/// PG_WAIT_BUFFER_PIN before PostgreSQL 17 and PG_WAIT_BUFFERPIN after,
/// with the same value, as every class keeps its value across majors).
const WAIT_CLASS_MASK: u32 = 0xFF00_0000;
const WAIT_CLASS_BUFFER_PIN: u32 = 0x0400_0000;

/// Whether the process with PGPROC number `procno` (the startup process)
/// waits on a recovery conflict now: for a lock or a buffer pin a standby
/// query holds, or for queries whose snapshots a cleanup record conflicts
/// with, or that use a tablespace being dropped.  Replay goes no further
/// until they end or are cancelled.
pub fn waits_on_recovery_conflict(procno: i32) -> bool {
    // SAFETY: ProcGlobal and its PGPROC array live in shared memory for the
    // server's life; `procno` is bounds-checked; wait_event_info is one
    // aligned word its owner stores, read the way pg_stat_activity does.
    unsafe {
        let g = &*pg_sys::ProcGlobal;
        let Ok(i) = u32::try_from(procno) else { return false };
        if i >= g.allProcCount {
            return false;
        }
        let we = std::ptr::read_volatile(&(*g.allProcs.add(i as usize)).wait_event_info);
        let class = we & WAIT_CLASS_MASK;
        class == pg_sys::PG_WAIT_LOCK
            || class == WAIT_CLASS_BUFFER_PIN
            || we == pg_sys::WaitEventIPC::WAIT_EVENT_RECOVERY_CONFLICT_SNAPSHOT
            || we == pg_sys::WaitEventIPC::WAIT_EVENT_RECOVERY_CONFLICT_TABLESPACE
    }
}
