//! pgkvx's own WAL records, through a custom resource manager: writing
//! them, and the pieces of a record its redo and description read.

use pgrx::pg_sys;

/// Our resource manager id: RM_EXPERIMENTAL_ID, until an id is reserved.
pub const RMGR_ID: u8 = pg_sys::RM_EXPERIMENTAL_ID as u8;

/// Whether this server writes WAL for standbys (wal_level replica or
/// logical) and may write WAL now (not in recovery).
pub fn logs_for_standbys() -> bool {
    // SAFETY: plain reads of a GUC variable and of recovery state, which
    // cannot raise.
    unsafe { pg_sys::wal_level >= pg_sys::WalLevel::WAL_LEVEL_REPLICA as i32 && !crate::pg::raw::RecoveryInProgress() }
}

/// Writes one record of ours, of kind `info`, with body `data`; where it
/// ends.  Marked unimportant: it alone does not make an idle server
/// checkpoint or switch segments (it always travels with the writes it
/// describes).
pub fn insert(info: u8, data: &[u8]) -> pg_sys::XLogRecPtr {
    use crate::pg::raw;
    // SAFETY: the record protocol in one piece (begin, flags, data,
    // insert) inside one FFI guard; `data` lives across the insert, which
    // copies it.  Errors are Postgres errors raised from inside XLogInsert
    // (the others only fill in the record being assembled), before which
    // nothing is half made; the guard turns them into a Rust panic.
    unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| {
            raw::XLogBeginInsert();
            raw::XLogSetRecordFlags(pg_sys::XLOG_MARK_UNIMPORTANT as u8);
            crate::pg::compat::xlog_register_data(data);
            raw::XLogInsert(RMGR_ID, info)
        })
    }
}

/// Has the WAL writer flush up to `lsn` soon, as for an asynchronous
/// commit, without this backend waiting for it: walsenders send only
/// flushed WAL, so a record written after its transaction's commit
/// record would otherwise wait for whoever flushes next.
pub fn flush_soon(lsn: pg_sys::XLogRecPtr) {
    // SAFETY: takes a spinlock for a few stores and may set the WAL
    // writer's latch; raises nothing.
    unsafe { pg_sys::XLogSetAsyncXactLSN(lsn) }
}

/// The kind bits and body of the record `record` decodes.
///
/// # Safety
/// `record` is the reader state a redo or desc callback was handed: its
/// decoded record and main data stay valid while the callback runs.
pub unsafe fn record_parts<'a>(record: *mut pg_sys::XLogReaderState) -> (u8, &'a [u8]) {
    // SAFETY: per the caller's contract (XLogRecGetInfo, XLogRecGetData,
    // XLogRecGetDataLen).
    unsafe {
        let dec = (*record).record;
        let info = (*dec).header.xl_info & !(pg_sys::XLR_INFO_MASK as u8);
        let data = if (*dec).main_data_len == 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts((*dec).main_data as *const u8, (*dec).main_data_len as usize)
        };
        (info, data)
    }
}

/// Registers resource manager `rm` under [`RMGR_ID`].
///
/// # Safety
/// From `_PG_init` while shared_preload_libraries loads; `rm` is static.
pub unsafe fn register(rm: &'static mut pg_sys::RmgrData) {
    // SAFETY: per the caller's contract; Postgres keeps the pointer.
    unsafe { pg_sys::RegisterCustomRmgr(RMGR_ID, rm) };
}

/// Where hot standby is: only once it tracks the primary's running
/// transactions (STANDBY_INITIALIZED and later) may latches be replayed.
pub fn standby_state() -> pg_sys::HotStandbyState::Type {
    // SAFETY: plain read of the startup process's global.
    unsafe { pg_sys::standbyState }
}

/// Appends `text` to a description buffer.
///
/// # Safety
/// `buf` is the StringInfo a desc callback was handed.
pub unsafe fn append_desc(buf: pg_sys::StringInfo, text: &str) {
    let c = std::ffi::CString::new(text.replace('\0', "")).expect("no NUL left");
    // SAFETY: per the caller's contract; the string is copied.
    unsafe { pg_sys::appendStringInfoString(buf, c.as_ptr()) };
}
