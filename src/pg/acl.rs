//! Privileges of the current user: every question pgkvx asks of the
//! catalog's ACLs, row-level security and ownership, in one place.  Each
//! answers for `GetUserId()`, the role a statement runs as (the owner
//! inside a SECURITY DEFINER function), as PostgreSQL's own checks do; it
//! is a read that cannot raise, so it is called without pgrx's guard.

use pgrx::pg_sys::{self, AclMode, Oid};

/// Whether the current user has a privilege in `mode` on table `relid`
/// (any one of them, as `pg_class_aclcheck` answers; pass one bit to ask
/// for exactly that privilege).
pub fn may(relid: Oid, mode: u32) -> bool {
    // SAFETY: a catalog ACL check for the current user.
    unsafe {
        pg_sys::pg_class_aclcheck(relid, super::raw::GetUserId(), mode as AclMode) == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// Whether the current user has some privilege in `mode` on table `relid`.
pub fn may_any(relid: Oid, mode: u32) -> bool {
    // SAFETY: a catalog ACL check for the current user.
    unsafe {
        pg_sys::pg_class_aclmask(relid, super::raw::GetUserId(), mode as AclMode, pg_sys::AclMaskHow::ACLMASK_ANY) != 0
    }
}

/// Whether the current user has some privilege in `mode` on table `relid`
/// or on any of its columns.
pub fn may_any_column(relid: Oid, mode: u32) -> bool {
    // SAFETY: catalog ACL checks for the current user.
    may_any(relid, mode)
        || unsafe {
            pg_sys::pg_attribute_aclcheck_all(
                relid,
                super::raw::GetUserId(),
                mode as AclMode,
                pg_sys::AclMaskHow::ACLMASK_ANY,
            ) == pg_sys::AclResult::ACLCHECK_OK
        }
}

/// Whether the current user has a privilege in `mode` (any one of them)
/// on column `attnum` of `relid`.
pub fn may_column(relid: Oid, attnum: i16, mode: u32) -> bool {
    // SAFETY: a catalog ACL check for the current user.
    unsafe {
        pg_sys::pg_attribute_aclcheck(relid, attnum, super::raw::GetUserId(), mode as AclMode)
            == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// Whether row-level security filters the current user's reads of `relid`.
/// With `row_security` off and a policy that would apply, PostgreSQL
/// raises its own 42501 here, as it does for a query.
pub fn rls_applies(relid: Oid) -> bool {
    // SAFETY: a catalog lookup for the current user.
    unsafe {
        pg_sys::check_enable_rls(relid, pg_sys::InvalidOid, false) == pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32
    }
}

/// Whether `role` owns relation `relid`.
///
/// # Safety
/// A transaction is open (a syscache lookup; raises for a missing relation).
pub unsafe fn owns(relid: Oid, role: Oid) -> bool {
    // SAFETY: a syscache lookup inside the transaction the caller keeps open, which is all
    // class_ownercheck asks.
    unsafe { super::compat::class_ownercheck(relid, role) }
}

/// Whether the current user owns relation `relid`.
pub fn is_owner(relid: Oid) -> bool {
    // SAFETY: a syscache lookup inside the caller's transaction.
    unsafe { owns(relid, super::raw::GetUserId()) }
}

/// Raises PostgreSQL's own 42501 ("must be owner of table …") unless the
/// current user owns `relid`.
pub fn require_owner(relid: Oid) {
    if is_owner(relid) {
        return;
    }
    // SAFETY: catalog lookups; aclcheck_error raises.
    unsafe {
        let kind = pg_sys::get_rel_relkind(relid);
        pg_sys::aclcheck_error(
            pg_sys::AclResult::ACLCHECK_NOT_OWNER,
            pg_sys::get_relkind_objtype(kind),
            pg_sys::get_rel_name(relid),
        );
    }
}

/// What the current user may see of a latched table's latches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Visibility {
    /// Its latches, without their keys (who holds them, how many).
    pub latches: bool,
    /// The latches' keys, which are table data.
    pub keys: bool,
}

/// What the current user may see of latched table `relid`.  Keys are table
/// data: they are shown only to a role that may read every row of the key
/// -- SELECT on the table or on each key column (`key_attnums`), and no
/// row-level security applying to it (its owner, BYPASSRLS, or a table
/// without policies).  Latches without keys are shown to roles that may
/// SELECT the table and to pg_monitor.  The views, EXPLAIN and every
/// message that could print a key ask this.
pub fn may_see(relid: Oid, key_attnums: &[i16]) -> Visibility {
    // SAFETY: catalog ACL and row-security checks for the current user.
    unsafe {
        let me = super::raw::GetUserId();
        // A table dropped while its ranges wait to be reclaimed: nothing
        // of it is anyone's to see.
        let mut missing = false;
        let select = pg_sys::pg_class_aclcheck_ext(relid, me, pg_sys::ACL_SELECT as AclMode, &mut missing)
            == pg_sys::AclResult::ACLCHECK_OK;
        if missing {
            return Visibility::default();
        }
        let monitor = pg_sys::has_privs_of_role(me, Oid::from(pg_sys::ROLE_PG_MONITOR));
        let key_columns = select
            || (!key_attnums.is_empty() && key_attnums.iter().all(|&a| may_column(relid, a, pg_sys::ACL_SELECT)));
        let all_rows = key_columns
            && pg_sys::check_enable_rls(relid, pg_sys::InvalidOid, true)
                != pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32;
        Visibility { latches: select || monitor, keys: all_rows }
    }
}
