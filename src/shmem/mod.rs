//! The latch table in Postgres shared memory, with LWLocks from named
//! tranches (visible as wait events `pgkvx_directory`, `pgkvx_range`,
//! `pgkvx_table` in `pg_stat_activity`).
//!
//! Sized from postmaster GUCs in `shmem_request_hook`, created or attached in
//! `shmem_startup_hook`.  The postmaster runs the startup hook and every
//! backend inherits the mapping; after a crash the postmaster re-creates
//! shared memory and the hook starts over with an empty table.

pub mod backend;
pub mod drawn;
pub mod wakeups;

use crate::guc;
use pgkvx_latch::{Config, LatchTable, LockId, LockSet, Mode};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::UnsafeCell;

const REGION_NAME: &std::ffi::CStr = c"pgkvx latch table";
const DIRECTORY_TRANCHE: &std::ffi::CStr = c"pgkvx_directory";
const RANGE_TRANCHE: &std::ffi::CStr = c"pgkvx_range";
const TABLE_TRANCHE: &std::ffi::CStr = c"pgkvx_table";

/// LWLocks of the three tranches.
pub struct PgLocks {
    directory: *mut pg_sys::LWLockPadded,
    ranges: *mut pg_sys::LWLockPadded,
    tables: *mut pg_sys::LWLockPadded,
    nranges: u32,
    ntables: u32,
}

impl PgLocks {
    fn get(&self, id: LockId) -> *mut pg_sys::LWLock {
        // SAFETY: the tranches were requested with these sizes; the indices
        // are bounds-checked here, so every pointer is into the tranche.
        unsafe {
            match id {
                LockId::Directory => &raw mut (*self.directory).lock,
                LockId::Range(i) => {
                    assert!(i < self.nranges, "range lock {i} out of bounds");
                    &raw mut (*self.ranges.add(i as usize)).lock
                }
                LockId::Table(i) => {
                    assert!(i < self.ntables, "table lock {i} out of bounds");
                    &raw mut (*self.tables.add(i as usize)).lock
                }
            }
        }
    }
}

fn lw_mode(mode: Mode) -> pg_sys::LWLockMode::Type {
    match mode {
        Mode::Shared => pg_sys::LWLockMode::LW_SHARED,
        Mode::Exclusive => pg_sys::LWLockMode::LW_EXCLUSIVE,
    }
}

impl LockSet for PgLocks {
    fn acquire(&self, id: LockId, mode: Mode) {
        // SAFETY: a valid LWLock in shared memory, never held twice (Held
        // guards pair every acquire with a release), so it cannot raise:
        // called plainly, without a jump buffer, on every guarded read.
        unsafe { crate::pg::raw::LWLockAcquire(self.get(id), lw_mode(mode)) };
    }
    fn try_acquire(&self, id: LockId, mode: Mode) -> bool {
        // SAFETY: as above.
        unsafe { pg_sys::LWLockConditionalAcquire(self.get(id), lw_mode(mode)) }
    }
    fn release(&self, id: LockId) {
        // SAFETY: we hold it (Held guards pair every acquire with a release).
        unsafe { crate::pg::raw::LWLockRelease(self.get(id)) };
    }
}

pub type SharedLatchTable = LatchTable<'static, PgLocks>;

/// A value set once per process (in the postmaster, inherited by fork) and
/// read by the same single-threaded process afterwards.
struct ProcessGlobal<T>(UnsafeCell<Option<T>>);
// SAFETY: Postgres processes are single-threaded; the value is written only
// by the shmem startup hook, before any reader exists in this process.
unsafe impl<T> Sync for ProcessGlobal<T> {}

static TABLE: ProcessGlobal<SharedLatchTable> = ProcessGlobal(UnsafeCell::new(None));
static mut PREV_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

/// The latch table of this cluster.
pub fn table() -> &'static SharedLatchTable {
    table_if_attached().unwrap_or_else(|| not_preloaded())
}

/// Whether pgkvx was loaded through `shared_preload_libraries` (and so
/// protects reads and latches writes in this server).
pub fn preloaded() -> bool {
    table_if_attached().is_some()
}

/// Raises the one error for whatever needs pgkvx's shared memory in a
/// server that did not preload it: latching a write, drawing a key,
/// waiting for a commit.
pub fn not_preloaded() -> ! {
    crate::errors::raise_hint(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "pgkvx is not loaded through shared_preload_libraries: latched tables cannot be written and their reads are not protected",
        "Add pgkvx to shared_preload_libraries in postgresql.conf and restart the server, or SELECT pgkvx.disable(table) to stop latching a table.",
    )
}

/// The latch table if this process has one; never raises.
pub fn table_if_attached() -> Option<&'static SharedLatchTable> {
    // SAFETY: see ProcessGlobal; it is set by the startup hook, before any
    // reader runs in this process.
    unsafe { &*TABLE.0.get() }.as_ref()
}

/// Backend slots for PGPROCs: one per process that can run a transaction.
fn proc_slots() -> u32 {
    // SAFETY: MaxBackends is set before shmem_request_hook runs.
    unsafe { pg_sys::MaxBackends as u32 + pg_sys::NUM_AUXILIARY_PROCS + 1 }
}

/// The backend slots past every PGPROC's, one per transaction a primary
/// can have in flight at once (it has at most as many backends as its hot
/// standby): a standby replays each primary transaction's latches into one
/// of them (standby/redo.rs).
pub fn replay_slots() -> std::ops::Range<u32> {
    // SAFETY: as in proc_slots.
    proc_slots()..proc_slots() + unsafe { pg_sys::MaxBackends } as u32
}

pub fn config() -> Config {
    Config {
        max_entries: guc::MAX_LATCHES.get() as u32,
        max_ranges: guc::MAX_RANGES.get() as u32,
        max_tables: guc::MAX_TABLES.get() as u32,
        max_backends: replay_slots().end,
    }
}

/// Installs the hooks; called from `_PG_init` in the postmaster.
pub fn init() {
    // SAFETY: _PG_init runs once, single-threaded, during preload.
    unsafe {
        PREV_REQUEST_HOOK = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request_hook);
        PREV_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(startup_hook);
    }
}

#[pg_guard]
extern "C-unwind" fn request_hook() {
    // SAFETY: chaining the hook we replaced.
    unsafe {
        if let Some(prev) = PREV_REQUEST_HOOK {
            prev();
        }
    }
    let cfg = config();
    // SAFETY: called from the shmem request hook, the only place allowed.
    unsafe {
        pg_sys::RequestAddinShmemSpace(SharedLatchTable::region_size(&cfg));
        pg_sys::RequestAddinShmemSpace(wakeups::region_size(cfg.max_tables, cfg.max_backends));
        pg_sys::RequestNamedLWLockTranche(DIRECTORY_TRANCHE.as_ptr(), 1);
        pg_sys::RequestNamedLWLockTranche(RANGE_TRANCHE.as_ptr(), cfg.max_ranges as i32);
        pg_sys::RequestNamedLWLockTranche(TABLE_TRANCHE.as_ptr(), cfg.max_tables as i32);
    }
}

#[pg_guard]
extern "C-unwind" fn startup_hook() {
    // SAFETY: chaining the hook we replaced.
    unsafe {
        if let Some(prev) = PREV_STARTUP_HOOK {
            prev();
        }
    }
    let cfg = config();
    let size = SharedLatchTable::region_size(&cfg);
    // SAFETY: the standard add-in shared memory protocol: create or find
    // the region under AddinShmemInitLock; initialise it only when new.
    unsafe {
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock; // AddinShmemInitLock
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let mem = pg_sys::ShmemInitStruct(REGION_NAME.as_ptr(), size, &mut found) as *mut u8;
        let locks = PgLocks {
            directory: pg_sys::GetNamedLWLockTranche(DIRECTORY_TRANCHE.as_ptr()),
            ranges: pg_sys::GetNamedLWLockTranche(RANGE_TRANCHE.as_ptr()),
            tables: pg_sys::GetNamedLWLockTranche(TABLE_TRANCHE.as_ptr()),
            nranges: cfg.max_ranges,
            ntables: cfg.max_tables,
        };
        let table = if found { SharedLatchTable::attach(mem, locks) } else { SharedLatchTable::init(mem, &cfg, locks) };
        table.set_range_max_latches(guc::RANGE_MAX_LATCHES.get() as u32);
        table.set_max_tables_per_owner(guc::MAX_TABLES_PER_OWNER.get() as u32);
        *TABLE.0.get() = Some(table);
        wakeups::startup(cfg.max_tables, cfg.max_backends);
        pg_sys::LWLockRelease(init_lock);
    }
}
