//! `pgkvx.latches`, `pgkvx.ranges` and `pgkvx.stats()`.
//!
//! Latches and ranges of a table are shown only to roles that may SELECT the
//! table (or have pg_monitor): key values are table data.

use super::registry;
use crate::latch::{LatchInfo, RangeInfo, RelId, Span, Stat, State};
use crate::shmem::{backend, table};
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::collections::HashMap;

fn may_see(relid: Oid) -> bool {
    // SAFETY: catalog ACL checks.
    unsafe {
        let me = pg_sys::GetUserId();
        pg_sys::has_privs_of_role(me, Oid::from(pg_sys::ROLE_PG_MONITOR))
            || pg_sys::pg_class_aclcheck(relid, me, pg_sys::ACL_SELECT as pg_sys::AclMode)
                == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// Formats spans with each table's key, caching one lookup per table.
struct SpanFormatter(HashMap<Oid, Option<std::rc::Rc<registry::Latched>>>);

impl SpanFormatter {
    fn new() -> Self {
        SpanFormatter(HashMap::new())
    }
    fn span(&mut self, relid: Oid, span: &Span) -> String {
        let l = self.0.entry(relid).or_insert_with(|| registry::lookup(relid));
        match l {
            Some(l) => l.key.format_span(span),
            None => format!("{span:?}"),
        }
    }
    fn key(&mut self, relid: Oid, k: &crate::latch::KeyBuf, open: &str) -> String {
        if k.is_infinite() || k.as_bytes().is_empty() {
            return open.to_string();
        }
        let l = self.0.entry(relid).or_insert_with(|| registry::lookup(relid));
        match l {
            Some(l) => l.key.format_key(k.as_bytes()),
            None => format!("{k:?}"),
        }
    }
}

fn visible_here(rel: RelId) -> Option<Oid> {
    let relid = Oid::from(rel.rel());
    (rel.db() == backend::my_db() && may_see(relid)).then_some(relid)
}

/// Latches of tables in this database the caller may see; tombstones
/// (released latches kept for readers) only when asked for.
#[pg_extern(volatile, parallel_safe)]
#[allow(clippy::type_complexity)]
fn latch_list(
    include_tombstones: default!(bool, false),
) -> TableIterator<
    'static,
    (
        name!(relid, Oid),
        name!(span, String),
        name!(state, String),
        name!(holder_pid, i32),
        name!(holder_xid, i64),
        name!(acquired_at, pgrx::datum::TimestampWithTimeZone),
        name!(range_id, i32),
    ),
> {
    let mut raw: Vec<LatchInfo> = Vec::new();
    table().for_each_latch(&mut |l| {
        if include_tombstones || l.state == State::Live {
            raw.push(*l);
        }
    });
    let mut fmt = SpanFormatter::new();
    let rows: Vec<_> = raw
        .into_iter()
        .filter_map(|l| {
            let relid = visible_here(l.rel)?;
            let state = if l.state == State::Live { "live" } else { "tombstone" };
            // SAFETY: TimestampTz is a plain i64.
            let at =
                unsafe { pgrx::datum::TimestampWithTimeZone::from_datum(pg_sys::Datum::from(l.acquired_at), false) }?;
            Some((
                relid,
                fmt.span(relid, &l.span),
                state.to_string(),
                l.pid,
                pgrx::xid_to_64bit(l.xid.0.into()) as i64,
                at,
                l.range as i32,
            ))
        })
        .collect();
    TableIterator::new(rows)
}

#[pg_extern(volatile, parallel_safe)]
#[allow(clippy::type_complexity)]
fn range_list() -> TableIterator<
    'static,
    (
        name!(relid, Oid),
        name!(range_id, i32),
        name!(lower, String),
        name!(upper, String),
        name!(live, i32),
        name!(tombstones, i32),
        name!(coalesced, i32),
        name!(acquires, i64),
        name!(lock_waits, i64),
        name!(queue_state, String),
    ),
> {
    let mut raw: Vec<RangeInfo> = Vec::new();
    table().for_each_range(&mut |r| raw.push(*r));
    let mut fmt = SpanFormatter::new();
    let rows: Vec<_> = raw
        .into_iter()
        .filter_map(|r| {
            let relid = visible_here(r.rel)?;
            Some((
                relid,
                r.id as i32,
                fmt.key(relid, &r.lo, "-∞"),
                fmt.key(relid, &r.hi, "+∞"),
                r.live as i32,
                r.tombstones as i32,
                r.coalesced as i32,
                r.acquires as i64,
                r.lock_waits as i64,
                crate::queue::state_name(r.queue).to_string(),
            ))
        })
        .collect();
    TableIterator::new(rows)
}

/// Counters since the server started, summed over all backends, plus how
/// full the latch table is.
#[pg_extern(volatile, parallel_safe)]
fn stats() -> TableIterator<'static, (name!(stat, String), name!(value, i64))> {
    let t = table();
    let counts = t.stats();
    let u = t.usage();
    let mut rows: Vec<(String, i64)> =
        Stat::ALL.iter().map(|s| (s.name().to_string(), counts[*s as usize] as i64)).collect();
    rows.extend([
        ("latch_entries_used".to_string(), i64::from(u.entries_used)),
        ("latch_entries_max".to_string(), i64::from(u.entries_max)),
        ("ranges_used".to_string(), i64::from(u.ranges_used)),
        ("ranges_max".to_string(), i64::from(u.ranges_max)),
        ("tables_used".to_string(), i64::from(u.tables_used)),
        ("tables_max".to_string(), i64::from(u.tables_max)),
    ]);
    TableIterator::new(rows)
}

extension_sql!(
    r#"
CREATE VIEW pgkvx.latches AS
    SELECT relid::regclass AS relid, span, state, holder_pid, holder_xid, acquired_at,
           pg_catalog.clock_timestamp() - acquired_at AS age, range_id
      FROM pgkvx.latch_list(false);
COMMENT ON VIEW pgkvx.latches IS 'Live write latches on tables you may SELECT (all with pg_monitor)';
CREATE VIEW pgkvx.ranges AS
    SELECT relid::regclass AS relid, range_id, lower, upper, live, tombstones, coalesced,
           acquires, lock_waits, queue_state
      FROM pgkvx.range_list();
COMMENT ON VIEW pgkvx.ranges IS 'Latch ranges of tables you may SELECT (all with pg_monitor)';
GRANT SELECT ON pgkvx.latches, pgkvx.ranges TO PUBLIC;
"#,
    name = "views",
    requires = [latch_list, range_list],
);
