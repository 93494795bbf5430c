//! pgkvx: span latches for PostgreSQL, fenced and optimistic LIMIT scans that
//! never skip a row committed late, and projected columns shipped as Arrow.
//!
//! `_PG_init` wires the parts together; every part lives in its own folder
//! (see docs/development.md).

use pgrx::prelude::*;

pub mod api;
pub mod args;
pub mod arrow;
pub mod errors;
pub mod fast_hash;
pub mod gapless;
pub mod guc;
mod heap;
pub mod keys;
pub mod maintenance;

pub mod pg;
pub mod read;
pub mod registry;
pub mod scan;
pub mod shmem;
pub mod standby;
mod utility;

pgrx::pg_module_magic!(name, version);

/// The schema every public object lives in.  The extension script creates
/// it first (api/mod.rs), so it belongs to the extension; this declaration
/// only tells pgrx where `schema = "pgkvx"` functions go.
#[pg_schema]
mod pgkvx {}

/// Loaded outside `shared_preload_libraries` pgkvx has no shared memory:
/// CREATE EXTENSION is refused, and in a database that has the extension
/// nothing is hooked -- reads are plain PostgreSQL, DDL and DROP EXTENSION
/// work, writes of latched tables fail naming the setting (shmem), and
/// `pgkvx.check()` says the protection is off.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // SAFETY: plain reads of backend globals during library load.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        if unsafe { pg_sys::creating_extension } {
            errors::raise_hint(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                "pgkvx must be loaded via shared_preload_libraries",
                "Add pgkvx to shared_preload_libraries in postgresql.conf and restart the server.",
            );
        }
        // What a backend needs to answer for latched tables plainly: its
        // registry cache follows DDL.
        registry::init();
        return;
    }
    // A Rust backtrace helps with our own bugs, not with PostgreSQL's errors
    // that cross a pgrx guard on their way to the client: with
    // RUST_BACKTRACE in the server's environment pgrx would capture one at
    // every guard an error crosses and put it in DETAIL.  The postmaster
    // drops it before any backend is forked.
    std::env::remove_var("RUST_BACKTRACE");
    std::env::remove_var("RUST_LIB_BACKTRACE");
    heap::prime_trim_threshold();
    guc::init();
    shmem::init();
    shmem::backend::init();
    standby::init();
    registry::init();
    read::snapshot::init();
    gapless::init();
    utility::init();
    scan::init();
    maintenance::worker::register();
}

/// The version of the loaded library (not of the SQL objects).
#[pg_extern(immutable, parallel_safe, schema = "pgkvx")]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[cfg(feature = "pg_test")]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn version_matches_crate() {
        let v = Spi::get_one::<String>("SELECT pgkvx.version()").unwrap();
        assert_eq!(v.as_deref(), Some(env!("CARGO_PKG_VERSION")));
    }
}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'pgkvx'"]
    }
}
