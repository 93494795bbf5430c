//! The maintenance worker processes.

use crate::guc;
use crate::shmem::{backend, table};
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// How often an idle worker looks for work: the first one (which also
/// refreshes the horizon and queues work) often, the others less.
const TICK: Duration = Duration::from_millis(5);
const TICK_OTHERS: Duration = Duration::from_millis(20);
/// How often the first worker queues every range that needs attention.
const SWEEP: Duration = Duration::from_millis(50);
/// How long a table must stay idle and empty before its slot is freed.
const IDLE_TABLE: Duration = Duration::from_secs(10);

/// Registers the workers; called from `_PG_init` in the postmaster.
pub fn register() {
    let n = guc::MAINTENANCE_CONCURRENCY.get();
    for i in 0..n {
        BackgroundWorkerBuilder::new(&format!("pgkvx maintenance {i}"))
            .set_type("pgkvx maintenance")
            .set_library("pgkvx")
            .set_function("pgkvx_maintenance_main")
            .set_argument(Some(pg_sys::Datum::from(i)))
            .enable_shmem_access(None)
            .set_restart_time(Some(Duration::from_secs(1)))
            .load();
    }
}

/// How long worker `index` waits before its next round: not at all when
/// a range it processed came back queued.
fn pause(index: i32, more: bool) -> Duration {
    match (more, index) {
        (true, _) => Duration::ZERO,
        (false, 0) => TICK,
        (false, _) => TICK_OTHERS,
    }
}

/// Entry point of each worker.
///
/// # Safety
/// Called by the postmaster as a background worker main function.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn pgkvx_maintenance_main(arg: pg_sys::Datum) {
    let index = arg.value() as i32;
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let t = table();
    let m = t.maintainer();
    let slot = backend::my_slot();
    let mut last_sweep = Instant::now() - SWEEP;
    let mut last_gc = Instant::now();
    // Set when a range came back queued: the next round starts at once.
    let mut more = false;
    while BackgroundWorker::wait_latch(Some(pause(index, more))) {
        let hurried = std::mem::take(&mut more);
        if BackgroundWorker::sighup_received() {
            // SAFETY: reloading the configuration file in our own process.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        t.set_range_max_latches(guc::RANGE_MAX_LATCHES.get() as u32);
        t.set_max_tables_per_owner(guc::MAX_TABLES_PER_OWNER.get() as u32);
        // SAFETY: reading the clock.
        m.beat(unsafe { pg_sys::GetCurrentTimestamp() });
        // Committed and aborted latches were released without locks; move
        // them to their ranges (tombstones) or free them (aborted).
        m.drain_released(slot);
        if index == 0 {
            // One horizon for everyone: tombstones of holders before it go.
            // A round that did not wait refreshes it at most as often as
            // the ticks do (it reads the whole proc array).
            backend::refresh_horizon(!hurried);
        }
        if index == 0 && last_sweep.elapsed() >= SWEEP {
            m.sweep();
            last_sweep = Instant::now();
        }
        if index == 0 && last_gc.elapsed() >= IDLE_TABLE {
            m.gc_idle_tables();
            last_gc = Instant::now();
        }
        while let Some(r) = m.claim_next() {
            let (_, again) = m.maintain(slot, r);
            pg_sys::check_for_interrupts!();
            if BackgroundWorker::sigterm_received() {
                break;
            }
            if again {
                // Writers enqueued the range while it was processed: it is
                // queued again.  Go round at once -- beat, drain released
                // latches, refresh the horizon -- and claim from a fresh
                // start, through the latch wait (zero timeout), which
                // honours postmaster death.
                more = true;
                break;
            }
        }
        if BackgroundWorker::sigterm_received() {
            break;
        }
    }
    // A worker that exits 0 is never started again; SIGTERM from anyone but
    // a shutting-down postmaster must not leave the table unmaintained, so
    // exit 1: the postmaster restarts the worker after its restart time
    // (and does not, when it is shutting down).
    // SAFETY: ends this process the Postgres way.
    unsafe { pg_sys::proc_exit(1) };
}
