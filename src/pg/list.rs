//! Walking Postgres `List`s, `Bitmapset`s and node tags.

use pgrx::pg_sys::{self, Oid};

/// The elements of a pointer `List` (NIL has none), in order, as `*mut T`.
///
/// # Safety
/// `list` is NIL or a valid `List` of pointers to `T`, neither changed nor
/// freed while the iterator is in use.
pub unsafe fn list_iter<T>(list: *mut pg_sys::List) -> impl Iterator<Item = *mut T> {
    // SAFETY: per the contract; the elements array holds `length` cells.
    let cells: &[pg_sys::ListCell] = unsafe { list_cells(list, pg_sys::NodeTag::T_List) };
    // SAFETY: the cells of a pointer List hold pointers.
    cells.iter().map(|c| unsafe { c.ptr_value } as *mut T)
}

/// Element `n` (0-based) of a pointer `List`, if it has one.
///
/// # Safety
/// As for [`list_iter`].
pub unsafe fn list_nth<T>(list: *mut pg_sys::List, n: usize) -> Option<*mut T> {
    // SAFETY: per the contract; the elements array holds `length` cells.
    let cells: &[pg_sys::ListCell] = unsafe { list_cells(list, pg_sys::NodeTag::T_List) };
    // SAFETY: the cells of a pointer List hold pointers.
    cells.get(n).map(|c| unsafe { c.ptr_value } as *mut T)
}

/// How many elements a `List` has (NIL has none).
///
/// # Safety
/// `list` is NIL or a valid `List`.
pub unsafe fn list_len(list: *mut pg_sys::List) -> usize {
    // SAFETY: `list` is NIL or a valid List (the caller's contract), whose `length`
    // is its number of cells.
    if list.is_null() {
        0
    } else {
        unsafe { (*list).length as usize }
    }
}

/// The oids of an `OidList` (NIL has none), in order.
///
/// # Safety
/// `list` is NIL or a valid `OidList`, neither changed nor freed while the
/// iterator is in use.
pub unsafe fn list_oids(list: *mut pg_sys::List) -> impl Iterator<Item = Oid> {
    // SAFETY: `list` is NIL or a valid OidList (the caller's contract), not changed
    // while the cells are read.
    let cells: &[pg_sys::ListCell] = unsafe { list_cells(list, pg_sys::NodeTag::T_OidList) };
    // SAFETY: the cells of an OidList hold oids.
    cells.iter().map(|c| unsafe { c.oid_value })
}

/// The integers of an `IntList` (NIL has none), in order.
///
/// # Safety
/// `list` is NIL or a valid `IntList`, neither changed nor freed while the
/// iterator is in use.
pub unsafe fn list_ints(list: *mut pg_sys::List) -> impl Iterator<Item = i32> {
    // SAFETY: `list` is NIL or a valid IntList (the caller's contract), not changed
    // while the cells are read.
    let cells: &[pg_sys::ListCell] = unsafe { list_cells(list, pg_sys::NodeTag::T_IntList) };
    // SAFETY: the cells of an IntList hold ints.
    cells.iter().map(|c| unsafe { c.int_value })
}

/// The members of a `Bitmapset` (NULL has none), in increasing order.
///
/// # Safety
/// `set` is NULL or a valid Bitmapset, neither changed nor freed while the
/// iterator is in use.
pub unsafe fn bitmapset_members(set: *mut pg_sys::Bitmapset) -> impl Iterator<Item = i32> {
    let mut prev = -1;
    std::iter::from_fn(move || {
        // SAFETY: per the contract; bms_next_member reads only.
        let next = unsafe { pg_sys::bms_next_member(set, prev) };
        (next >= 0).then(|| {
            prev = next;
            next
        })
    })
}

/// # Safety
/// As for [`list_iter`]; `tag` is the kind of List expected.
unsafe fn list_cells<'a>(list: *mut pg_sys::List, tag: pg_sys::NodeTag) -> &'a [pg_sys::ListCell] {
    if list.is_null() {
        return &[];
    }
    // SAFETY: per the contract: a valid List whose `elements` holds
    // `length` cells.  A List of another kind would be misread.
    unsafe {
        assert_eq!((*list).type_, tag, "a List of another kind");
        std::slice::from_raw_parts((*list).elements, (*list).length as usize)
    }
}

/// A new pointer `List` of `items`, allocated in the current memory context.
pub fn make_list<T>(items: impl IntoIterator<Item = *mut T>) -> *mut pg_sys::List {
    items.into_iter().fold(std::ptr::null_mut(), |list, item| {
        // SAFETY: lappend extends NIL or a List it made, in the current
        // memory context.
        unsafe { pg_sys::lappend(list, item as *mut std::ffi::c_void) }
    })
}

/// The tag of a node (plan, plan state, expression, path, ...).
///
/// # Safety
/// `n` points to a Postgres node: every node starts with its tag.
pub unsafe fn node_tag<T>(n: *const T) -> pg_sys::NodeTag {
    // SAFETY: `n` points to a Postgres node (the caller's contract), and every node
    // starts with its NodeTag.
    unsafe { (*(n as *const pg_sys::Node)).type_ }
}
