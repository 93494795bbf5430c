//! Which tables are latched, and their keys: `pgkvx.tables` plus a
//! per-backend cache.
//!
//! A table is latched when its latch trigger exists and `pgkvx.tables` has
//! its row.  The trigger check reads the relcache (cheap, so unlatched
//! tables cost a hash lookup per query); the row is read once per backend,
//! straight from the table — no SQL, so neither the caller's search_path nor
//! its row_security can change what is read.  Trigger DDL, `enable`,
//! `disable` and index rebuilds invalidate the relcache entry, and our
//! relcache callback drops the cached answer with it.
//!
//! The key is the primary key or the unique index named at `enable`.  The
//! row also keeps the key's columns, so that an index rebuilt under a new
//! oid (`REINDEX CONCURRENTLY`, `ALTER COLUMN ... TYPE`) is followed by its
//! columns; a key index that is gone raises a clear error.

use crate::errors;
use crate::keys::KeyDesc;
use crate::pg::acl::{self, Visibility};
use crate::pg::{quote_literal, regclass_text, rel_name, OpenRel};
use crate::shmem::backend;
use pgkvx_latch::RelId;
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::cell::RefCell;
use std::rc::Rc;

pub mod partitions;

/// Name of the row trigger `enable` installs.  Row triggers of one timing
/// fire in name order, so "zz_" makes it fire after the user's BEFORE
/// triggers, which may still change the key (`pgkvx.check()` reports any
/// that sort later).
pub const ROW_TRIGGER: &str = "zz_pgkvx_latch";
pub const TRUNCATE_TRIGGER: &str = "zz_pgkvx_latch_truncate";

/// A latched table as this backend knows it.
#[derive(Debug)]
pub struct Latched {
    /// The key as this relation stores it (a partition's own attnums).
    pub key: KeyDesc,
    /// The latch identity: the registered table whose latches, draw lock
    /// and ranges this relation's writes and reads use.  The relation
    /// itself, or for a partition of a latched partitioned table, that
    /// registered ancestor (partitions.rs).
    pub root: Oid,
    pub gapless: bool,
    /// The table's owner (charged for its latch-table slot).
    pub owner: Oid,
    /// Why reads of this table cannot be protected, when they cannot: its
    /// latch trigger does not fire for every write, or it is a logical
    /// replication target.
    pub exposure: Option<String>,
}

impl Latched {
    /// The latch identity its writers latch and wake under ([`latch_id`]).
    pub fn latch_id(&self) -> RelId {
        backend::rel_id(self.root)
    }
}

/// A cached answer and the partition ancestors it was derived from: an
/// invalidation of any of them (ATTACH, DETACH, `enable` of a parent)
/// drops it too.
type Cached = (Option<Rc<Latched>>, Vec<Oid>);

type OidMap<V> = crate::fast_hash::Map<Oid, V>;

thread_local! {
    static LATCHED_CACHE: RefCell<OidMap<Cached>> = RefCell::new(OidMap::default());
    /// Bumped by every relcache invalidation: answers derived from many
    /// relations (a partition tree's) are kept for one generation.
    static GENERATION: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The relcache generation (see GENERATION).
pub fn generation() -> u64 {
    GENERATION.get()
}

/// Installs the relcache callback; called from `_PG_init`.
pub fn init() {
    // SAFETY: registering a process-wide callback during preload.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(on_relcache_inval), pg_sys::Datum::from(0)) };
}

#[pg_guard]
unsafe extern "C-unwind" fn on_relcache_inval(_arg: pg_sys::Datum, relid: Oid) {
    // Runs inside invalidation processing: no catalog access here.
    GENERATION.set(GENERATION.get().wrapping_add(1));
    LATCHED_CACHE.with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            if relid == pg_sys::InvalidOid {
                c.clear();
            } else {
                c.remove(&relid);
                // Partitions whose answer came from this relation.
                c.retain(|_, (_, ancestors)| !ancestors.contains(&relid));
            }
        }
    });
}

/// A latched table a call acts on, resolved once at the call's start --
/// its oid, latch identity and registration (key, gapless, exposure) --
/// and handed down to every step of the call, as `nodeIndexscan.c`
/// derives its state once, instead of each step asking the registry again.
#[derive(Clone, Debug)]
pub struct Table {
    pub relid: Oid,
    /// The identity its writers latch and wake under (a partition's is its
    /// latched parent's).
    pub latch_id: RelId,
    pub latched: Rc<Latched>,
}

/// What [`Table::nowait`] knows of a table whose registration it could
/// not read: its latch identity, from the catalogs alone, and whether it
/// was someone else's lock that kept it from the rest (else the table is
/// registered but not latched now: its latch trigger is gone).
pub struct Unresolved {
    pub latch_id: RelId,
    pub locked: bool,
}

impl Table {
    /// `relid`, which must be latched (itself or through a parent):
    /// raises [`not_latched`] otherwise.  May wait for the table's lock the
    /// first time this backend reads its registration.
    pub fn require(relid: Oid) -> Table {
        let latched = require(relid);
        Table { relid, latch_id: latched.latch_id(), latched }
    }

    /// [`Table::require`] for monitoring, which never waits on a table
    /// lock: [`Unresolved`] when the registration is not cached and the
    /// table, an ancestor or its key index is locked by someone else, or
    /// when it is registered (else this raises [`not_latched`]) but not
    /// latched now.
    pub fn nowait(relid: Oid) -> Result<Table, Unresolved> {
        match lookup_nowait(relid) {
            Some(Some(latched)) => Ok(Table { relid, latch_id: latched.latch_id(), latched }),
            // The identity from the catalogs alone (raises not_latched for
            // a table that is not registered, itself or through a parent).
            Some(None) => Err(Unresolved { latch_id: latch_id_unlocked(relid), locked: false }),
            None => Err(Unresolved { latch_id: latch_id_unlocked(relid), locked: true }),
        }
    }

    pub fn key(&self) -> &KeyDesc {
        &self.latched.key
    }

    /// Its name, for messages (its oid once it is dropped).
    pub fn name(&self) -> String {
        rel_name(self.relid)
    }

    /// The same table as the registry says now: a call that slept, or
    /// released the table's lock, may find it disabled (raises
    /// [`not_latched`]) or enabled again with another key.
    pub fn now(&self) -> Table {
        Table::require(self.relid)
    }
}

/// The latched table `relid`, or `None` when it is not latched.
pub fn lookup(relid: Oid) -> Option<Rc<Latched>> {
    if let Some(hit) = LATCHED_CACHE.with(|c| c.borrow().get(&relid).map(|(l, _)| l.clone())) {
        return hit;
    }
    let ancestors = partitions::ancestors(relid);
    let found = match ancestors.iter().rev().find(|&&a| registration(a).is_some()) {
        // The topmost latched ancestor is the latch identity of the tree.
        Some(&root) => partitions::load_member(relid, root),
        None => load(relid),
    };
    LATCHED_CACHE.with(|c| c.borrow_mut().insert(relid, (found.clone(), ancestors)));
    found
}

/// [`lookup`] for monitoring, which must never wait on a table lock: None
/// when the table, one of its ancestors or its key index is locked by
/// someone else (DDL, TRUNCATE) and its registration is not cached yet;
/// Some(None) when it is not latched (or gone).
pub fn lookup_nowait(relid: Oid) -> Option<Option<Rc<Latched>>> {
    if let Some(hit) = LATCHED_CACHE.with(|c| c.borrow().get(&relid).map(|(l, _)| l.clone())) {
        return Some(hit);
    }
    let lock = pg_sys::AccessShareLock;
    let mut held = Vec::new();
    let mut take = |oid: Oid| -> bool {
        // SAFETY: a lock on an oid, taken only when free.
        let ok = unsafe { pg_sys::ConditionalLockRelationOid(oid, lock as pg_sys::LOCKMODE) };
        if ok {
            held.push(oid);
        }
        ok
    };
    let mut free = take(relid);
    for a in partitions::ancestors(relid) {
        free = free && take(a);
    }
    if free {
        let index = registration(relid).and_then(|r| r.key_index);
        free = index.is_none_or(&mut take);
    }
    let found = free.then(|| lookup(relid));
    for oid in held {
        // SAFETY: releasing the locks taken above (lookup took its own).
        unsafe { pg_sys::UnlockRelationOid(oid, lock as pg_sys::LOCKMODE) };
    }
    found
}

/// The table whose latches `relid`'s are, from the catalogs alone, taking
/// no lock on the table: its topmost registered ancestor, else itself.
pub fn latch_root_unlocked(relid: Oid) -> Oid {
    partitions::ancestors(relid).into_iter().rev().find(|&a| registration(a).is_some()).unwrap_or(relid)
}

/// [`latch_root_unlocked`] for a table that must be latched (itself or
/// through a parent): raises [`not_latched`] otherwise.
pub fn require_root_unlocked(relid: Oid) -> Oid {
    let root = latch_root_unlocked(relid);
    if registration(root).is_none() {
        not_latched(relid);
    }
    root
}

/// The latch identity of `relid` -- the id its writers latch and wake
/// under: its latched ancestor's for a partition of a latched partitioned
/// table, else its own (also for a table that is not latched).
pub fn latch_id(relid: Oid) -> RelId {
    lookup(relid).map_or_else(|| backend::rel_id(relid), |l| l.latch_id())
}

/// [`latch_id`] from the catalogs alone, taking no lock on the table (for
/// monitoring), of a table that must be latched (itself or through a
/// parent): raises [`not_latched`] otherwise.
pub fn latch_id_unlocked(relid: Oid) -> RelId {
    backend::rel_id(require_root_unlocked(relid))
}

/// What the current user may see of a table's latches.  Privileges first,
/// from the catalog alone: a table the caller may not see is never looked
/// up, and no lookup waits for a table lock.
pub fn visibility(relid: Oid) -> Visibility {
    let v = acl::may_see(relid, &[]);
    if !v.latches || v.keys {
        return v;
    }
    // Column privileges on the key: the key's columns, if known now.
    let attnums: Vec<i16> =
        lookup_nowait(relid).flatten().map(|l| l.key.cols.iter().map(|c| c.attnum).collect()).unwrap_or_default();
    acl::may_see(relid, &attnums)
}

/// Like [`lookup`] but raises a clear error for a table that is not latched.
pub fn require(relid: Oid) -> Rc<Latched> {
    lookup(relid).unwrap_or_else(|| not_latched(relid))
}

/// Raises the error of [`require`] for a table that is not latched.
pub fn not_latched(relid: Oid) -> ! {
    errors::raise_hint(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("table \"{}\" is not latched by pgkvx", rel_name(relid)),
        format!("SELECT pgkvx.enable({});", quote_literal(&regclass_text(relid))),
    )
}

/// `pgkvx.tables` of this database, if the extension is installed here.
fn tables_relid() -> Option<Oid> {
    // SAFETY: catalog lookups by name in a fixed schema; no search_path.
    unsafe {
        if pg_sys::get_extension_oid(c"pgkvx".as_ptr(), true) == pg_sys::InvalidOid {
            return None;
        }
        let nsp = pg_sys::get_namespace_oid(c"pgkvx".as_ptr(), true);
        if nsp == pg_sys::InvalidOid {
            return None;
        }
        let t = pg_sys::get_relname_relid(c"tables".as_ptr(), nsp);
        (t != pg_sys::InvalidOid).then_some(t)
    }
}

/// One row of `pgkvx.tables`.
pub struct Registration {
    pub key_index: Option<Oid>,
    pub key_columns: Option<Vec<i16>>,
    pub gapless: bool,
}

/// Reads `relid`'s row of `pgkvx.tables`.
pub fn registration(relid: Oid) -> Option<Registration> {
    read_rows(Some(relid)).into_iter().next().map(|(_, r)| r)
}

/// Every row of `pgkvx.tables` in this database.
pub fn registered() -> Vec<(Oid, Registration)> {
    read_rows(None)
}

fn read_rows(only: Option<Oid>) -> Vec<(Oid, Registration)> {
    let Some(tables_oid) = tables_relid() else { return Vec::new() };
    let tables = OpenRel::open(tables_oid, pg_sys::AccessShareLock);
    let desc = tables.get().rd_att;
    let attrs = tables.attrs();
    let attnum = |name: &str| attrs.iter().find(|a| !a.dropped && a.name == name).map(|a| i32::from(a.attnum));
    let (Some(a_relid), Some(a_index), Some(a_gapless)) = (attnum("relid"), attnum("key_index"), attnum("gapless"))
    else {
        return Vec::new();
    };
    let a_columns = attnum("key_columns");
    let mut out = Vec::new();
    // SAFETY: a heap scan of an open relation with at most one equality
    // key, ended before the relation closes; values are copied out first.
    unsafe {
        let mut key = pg_sys::ScanKeyData::default();
        let nkeys = match only {
            Some(relid) => {
                pg_sys::ScanKeyInit(
                    &mut key,
                    a_relid as i16,
                    pg_sys::BTEqualStrategyNumber as u16,
                    pg_sys::F_OIDEQ.into(),
                    pg_sys::Datum::from(relid),
                );
                1
            }
            None => 0,
        };
        let scan = pg_sys::systable_beginscan(
            tables.as_ptr(),
            pg_sys::InvalidOid,
            false,
            std::ptr::null_mut(),
            nkeys,
            &mut key,
        );
        loop {
            let tup = pg_sys::systable_getnext(scan);
            if tup.is_null() {
                break;
            }
            let get = |a: i32| {
                let mut isnull = false;
                let d = pg_sys::heap_getattr(tup, a, desc, &mut isnull);
                (!isnull).then_some(d)
            };
            let columns = a_columns.and_then(get).map(|d| {
                let arr = pgrx::Array::<i16>::from_datum(d, false).expect("not null");
                arr.iter().map(|v| v.unwrap_or(0)).collect()
            });
            let relid = Oid::from(get(a_relid).expect("relid is the primary key").value() as u32);
            out.push((
                relid,
                Registration {
                    key_index: get(a_index).map(|d| Oid::from(d.value() as u32)),
                    key_columns: columns,
                    gapless: get(a_gapless).is_some_and(|d| d.value() != 0),
                },
            ));
        }
        pg_sys::systable_endscan(scan);
    }
    out
}

fn load(relid: Oid) -> Option<Rc<Latched>> {
    let rel = OpenRel::try_open(relid, pg_sys::AccessShareLock)?;
    // Registered but with its latch trigger dropped or renamed: still a
    // latched table (its reads are guarded and say they cannot be
    // protected), not a plain one read silently.
    let owner = rel.form().relowner;
    let reg = registration(relid)?;
    let index = resolve_key_index(&rel, relid, &reg);
    let key = partitions::narrow(KeyDesc::resolve(relid, index), reg.key_columns.as_deref());
    // A partitioned table's own row and TRUNCATE triggers never fire for a
    // row: their clones on its partitions do, and each partition answers
    // for its own (partitions.rs).  check() still names the parent's.
    let found = if rel.form().relkind as u8 == pg_sys::RELKIND_PARTITIONED_TABLE {
        subscription_exposure(relid).into_iter().collect()
    } else {
        exposures(&rel, relid)
    };
    let exposure = (!found.is_empty()).then(|| found.join("; "));
    Some(Rc::new(Latched { key, root: relid, gapless: reg.gapless, owner, exposure }))
}

/// The key index of a latched table: the one registered, or — when that
/// oid is gone (rebuilt) — the valid unique btree index on the registered
/// columns, or the primary key.  Raises when none is left.
fn resolve_key_index(rel: &OpenRel, relid: Oid, reg: &Registration) -> Option<Oid> {
    let named = reg.key_index?;
    // SAFETY: a syscache probe.
    let alive = unsafe {
        let t = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::INDEXRELID as i32, pg_sys::Datum::from(named));
        let ok = !t.is_null() && {
            let form = &*(pg_sys::GETSTRUCT(t) as *const pg_sys::FormData_pg_index);
            form.indrelid == relid && form.indisvalid
        };
        if !t.is_null() {
            pg_sys::ReleaseSysCache(t);
        }
        ok
    };
    if alive {
        return Some(named);
    }
    let cols = reg.key_columns.clone().unwrap_or_default();
    if let Some(found) = index_on_columns(rel, &cols) {
        return Some(found);
    }
    errors::raise_hint(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("the key index of latched table \"{}\" no longer exists", rel_name(relid)),
        format!(
            "Create a unique index on the key columns again and run SELECT pgkvx.enable({0}, 'the_index'), or SELECT pgkvx.disable({0}).",
            quote_literal(&regclass_text(relid))
        ),
    )
}

/// A valid, unique, non-partial, plain btree index of `rel` on exactly
/// `cols`, in that order.
pub fn index_on_columns(rel: &OpenRel, cols: &[i16]) -> Option<Oid> {
    if cols.is_empty() {
        return None;
    }
    rel.index_oids().into_iter().find(|&ix| {
        let Some(ir) = OpenRel::try_open(ix, pg_sys::AccessShareLock) else { return false };
        let Some(ind) = ir.index() else { return false };
        // SAFETY: indkey holds indnatts >= indnkeyatts entries; the
        // relcache helpers read an open index.
        unsafe {
            ind.indisunique
                && ind.indisvalid
                && ir.form().relam == pg_sys::BTREE_AM_OID
                && ind.indnkeyatts as usize == cols.len()
                && ind.indkey.values.as_slice(cols.len()) == cols
                && pg_sys::RelationGetIndexPredicate(ir.as_ptr()).is_null()
                && pg_sys::RelationGetIndexExpressions(ir.as_ptr()).is_null()
        }
    })
}

/// Whether a logical replication subscription in this database writes
/// into `relid`.
/// The ways writes of latched table `relid` (open as `rel`) can escape its
/// latches, worded as `pgkvx.check()` lists them: the one rule that check()
/// and every reader (whose reads then warn, per pgkvx.unprotected_reads)
/// ask.
pub fn exposures(rel: &OpenRel, relid: Oid) -> Vec<String> {
    let mut out = trigger_exposures(rel, relid, relid);
    out.extend(subscription_exposure(relid));
    out
}

/// Why `relid` cannot be protected as a logical replication target, if it
/// is one.
fn subscription_exposure(relid: Oid) -> Option<String> {
    is_subscription_target(relid).then(|| {
        "logical replication writes into it: rows arrive in the publisher's commit order and the publisher's writers in flight are invisible here, so a tail read on this database can skip rows (see pgkvx.unprotected_reads)"
            .into()
    })
}

/// How `rel`'s latch triggers let writes through; `enable_target` is the
/// table whose `pgkvx.enable` puts them back.
pub fn trigger_exposures(rel: &OpenRel, relid: Oid, enable_target: Oid) -> Vec<String> {
    let mut out = Vec::new();
    for trigger in [ROW_TRIGGER, TRUNCATE_TRIGGER] {
        // A partitioned table's rows live in its leaves, which TRUNCATE of
        // any level truncates with their own triggers.
        if trigger == TRUNCATE_TRIGGER && rel.relkind() == b'p' && relid != enable_target {
            continue;
        }
        match rel.trigger_enabled(trigger) {
            Some(b'A') => {}
            None => out.push(format!(
                "latch trigger {trigger} is missing: writes are not latched; run pgkvx.enable({}) again",
                crate::pg::quote_literal(&crate::pg::qualified_name(enable_target))
            )),
            Some(b'D') => out.push(format!("latch trigger {trigger} is disabled: writes are not latched")),
            Some(b'O') => out.push(format!(
                "latch trigger {trigger} fires only in origin mode: session_replication_role = replica and logical replication apply write unlatched"
            )),
            Some(_) => {
                out.push(format!("latch trigger {trigger} fires only in replica mode: ordinary writes are not latched"))
            }
        }
    }
    out
}

pub(crate) fn is_subscription_target(relid: Oid) -> bool {
    // SAFETY: a syscache list probe on the first key column of
    // pg_subscription_rel's (srrelid, srsubid) index.
    unsafe {
        let list = pg_sys::SearchSysCacheList(
            pg_sys::SysCacheIdentifier::SUBSCRIPTIONRELMAP as i32,
            1,
            pg_sys::Datum::from(relid),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
        );
        let n = (*list).n_members;
        pg_sys::ReleaseCatCacheList(list);
        n > 0
    }
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
        assert!(l.exposure.is_none());
        Spi::run("SELECT pgkvx.disable('rt')").unwrap();
        unsafe { pg_sys::CommandCounterIncrement() };
        assert!(super::lookup(oid).is_none());
    }

    #[pg_test]
    fn a_disabled_latch_trigger_is_an_exposure() {
        Spi::run("CREATE TABLE rx (k int PRIMARY KEY); SELECT pgkvx.enable('rx')").unwrap();
        Spi::run("ALTER TABLE rx DISABLE TRIGGER zz_pgkvx_latch").unwrap();
        unsafe { pg_sys::CommandCounterIncrement() };
        let oid = Spi::get_one::<pg_sys::Oid>("SELECT 'rx'::regclass::oid").unwrap().unwrap();
        let l = super::lookup(oid).expect("still registered");
        assert!(l.exposure.as_deref().is_some_and(|e| e.contains("disabled")), "{:?}", l.exposure);
    }

    fn oid_of(name: &str) -> pg_sys::Oid {
        Spi::get_one::<pg_sys::Oid>(&format!("SELECT '{name}'::regclass::oid")).unwrap().unwrap()
    }

    /// A key index rebuilt under a new oid is found again by its columns,
    /// and only an index that could be a key qualifies.
    #[pg_test]
    fn a_key_index_is_found_by_its_columns() {
        Spi::run(
            "CREATE TABLE ic (a int NOT NULL, b int NOT NULL, c int);
             CREATE INDEX ic_plain ON ic (a, b);
             CREATE UNIQUE INDEX ic_partial ON ic (a, b) WHERE c > 0;
             CREATE UNIQUE INDEX ic_expr ON ic (a, (b + 1));
             CREATE UNIQUE INDEX ic_ba ON ic (b, a);",
        )
        .unwrap();
        let rel = crate::pg::OpenRel::open(oid_of("ic"), pg_sys::AccessShareLock);
        assert_eq!(super::index_on_columns(&rel, &[1, 2]), None, "not unique, partial or on an expression");
        assert_eq!(super::index_on_columns(&rel, &[2, 1]), Some(oid_of("ic_ba")));
        assert_eq!(super::index_on_columns(&rel, &[]), None);
        rel.close();
        Spi::run("CREATE UNIQUE INDEX ic_ab ON ic (a, b)").unwrap();
        let rel = crate::pg::OpenRel::open(oid_of("ic"), pg_sys::AccessShareLock);
        assert_eq!(super::index_on_columns(&rel, &[1, 2]), Some(oid_of("ic_ab")));
        assert_eq!(super::index_on_columns(&rel, &[1]), None, "all of the key's columns, no more");
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

/// Writes `relid`'s row of `pgkvx.tables` (inserted, or replaced).  Done
/// straight on the table, not through SQL: the caller (the table's owner,
/// checked by `enable`) holds no privilege on it.
pub fn register(relid: Oid, key_index: Option<Oid>, key_columns: &[i16], gapless: bool) {
    write_row(relid, Some((key_index, key_columns, gapless)));
}

/// Deletes `relid`'s row of `pgkvx.tables`, if there is one.
pub fn unregister(relid: Oid) {
    write_row(relid, None);
}

fn write_row(relid: Oid, row: Option<(Option<Oid>, &[i16], bool)>) {
    let Some(tables_oid) = tables_relid() else {
        errors::raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            "extension \"pgkvx\" is not installed in this database",
        );
    };
    let tables = OpenRel::open(tables_oid, pg_sys::RowExclusiveLock);
    let desc = tables.get().rd_att;
    let attrs = tables.attrs();
    let natts = attrs.len();
    let column = |i: usize| (!attrs[i].dropped).then_some(attrs[i].name.as_str());
    let relid_att = (0..natts).find(|&i| column(i) == Some("relid")).expect("relid column") + 1;
    // SAFETY: forming a tuple of the table's own descriptor, finding the
    // old one by a heap scan, and the catalog-style insert/update/delete
    // helpers (heap change plus index entries) on the open table.
    unsafe {
        let mut key = pg_sys::ScanKeyData::default();
        pg_sys::ScanKeyInit(
            &mut key,
            relid_att as i16,
            pg_sys::BTEqualStrategyNumber as u16,
            pg_sys::F_OIDEQ.into(),
            pg_sys::Datum::from(relid),
        );
        let scan =
            pg_sys::systable_beginscan(tables.as_ptr(), pg_sys::InvalidOid, false, std::ptr::null_mut(), 1, &mut key);
        let old = pg_sys::systable_getnext(scan);
        let old_tid = (!old.is_null()).then(|| (*old).t_self);
        pg_sys::systable_endscan(scan);
        match (row, old_tid) {
            (None, Some(mut tid)) => pg_sys::CatalogTupleDelete(tables.as_ptr(), &mut tid),
            (None, None) => {}
            (Some((index, cols, gapless)), old_tid) => {
                let mut values = vec![pg_sys::Datum::from(0); natts];
                let mut nulls = vec![true; natts];
                for i in 0..natts {
                    let v: Option<pg_sys::Datum> = match column(i) {
                        Some("relid") => Some(pg_sys::Datum::from(relid)),
                        Some("key_index") => index.map(pg_sys::Datum::from),
                        Some("key_columns") => cols.to_vec().into_datum(),
                        Some("gapless") => Some(pg_sys::Datum::from(gapless)),
                        Some("enabled_at") => Some(pg_sys::Datum::from(pg_sys::GetCurrentTransactionStartTimestamp())),
                        _ => None,
                    };
                    if let Some(v) = v {
                        values[i] = v;
                        nulls[i] = false;
                    }
                }
                let tup = pg_sys::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr());
                match old_tid {
                    Some(mut tid) => pg_sys::CatalogTupleUpdate(tables.as_ptr(), &mut tid, tup),
                    None => pg_sys::CatalogTupleInsert(tables.as_ptr(), tup),
                }
            }
        }
        pg_sys::CommandCounterIncrement();
    }
}
