//! How a guarded scan moves, found once when its node begins: an index
//! scan in key order (and which way), a partitioned table's ordered
//! stream, or a scan in no key order -- and reading back the key of the
//! row it examined last.

use crate::keys::codec::KeyWriter;
use crate::keys::KeyDesc;
use crate::pg::node_tag;
use pgrx::pg_sys;

/// Where the guarded scan has got to.
pub(super) enum ScanPosition {
    /// An index scan in key order: its scan slot holds the row it examined
    /// last, `attnos` are the key columns' positions in that slot,
    /// `key_col` maps an index column to its key position, and `forward`
    /// says whether it moves up the key encoding.
    Ordered {
        scan: *mut pg_sys::ScanState,
        keys: *mut pg_sys::ScanKeyData,
        nkeys: usize,
        key_col: Vec<Option<usize>>,
        attnos: Vec<i32>,
        forward: bool,
    },
    /// A partitioned table's MergeAppend in key order (tree.rs): the rows
    /// it handed up end at the last one (`NodeRuntime::last`), whose key
    /// columns are at `attnos`.
    Stream { attnos: Vec<i32>, forward: bool },
    /// Any other scan: it may have looked anywhere in the declared span.
    Anywhere,
}

/// Whether a scan moving forward through `index` under `keys` returns
/// rows in the order of `key`'s encoding (Some(true)), in its reverse
/// (Some(false)), or neither.  Index columns an equality fixes do not
/// matter; the key's columns must follow in key order.
///
/// # Safety
/// `index` is an open index, `keys` its scan keys.
pub(super) unsafe fn index_order(index: pg_sys::Relation, keys: &[pg_sys::ScanKeyData], key: &KeyDesc) -> Option<bool> {
    // SAFETY: the caller's contract: `index` is an open index, `keys` its scan keys.
    unsafe {
        // Only a btree index with the key's operator family and collation
        // runs in key order; any other returns rows in an order of its own.
        if (*(*index).rd_rel).relam != pg_sys::BTREE_AM_OID {
            return None;
        }
        let ind = &*(*index).rd_index;
        let n = ind.indnkeyatts as usize;
        let same_order = |col: usize, kc: &crate::keys::desc::KeyCol| {
            *(*index).rd_opfamily.add(col) == kc.opfamily && kc.orders_like_key(*(*index).rd_indcollation.add(col))
        };
        // An equality fixes one value of a column only under a
        // deterministic collation (or none).
        let fixes_one_value = |col: usize| {
            let coll = *(*index).rd_indcollation.add(col);
            coll == pg_sys::InvalidOid || pg_sys::get_collation_isdeterministic(coll)
        };
        let attnums = ind.indkey.values.as_slice(n);
        let fixed = |col: usize| {
            fixes_one_value(col)
                && keys.iter().any(|sk| {
                    let flags = sk.sk_flags as u32;
                    sk.sk_attno as usize == col + 1
                        && u32::from(sk.sk_strategy) == pg_sys::BTEqualStrategyNumber
                        && flags
                            & (pg_sys::SK_SEARCHARRAY
                                | pg_sys::SK_ROW_HEADER
                                | pg_sys::SK_SEARCHNULL
                                | pg_sys::SK_SEARCHNOTNULL)
                            == 0
                })
        };
        let mut next = 0;
        let mut same: Option<bool> = None;
        for (col, &attnum) in attnums.iter().enumerate() {
            if next < key.cols.len() && attnum == key.cols[next].attnum {
                if !same_order(col, &key.cols[next]) {
                    return None;
                }
                if !fixed(col) {
                    let index_desc = *(*index).rd_indoption.add(col) & pg_sys::INDOPTION_DESC as i16 != 0;
                    let s = index_desc == key.cols[next].desc;
                    if same.is_some_and(|d| d != s) {
                        return None;
                    }
                    same = Some(s);
                }
                next += 1;
            } else if !fixed(col) {
                break;
            }
        }
        (next == key.cols.len()).then_some(same.unwrap_or(true))
    }
}

/// How to follow the child's position.
///
/// # Safety
/// `child` is an initialised plan state (not EXPLAIN-only).
pub(super) unsafe fn position_of(child: *mut pg_sys::PlanState, key: &KeyDesc) -> ScanPosition {
    // SAFETY: the caller's contract: `child` is an initialised plan state (not EXPLAIN-only). Nodes are
    // checked by tag before each cast.
    unsafe {
        let mut s = child;
        // A gating Result (pseudoconstant quals) sits over the scan.
        while node_tag(s) == pg_sys::NodeTag::T_ResultState && !(*s).lefttree.is_null() {
            s = (*s).lefttree;
        }
        let (scan, index, keys, nkeys, dir, only) = match node_tag(s) {
            pg_sys::NodeTag::T_IndexScanState => {
                let is = s as *mut pg_sys::IndexScanState;
                if (*is).iss_NumOrderByKeys > 0 {
                    return ScanPosition::Anywhere;
                }
                let plan = (*s).plan as *mut pg_sys::IndexScan;
                let (k, n) = ((*is).iss_ScanKeys, (*is).iss_NumScanKeys);
                (s as *mut pg_sys::ScanState, (*is).iss_RelationDesc, k, n, (*plan).indexorderdir, false)
            }
            pg_sys::NodeTag::T_IndexOnlyScanState => {
                let is = s as *mut pg_sys::IndexOnlyScanState;
                if (*is).ioss_NumOrderByKeys > 0 {
                    return ScanPosition::Anywhere;
                }
                let plan = (*s).plan as *mut pg_sys::IndexOnlyScan;
                let (k, n) = ((*is).ioss_ScanKeys, (*is).ioss_NumScanKeys);
                (s as *mut pg_sys::ScanState, (*is).ioss_RelationDesc, k, n, (*plan).indexorderdir, true)
            }
            _ => return ScanPosition::Anywhere,
        };
        if index.is_null() {
            return ScanPosition::Anywhere;
        }
        let sks: &[pg_sys::ScanKeyData] =
            if nkeys > 0 { std::slice::from_raw_parts(keys, nkeys as usize) } else { &[] };
        let Some(same) = index_order(index, sks, key) else { return ScanPosition::Anywhere };
        let ind = &*(*index).rd_index;
        let attnums = ind.indkey.values.as_slice(ind.indnatts as usize);
        let key_col = attnums.iter().map(|a| key.cols.iter().position(|c| c.attnum == *a)).collect();
        // An index-only scan's slot holds the index's columns, in its order.
        let attnos = key
            .cols
            .iter()
            .map(|c| {
                if only {
                    attnums.iter().position(|a| *a == c.attnum).map_or(0, |p| p as i32 + 1)
                } else {
                    i32::from(c.attnum)
                }
            })
            .collect::<Vec<_>>();
        if attnos.contains(&0) {
            return ScanPosition::Anywhere;
        }
        let backward = dir == pg_sys::ScanDirection::BackwardScanDirection;
        ScanPosition::Ordered { scan, keys, nkeys: nkeys.max(0) as usize, key_col, attnos, forward: same != backward }
    }
}

/// Where the row an unordered scan of the latched table returned last can
/// be read with its key: the scan's slot and the key columns' positions in
/// it.  None for anything but a scan of the table itself (a join, an
/// Append, a function scan).
///
/// # Safety
/// `child` is an initialised plan state (not EXPLAIN-only).
pub(super) unsafe fn key_source_of(
    child: *mut pg_sys::PlanState,
    key: &KeyDesc,
) -> Option<(*mut pg_sys::ScanState, Vec<i32>)> {
    // SAFETY: the caller's contract: `child` is an initialised plan state (not EXPLAIN-only). Nodes are
    // checked by tag before each cast.
    unsafe {
        let mut s = child;
        while node_tag(s) == pg_sys::NodeTag::T_ResultState && !(*s).lefttree.is_null() {
            s = (*s).lefttree;
        }
        let heap_cols = || key.cols.iter().map(|c| i32::from(c.attnum)).collect::<Vec<_>>();
        match node_tag(s) {
            pg_sys::NodeTag::T_SeqScanState
            | pg_sys::NodeTag::T_SampleScanState
            | pg_sys::NodeTag::T_BitmapHeapScanState
            | pg_sys::NodeTag::T_TidScanState
            | pg_sys::NodeTag::T_TidRangeScanState
            | pg_sys::NodeTag::T_IndexScanState => {
                let ss = s as *mut pg_sys::ScanState;
                let rel = (*ss).ss_currentRelation;
                (!rel.is_null() && (*rel).rd_id == key.relid).then(|| (ss, heap_cols()))
            }
            pg_sys::NodeTag::T_IndexOnlyScanState => {
                let is = s as *mut pg_sys::IndexOnlyScanState;
                let index = (*is).ioss_RelationDesc;
                let rel = (*is).ss.ss_currentRelation;
                if index.is_null() || rel.is_null() || (*rel).rd_id != key.relid {
                    return None;
                }
                let ind = &*(*index).rd_index;
                let attnums = ind.indkey.values.as_slice(ind.indnatts as usize);
                let attnos: Vec<i32> = key
                    .cols
                    .iter()
                    .map(|c| attnums.iter().position(|a| *a == c.attnum).map_or(0, |p| p as i32 + 1))
                    .collect();
                (!attnos.contains(&0)).then_some((s as *mut pg_sys::ScanState, attnos))
            }
            _ => None,
        }
    }
}

/// Whether `slot` is NULL or holds no row.
///
/// # Safety
/// `slot` is NULL or a live slot.
pub(super) unsafe fn is_empty(slot: *mut pg_sys::TupleTableSlot) -> bool {
    // SAFETY: the caller's contract: `slot` is NULL or a live slot.
    slot.is_null() || unsafe { (*slot).tts_flags } & pg_sys::TTS_FLAG_EMPTY as u16 != 0
}

/// The key of the row in `slot` (its key columns at `attnos`), or None
/// when it holds none: the scan ran out of rows.
///
/// # Safety
/// `slot` is NULL or a live slot holding a row of the latched table.
pub(super) unsafe fn row_key(key: &KeyDesc, slot: *mut pg_sys::TupleTableSlot, attnos: &[i32]) -> Option<KeyWriter> {
    // SAFETY: the caller's contract: `slot` is NULL or a live slot holding a row of the latched table.
    unsafe { (!is_empty(slot)).then(|| key.encode_slot_at(slot, attnos)) }
}

/// The key of the heap row at `tid`, read into `scan`'s own slot -- empty,
/// as the scan has run out of rows -- and cleared from it again.  The row
/// was visible to the statement's snapshot, which is still registered, so
/// no vacuum can have removed it; None if it is gone all the same.
///
/// # Safety
/// `scan` is a heap scan of the latched table that has run out of rows;
/// `attnos` are the key columns' positions in its slot.
pub(super) unsafe fn key_at_tid(
    scan: *mut pg_sys::ScanState,
    tid: pg_sys::ItemPointerData,
    key: &KeyDesc,
    attnos: &[i32],
) -> Option<KeyWriter> {
    // SAFETY: the caller's contract: `scan` is a heap scan of the latched table that has run out of rows;
    // `attnos` are the key columns' positions in its slot. The fetch is the table AM's own, into a slot
    // of the AM's kind (the scan's), under any snapshot: the TID names the
    // row version the scan returned.
    unsafe {
        let rel = (*scan).ss_currentRelation;
        let slot = (*scan).ss_ScanTupleSlot;
        if rel.is_null() || !is_empty(slot) {
            return None;
        }
        let fetch = (*(*rel).rd_tableam).tuple_fetch_row_version?;
        let mut tid = tid;
        let found = crate::pg::boundary::pass(|| fetch(rel, &mut tid, &raw mut pg_sys::SnapshotAnyData, slot));
        if !found {
            return None;
        }
        Some(take_key(slot, key, attnos))
    }
}

/// The key of the row a lookup of ours put into a scan's own slot (its
/// key columns at `attnos`), cleared from the slot again: the scan had run
/// out, and leaves its slot as it found it.
///
/// # Safety
/// `slot` is a live slot holding a row of the latched table.
unsafe fn take_key(slot: *mut pg_sys::TupleTableSlot, key: &KeyDesc, attnos: &[i32]) -> KeyWriter {
    // SAFETY: the caller's contract; clearing is the slot's own operation.
    unsafe {
        let k = key.encode_slot_at(slot, attnos);
        crate::pg::boundary::pass(|| ((*(*slot).tts_ops).clear.unwrap_unchecked())(slot));
        k
    }
}

/// The key of the last row an index scan that has run out of rows
/// returned: the row its own index scan finds one step back from its end,
/// at its own snapshot, as a scroll cursor's `FETCH PRIOR` past the end
/// does.  Read into its scan slot (empty, as it ran out) and cleared from
/// it again.  Some(None): the scan never started or found no row; None:
/// `scan` is no index scan.
///
/// # Safety
/// `scan` is a plain index scan of the latched table, without filter or
/// array keys, that has run out of rows; `attnos` are the key columns'
/// positions in its slot.
pub(super) unsafe fn key_one_back(
    scan: *mut pg_sys::ScanState,
    key: &KeyDesc,
    attnos: &[i32],
) -> Option<Option<KeyWriter>> {
    // SAFETY: the caller's contract; the scan descriptor is the executor's
    // own, begun at the scan's first row (NULL before), and stepping it the
    // other way after its end is what a scroll cursor does.
    unsafe {
        if node_tag(scan as *mut pg_sys::PlanState) != pg_sys::NodeTag::T_IndexScanState {
            return None;
        }
        let desc = (*(scan as *mut pg_sys::IndexScanState)).iss_ScanDesc;
        let slot = (*scan).ss_ScanTupleSlot;
        if desc.is_null() {
            return Some(None);
        }
        if !is_empty(slot) {
            return None;
        }
        // Back is the other way from the scan's own direction (the
        // executor runs forward), whichever way the key runs.
        let dir = (*((*scan).ps.plan as *mut pg_sys::IndexScan)).indexorderdir;
        let back = if dir == pg_sys::ScanDirection::BackwardScanDirection {
            pg_sys::ScanDirection::ForwardScanDirection
        } else {
            pg_sys::ScanDirection::BackwardScanDirection
        };
        let found = crate::pg::boundary::pass(|| pg_sys::index_getnext_slot(desc, back, slot));
        if !found {
            return Some(None);
        }
        Some(Some(take_key(slot, key, attnos)))
    }
}
