//! The few Postgres internals the Arrow projection needs, each behind a safe
//! function.  Everything that dereferences a Postgres pointer lives here or in
//! the per-type encoders, so the scan and query drivers stay plain Rust.

use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;

use crate::errors;
use crate::pg::{in_live_transaction, OpenRel};

/// A private memory context for one row's transient allocations (detoasted
/// values, output-function strings), reset after every row so that a batch of
/// 64k wide rows never accumulates them.
pub struct RowContext(pg_sys::MemoryContext);

impl RowContext {
    /// Created as a child of the current context, which for a set-returning
    /// function's first call is its multi-call context: it is freed with it.
    pub fn new() -> Self {
        // SAFETY: creating a context under CurrentMemoryContext is always
        // allowed; the name is a static C string as the API requires.
        let cx = unsafe {
            pg_sys::AllocSetContextCreateInternal(
                pg_sys::CurrentMemoryContext,
                c"pgkvx arrow row".as_ptr(),
                0,
                8 * 1024,
                8 * 1024 * 1024,
            )
        };
        RowContext(cx)
    }

    /// Runs `f` with this context current, then resets it.  An ERROR inside
    /// `f` unwinds through here; the context is then left as is and freed
    /// with its parent.
    ///
    /// Switches by hand rather than through `PgMemoryContexts::switch_to`:
    /// this runs once per row, and pgrx's two non-inlined calls per switch
    /// were 6% of an arrow_scan's time.
    #[inline(always)]
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        // SAFETY: the context is alive as long as its parent, which outlives
        // every call of the set-returning function that owns `self`.
        unsafe {
            let prev = pg_sys::CurrentMemoryContext;
            pg_sys::CurrentMemoryContext = self.0;
            let r = f();
            pg_sys::CurrentMemoryContext = prev;
            crate::pg::memcx::reset_if_used(self.0);
            r
        }
    }
}

/// Key columns of a btree index: heap attribute numbers, plus what a scan key
/// on its first column needs.
pub struct IndexInfo {
    pub heap_attnums: Vec<i16>,
    pub opfamily: pg_sys::Oid,
    pub opcintype: pg_sys::Oid,
    pub collation: pg_sys::Oid,
    pub is_btree: bool,
}

impl IndexInfo {
    pub fn of(index: &OpenRel) -> IndexInfo {
        let Some(form) = index.index() else {
            errors::raise(PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE, format!("\"{}\" is not an index", index.name()))
        };
        let nkeys = form.indnkeyatts as usize;
        let r = index.get();
        // SAFETY: an open index: indkey, rd_opfamily, rd_opcintype and
        // rd_indcollation have an entry per key column, and it has one.
        unsafe {
            IndexInfo {
                heap_attnums: form.indkey.values.as_slice(nkeys).to_vec(),
                opfamily: *r.rd_opfamily,
                opcintype: *r.rd_opcintype,
                collation: *r.rd_indcollation,
                is_btree: index.form().relam == pg_sys::BTREE_AM_OID,
            }
        }
    }
}

/// A btree scan key `<index column 1> <strategy> value`.
pub fn btree_key(info: &IndexInfo, strategy: u32, value: pg_sys::Datum) -> pg_sys::ScanKeyData {
    // SAFETY: catalog lookups; ScanKeyEntryInitialize only fills the struct.
    unsafe {
        let op = pg_sys::get_opfamily_member(info.opfamily, info.opcintype, info.opcintype, strategy as i16);
        if op == pg_sys::InvalidOid {
            errors::raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
                "the key index has no comparison operator for its own type",
            );
        }
        let mut key = pg_sys::ScanKeyData::default();
        pg_sys::ScanKeyEntryInitialize(
            &mut key,
            0,
            1,
            strategy as pg_sys::StrategyNumber,
            info.opcintype,
            info.collation,
            pg_sys::get_opcode(op),
            value,
        );
        key
    }
}

/// The statement's snapshot, registered so that it outlives every call of a
/// value-per-call function, whatever the caller does between calls.
pub struct RegisteredSnapshot(pg_sys::Snapshot);

impl RegisteredSnapshot {
    pub fn active() -> Self {
        // SAFETY: a function called from a query always runs with an active
        // snapshot; registering it pins it to the current resource owner.
        unsafe { RegisteredSnapshot(pg_sys::RegisterSnapshot(pg_sys::GetActiveSnapshot())) }
    }
    pub fn as_ptr(&self) -> pg_sys::Snapshot {
        self.0
    }
    pub fn release(self) {
        if in_live_transaction() {
            // SAFETY: registered by `active` on the resource owner that is
            // current again when the scan is released (see scan.rs).
            unsafe { pg_sys::UnregisterSnapshot(self.0) };
        }
    }
}

/// A table slot for `rel`, holding one tuple at a time.
pub struct TableSlot(*mut pg_sys::TupleTableSlot);

impl TableSlot {
    pub fn for_rel(rel: &OpenRel) -> TableSlot {
        // SAFETY: rel is open; the slot is allocated in the current context.
        TableSlot(unsafe { pg_sys::table_slot_create(rel.as_ptr(), std::ptr::null_mut()) })
    }
    pub fn as_ptr(&self) -> *mut pg_sys::TupleTableSlot {
        self.0
    }
    pub fn drop_slot(self) {
        if in_live_transaction() {
            // SAFETY: created by table_slot_create; releases its buffer pin.
            unsafe { pg_sys::ExecDropSingleTupleTableSlot(self.0) };
        }
    }
}

/// Deforms `slot` up to attribute `natts` (1-based count) and returns its
/// value and null arrays.
///
/// # Safety
/// `slot` must hold a tuple with at least `natts` attributes.
#[inline]
pub unsafe fn deform(slot: *mut pg_sys::TupleTableSlot, natts: usize) -> (*const pg_sys::Datum, *const bool) {
    // SAFETY: per the caller; slot_getsomeattrs_int fills tts_values and
    // tts_isnull up to natts, as the inline slot_getsomeattrs would.
    unsafe {
        if ((*slot).tts_nvalid as usize) < natts {
            pg_sys::slot_getsomeattrs_int(slot, natts as i32);
        }
        ((*slot).tts_values, (*slot).tts_isnull)
    }
}

/// How text leaves the server: Arrow Utf8 must be UTF-8.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ServerEncoding {
    Utf8,
    /// SQL_ASCII stores bytes unchecked: valid UTF-8 passes, anything else is refused.
    Unchecked,
    /// Any other server encoding: converted value by value.
    Other,
}

pub fn server_encoding() -> ServerEncoding {
    // SAFETY: reads a backend global.
    let enc = unsafe { pg_sys::GetDatabaseEncoding() } as u32;
    if enc == pg_sys::pg_enc::PG_UTF8 {
        ServerEncoding::Utf8
    } else if enc == pg_sys::pg_enc::PG_SQL_ASCII {
        ServerEncoding::Unchecked
    } else {
        ServerEncoding::Other
    }
}

/// Converts `bytes` from the server encoding to UTF-8, calling `f` with the
/// result (which may point into the row memory context).
pub fn with_utf8<R>(bytes: &[u8], enc: ServerEncoding, f: impl FnOnce(&[u8]) -> R) -> R {
    match enc {
        ServerEncoding::Utf8 => f(bytes),
        ServerEncoding::Unchecked => {
            if std::str::from_utf8(bytes).is_err() {
                errors::raise_hint(
                    PgSqlErrorCode::ERRCODE_CHARACTER_NOT_IN_REPERTOIRE,
                    "text value is not valid UTF-8 and cannot be sent as Arrow Utf8",
                    "The database encoding is SQL_ASCII; convert the value (e.g. with convert_to) in pgkvx.arrow_query.",
                )
            }
            f(bytes)
        }
        ServerEncoding::Other => {
            // SAFETY: pg_server_to_any reads len bytes and returns either the
            // input pointer or a palloc'd NUL-terminated conversion.
            unsafe {
                let out = pg_sys::pg_server_to_any(
                    bytes.as_ptr() as *const _,
                    bytes.len() as i32,
                    pg_sys::pg_enc::PG_UTF8 as i32,
                );
                if out as *const u8 == bytes.as_ptr() {
                    f(bytes)
                } else {
                    f(CStr::from_ptr(out).to_bytes())
                }
            }
        }
    }
}

/// A type's output function, looked up once and cached with its FmgrInfo.
pub struct OutputFn {
    finfo: Box<pg_sys::FmgrInfo>,
}

impl OutputFn {
    pub fn new(typid: pg_sys::Oid) -> OutputFn {
        // SAFETY: catalog lookup; fmgr_info_cxt fills the boxed FmgrInfo,
        // keeping its private data in the current (multi-call) context.
        unsafe {
            let mut func = pg_sys::InvalidOid;
            let mut varlena = false;
            pg_sys::getTypeOutputInfo(typid, &mut func, &mut varlena);
            let mut finfo = Box::new(pg_sys::FmgrInfo::default());
            pg_sys::fmgr_info_cxt(func, finfo.as_mut(), pg_sys::CurrentMemoryContext);
            OutputFn { finfo }
        }
    }

    /// # Safety
    /// `datum` must be a non-null value of the type this was made for.
    pub unsafe fn call<'a>(&mut self, datum: pg_sys::Datum) -> &'a [u8] {
        // SAFETY: per the caller; the string is palloc'd in the row context.
        unsafe { CStr::from_ptr(pg_sys::OutputFunctionCall(self.finfo.as_mut(), datum)).to_bytes() }
    }
}

/// The base type and typmod of a (possibly domain) type.
pub fn base_type(typid: pg_sys::Oid, typmod: i32) -> (pg_sys::Oid, i32) {
    let mut m = typmod;
    // SAFETY: catalog lookup.
    let base = unsafe { pg_sys::getBaseTypeAndTypmod(typid, &mut m) };
    (base, m)
}

/// The element type of an array type (InvalidOid for non-arrays).
pub fn element_type(typid: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: catalog lookup.
    unsafe { pg_sys::get_element_type(typid) }
}

pub fn typlenbyvalalign(typid: pg_sys::Oid) -> (i16, bool, i8) {
    let (mut len, mut byval, mut align) = (0i16, false, 0 as std::ffi::c_char);
    // SAFETY: catalog lookup filling three out-parameters.
    unsafe { pg_sys::get_typlenbyvalalign(typid, &mut len, &mut byval, &mut align) };
    (len, byval, align)
}

/// Watches the resource owner that holds a scan's pins, relcache references
/// and snapshot.  If Postgres releases that owner on its own (transaction or
/// subtransaction abort, a cursor failing inside a savepoint that is rolled
/// back) the scan's resources are gone, and ending the scan later would
/// release them a second time; `released()` says so.
pub struct OwnerWatch {
    owner: pg_sys::ResourceOwner,
    released: std::cell::Cell<bool>,
    registered: std::cell::Cell<bool>,
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn owner_released(
    phase: pg_sys::ResourceReleasePhase::Type,
    _is_commit: bool,
    _is_top_level: bool,
    arg: *mut std::ffi::c_void,
) {
    // SAFETY: `arg` is the boxed OwnerWatch registered by `OwnerWatch::new`,
    // unregistered before it is freed.  Postgres makes the owner being
    // released current while it runs these callbacks.
    unsafe {
        let w = &*(arg as *const OwnerWatch);
        if phase == pg_sys::ResourceReleasePhase::RESOURCE_RELEASE_BEFORE_LOCKS
            && pg_sys::CurrentResourceOwner == w.owner
        {
            w.released.set(true);
        }
    }
}

impl OwnerWatch {
    /// Watches the current resource owner.
    pub fn new() -> Box<OwnerWatch> {
        // SAFETY: reads a backend global.
        let owner = unsafe { pg_sys::CurrentResourceOwner };
        let w = Box::new(OwnerWatch {
            owner,
            released: std::cell::Cell::new(false),
            registered: std::cell::Cell::new(true),
        });
        // SAFETY: the Box's address is stable until `unregister`, which
        // Drop guarantees.
        unsafe { pg_sys::RegisterResourceReleaseCallback(Some(owner_released), &*w as *const OwnerWatch as *mut _) };
        w
    }

    pub fn owner(&self) -> pg_sys::ResourceOwner {
        self.owner
    }

    pub fn released(&self) -> bool {
        self.released.get()
    }

    pub fn unregister(&self) {
        if self.registered.replace(false) {
            // SAFETY: removes the entry added in `new`; only touches the
            // callback list, valid in any transaction state.
            unsafe {
                pg_sys::UnregisterResourceReleaseCallback(Some(owner_released), self as *const OwnerWatch as *mut _)
            };
        }
    }
}

impl Drop for OwnerWatch {
    fn drop(&mut self) {
        self.unregister();
    }
}
