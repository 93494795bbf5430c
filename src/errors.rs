//! One way to raise a Postgres error from Rust: SQLSTATE, message, optional
//! detail and hint.  Keeping it in one place keeps messages consistent.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

/// Raises an ERROR; the current transaction aborts.
pub fn raise(code: PgSqlErrorCode, message: impl Into<String>) -> ! {
    raise_full(code, message, None::<String>, None::<String>)
}

pub fn raise_hint(code: PgSqlErrorCode, message: impl Into<String>, hint: impl Into<String>) -> ! {
    raise_full(code, message, None::<String>, Some(hint))
}

pub fn raise_full(
    code: PgSqlErrorCode,
    message: impl Into<String>,
    detail: Option<impl Into<String>>,
    hint: Option<impl Into<String>>,
) -> ! {
    let mut report = ErrorReport::new(code, message.into(), "pgkvx");
    if let Some(d) = detail {
        report = report.set_detail(d);
    }
    if let Some(h) = hint {
        report = report.set_hint(h);
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("ERROR returned")
}

/// Emits a WARNING with a hint; execution goes on.
pub fn warn_hint(code: PgSqlErrorCode, message: impl Into<String>, hint: impl Into<String>) {
    ErrorReport::new(code, message.into(), "pgkvx").set_hint(hint).report(PgLogLevel::WARNING);
}
