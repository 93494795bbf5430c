//! What the planner tells the executor about one `PgkvxLimitScan`: its
//! name and method tables, and one struct, written to and read from the CustomScan's `custom_private` list
//! here and nowhere else.  A list of Integer nodes survives `copyObject`,
//! the plan cache and EXPLAIN.

use crate::pg::{list_iter, make_list};
use pgrx::pg_sys::{self, List, Oid};

/// [`GuardPlan::runtime_caps`]: bounded above, below (in the key's
/// encoded order).
pub const RUNTIME_CAPS_ABOVE: u8 = 1;
pub const RUNTIME_CAPS_BELOW: u8 = 2;

/// The custom scan's name, in plans and EXPLAIN.
pub const NAME: &std::ffi::CStr = c"PgkvxLimitScan";

/// The `PgkvxLimitScan` plan methods as PostgreSQL's registry has them
/// (node.rs registers them at load): the planner builds and recognises our
/// plans through PostgreSQL's own lookup, and needs nothing of the node.
pub fn scan_methods() -> *const pg_sys::CustomScanMethods {
    use std::sync::atomic::{AtomicPtr, Ordering};
    static METHODS: AtomicPtr<pg_sys::CustomScanMethods> = AtomicPtr::new(std::ptr::null_mut());
    let p = METHODS.load(Ordering::Relaxed);
    if !p.is_null() {
        return p;
    }
    // SAFETY: a lookup in the backend's registry of custom scan methods,
    // filled at load (the first call is right after registering, in
    // `_PG_init`); raises if the name is missing, which it never is then.
    let p = unsafe { pg_sys::GetCustomScanMethods(NAME.as_ptr(), false) } as *mut pg_sys::CustomScanMethods;
    METHODS.store(p, Ordering::Relaxed);
    p
}

/// A `PgkvxLimitScan` plan node: `plans` (one child) under it, `tlist` its
/// output and `scan_tlist` the child's rows it refers to, `exprs` the
/// bounds' expressions, `plan` what the executor is told.  Built like
/// makeNode(CustomScan); the caller sets what else the plan needs (costs).
///
/// # Safety
/// Called while planning, in the plan's memory context; the lists are
/// valid (or NIL).
pub unsafe fn custom_scan(
    tlist: *mut List,
    scan_tlist: *mut List,
    plans: *mut List,
    exprs: *mut List,
    plan: &GuardPlan,
    flags: u32,
) -> *mut pg_sys::CustomScan {
    // SAFETY: the caller plans in the plan's memory context with valid lists, so the node and what it
    // points to live as long as the plan; palloc0 zeroes every field not set here, as makeNode does.
    unsafe {
        let cs = pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomScan>()) as *mut pg_sys::CustomScan;
        (*cs).scan.plan.type_ = pg_sys::NodeTag::T_CustomScan;
        (*cs).scan.plan.targetlist = tlist;
        (*cs).custom_scan_tlist = scan_tlist;
        (*cs).scan.scanrelid = 0;
        (*cs).custom_plans = plans;
        (*cs).custom_exprs = exprs;
        (*cs).custom_private = plan.to_list();
        (*cs).flags = flags;
        (*cs).methods = scan_methods();
        cs
    }
}

/// Static method tables Postgres keeps pointers to.
#[repr(transparent)]
pub struct StaticMethods<T>(pub T);
// SAFETY: immutable after construction; only read by this process.
unsafe impl<T> Sync for StaticMethods<T> {}

/// Bumped whenever the layout changes: a plan cached by an older library
/// is refused rather than misread.
const LAYOUT: i32 = 5;

/// A qual `key column <strategy> expression` that bounds the declared span,
/// the expression being the matching entry of `custom_exprs`.  Only
/// expressions with one value for the whole statement are kept: constants,
/// query parameters, stable functions of them, and results of init plans
/// (known once the scan starts, not before the statement runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundQual {
    /// Position in the key (0-based).
    pub col: u16,
    /// btree strategy number of the operator, with the key column on its left.
    pub strategy: u16,
    /// The expression's type; for `array`, its element type.
    pub typid: Oid,
    /// `key column = ANY(expression)`.
    pub array: bool,
    /// 0: ANDed with the other bounds; n > 0: in branch `branch` of the
    /// n-th OR of the quals (read/span.rs).
    pub group: u16,
    pub branch: u16,
}

impl BoundQual {
    /// The qual this bound gives with its expression evaluated.
    pub fn qual(&self, value: pg_sys::Datum, isnull: bool) -> crate::read::span::KeyQual {
        crate::read::span::KeyQual {
            col: usize::from(self.col),
            strategy: self.strategy,
            value,
            typid: self.typid,
            isnull,
            array: self.array,
            group: self.group,
            branch: self.branch,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardPlan {
    /// The latched table the guarded scan reads.
    pub relid: Oid,
    /// The statement has no side effects, so it may run again: optimistic
    /// reads may retry it at another snapshot.
    pub restartable: bool,
    pub bounds: Vec<BoundQual>,
    /// Which ways key quals with values that change while the statement
    /// runs (nestloop and lateral parameters) bound the key: `bounds` do
    /// not hold them, and the span is not open where they cap it.
    pub runtime_caps: u8,
    /// The node guards a partitioned table's Append or MergeAppend (all
    /// its partitions' scans), not one table's scan.
    pub tree: bool,
    /// For a tree: how its rows come, when they come in key order.
    pub stream: Option<StreamOrder>,
}

/// A stream of rows in key order: the key columns' positions in each row
/// (1-based, in the node's target list) and whether the stream moves up
/// the key encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamOrder {
    pub forward: bool,
    pub resnos: Vec<i16>,
}

fn integer_node(v: i32) -> *mut std::ffi::c_void {
    // SAFETY: makeInteger pallocs a node in the current context.
    unsafe { pg_sys::makeInteger(v) as *mut std::ffi::c_void }
}

impl GuardPlan {
    /// The plan's private list.
    pub fn to_list(&self) -> *mut List {
        let mut v = vec![LAYOUT, self.relid.to_u32() as i32, i32::from(self.restartable), self.bounds.len() as i32];
        for b in &self.bounds {
            v.extend([
                i32::from(b.col),
                i32::from(b.strategy),
                b.typid.to_u32() as i32,
                i32::from(b.array),
                i32::from(b.group),
                i32::from(b.branch),
            ]);
        }
        v.push(i32::from(self.runtime_caps));
        v.push(i32::from(self.tree));
        match &self.stream {
            None => v.push(0),
            Some(s) => {
                v.push(if s.forward { 1 } else { 2 });
                v.push(s.resnos.len() as i32);
                v.extend(s.resnos.iter().map(|&r| i32::from(r)));
            }
        }
        make_list(v.into_iter().map(integer_node))
    }

    /// Reads the private list back; None for a list this library did not
    /// write.
    ///
    /// # Safety
    /// `list` is NIL or a valid pointer List of nodes, none of them NULL (a
    /// CustomScan's `custom_private`).
    pub unsafe fn from_list(list: *mut List) -> Option<GuardPlan> {
        // Read at every executor start of a guarded statement: straight
        // from the list, with one allocation (the bounds).
        // SAFETY: the caller passes NIL or a pointer List of non-null nodes; each element's tag is
        // checked to be T_Integer before it is read as an Integer.
        let mut ints = unsafe {
            list_iter::<pg_sys::Node>(list)
                .map(|n| ((*n).type_ == pg_sys::NodeTag::T_Integer).then(|| (*(n as *mut pg_sys::Integer)).ival))
        };
        let mut next = || ints.next().flatten();
        let (layout, relid, restartable, n) = (next()?, next()?, next()?, next()?);
        if layout != LAYOUT || n < 0 {
            return None;
        }
        let mut bounds = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let (col, strategy, typid) = (next()?, next()?, next()?);
            let (array, group, branch) = (next()?, next()?, next()?);
            bounds.push(BoundQual {
                col: col as u16,
                strategy: strategy as u16,
                typid: Oid::from(typid as u32),
                array: array != 0,
                group: group as u16,
                branch: branch as u16,
            });
        }
        let runtime_caps = next()? as u8;
        let tree = next()? != 0;
        let stream = match next()? {
            0 => None,
            order @ (1 | 2) => {
                let n = next()?;
                let resnos = (0..n).map(|_| next().map(|r| r as i16)).collect::<Option<Vec<_>>>()?;
                Some(StreamOrder { forward: order == 1, resnos })
            }
            _ => return None,
        };
        // Also refuses a list with elements left over, as before.
        if ints.next().is_some() {
            return None;
        }
        Some(GuardPlan {
            relid: Oid::from(relid as u32),
            restartable: restartable != 0,
            bounds,
            runtime_caps,
            tree,
            stream,
        })
    }
}

#[cfg(feature = "pg_test")]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    #[pg_test]
    fn plan_data_round_trips_through_copy_object() {
        let p = GuardPlan {
            relid: Oid::from(4_000_000_123),
            restartable: true,
            bounds: vec![
                BoundQual { col: 0, strategy: 5, typid: pg_sys::INT8OID, array: false, group: 0, branch: 0 },
                BoundQual { col: 1, strategy: 3, typid: pg_sys::TEXTOID, array: true, group: 2, branch: 1 },
            ],
            runtime_caps: RUNTIME_CAPS_BELOW,
            tree: false,
            stream: None,
        };
        let list = p.to_list();
        // SAFETY: a list we just built, and its copy.
        let copied = unsafe { pg_sys::copyObjectImpl(list as *const std::ffi::c_void) as *mut List };
        assert_eq!(unsafe { GuardPlan::from_list(copied) }, Some(p.clone()));
        let tree = GuardPlan { tree: true, stream: Some(StreamOrder { forward: false, resnos: vec![3, 1] }), ..p };
        // SAFETY: as above.
        assert_eq!(unsafe { GuardPlan::from_list(tree.to_list()) }, Some(tree));
        // A list of another layout is not misread.
        assert_eq!(unsafe { GuardPlan::from_list(make_list([integer_node(99)])) }, None);
    }
}
