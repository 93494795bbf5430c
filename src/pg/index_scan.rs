//! Index scans outside the executor: one scan of an index under a given
//! or a fresh MVCC snapshot, for reads that look at committed rows
//! without a plan (the fenced probe, `wait_for`, `head_blockers`,
//! `high_water`).

use super::compat::index_beginscan;
use super::OpenRel;
use pgrx::pg_sys;

/// Scans `index` of `heap` with `keys` under a fresh MVCC snapshot (rows
/// committed now, whoever is still writing), handing each row to `visit`
/// until it returns false.
pub fn scan_fresh(
    heap: &OpenRel,
    index: &OpenRel,
    keys: &mut [pg_sys::ScanKeyData],
    direction: pg_sys::ScanDirection::Type,
    visit: impl FnMut(*mut pg_sys::TupleTableSlot) -> bool,
) {
    // SAFETY: a fresh MVCC snapshot, registered for the scan and released
    // after it.
    unsafe {
        let snap = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        scan_at(snap, heap, index, keys, direction, visit);
        pg_sys::UnregisterSnapshot(snap);
    }
}

/// [`scan_fresh`] under snapshot `snap`.
///
/// # Safety
/// `snap` is a registered MVCC snapshot that outlives the call.
pub unsafe fn scan_at(
    snap: pg_sys::Snapshot,
    heap: &OpenRel,
    index: &OpenRel,
    keys: &mut [pg_sys::ScanKeyData],
    direction: pg_sys::ScanDirection::Type,
    mut visit: impl FnMut(*mut pg_sys::TupleTableSlot) -> bool,
) {
    // SAFETY: `snap` is a registered MVCC snapshot that outlives the call (the caller's contract); the
    // OpenRels keep relation and index open and locked; the keys (and the row members they point to)
    // are borrowed for the whole scan; the slot belongs to the relation and is dropped before the scan ends.
    unsafe {
        let scan = index_beginscan(heap.as_ptr(), index.as_ptr(), snap, keys.len() as i32, 0);
        pg_sys::index_rescan(scan, keys.as_mut_ptr(), keys.len() as i32, std::ptr::null_mut(), 0);
        let slot = pg_sys::table_slot_create(heap.as_ptr(), std::ptr::null_mut());
        while pg_sys::index_getnext_slot(scan, direction, slot) {
            if !visit(slot) {
                break;
            }
        }
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::index_endscan(scan);
    }
}
