//! Gapless identity keys.
//!
//! An identity column has no DEFAULT to replace with `pgkvx.next_key`: the
//! rewriter puts a `NextValueExpr` for the column's sequence wherever an
//! INSERT (multi-row VALUES, INSERT ... SELECT, ON CONFLICT ... SET id =
//! DEFAULT), an UPDATE's `SET id = DEFAULT` or a MERGE action leaves the
//! key to it, and the executor draws from the sequence with nothing
//! latched.  So every statement that reaches the planner with such an
//! expression for a gapless table's key sequence gets, in its place, the
//! call the serial default would make: `pgkvx.next_key(table)`, which
//! draws and latches in one step.  The planner sees every statement
//! (prepared ones, PL/pgSQL and SQL functions, rule actions, inserts
//! through views), and `enable`/`disable` invalidate the table's relcache
//! entry, which drops every cached plan that writes it — also plans made
//! before `enable`, whose unlatched draws the row trigger would refuse.
//!
//! What does not pass the planner is stopped in ProcessUtility: `COPY
//! FROM` that leaves the key to the identity default (COPY evaluates it
//! itself, unlatched), and DDL that moves a gapless table's key sequence
//! backwards (`ALTER SEQUENCE`/`ALTER TABLE ... ALTER COLUMN` with
//! RESTART, a negative INCREMENT, CYCLE, and
//! `TRUNCATE ... RESTART IDENTITY`), for serial and identity keys alike.
//! `setval` is a plain function call anyone with UPDATE on the sequence
//! can make from anywhere, so it is not hooked: `pgkvx.check()` reports a
//! key sequence that is behind the highest key in its table.

pub mod ddl;
pub mod rewrite;
pub mod sequence;

/// Installs the sequence caches' relcache callback; called from `_PG_init`.
pub fn init() {
    sequence::init();
}
