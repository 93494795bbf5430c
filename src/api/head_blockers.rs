//! `pgkvx.head_blockers`: who holds up the head of a tail.
//!
//! A consumer at cursor `c` reading `k > c ORDER BY k LIMIT n` waits for
//! every writer still in flight whose latch lies past `c` and inside the
//! part of the key space its read reaches.  Which writers those are does
//! not depend on the consumer's LIMIT for the first of them -- the writer
//! with the lowest latched key past the cursor, "the head blocker" -- and
//! every committed row at or after that key waits with it.  The view lists,
//! per latched table (and, in the function form, from a cursor), the
//! writers in flight with latches past the cursor in the order a consumer
//! meets them (`rank` 1 is the head), and how many committed rows sit at or
//! after each one's first latched key.
//!
//! Cost is bounded: the latches are copied out of the latch table under
//! its range locks (nothing else runs while they are held), then the
//! holders are checked against the proc array and the committed rows
//! counted by one index scan per table from the head blocker's first key,
//! reading at most [`ROWS_BEHIND_LIMIT`] rows (`rows_behind_capped` says
//! when it stopped there: the counts are then lower bounds).
//!
//! Visibility follows `pgkvx.latches`: a table's blockers are shown to
//! roles that may SELECT it (or have pg_monitor); spans and row counts --
//! table data -- only to roles that may read every row of the key
//! (`pg::acl::may_see`).  A cursor is a key: passing one needs that
//! too.  The holder's backend state comes from `pg_stat_activity`, with
//! its rules (other roles' sessions need pg_read_all_stats, which
//! pg_monitor has).

use super::cursor::{parse_after, scan_keys, After};
use crate::args::Regclass;
use crate::errors;
use crate::keys::KeyDesc;
use crate::pg::acl::Visibility;
use crate::pg::index_scan::scan_fresh;
use crate::pg::{rel_name, OpenRel};
use crate::registry::{self, Latched};
use crate::shmem::{backend, table};
use pgkvx_latch::{KeyBuf, LatchInfo, RelId, Span, State};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::collections::BTreeMap;

/// Most rows the count of rows behind the blockers reads per table.
pub const ROWS_BEHIND_LIMIT: u64 = 10_000;

/// One writer in flight with latches past the cursor.
struct Blocker {
    xid: u32,
    pid: i32,
    /// Its first latch past the cursor, and where a consumer meets it.
    span: Span,
    at: KeyBuf,
    latches: i32,
    since_us: i64,
}

/// The keys past cursor `after` in the key's order (every key without a
/// cursor).  A cursor that is a prefix `(3)` stands for every key starting
/// with it; a truncated one may tie with longer keys, which then count as
/// past it (more blockers shown, never one hidden).
fn past(after: Option<&After>) -> Span {
    match after {
        None => Span::ALL,
        Some(a) if a.truncated => Span::new(&a.bytes, None),
        Some(a) => Span { start: KeyBuf::prefix_successor(&a.bytes), end: KeyBuf::INFINITE },
    }
}

/// The writers still in flight among `latches` (live ones, inside `region`),
/// one per transaction, in the order a consumer meets them.
fn blockers(latches: &[LatchInfo], region: &Span) -> Vec<Blocker> {
    let mut by_xid: BTreeMap<u32, Blocker> = BTreeMap::new();
    for l in latches.iter().filter(|l| l.state == State::Live && l.span.overlaps(region)) {
        let at = l.span.start.max(region.start);
        let b = by_xid.entry(l.xid.0).or_insert(Blocker {
            xid: l.xid.0,
            pid: l.pid,
            span: l.span,
            at,
            latches: 0,
            since_us: l.acquired_at,
        });
        b.latches += 1;
        b.since_us = b.since_us.min(l.acquired_at);
        if at < b.at {
            b.at = at;
            b.span = l.span;
        }
    }
    // A latch stays live until its holder's commit is visible and it is
    // released: a holder that ended blocks nobody.  Asked with no latch
    // lock held (the proc array takes its own).
    let mut out: Vec<Blocker> = by_xid
        .into_values()
        // SAFETY: a plain proc-array lookup for an xid this database assigned.
        .filter(|b| unsafe { pg_sys::TransactionIdIsInProgress(pg_sys::TransactionId::from(b.xid)) })
        .collect();
    out.sort_by(|a, b| a.at.cmp(&b.at).then(a.xid.cmp(&b.xid)));
    out
}

/// Committed rows (visible to a fresh snapshot) at or after each of
/// `starts` (sorted), counted in one index scan of the key index from the
/// first of them -- or from the cursor, or the start, when that key cannot
/// be written as a scan key (a truncated one) -- reading at most
/// `budget` rows in all (the partitions of a partitioned table share it).
/// Returns the counts and whether it stopped at the budget; None when a
/// table or index it would scan is locked by someone else (monitoring never
/// waits for a table lock: a TRUNCATE in flight is a head blocker).
fn rows_behind(
    relid: Oid,
    key: &KeyDesc,
    starts: &[KeyBuf],
    after: Option<&After>,
    budget: &mut u64,
) -> Option<(Vec<i64>, bool)> {
    let mut segments = vec![0i64; starts.len()];
    let Some(head) = starts.first() else { return Some((segments, false)) };
    let heap = OpenRel::try_open_nowait(relid, pg_sys::AccessShareLock)?;
    if heap.relkind() == pg_sys::RELKIND_PARTITIONED_TABLE {
        // A partitioned table's index has no storage to scan: count in each
        // leaf (whose key encodes into the parent's key space), each leaf
        // up to the limit.
        drop(heap);
        let mut capped = false;
        for m in registry::partitions::members(relid) {
            // SAFETY: a syscache probe.
            if unsafe { pg_sys::get_rel_relkind(m) as u8 } != pg_sys::RELKIND_RELATION {
                continue;
            }
            let leaf = registry::lookup_nowait(m)?;
            let Some(leaf) = leaf else { continue };
            if leaf.key.index == pg_sys::InvalidOid {
                continue;
            }
            let (counts, c) = rows_behind(m, &leaf.key, starts, after, budget)?;
            for (total, n) in segments.iter_mut().zip(counts) {
                *total += n;
            }
            capped |= c;
            if capped {
                break;
            }
        }
        return Some((segments, capped));
    }
    let index = OpenRel::try_open_nowait(key.index, pg_sys::AccessShareLock)?;
    let from_head = key.key_fields(head.as_bytes()).map(|fields| After {
        fields,
        bytes: head.as_bytes().to_vec(),
        truncated: false,
    });
    let (mut keys, _members, _) = match &from_head {
        Some(h) => scan_keys(key, &index, Some(h), true, false),
        None => scan_keys(key, &index, after, false, false),
    };
    let mut read = 0u64;
    if *budget > 0 {
        scan_fresh(&heap, &index, &mut keys, pg_sys::ScanDirection::ForwardScanDirection, |slot| {
            read += 1;
            // SAFETY: the scan's slot holds a row of the keyed table.
            let k = unsafe { key.encode_slot(slot) };
            // The blockers whose first key is at or before this row's.
            let n = starts.partition_point(|s| s.as_bytes() <= k.bytes());
            if n > 0 {
                segments[n - 1] += 1;
            }
            read < *budget
        });
    }
    let capped = read == *budget;
    *budget -= read;
    // Rows at or after blocker i: its segment and every later one.
    for i in (0..segments.len().saturating_sub(1)).rev() {
        segments[i] += segments[i + 1];
    }
    Some((segments, capped))
}

type Row = (Oid, i32, i32, i64, Option<String>, i32, Option<TimestampWithTimeZone>, Option<i64>, Option<bool>);

/// One table's blockers as rows.  Without the table's key (it is locked
/// by someone else, and monitoring never waits) spans and counts are NULL.
fn table_rows(
    relid: Oid,
    latched: Option<&Latched>,
    latches: &[LatchInfo],
    after: Option<&After>,
    keys_visible: bool,
    out: &mut Vec<Row>,
) {
    let region = past(after);
    let bs = blockers(latches, &region);
    if bs.is_empty() {
        return;
    }
    let counted = match latched {
        Some(l) if keys_visible => {
            let starts: Vec<KeyBuf> = bs.iter().map(|b| b.at).collect();
            let mut budget = ROWS_BEHIND_LIMIT;
            rows_behind(relid, &l.key, &starts, after, &mut budget)
        }
        _ => None,
    };
    let (behind, capped) = match counted {
        Some((n, c)) => (n.into_iter().map(Some).collect(), Some(c)),
        None => (vec![None; bs.len()], None),
    };
    let keys_visible = keys_visible && latched.is_some();
    for (i, (b, n)) in bs.iter().zip(behind).enumerate() {
        out.push((
            relid,
            i as i32 + 1,
            b.pid,
            pgrx::xid_to_64bit(b.xid.into()) as i64,
            latched.filter(|_| keys_visible).map(|l| l.key.format_span(&b.span)),
            b.latches,
            crate::pg::timestamptz(b.since_us),
            n,
            capped,
        ));
    }
}

/// The rows of `pgkvx.head_blockers`: for `rel` (every latched table of
/// this database the caller may see when NULL), from cursor `after` (the
/// start when NULL; only with a table).
#[pg_extern(volatile, parallel_restricted, schema = "pgkvx")]
#[allow(clippy::type_complexity)]
fn head_blocker_list(
    rel: Option<Regclass>,
    after: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(relid, Oid),
        name!(rank, i32),
        name!(holder_pid, i32),
        name!(holder_xid, i64),
        name!(span, Option<String>),
        name!(latches, i32),
        name!(latched_at, Option<TimestampWithTimeZone>),
        name!(rows_behind, Option<i64>),
        name!(rows_behind_capped, Option<bool>),
    ),
> {
    let mut rows: Vec<Row> = Vec::new();
    match rel {
        Some(rel) => {
            let relid = rel.0;
            // Privileges first, from the catalog: nothing of a table the
            // caller may not see is looked up.
            let Visibility { latches: row, keys } = registry::visibility(relid);
            if !row {
                errors::raise(
                    PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                    format!("permission denied for table {}", rel_name(relid)),
                );
            }
            // Resolved once, without waiting for a lock (a partition's
            // latches are its latched parent's); handed down.
            let (latch_id, latched) = match registry::Table::nowait(relid) {
                Ok(t) => (t.latch_id, Some(t.latched)),
                Err(unresolved) => (unresolved.latch_id, None),
            };
            if after.is_some() && latched.is_none() {
                errors::raise(
                    PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
                    format!("table {} is locked: its keys cannot be read now", rel_name(relid)),
                );
            }
            if after.is_some() && !keys {
                errors::raise_hint(
                    PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                    format!("permission denied to compare keys of table {}", rel_name(relid)),
                    "A cursor is a key: it needs SELECT on every row of the key (no row level security applying to you). Call pgkvx.head_blockers(rel) without one.",
                );
            }
            let after = latched.as_ref().and_then(|l| after.map(|t| parse_after(&l.key, t)));
            let region = past(after.as_ref());
            let mut latches = Vec::new();
            table().inspector().for_each_latch_of(latch_id, &region, &mut |l| {
                if l.state == State::Live {
                    latches.push(*l);
                }
            });
            table_rows(relid, latched.as_deref(), &latches, after.as_ref(), keys, &mut rows);
        }
        None => {
            if after.is_some() {
                errors::raise(
                    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                    "pgkvx.head_blockers(): a cursor needs a table",
                );
            }
            let db = backend::my_db();
            let mut by_rel: BTreeMap<u64, Vec<LatchInfo>> = BTreeMap::new();
            table().inspector().for_each_latch(&mut |l| {
                if l.state == State::Live && l.rel.db() == db {
                    by_rel.entry(l.rel.0).or_default().push(*l);
                }
            });
            for (rel, latches) in by_rel {
                let relid = Oid::from(RelId(rel).rel());
                let Visibility { latches: row, keys } = registry::visibility(relid);
                if row {
                    let latched = registry::lookup_nowait(relid).flatten();
                    table_rows(relid, latched.as_deref(), &latches, None, keys, &mut rows);
                }
            }
        }
    }
    TableIterator::new(rows)
}

extension_sql!(
    r#"
CREATE FUNCTION pgkvx.head_blockers(rel regclass, after text DEFAULT NULL)
RETURNS TABLE (relid regclass, rank integer, holder_pid integer, holder_xid bigint, span text,
               latches integer, state text, wait_event_type text, wait_event text,
               xact_start timestamp with time zone, latched_at timestamp with time zone,
               age interval, rows_behind bigint, rows_behind_capped boolean)
LANGUAGE sql VOLATILE PARALLEL RESTRICTED
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT b.relid::pg_catalog.regclass, b.rank, b.holder_pid, b.holder_xid, b.span, b.latches,
           a.state, a.wait_event_type, a.wait_event, a.xact_start, b.latched_at,
           pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) b.latched_at, b.rows_behind,
           b.rows_behind_capped
      FROM pgkvx.head_blocker_list(rel, after) AS b
      LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid OPERATOR(pg_catalog.=) b.holder_pid
     ORDER BY b.relid, b.rank
$$;
COMMENT ON FUNCTION pgkvx.head_blockers(regclass, text) IS 'Writers in flight a consumer of rel at cursor after waits for, in the order it meets them (rank 1 is the head), with the committed rows behind each';
CREATE VIEW pgkvx.head_blockers AS
    SELECT * FROM pgkvx.head_blockers(NULL::pg_catalog.regclass);
COMMENT ON VIEW pgkvx.head_blockers IS 'Writers in flight that hold up the head of each latched table you may SELECT (all with pg_monitor); spans and row counts only where you may read every row';
GRANT SELECT ON pgkvx.head_blockers TO PUBLIC;
"#,
    name = "head_blockers",
    requires = [head_blocker_list],
);
