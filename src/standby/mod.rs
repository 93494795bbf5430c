//! Hot standbys: latches reach them through WAL, in a custom resource
//! manager (`pgkvx`, id RM_EXPERIMENTAL_ID), so a tail read on a standby
//! waits for exactly the writers a tail on the primary would.
//!
//! - record.rs: the two records, as bytes;
//! - log.rs: the primary writes them;
//! - redo.rs: the standby's startup process replays them into its latch
//!   table.
//!
//! Why a standby never replays a later key's commit before an earlier
//! key's latch, and when a replayed latch may go: src/latch/README.md,
//! "Standbys".

pub mod log;
mod record;
mod redo;

pub use record::End;

use pgrx::pg_sys;

/// The resource manager; Postgres keeps a pointer to it for the server's
/// life.
static mut RMGR: pg_sys::RmgrData = pg_sys::RmgrData {
    rm_name: c"pgkvx".as_ptr(),
    rm_redo: Some(redo::redo),
    rm_desc: Some(redo::desc),
    rm_identify: Some(redo::identify),
    rm_startup: Some(redo::startup),
    rm_cleanup: Some(redo::cleanup),
    rm_mask: None,
    rm_decode: None,
};

/// Registers the resource manager; called from `_PG_init` while
/// shared_preload_libraries loads (the only time Postgres allows it).
pub fn init() {
    // SAFETY: _PG_init, single-threaded; RMGR is static and never touched
    // again by us.
    unsafe { crate::pg::wal::register(&mut *std::ptr::addr_of_mut!(RMGR)) };
}
