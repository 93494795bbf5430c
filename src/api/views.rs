//! `pgkvx.latches`, `pgkvx.ranges` and `pgkvx.stats()`.
//!
//! Latches and ranges of a table are shown to roles that may SELECT the
//! table or have pg_monitor.  Their keys (spans, range bounds) are table
//! data: they are shown only to roles that may read every row — SELECT on
//! the table and no row level security applying to them (its owner,
//! BYPASSRLS, or a table without policies); otherwise they are NULL.

use crate::args::Regclass;
use crate::errors;
use crate::pg::acl::Visibility;
use crate::pg::rel_name;
use crate::registry;
use crate::shmem::wakeups;
use crate::shmem::{backend, table};
use pgkvx_latch::{LatchInfo, QueueState, RangeInfo, RelId, Span, Stat, State};
use pgrx::pg_sys::Oid;
use pgrx::prelude::*;
use std::collections::HashMap;

/// Formats spans with each table's key, caching one lookup per table; a
/// table locked by someone else (DDL) shows its keys encoded.
struct SpanFormatter(HashMap<Oid, Option<std::rc::Rc<registry::Latched>>>);

impl SpanFormatter {
    fn new() -> Self {
        SpanFormatter(HashMap::new())
    }
    fn span(&mut self, relid: Oid, span: &Span) -> String {
        let l = self.0.entry(relid).or_insert_with(|| registry::lookup_nowait(relid).flatten());
        match l {
            Some(l) => l.key.format_span(span),
            None => format!("{span:?}"),
        }
    }
    fn key(&mut self, relid: Oid, k: &pgkvx_latch::KeyBuf, open: &str) -> String {
        if k.is_infinite() || k.as_bytes().is_empty() {
            return open.to_string();
        }
        let l = self.0.entry(relid).or_insert_with(|| registry::lookup_nowait(relid).flatten());
        match l {
            Some(l) => l.key.format_key(k.as_bytes()),
            None => format!("{k:?}"),
        }
    }
}

/// The table of `rel` if its latches are shown here, and whether its keys
/// are.
fn visible_here(rel: RelId, cache: &mut HashMap<Oid, Visibility>) -> Option<(Oid, bool)> {
    let relid = Oid::from(rel.rel());
    if rel.db() != backend::my_db() {
        return None;
    }
    let Visibility { latches: row, keys } = *cache.entry(relid).or_insert_with(|| registry::visibility(relid));
    row.then_some((relid, keys))
}

/// Latches of tables in this database the caller may see; tombstones
/// (released latches kept for readers) only when asked for.
#[pg_extern(volatile, parallel_safe, schema = "pgkvx")]
#[allow(clippy::type_complexity)]
fn latch_list(
    include_tombstones: default!(bool, false),
) -> TableIterator<
    'static,
    (
        name!(relid, Oid),
        name!(span, Option<String>),
        name!(state, String),
        name!(holder_pid, i32),
        name!(holder_xid, i64),
        name!(acquired_at, pgrx::datum::TimestampWithTimeZone),
        name!(range_id, i32),
    ),
> {
    let mut raw: Vec<LatchInfo> = Vec::new();
    table().inspector().for_each_latch(&mut |l| {
        if include_tombstones || l.state == State::Live {
            raw.push(*l);
        }
    });
    let mut fmt = SpanFormatter::new();
    let mut seen = HashMap::new();
    let rows: Vec<_> = raw
        .into_iter()
        .filter_map(|l| {
            let (relid, keys) = visible_here(l.rel, &mut seen)?;
            let state = if l.state == State::Live { "live" } else { "tombstone" };
            let at = crate::pg::timestamptz(l.acquired_at)?;
            Some((
                relid,
                keys.then(|| fmt.span(relid, &l.span)),
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

/// A range's maintenance-queue state (the latch core's), for people.
fn queue_state_name(state: QueueState) -> &'static str {
    match state {
        QueueState::Idle => "idle",
        QueueState::Queued => "queued",
        QueueState::Processing => "processing",
        QueueState::Requeued => "processing, requeued",
    }
}

#[pg_extern(volatile, parallel_safe, schema = "pgkvx")]
#[allow(clippy::type_complexity)]
fn range_list() -> TableIterator<
    'static,
    (
        name!(relid, Oid),
        name!(range_id, i32),
        name!(lower, Option<String>),
        name!(upper, Option<String>),
        name!(live, i32),
        name!(tombstones, i32),
        name!(coalesced, i32),
        name!(acquires, i64),
        name!(lock_waits, i64),
        name!(queue_state, String),
    ),
> {
    let mut raw: Vec<RangeInfo> = Vec::new();
    table().inspector().for_each_range(&mut |r| raw.push(*r));
    let mut fmt = SpanFormatter::new();
    let mut seen = HashMap::new();
    let rows: Vec<_> = raw
        .into_iter()
        .filter_map(|r| {
            let (relid, keys) = visible_here(r.rel, &mut seen)?;
            Some((
                relid,
                r.id as i32,
                keys.then(|| fmt.key(relid, &r.lo, "-∞")),
                keys.then(|| fmt.key(relid, &r.hi, "+∞")),
                r.live as i32,
                r.tombstones as i32,
                r.coalesced as i32,
                r.acquires as i64,
                r.lock_waits as i64,
                queue_state_name(r.queue).to_string(),
            ))
        })
        .collect();
    TableIterator::new(rows)
}

/// Counters since the server started, summed over all backends, plus how
/// full the latch table is.
#[pg_extern(volatile, parallel_safe, schema = "pgkvx")]
fn stats() -> TableIterator<'static, (name!(stat, String), name!(value, i64))> {
    let t = table().inspector();
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
    rows.extend(stat_rows());
    TableIterator::new(rows)
}

/// `pgkvx.stats(rel)`: one table's waits since the server started -- reads
/// that waited for its writers and `wait_for` calls on it -- as the same
/// (stat, value) rows `pgkvx.stats()` gives for the whole cluster.  Needs
/// what `pgkvx.waiters` needs: SELECT on the table, or pg_monitor.
#[pg_extern(volatile, parallel_safe, schema = "pgkvx", name = "stats")]
fn table_stats(rel: Option<Regclass>) -> TableIterator<'static, (name!(stat, String), name!(value, i64))> {
    let relid = crate::args::required(rel, "rel");
    if !registry::visibility(relid).latches {
        errors::raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied for table {}", rel_name(relid)),
        );
    }
    // Waits are counted under the latch identity: a partition's parent.
    let (s, waiting) = wakeups::table_stats(registry::latch_id_unlocked(relid));
    TableIterator::new(wait_rows(&s, waiting))
}

/// The rows of `pgkvx.stats()` (all tables) and `pgkvx.stats(rel)`.
pub fn wait_rows(t: &wakeups::WaitStats, waiting: u32) -> Vec<(String, i64)> {
    vec![
        ("read_waits".to_string(), t.read_waits as i64),
        ("read_wait_micros".to_string(), t.read_wait_us as i64),
        ("wait_for_calls".to_string(), t.calls as i64),
        ("wait_for_immediate".to_string(), t.immediate as i64),
        ("wait_for_woken".to_string(), t.woken as i64),
        ("wait_for_timeouts".to_string(), t.timeouts as i64),
        ("wait_for_micros".to_string(), t.wait_us as i64),
        ("wait_for_broadcasts".to_string(), t.broadcasts as i64),
        ("wait_for_spurious_wakeups".to_string(), t.spurious as i64),
        ("wait_for_waiting".to_string(), i64::from(waiting)),
    ]
}

/// Global rows for `pgkvx.stats()`.
fn stat_rows() -> Vec<(String, i64)> {
    let (t, waiting) = wakeups::totals();
    wait_rows(&t, waiting)
}

extension_sql!(
    r#"
CREATE VIEW pgkvx.latches AS
    SELECT relid::regclass AS relid, span, state, holder_pid, holder_xid, acquired_at,
           pg_catalog.clock_timestamp() - acquired_at AS age, range_id
      FROM pgkvx.latch_list(false);
COMMENT ON VIEW pgkvx.latches IS 'Live write latches on tables you may SELECT (all with pg_monitor); spans only where you may read every row';
CREATE VIEW pgkvx.ranges AS
    SELECT relid::regclass AS relid, range_id, lower, upper, live, tombstones, coalesced,
           acquires, lock_waits, queue_state
      FROM pgkvx.range_list();
COMMENT ON VIEW pgkvx.ranges IS 'Latch ranges of tables you may SELECT (all with pg_monitor); bounds only where you may read every row';
GRANT SELECT ON pgkvx.latches, pgkvx.ranges TO PUBLIC;
"#,
    name = "views",
    requires = [latch_list, range_list],
);
