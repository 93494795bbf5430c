//! The sequence behind a gapless key: which sequence feeds a table's key
//! and whether it may (one integer column, CACHE 1), the identity
//! sequences the planner rewrites, where a sequence stands, and the
//! per-backend caches of all this, dropped with the table's relcache entry.

use crate::errors;
use crate::keys::{KeyDesc, KeyKind};
use crate::pg::{qualified_name, quote_ident, quote_literal, with_pinned_settings, OpenRel};
use crate::registry;
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::cell::RefCell;
use std::ffi::CStr;

thread_local! {
    /// Per table: the identity sequence of its gapless key column, or None
    /// when the table is not a gapless identity table.  Dropped with the
    /// table's relcache entry (enable, disable, identity DDL all send one).
    static IDENTITY_SEQUENCES: RefCell<OidMap<Option<Oid>>> = RefCell::default();
    /// Per latched gapless table: its key sequence, and whether that is the
    /// key's identity sequence (what `next_key` draws from).
    static KEY_SEQUENCES: RefCell<OidMap<(Oid, bool)>> = RefCell::default();
}

type OidMap<V> = crate::fast_hash::Map<Oid, V>;

/// Installs the caches' relcache callback; called from `_PG_init`.
pub fn init() {
    // SAFETY: _PG_init, single-threaded.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(on_relcache_inval), pg_sys::Datum::from(0)) };
}

/// Forgets `relid`'s entries (all tables' for InvalidOid): its key column
/// may have another sequence now.  Runs inside invalidation processing, so
/// it only touches the maps.
#[pg_guard]
unsafe extern "C-unwind" fn on_relcache_inval(_arg: pg_sys::Datum, relid: Oid) {
    fn forget<V>(c: &RefCell<OidMap<V>>, relid: Oid) {
        if let Ok(mut c) = c.try_borrow_mut() {
            if relid == pg_sys::InvalidOid {
                c.clear();
            } else {
                c.remove(&relid);
            }
        }
    }
    let _ = IDENTITY_SEQUENCES.try_with(|c| forget(c, relid));
    let _ = KEY_SEQUENCES.try_with(|c| forget(c, relid));
}

/// The sequence `next_key` draws `relid`'s keys from, and whether it is
/// the key's identity sequence; checked gapless-capable once per relcache
/// lifetime of the table.
pub fn drawn_sequence(relid: Oid, key: &KeyDesc) -> (Oid, bool) {
    if let Some(found) = KEY_SEQUENCES.with(|s| s.borrow().get(&relid).copied()) {
        return found;
    }
    let seq = gapless_sequence(key);
    let identity = is_identity(relid, key.cols[0].attnum);
    KEY_SEQUENCES.with(|s| s.borrow_mut().insert(relid, (seq, identity)));
    (seq, identity)
}

/// Whether column `attnum` of `relid` is an identity column.
pub fn is_identity(relid: Oid, attnum: i16) -> bool {
    // SAFETY: a syscache probe, released before returning.
    unsafe {
        let t = pg_sys::SearchSysCache2(
            pg_sys::SysCacheIdentifier::ATTNUM as i32,
            pg_sys::Datum::from(relid),
            pg_sys::Datum::from(attnum),
        );
        if t.is_null() {
            return false;
        }
        let identity = (*(pg_sys::GETSTRUCT(t) as *const pg_sys::FormData_pg_attribute)).attidentity != 0;
        pg_sys::ReleaseSysCache(t);
        identity
    }
}

/// The key column (number, name) of `relid` when it is registered gapless
/// with a one-column key.  Read from its registration, not the registry's
/// lookup, which raises for a table that lost its key index: the hooks
/// asking this run for every write and DDL (a restore copies rows in before
/// it creates the primary key), and must leave those errors to the writes
/// that need the key.
pub fn gapless_key(relid: Oid) -> Option<(i16, String)> {
    let reg = registry::registration(relid).filter(|r| r.gapless)?;
    let attnum = match reg.key_columns.as_deref() {
        Some(&[attnum]) => attnum,
        Some(_) => return None,
        // Registered through 0.1.0's SQL, whose table has no key_columns.
        None => {
            let rel = OpenRel::try_open(relid, pg_sys::AccessShareLock)?;
            let index = reg.key_index.or_else(|| rel.primary_key_index())?;
            let ir = OpenRel::try_open(index, pg_sys::AccessShareLock)?;
            let ind = ir.index()?;
            if ind.indnkeyatts != 1 {
                return None;
            }
            // SAFETY: indkey holds at least indnkeyatts entries.
            unsafe { ind.indkey.values.as_slice(1)[0] }
        }
    };
    // SAFETY: a syscache lookup; NULL for a missing column.
    let name = unsafe {
        let name = pg_sys::get_attname(relid, attnum, true);
        (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
    }?;
    Some((attnum, name))
}

/// The identity sequence of column `attnum` of `relid`, or InvalidOid.
pub use crate::pg::compat::identity_sequence;

/// The identity sequence of `relid`'s key column when `relid` is latched
/// gapless (itself, or as a partition of a latched gapless tree: from
/// PostgreSQL 17 a partition shares its root's identity) and its key is an
/// identity column.
pub fn gapless_identity_sequence(relid: Oid) -> Option<Oid> {
    if let Some(hit) = IDENTITY_SEQUENCES.with(|c| c.borrow().get(&relid).copied()) {
        return hit;
    }
    let root = registry::latch_root_unlocked(relid);
    let found = gapless_key(root).and_then(|(root_attnum, name)| {
        let attnum = if root == relid {
            root_attnum
        } else {
            let name = std::ffi::CString::new(name).ok()?;
            // SAFETY: a syscache lookup; InvalidAttrNumber (0) when missing.
            unsafe { pg_sys::get_attnum(relid, name.as_ptr()) }
        };
        if attnum <= 0 || !is_identity(relid, attnum) {
            return None;
        }
        // SAFETY: a pg_depend lookup; InvalidOid when there is none.
        let seq = unsafe { identity_sequence(relid, attnum) };
        (seq != pg_sys::InvalidOid).then_some(seq)
    });
    IDENTITY_SEQUENCES.with(|c| c.borrow_mut().insert(relid, found));
    found
}

/// The sequence that feeds the key column (serial/bigserial or identity).
pub fn key_sequence(key: &KeyDesc) -> Option<Oid> {
    let table = qualified_name(key.relid);
    with_pinned_settings(|| {
        Spi::connect(|c| {
            c.select(
                "SELECT pg_catalog.pg_get_serial_sequence($1, $2)::pg_catalog.regclass::pg_catalog.oid",
                Some(1),
                &[table.into(), key.cols[0].name.clone().into()],
            )
            .ok()?
            .first()
            .get_one::<Oid>()
            .ok()
            .flatten()
        })
    })
}

/// A unique index of `relid` that can be a gapless tail key: one integer
/// column fed by a sequence, not partial, no expression, valid.  Named as
/// `pgkvx.enable` takes it.
fn tail_key_index(relid: Oid) -> Option<String> {
    with_pinned_settings(|| {
        Spi::get_one_with_args::<Oid>(
            "SELECT i.indexrelid
               FROM pg_catalog.pg_index i
               JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
              WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid AND i.indnkeyatts = 1
                AND i.indexprs IS NULL AND i.indpred IS NULL
                AND a.atttypid IN ('pg_catalog.int2'::pg_catalog.regtype, 'pg_catalog.int4'::pg_catalog.regtype,
                                   'pg_catalog.int8'::pg_catalog.regtype)
                AND pg_catalog.pg_get_serial_sequence(i.indrelid::pg_catalog.regclass::pg_catalog.text,
                                                      a.attname::pg_catalog.text) IS NOT NULL
              ORDER BY i.indexrelid LIMIT 1",
            &[relid.into()],
        )
    })
    .ok()
    .flatten()
    // Named as the caller's search_path finds it.
    .map(crate::pg::regclass_text)
}

/// Refuses a gapless table whose key is not one integer column, naming the
/// unique index that could be its key (or how to make one).
pub fn refuse_gapless_key(relid: Oid, relname: &str, columns: &[String]) -> ! {
    let table = quote_literal(&crate::pg::regclass_text(relid));
    let hint = match tail_key_index(relid) {
        Some(index) => format!(
            "Name a unique index on the tail column as the key: SELECT pgkvx.enable({table}, {}, gapless => true);",
            quote_literal(&index)
        ),
        None => format!(
            "Create a unique index on the tail column (an integer column fed by a sequence) and name it as the key: SELECT pgkvx.enable({table}, '<index>', gapless => true);"
        ),
    };
    errors::raise_full(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!("gapless keys need a single integer key column; \"{relname}\" has another key"),
        Some(format!(
            "The key of \"{relname}\" is ({}).",
            columns.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ")
        )),
        Some(hint),
    )
}

/// Checks `key` can be drawn gaplessly and returns its sequence.
pub fn gapless_sequence(key: &KeyDesc) -> Oid {
    if key.cols.len() != 1 || key.cols[0].kind != KeyKind::Int {
        let columns: Vec<String> = key.cols.iter().map(|c| c.name.clone()).collect();
        refuse_gapless_key(key.relid, &key.relname, &columns);
    }
    let Some(seq) = key_sequence(key) else {
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("key column \"{}\" of \"{}\" has no sequence", key.cols[0].name, key.relname),
            "Declare the key column bigserial (or attach a sequence with OWNED BY).",
        );
    };
    seq
}

/// Refuses sequences whose values are cached per backend: a backend can
/// then hand out a smaller value after another committed a larger one,
/// which is exactly the gap gapless keys exist to prevent.
pub fn check_sequence_cache(seq: Oid) {
    // SAFETY: a syscache probe of pg_sequence.
    let cache = unsafe {
        let t = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::SEQRELID as i32, pg_sys::Datum::from(seq));
        if t.is_null() {
            1
        } else {
            // pg_sequence.seqcache is its 7th column.
            let mut isnull = false;
            let d = pg_sys::SysCacheGetAttr(pg_sys::SysCacheIdentifier::SEQRELID as i32, t, 7, &mut isnull);
            pg_sys::ReleaseSysCache(t);
            if isnull {
                1
            } else {
                d.value() as i64
            }
        }
    };
    if cache != 1 {
        let name = qualified_name(seq);
        errors::raise_hint(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("sequence {name} caches {cache} values per session; gapless keys need CACHE 1"),
            format!("ALTER SEQUENCE {name} CACHE 1;"),
        );
    }
}

/// The gapless table whose key `seq` feeds, if any: serial sequences are
/// owned by their column (an auto dependency), identity ones internally.
pub fn gapless_table_of(seq: Oid) -> Option<Oid> {
    let mut table = pg_sys::InvalidOid;
    let mut col = 0i32;
    // SAFETY: pg_depend lookups filling the two out-parameters.
    let owned = unsafe {
        pg_sys::sequenceIsOwned(seq, pg_sys::DependencyType::DEPENDENCY_AUTO as std::ffi::c_char, &mut table, &mut col)
            || pg_sys::sequenceIsOwned(
                seq,
                pg_sys::DependencyType::DEPENDENCY_INTERNAL as std::ffi::c_char,
                &mut table,
                &mut col,
            )
    };
    if !owned {
        return None;
    }
    gapless_key(table).is_some_and(|(attnum, _)| i32::from(attnum) == col).then_some(table)
}

/// Where a sequence stands: the last value it handed out (or one step
/// before the value it hands out next) and its start value.
pub struct Position {
    pub last: i64,
    pub start: i64,
    pub increment: i64,
}

/// Reads `seq`'s position straight from the sequence, as its owner's DDL
/// is about to change it (no SELECT privilege needed).
pub fn position(seq: Oid) -> Option<Position> {
    let rel = OpenRel::try_open(seq, pg_sys::AccessShareLock)?;
    // SAFETY: a sequence holds one tuple (last_value int8, log_cnt int8,
    // is_called bool), read through a catalog-style scan ended before the
    // relation closes; pg_sequence's syscache row gives start and step.
    unsafe {
        let scan = pg_sys::systable_beginscan(
            rel.as_ptr(),
            pg_sys::InvalidOid,
            false,
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        );
        let tup = pg_sys::systable_getnext(scan);
        let state = (!tup.is_null()).then(|| {
            let desc = rel.get().rd_att;
            let mut isnull = false;
            let last = pg_sys::heap_getattr(tup, 1, desc, &mut isnull).value() as i64;
            let called = pg_sys::heap_getattr(tup, 3, desc, &mut isnull).value() != 0;
            (last, called)
        });
        pg_sys::systable_endscan(scan);
        let (last, called) = state?;
        let t = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::SEQRELID as i32, pg_sys::Datum::from(seq));
        if t.is_null() {
            return None;
        }
        // pg_sequence: seqstart and seqincrement are its 3rd and 4th columns.
        let attr = |n: i16| {
            let mut isnull = false;
            let d = pg_sys::SysCacheGetAttr(pg_sys::SysCacheIdentifier::SEQRELID as i32, t, n, &mut isnull);
            (!isnull).then(|| d.value() as i64)
        };
        let (start, increment) = (attr(3).unwrap_or(1), attr(4).unwrap_or(1));
        pg_sys::ReleaseSysCache(t);
        // Not yet called: `last` is what it hands out next.
        Some(Position { last: if called { last } else { last.saturating_sub(increment.signum()) }, start, increment })
    }
}

// ---- check(): a key sequence behind its table -----------------------------

/// For `pgkvx.check()`: the key sequence of gapless table `relid` stands
/// at or below a key already in the table (setval, or an identity added
/// anew), so the keys it draws next lie behind consumers' cursors.  Said
/// only to a role that may SELECT the table without row level security (it
/// names key values); the highest key is the key index's last entry.
/// Rows deleted since (an outbox emptied behind its consumers) are not
/// seen: a sequence moved back past them is not reported.
pub fn sequence_behind(relid: Oid) -> Option<String> {
    // check() must also get through tables whose key index is gone (which
    // it reports).
    let (attnum, col) = gapless_key(relid)?;
    let seq = crate::pg::with_pinned_settings(|| {
        Spi::get_one_with_args::<Oid>(
            "SELECT pg_catalog.pg_get_serial_sequence($1, $2)::pg_catalog.regclass::pg_catalog.oid",
            &[qualified_name(relid).into(), col.clone().into()],
        )
    })
    .ok()
    .flatten()?;
    if !crate::pg::acl::may_see(relid, &[attnum]).keys {
        return None;
    }
    let col = &col;
    // A plain read: check() reports, it does not wait for writers.
    let max = with_plain_reads(|| {
        Spi::get_one::<i64>(&format!(
            "SELECT pg_catalog.max({})::pg_catalog.int8 FROM ONLY {}",
            quote_ident(col),
            qualified_name(relid)
        ))
    })
    .ok()
    .flatten()?;
    let pos = position(seq)?;
    if pos.increment <= 0 || pos.last >= max {
        return None;
    }
    Some(format!(
        "key sequence {} of gapless column {} stands at {}, behind key {max} in the table: the keys it draws next commit behind consumers' cursors; move it past the highest key: SELECT pg_catalog.setval({}, {max})",
        qualified_name(seq),
        quote_ident(col),
        pos.last,
        quote_literal(&qualified_name(seq))
    ))
}

/// Runs `f` (SQL of ours) with pinned settings and pgkvx's read protection
/// off: it reads a latched table in key order and must neither wait for
/// its writers nor warn that it did not.  The settings come back when `f`
/// returns; after an ERROR the transaction abort restores them.
fn with_plain_reads<R>(f: impl FnOnce() -> R) -> R {
    crate::pg::with_settings(&[(c"pgkvx.scan_mode", c"off"), (c"pgkvx.unprotected_reads", c"allow")], || {
        crate::pg::with_pinned_settings(f)
    })
}
