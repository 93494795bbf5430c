//! Partitioned tables: one latch identity per latched parent.
//!
//! `pgkvx.enable` on a partitioned table registers the parent only.  Its
//! row trigger is cloned by PostgreSQL onto every partition, including
//! those created or attached later, and dropped from a partition that is
//! detached; the trigger then maps the partition it fires on to its
//! topmost latched ancestor (the *root*), so every write of the tree
//! latches `(root, key)` and every gapless key is drawn under the root's
//! one draw lock.  Reads of a partition -- through the parent's Append or
//! MergeAppend, or directly -- validate against the same root.
//!
//! A partition's key is the root's key columns found by name in the
//! partition (an attached table may number its columns differently): the
//! same types, so the same encoding.  The answers are cached with the
//! ancestors they came from, and an invalidation of any ancestor (ATTACH,
//! DETACH, `enable`, `disable`) drops them.

use super::{lookup, trigger_exposures, Latched};
use crate::keys::KeyDesc;
use crate::pg::{raw, rel_name, OpenRel};
use pgrx::pg_sys::{self, Oid};
use std::rc::Rc;

/// The partition ancestors of `relid`, nearest first; empty for a table
/// that is no partition.  A partition being detached concurrently still
/// counts: snapshots that see it in its parent may still read it there.
pub fn ancestors(relid: Oid) -> Vec<Oid> {
    let mut out = Vec::new();
    let mut at = relid;
    // SAFETY: syscache probes; get_partition_parent raises only for a
    // partition without its pg_inherits row, which relispartition rules out
    // (both are read under the same catalog snapshot).
    unsafe {
        while pg_sys::get_rel_relispartition(at) {
            let parent = pg_sys::ffi::pg_guard_ffi_boundary(|| raw::get_partition_parent(at, true));
            if parent == pg_sys::InvalidOid || out.contains(&parent) {
                break;
            }
            out.push(parent);
            at = parent;
        }
    }
    out
}

/// Every partition under `root` (all levels, not `root` itself).
pub fn members(root: Oid) -> Vec<Oid> {
    // SAFETY: a pg_inherits scan without locks; returns a fresh OidList.
    unsafe {
        let list = pg_sys::ffi::pg_guard_ffi_boundary(|| {
            raw::find_all_inheritors(root, pg_sys::NoLock as pg_sys::LOCKMODE, std::ptr::null_mut())
        });
        let out = crate::pg::list_oids(list).filter(|&o| o != root).collect();
        pg_sys::list_free(list);
        out
    }
}

/// `key` restricted to the registered `columns` when they are a proper
/// subset of its index's: a partitioned table's tail key, one column of a
/// primary key that also holds the partition key (unique because every
/// key is drawn by `next_key`; see `enable`).
pub fn narrow(mut key: KeyDesc, columns: Option<&[i16]>) -> KeyDesc {
    let Some(cols) = columns else { return key };
    if cols.is_empty() || cols.len() >= key.cols.len() || !cols.iter().all(|a| key.cols.iter().any(|c| c.attnum == *a))
    {
        return key;
    }
    let all = std::mem::take(&mut key.cols);
    key.cols = cols.iter().filter_map(|a| all.iter().find(|c| c.attnum == *a).cloned()).collect();
    key
}

/// Partition `relid` of latched table `root`, as a latched table of its
/// own whose latch identity is `root`.
pub fn load_member(relid: Oid, root: Oid) -> Option<Rc<Latched>> {
    let parent = lookup(root)?;
    let rel = OpenRel::try_open(relid, pg_sys::AccessShareLock)?;
    let key = member_key(&rel, relid, &parent.key);
    let mut found = trigger_exposures(&rel, relid, root);
    if super::is_subscription_target(relid) {
        found.push("logical replication writes into it: a tail read on this database can skip rows".into());
    }
    let exposure = (!found.is_empty()).then(|| found.join("; "));
    Some(Rc::new(Latched { key, root, gapless: parent.gapless, owner: parent.owner, exposure }))
}

/// The root's key columns as partition `rel` numbers them, with the
/// partition's btree index led by them (the clone of the root's key index,
/// or any other) as its index.
fn member_key(rel: &OpenRel, relid: Oid, root_key: &KeyDesc) -> KeyDesc {
    let attrs = rel.attrs();
    let mut key = root_key.clone();
    for c in &mut key.cols {
        // Partition columns match the parent's by name and type.
        if let Some(a) = attrs.iter().find(|a| !a.dropped && a.name == c.name) {
            c.attnum = a.attnum;
        }
    }
    key.relid = relid;
    key.relname = rel_name(relid);
    let want: Vec<i16> = key.cols.iter().map(|c| c.attnum).collect();
    let led_by_key = |ix: Oid| {
        let Some(ir) = OpenRel::try_open(ix, pg_sys::AccessShareLock) else { return false };
        let Some(ind) = ir.index() else { return false };
        // SAFETY: indkey holds indnatts entries; the relcache helpers read
        // an open index.
        unsafe {
            ind.indisvalid
                && ir.form().relam == pg_sys::BTREE_AM_OID
                && ind.indnkeyatts as usize >= want.len()
                && ind.indkey.values.as_slice(want.len()) == want.as_slice()
                && pg_sys::RelationGetIndexPredicate(ir.as_ptr()).is_null()
                && pg_sys::RelationGetIndexExpressions(ir.as_ptr()).is_null()
        }
    };
    let ixs = rel.index_oids();
    key.index = ixs.iter().copied().find(|&ix| led_by_key(ix)).unwrap_or(pg_sys::InvalidOid);
    if key.index != pg_sys::InvalidOid {
        key.index_name = rel_name(key.index);
    }
    key
}

/// A root's partitions whose writes escape latching.
type Exposed = Rc<Vec<Rc<Latched>>>;

thread_local! {
    /// Per root: its exposed partitions, as of a relcache generation.
    static EXPOSED: std::cell::RefCell<Vec<(Oid, u64, Exposed)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The partitions of latched partitioned table `root` whose reads cannot be
/// protected (`Latched::exposure`), usually none.  Asked by every guarded
/// read of the tree: the answer is kept until a relcache invalidation (a
/// trigger disabled or dropped, a partition attached or detached).
pub fn exposed_members(root: Oid) -> Exposed {
    let generation = super::generation();
    let hit =
        EXPOSED.with(|e| e.borrow().iter().find(|(r, g, _)| *r == root && *g == generation).map(|(_, _, l)| l.clone()));
    if let Some(l) = hit {
        return l;
    }
    let exposed: Exposed =
        Rc::new(members(root).into_iter().filter_map(lookup).filter(|l| l.exposure.is_some()).collect());
    // Kept under the generation it started at: an invalidation run while
    // the members were looked up leaves it stale, and asked again.
    EXPOSED.with(|e| {
        let mut e = e.borrow_mut();
        e.retain(|(r, _, _)| *r != root);
        e.push((root, generation, exposed.clone()));
    });
    exposed
}

/// What escapes latching in the partitions of latched partitioned table
/// `root`, each named: `pgkvx.check()` lists them under the root.
pub fn member_exposures(root: Oid) -> Vec<String> {
    let mut out = Vec::new();
    for m in members(root) {
        let Some(rel) = OpenRel::try_open(m, pg_sys::AccessShareLock) else { continue };
        let name = crate::pg::regclass_text(m);
        for problem in trigger_exposures(&rel, m, root) {
            out.push(format!("partition {name}: {problem}"));
        }
        if super::is_subscription_target(m) {
            out.push(format!("partition {name}: logical replication writes into it: a tail read can skip its rows"));
        }
    }
    out
}

/// The tail column of partitioned table `relid` whose primary key also
/// holds the partition key, `PRIMARY KEY (id, created_at)`: the one key
/// column of an integer type fed by a sequence, with the primary key index.
/// No index can make it unique alone (a unique index on a partitioned table
/// must include the partition key): it is unique because it is gapless --
/// every key is drawn from that one sequence by `next_key`, and the latch
/// trigger refuses keys this transaction did not draw.
pub fn tail_column(relid: Oid) -> Option<(Oid, i16)> {
    let row = crate::pg::with_pinned_settings(|| {
        pgrx::Spi::connect(|c| {
            let t = c
                .select(
                    "SELECT i.indexrelid, a.attnum
                       FROM pg_catalog.pg_index i
                       JOIN pg_catalog.pg_attribute a
                         ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey::pg_catalog.int2[])
                      WHERE i.indrelid = $1 AND i.indisprimary AND NOT a.attisdropped
                        AND a.atttypid IN ('pg_catalog.int2'::pg_catalog.regtype, 'pg_catalog.int4'::pg_catalog.regtype,
                                           'pg_catalog.int8'::pg_catalog.regtype)
                        AND pg_catalog.pg_get_serial_sequence(i.indrelid::pg_catalog.regclass::pg_catalog.text,
                                                              a.attname::pg_catalog.text) IS NOT NULL
                      ORDER BY a.attnum",
                    None,
                    &[relid.into()],
                )
                .ok()?;
            let rows: Vec<(Option<Oid>, Option<i16>)> =
                t.map(|r| (r.get::<Oid>(1).ok().flatten(), r.get::<i16>(2).ok().flatten())).collect();
            // Exactly one candidate: two sequence-fed columns leave the
            // choice to the user (name a unique index, or one column).
            match rows.as_slice() {
                [(Some(ix), Some(att))] => Some((*ix, *att)),
                _ => None,
            }
        })
    });
    row
}

/// Refuses to latch a table twice in one partition tree: an ancestor of
/// `relid` or one of its partitions is latched already.
pub fn refuse_overlap(relid: Oid) {
    let latched_above = ancestors(relid).into_iter().find(|&a| super::registration(a).is_some());
    if let Some(a) = latched_above {
        crate::errors::raise_hint(
            pgrx::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("\"{}\" is latched already, as a partition of latched table \"{}\"", rel_name(relid), rel_name(a)),
            "Its writes and reads use the latches of the partitioned table; nothing to do.",
        );
    }
    let latched_below = members(relid).into_iter().find(|&m| super::registration(m).is_some());
    if let Some(m) = latched_below {
        crate::errors::raise_hint(
            pgrx::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("partition \"{}\" of \"{}\" is latched on its own", rel_name(m), rel_name(relid)),
            format!(
                "A partitioned table is latched as one: SELECT pgkvx.disable({}) for each latched partition first.",
                crate::pg::quote_literal(&crate::pg::regclass_text(m))
            ),
        );
    }
}
