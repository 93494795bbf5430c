//! Arguments of the SQL functions: `regclass` as a plain oid (pgrx's
//! `PgRelation` opens and locks the relation on every call; `next_key` runs
//! once per inserted row, so it takes the oid and locks only what it must),
//! and NULL refused with a proper error where a function is not STRICT.

use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use pgrx::{FromDatum, IntoDatum};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regclass(pub Oid);

impl FromDatum for Regclass {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _typoid: Oid) -> Option<Self> {
        // SAFETY: a regclass datum is an oid.
        (!is_null).then(|| Regclass(unsafe { Oid::from_datum(datum, false) }.expect("not null")))
    }
}

impl IntoDatum for Regclass {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(pg_sys::Datum::from(self.0))
    }
    fn type_oid() -> Oid {
        pg_sys::REGCLASSOID
    }
}

impl_sql_translatable!(Regclass, "regclass");

// SAFETY: mirrors pgrx's own impls for by-value FromDatum types.
unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for Regclass {
    unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        // SAFETY: the argument is a non-null regclass.
        unsafe { arg.unbox_arg_using_from_datum() }.unwrap_or_else(|| panic!("argument {index} must not be null"))
    }

    unsafe fn unbox_nullable_arg(arg: pgrx::callconv::Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
        // SAFETY: the argument is a regclass or NULL.
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

/// The relation a required `regclass` argument names: NULL is refused with
/// 22004, an oid that names no relation with 42P01.
pub fn required(arg: Option<Regclass>, name: &str) -> Oid {
    let Some(Regclass(oid)) = arg else {
        crate::errors::raise(
            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            format!("argument \"{name}\" must not be NULL"),
        )
    };
    // SAFETY: a syscache probe.
    if unsafe { pg_sys::get_rel_name(oid) }.is_null() {
        crate::errors::raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("relation with OID {} does not exist", oid.to_u32()),
        );
    }
    oid
}

/// The value of a required argument of a function that is not STRICT (it
/// has optional ones): NULL is refused with 22004 naming the argument.
pub fn required_value<T>(arg: Option<T>, name: &str) -> T {
    arg.unwrap_or_else(|| {
        crate::errors::raise(
            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            format!("argument \"{name}\" must not be NULL"),
        )
    })
}
