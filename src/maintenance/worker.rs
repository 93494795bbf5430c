//! The maintenance processes: one launcher that starts with the server,
//! and helpers it starts when ranges queue up faster than it processes
//! them.
//!
//! The launcher holds pgkvx's one background-worker slot while the server
//! is idle (parallel queries, replication workers and other extensions
//! share `max_worker_processes` with it).  It refreshes the xmin horizon,
//! moves released latches to their ranges, queues what needs attention and
//! processes queued ranges itself; when more are queued than it is taking,
//! it starts up to `pgkvx.maintenance_concurrency - 1` helpers (dynamic
//! workers, never restarted), each of which claims ranges until the queue
//! has stayed empty for [`HELPER_IDLE`] and then exits.  A round that found
//! nothing to do doubles the launcher's pause, up to [`IDLE_TICK`]; past
//! that, once the latch table is at rest (nothing released, queued or
//! waiting for the horizon), it sleeps until a writer wakes it (the latch
//! crate's rest.rs), or until the idle-table sweep is due: an idle server
//! costs it nothing.

use crate::guc;
use crate::shmem::{backend, table};
use pgkvx_latch::{Action, Rest};
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, DynamicBackgroundWorker, SignalWakeFlags};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// The launcher's pause while there is work, and the longest it grows to
/// while there is none.
const TICK: Duration = Duration::from_millis(5);
const IDLE_TICK: Duration = Duration::from_millis(200);
/// A helper's pause between looks at an empty queue, and how long the
/// queue must stay empty before it exits.
const HELPER_TICK: Duration = Duration::from_millis(20);
const HELPER_IDLE: Duration = Duration::from_secs(2);
/// How often the launcher queues every range that needs attention.
const SWEEP: Duration = Duration::from_millis(50);
/// How long a table must stay idle and empty before its slot is freed.
const IDLE_TABLE: Duration = Duration::from_secs(10);

/// The process title of the launcher and of its helpers.
const LAUNCHER: &str = "pgkvx maintenance launcher";
const HELPER: &str = "pgkvx maintenance helper";

/// Registers the launcher; called from `_PG_init` in the postmaster.
pub fn register() {
    if guc::MAINTENANCE_CONCURRENCY.get() == 0 {
        return;
    }
    BackgroundWorkerBuilder::new(LAUNCHER)
        .set_type(LAUNCHER)
        .set_library("pgkvx")
        .set_function("pgkvx_maintenance_main")
        .set_argument(Some(pg_sys::Datum::from(0)))
        .enable_shmem_access(None)
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

/// Starts helper `index` (1-based); None when no slot is free.
fn start_helper(index: i32) -> Option<DynamicBackgroundWorker> {
    BackgroundWorkerBuilder::new(&format!("{HELPER} {index}"))
        .set_type(HELPER)
        .set_library("pgkvx")
        .set_function("pgkvx_maintenance_main")
        .set_argument(Some(pg_sys::Datum::from(index)))
        .enable_shmem_access(None)
        .set_restart_time(None)
        .load_dynamic()
        .ok()
}

/// Entry point of the launcher (argument 0) and of each helper.
///
/// # Safety
/// Called by the postmaster as a background worker main function.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn pgkvx_maintenance_main(arg: pg_sys::Datum) {
    let index = arg.value() as i32;
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let exit = if index == 0 { launch() } else { help() };
    // SAFETY: ends this process the Postgres way.
    unsafe { pg_sys::proc_exit(exit) };
}

/// The launcher's loop.  A launcher that exits 0 is never started again;
/// SIGTERM from anyone but a shutting-down postmaster must not leave the
/// table unmaintained, so it returns 1: the postmaster restarts it after
/// its restart time (and does not, when it is shutting down).
fn launch() -> i32 {
    let t = table();
    let m = t.maintainer();
    let slot = backend::my_slot();
    let mut last_sweep = Instant::now() - SWEEP;
    let mut last_gc = Instant::now();
    let mut helpers: Vec<DynamicBackgroundWorker> = Vec::new();
    let mut pause = TICK;
    // Set when a range came back queued: the next round starts at once.
    let mut more = false;
    let mut wait = Some(TICK);
    while BackgroundWorker::wait_latch(wait) {
        // Woken by a writer, a signal or the clock: up, until it rests again.
        m.stop_resting();
        let hurried = std::mem::take(&mut more);
        reload_settings();
        // SAFETY: reading the clock.
        m.beat(unsafe { pg_sys::GetCurrentTimestamp() });
        // Committed and aborted latches were released without locks; move
        // them to their ranges (tombstones) or free them (aborted).
        let mut worked = m.drain_released(slot) > 0;
        // One horizon for everyone: tombstones of holders before it go.
        // A round that did not wait refreshes it at most as often as the
        // ticks do (it reads the whole proc array).
        backend::refresh_horizon(!hurried);
        if last_sweep.elapsed() >= SWEEP {
            // What it queues is processed below: progress there is work,
            // a range waiting for its holders or the horizon is not.
            m.sweep();
            last_sweep = Instant::now();
        }
        if last_gc.elapsed() >= IDLE_TABLE {
            m.gc_idle_tables();
            last_gc = Instant::now();
        }
        let queued = m.queued();
        if queued > 1 {
            start_helpers(&mut helpers, queued);
        }
        match process_queue(slot) {
            Processed::None => {}
            Processed::Some => worked = true,
            Processed::Again => (worked, more) = (true, true),
            Processed::Terminated => return 1,
        }
        if BackgroundWorker::sigterm_received() {
            return 1;
        }
        pause = if worked { TICK } else { (pause * 2).min(IDLE_TICK) };
        wait = if more {
            Some(Duration::ZERO)
        } else if pause < IDLE_TICK {
            Some(pause)
        } else {
            // Idle for a while: sleep until a writer makes work, or until
            // the idle-table sweep is due while table slots remain.
            match m.rest(backend::my_waker()) {
                Rest::Busy => Some(pause),
                Rest::Resting { tables: 0 } => None,
                Rest::Resting { .. } => Some(IDLE_TABLE.saturating_sub(last_gc.elapsed())),
            }
        };
    }
    m.stop_resting();
    1
}

/// Starts helpers for `queued` ranges, up to the concurrency setting less
/// the launcher itself, forgetting those that have exited.
fn start_helpers(helpers: &mut Vec<DynamicBackgroundWorker>, queued: u32) {
    helpers.retain(|h| !matches!(h.pid(), Err(pgrx::bgworkers::BackgroundWorkerStatus::Stopped)));
    let most = (guc::MAINTENANCE_CONCURRENCY.get() - 1).max(0) as usize;
    let wanted = (queued as usize).saturating_sub(1).min(most);
    while helpers.len() < wanted {
        match start_helper(helpers.len() as i32 + 1) {
            Some(h) => helpers.push(h),
            None => break,
        }
    }
}

/// A helper's loop: claims ranges until the queue stays empty for
/// [`HELPER_IDLE`], then exits 0 (helpers are never restarted: the
/// launcher starts new ones when ranges queue up again).
fn help() -> i32 {
    let slot = backend::my_slot();
    let mut idle_since = Instant::now();
    let mut more = false;
    while BackgroundWorker::wait_latch(Some(if more { Duration::ZERO } else { HELPER_TICK })) {
        more = false;
        reload_settings();
        match process_queue(slot) {
            Processed::None if idle_since.elapsed() >= HELPER_IDLE => return 0,
            Processed::None => {}
            Processed::Some => idle_since = Instant::now(),
            Processed::Again => (idle_since, more) = (Instant::now(), true),
            Processed::Terminated => return 0,
        }
        if BackgroundWorker::sigterm_received() {
            return 0;
        }
    }
    0
}

/// What one pass over the queue did.
enum Processed {
    /// The queue was empty, or nothing in it could progress.
    None,
    /// It processed ranges until the queue was empty, and changed some.
    Some,
    /// Writers enqueued a range while it was processed: go round at once --
    /// beat, drain released latches, refresh the horizon -- and claim from
    /// a fresh start, through the latch wait (zero timeout), which honours
    /// postmaster death.
    Again,
    /// SIGTERM arrived.
    Terminated,
}

/// Processes queued ranges, highest priority first, one at a time.
fn process_queue(slot: u32) -> Processed {
    let m = table().maintainer();
    let mut done = Processed::None;
    while let Some(r) = m.claim_next() {
        let (action, again) = m.maintain(slot, r);
        // A range that waits for its holders or the horizon is looked at
        // again by the next sweep; only progress keeps the pace up.
        if action != Action::Nothing {
            done = Processed::Some;
        }
        pg_sys::check_for_interrupts!();
        if BackgroundWorker::sigterm_received() {
            return Processed::Terminated;
        }
        if again {
            return Processed::Again;
        }
    }
    done
}

/// Applies a reloaded configuration file and the settings the latch table
/// reads from shared memory.
fn reload_settings() {
    if BackgroundWorker::sighup_received() {
        // SAFETY: reloading the configuration file in our own process.
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
    }
    let t = table();
    t.set_range_max_latches(guc::RANGE_MAX_LATCHES.get() as u32);
    t.set_max_tables_per_owner(guc::MAX_TABLES_PER_OWNER.get() as u32);
}
