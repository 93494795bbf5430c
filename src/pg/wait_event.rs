//! Wait events of our own waits that are not Postgres waits (a spin at
//! commit), so pg_stat_activity shows them as waiting.

use pgrx::pg_sys;

/// Shows wait event class Extension for this backend while it lives.
pub struct WaitEvent(());

impl WaitEvent {
    pub fn extension() -> WaitEvent {
        set(pg_sys::PG_WAIT_EXTENSION);
        WaitEvent(())
    }
}

impl Drop for WaitEvent {
    fn drop(&mut self) {
        set(0);
    }
}

/// What pgstat_report_wait_start/end do (inline functions in C).
fn set(event: u32) {
    // SAFETY: my_wait_event_info points at this backend's own word (its
    // PGPROC's, or a local one before it has a PGPROC), written only by it.
    unsafe {
        let p = pg_sys::my_wait_event_info;
        if !p.is_null() {
            std::ptr::write_volatile(p, event);
        }
    }
}
