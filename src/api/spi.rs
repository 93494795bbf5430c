//! Read-only catalog queries.  pgrx's `Spi::get_one*` helpers run in
//! read-write mode, which assigns the transaction an xid — a reader that
//! merely planned a query on a latched table would become a writer.  These
//! run read-only.

use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::{FromDatum, IntoDatum};

/// The first column of the first row, if any.
pub fn one<T: FromDatum + IntoDatum>(query: &str, args: &[DatumWithOid]) -> Option<T> {
    Spi::connect(|c| c.select(query, Some(1), args).ok()?.first().get_one::<T>().ok().flatten())
}

/// The first two columns of the first row; `None` when there is no row.
pub fn two<A: FromDatum + IntoDatum, B: FromDatum + IntoDatum>(
    query: &str,
    args: &[DatumWithOid],
) -> Option<(Option<A>, Option<B>)> {
    Spi::connect(|c| {
        let t = c.select(query, Some(1), args).ok()?;
        if t.is_empty() {
            return None;
        }
        t.first().get_two::<A, B>().ok()
    })
}
