//! A statement's result held back until it is known to be valid: a
//! DestReceiver that copies each row (bounded in rows and bytes), and the
//! rows handed on later, as many per call as the caller asks for.

use pgrx::pg_sys::{self, MinimalTuple};
use pgrx::prelude::*;

/// The receiver the executor hands each row to while an optimistic attempt
/// runs.  `base` must come first: Postgres sees only a `DestReceiver *`.
///
/// It lives in Postgres memory and owns nothing Rust must free (its rows
/// are a `List` in its own context), so an ERROR during a run may longjmp
/// past its owner's frames: the executor's memory takes it all.
#[repr(C)]
pub struct BufferDest {
    base: pg_sys::DestReceiver,
    /// The copied rows, a List of MinimalTuples in `cx`.
    rows: *mut pg_sys::List,
    /// Where rows go: the executor's memory for the first attempt, a
    /// context of the buffer's own (reset by [`Self::clear`]) for any
    /// later one.  Most statements run one attempt, and a context made
    /// and deleted for each of them cost more than its rows.
    cx: pg_sys::MemoryContext,
    own_cx: bool,
    max_rows: usize,
    max_bytes: usize,
    bytes: usize,
    overflowed: bool,
}

#[pg_guard]
unsafe extern "C-unwind" fn receive_slot(slot: *mut pg_sys::TupleTableSlot, dest: *mut pg_sys::DestReceiver) -> bool {
    // SAFETY: `dest` is the `base` of a live BufferDest (repr(C), first
    // field); the copy goes into the buffer's own context.
    unsafe {
        let d = &mut *(dest as *mut BufferDest);
        if crate::pg::list_len(d.rows) >= d.max_rows || d.bytes > d.max_bytes {
            d.overflowed = true;
            return false; // stops the executor
        }
        let old = pg_sys::MemoryContextSwitchTo(d.cx);
        let mt = pg_sys::ExecCopySlotMinimalTuple(slot);
        d.rows = pg_sys::lappend(d.rows, mt as *mut std::ffi::c_void);
        pg_sys::MemoryContextSwitchTo(old);
        d.bytes += (*mt).t_len as usize;
        true
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn startup(_dest: *mut pg_sys::DestReceiver, _op: i32, _desc: pg_sys::TupleDesc) {}

#[pg_guard]
unsafe extern "C-unwind" fn noop(_dest: *mut pg_sys::DestReceiver) {}

impl BufferDest {
    /// An empty buffer in the current memory context whose rows live in
    /// `cx`, the executor's memory, until the first [`Self::clear`].
    pub fn new(cx: pg_sys::MemoryContext, max_rows: usize, max_bytes: usize) -> *mut BufferDest {
        let b = BufferDest {
            base: pg_sys::DestReceiver {
                receiveSlot: Some(receive_slot),
                rStartup: Some(startup),
                rShutdown: Some(noop),
                rDestroy: Some(noop),
                mydest: pg_sys::CommandDest::DestNone,
            },
            rows: std::ptr::null_mut(),
            cx,
            own_cx: false,
            max_rows,
            max_bytes,
            bytes: 0,
            overflowed: false,
        };
        // SAFETY: palloc'd room of the struct's size, written once; the
        // struct has no destructor to skip.
        unsafe {
            let p = pg_sys::palloc(std::mem::size_of::<BufferDest>()) as *mut BufferDest;
            p.write(b);
            p
        }
    }

    pub fn as_dest(&mut self) -> *mut pg_sys::DestReceiver {
        &mut self.base
    }

    /// More rows arrived than fit: the attempt stopped early.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Forgets the rows for the next attempt, and frees their memory when
    /// they are in the buffer's own context.  The first attempt's stay in
    /// the executor's memory until the statement ends: at most one
    /// buffer's worth (`max_rows`, `max_bytes` and a row's overshoot).
    pub fn clear(&mut self) {
        self.rows = std::ptr::null_mut();
        self.bytes = 0;
        self.overflowed = false;
        // SAFETY: nothing references the rows now; the own context is a
        // child of the executor's memory, which frees it at the latest.
        unsafe {
            if self.own_cx {
                pg_sys::MemoryContextReset(self.cx);
            } else {
                self.cx = pg_sys::AllocSetContextCreateInternal(
                    self.cx,
                    c"pgkvx held rows".as_ptr(),
                    pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                    pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                    pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
                );
                self.own_cx = true;
            }
        }
    }

    /// The rows, to be handed on (they stay in the buffer's context).
    pub fn take(&mut self) -> Vec<MinimalTuple> {
        // SAFETY: a List of MinimalTuples built by receive_slot.
        let rows = unsafe { crate::pg::list_iter::<pg_sys::MinimalTupleData>(self.rows).collect() };
        self.rows = std::ptr::null_mut();
        rows
    }
}

/// Validated rows waiting to be handed on, in order.
pub struct HeldRows {
    rows: Vec<MinimalTuple>,
    next: usize,
    slot: *mut pg_sys::TupleTableSlot,
}

impl HeldRows {
    /// Rows to hand on through a slot of `desc`, made in the current
    /// memory context.
    ///
    /// # Safety
    /// `desc` is a valid tuple descriptor that describes the rows.
    pub unsafe fn new(rows: Vec<MinimalTuple>, desc: pg_sys::TupleDesc) -> HeldRows {
        // SAFETY: a standalone slot for minimal tuples of the result's
        // descriptor, freed with the executor's memory.
        let slot = unsafe { pg_sys::MakeSingleTupleTableSlot(desc, &pg_sys::TTSOpsMinimalTuple) };
        HeldRows { rows, next: 0, slot }
    }

    /// Hands up to `count` rows (0: all) to `dest` as one executor run
    /// in direction `dir` would: startup, rows (none when the direction is
    /// no movement), shutdown.  Returns how many.  An ERROR in the receiver
    /// leaves this run unfinished and passes on as raised.
    ///
    /// # Safety
    /// `dest` is a live receiver; `desc` describes the rows; called inside
    /// [`crate::pg::boundary::rethrow_pending`].
    pub unsafe fn send(
        &mut self,
        dest: *mut pg_sys::DestReceiver,
        desc: pg_sys::TupleDesc,
        dir: pg_sys::ScanDirection::Type,
        count: u64,
    ) -> u64 {
        let moving = dir != pg_sys::ScanDirection::NoMovementScanDirection;
        let (rows, slot) = (&self.rows, self.slot);
        let mut next = self.next;
        // SAFETY: the caller's contract: `dest` is a live receiver; `desc` describes the rows; called inside
        // [`crate::pg::boundary::rethrow_pending`]. The rows live in the buffer context until
        // the statement ends, and the receiver's callbacks are plain C
        // calls (nothing in this closure can panic).
        let n = unsafe {
            crate::pg::boundary::pass(|| {
                let mut n = 0u64;
                if let Some(startup) = (*dest).rStartup {
                    startup(dest, pg_sys::CmdType::CMD_SELECT as i32, desc);
                }
                while moving && (count == 0 || n < count) {
                    let Some(&row) = rows.get(next) else { break };
                    crate::pg::raw::ExecStoreMinimalTuple(row, slot, false);
                    next += 1;
                    n += 1;
                    if let Some(receive) = (*dest).receiveSlot {
                        if !receive(slot, dest) {
                            break;
                        }
                    }
                }
                if let Some(shutdown) = (*dest).rShutdown {
                    shutdown(dest);
                }
                n
            })
        };
        self.next = next;
        n
    }
}
