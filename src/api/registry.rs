//! Which tables are latched, and their keys: `pgkvx.tables` plus a
//! per-backend cache.
//!
//! A table is latched when its latch trigger exists and `pgkvx.tables` has
//! its row.  The trigger check reads the relcache (cheap, so unlatched
//! tables cost a hash lookup per query); the row is read once per backend.
//! Trigger DDL and `enable`/`disable` invalidate the relcache entry, and our
//! relcache callback drops the cached answer with it.

use crate::keys::KeyDesc;
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Name of the row trigger `enable` installs.  Row triggers of one timing
/// fire in name order, so "zz_" makes it fire after the user's BEFORE
/// triggers, which may still change the key (`pgkvx.check()` reports any
/// that sort later).
pub const ROW_TRIGGER: &str = "zz_pgkvx_latch";
pub const TRUNCATE_TRIGGER: &str = "zz_pgkvx_latch_truncate";

/// A latched table as this backend knows it.
#[derive(Debug)]
pub struct Latched {
    pub key: KeyDesc,
    pub gapless: bool,
}

thread_local! {
    static CACHE: RefCell<HashMap<Oid, Option<Rc<Latched>>>> = RefCell::new(HashMap::new());
}

/// Installs the relcache callback; called from `_PG_init`.
pub fn init() {
    // SAFETY: registering a process-wide callback during preload.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(on_relcache_inval), pg_sys::Datum::from(0)) };
}

#[pg_guard]
unsafe extern "C-unwind" fn on_relcache_inval(_arg: pg_sys::Datum, relid: Oid) {
    // Runs inside invalidation processing: no catalog access here.
    CACHE.with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            if relid == pg_sys::InvalidOid {
                c.clear();
            } else {
                c.remove(&relid);
            }
        }
    });
}

/// Whether `rel` (open) carries the latch trigger.
///
/// # Safety
/// `rel` is an open relation.
pub unsafe fn has_latch_trigger(rel: pg_sys::Relation) -> bool {
    // SAFETY: per the contract; trigdesc and its array belong to the relcache entry.
    unsafe {
        let td = (*rel).trigdesc;
        if td.is_null() {
            return false;
        }
        let n = (*td).numtriggers as usize;
        (0..n).any(|i| {
            let t = &*(*td).triggers.add(i);
            std::ffi::CStr::from_ptr(t.tgname).to_bytes() == ROW_TRIGGER.as_bytes()
        })
    }
}

/// The latched table `relid`, or `None` when it is not latched.
pub fn lookup(relid: Oid) -> Option<Rc<Latched>> {
    if let Some(hit) = CACHE.with(|c| c.borrow().get(&relid).cloned()) {
        return hit;
    }
    let found = load(relid);
    CACHE.with(|c| c.borrow_mut().insert(relid, found.clone()));
    found
}

/// Like [`lookup`] but raises a clear error for a table that is not latched.
pub fn require(relid: Oid) -> Rc<Latched> {
    lookup(relid).unwrap_or_else(|| {
        crate::errors::raise_hint(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("table \"{}\" is not latched by pgkvx", rel_name(relid)),
            format!("SELECT pgkvx.enable('{}');", rel_name(relid)),
        )
    })
}

pub fn rel_name(relid: Oid) -> String {
    // SAFETY: returns a palloc'd copy or NULL.
    let p = unsafe { pg_sys::get_rel_name(relid) };
    if p.is_null() {
        relid.to_u32().to_string()
    } else {
        // SAFETY: NUL-terminated catalog string.
        unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn load(relid: Oid) -> Option<Rc<Latched>> {
    // SAFETY: try_relation_open returns NULL for a relation that is gone.
    let rel = unsafe { pg_sys::try_relation_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
    if rel.is_null() {
        return None;
    }
    // SAFETY: rel is open.
    let latched = unsafe { has_latch_trigger(rel) };
    // SAFETY: closing what we opened.
    unsafe { pg_sys::relation_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
    if !latched {
        return None;
    }
    let row = super::spi::two::<Oid, bool>(
        "SELECT key_index::oid, gapless FROM pgkvx.tables WHERE relid = $1",
        &[relid.into()],
    )?;
    let gapless = row.1?;
    let key = KeyDesc::resolve(relid, row.0);
    Some(Rc::new(Latched { key, gapless }))
}

#[cfg(feature = "pg_test")]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn enable_makes_a_table_latched_and_disable_undoes_it() {
        Spi::run("CREATE TABLE rt (k int PRIMARY KEY)").unwrap();
        let oid = Spi::get_one::<pg_sys::Oid>("SELECT 'rt'::regclass::oid").unwrap().unwrap();
        assert!(super::lookup(oid).is_none());
        Spi::run("SELECT pgkvx.enable('rt')").unwrap();
        // The relcache invalidation is processed at the next command.
        unsafe { pg_sys::CommandCounterIncrement() };
        let l = super::lookup(oid).expect("latched after enable");
        assert_eq!(l.key.cols.len(), 1);
        assert_eq!(l.key.cols[0].name, "k");
        Spi::run("SELECT pgkvx.disable('rt')").unwrap();
        unsafe { pg_sys::CommandCounterIncrement() };
        assert!(super::lookup(oid).is_none());
    }

    #[pg_test]
    fn writes_publish_latches_visible_in_the_view() {
        Spi::run("CREATE TABLE rw (k int PRIMARY KEY); SELECT pgkvx.enable('rw')").unwrap();
        Spi::run("INSERT INTO rw VALUES (7), (8); UPDATE rw SET k = 9 WHERE k = 8").unwrap();
        let spans = Spi::get_one::<String>(
            "SELECT string_agg(span, ' ' ORDER BY span) FROM pgkvx.latches WHERE relid = 'rw'::regclass",
        )
        .unwrap()
        .unwrap();
        assert_eq!(spans, "[7] [8] [9]");
        let plan = Spi::explain("SELECT k FROM rw WHERE k > 1 ORDER BY k LIMIT 1").unwrap();
        assert!(format!("{plan:?}").contains("PgkvxLimitScan"), "{plan:?}");
    }
}
