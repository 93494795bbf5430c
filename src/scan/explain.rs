//! EXPLAIN for `PgkvxLimitScan`: the mode, the table, and the spans -- only
//! to a role that may see the keys -- and, under ANALYZE, what the read
//! protocol did.

use super::plan_walk::param_ids;
use super::report::ReadPath;
use super::runtime::with_runtime;
use crate::keys::KeyDesc;
use crate::pg::{list_iter, rel_name};
use pgkvx_latch::Span;
use pgrx::pg_sys::{self, List};
use pgrx::prelude::*;
use std::ffi::{CStr, CString};

/// Properties of one node's EXPLAIN output, in every format EXPLAIN
/// writes (text, JSON, YAML, XML): the one way this node adds a line.
struct Explainer(*mut pg_sys::ExplainState);

impl Explainer {
    fn text(&self, label: &CStr, value: &str) {
        let v = CString::new(value.replace('\0', "")).expect("no NUL");
        // SAFETY: the caller's live ExplainState; strings outlive the call.
        unsafe { pg_sys::ExplainPropertyText(label.as_ptr(), v.as_ptr(), self.0) };
    }

    fn int(&self, label: &CStr, value: i64) {
        // SAFETY: as above.
        unsafe { pg_sys::ExplainPropertyInteger(label.as_ptr(), std::ptr::null(), value, self.0) };
    }

    fn millis(&self, label: &CStr, ms: f64) {
        // SAFETY: as above.
        unsafe { pg_sys::ExplainPropertyFloat(label.as_ptr(), c"ms".as_ptr(), ms, 3, self.0) };
    }

    /// EXPLAIN ANALYZE: the statement ran.
    fn analyze(&self) -> bool {
        // SAFETY: as above.
        unsafe { (*self.0).analyze }
    }

    /// EXPLAIN (TIMING): times are shown.
    fn timing(&self) -> bool {
        // SAFETY: as above.
        unsafe { (*self.0).timing }
    }
}

/// Intervals shown before the rest are only counted.
const SHOWN_SPANS: usize = 8;

fn spans_text(key: &KeyDesc, spans: &[Span]) -> String {
    if spans.is_empty() {
        return "none".into();
    }
    let mut text = spans.iter().take(SHOWN_SPANS).map(|s| key.format_span(s)).collect::<Vec<_>>().join(", ");
    if spans.len() > SHOWN_SPANS {
        text.push_str(&format!(", … ({} intervals)", spans.len()));
    }
    text
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn explain(
    node: *mut pg_sys::CustomScanState,
    _ancestors: *mut List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: see pg/boundary.rs.
    unsafe { crate::pg::boundary::rethrow_pending(|| explain_node(node, es)) }
}

/// # Safety
/// The arguments of ExplainCustomScan.
unsafe fn explain_node(node: *mut pg_sys::CustomScanState, es: *mut pg_sys::ExplainState) {
    // SAFETY (whole body): our node and the caller's ExplainState.
    unsafe {
        with_runtime(node, |rt| {
            let ex = Explainer(es);
            let analyze = ex.analyze();
            let st = rt.statement.clone();
            let mode = match (&st, analyze) {
                (Some(st), true) => st.borrow().mode.describe().to_string(),
                // What the statement would read in: one that cannot run twice
                // (row locks, side effects) never reads optimistically.
                _ => crate::read::admit::planned_mode(rt.plan.restartable).to_string(),
            };
            ex.text(c"Mode", &mode);
            let Some(key) = rt.latched.as_ref().map(|l| l.key.clone()) else {
                ex.text(c"Table", &format!("{} (no longer latched)", rel_name(rt.plan.relid)));
                return;
            };
            match rt.latched.as_ref().map(|l| l.root).filter(|&r| r != rt.plan.relid) {
                // The latch identity, and the partition this scan reads.
                Some(root) => ex.text(c"Table", &format!("{} (partition {})", rel_name(root), key.relname)),
                None => ex.text(c"Table", &key.relname),
            }
            // Plain EXPLAIN runs nothing of the user's: bounds that call
            // functions other than immutable ones, or that could raise
            // (`100 / $1`), or read an init plan's result, are known only
            // at run time; so are `$n` bounds explained without values
            // (EXPLAIN (GENERIC_PLAN), PostgreSQL 16 on).
            let cs = (*node).ss.ps.plan as *mut pg_sys::CustomScan;
            let no_param_values = (*(*node).ss.ps.state).es_param_list_info.is_null();
            let bounds_run_functions = || {
                list_iter::<pg_sys::Node>((*cs).custom_exprs).any(|e| {
                    pg_sys::contain_mutable_functions(e)
                        || !super::guards::cannot_raise(e as *mut pg_sys::Expr)
                        || !param_ids(e, pg_sys::ParamKind::PARAM_EXEC).is_empty()
                        || (no_param_values && !param_ids(e, pg_sys::ParamKind::PARAM_EXTERN).is_empty())
                })
            };
            // Spans are keys, and keys are table data: only for a role that
            // may read every row of the key (a view can hide the key column).
            let attnums: Vec<i16> = key.cols.iter().map(|c| c.attnum).collect();
            let keys_visible = crate::pg::acl::may_see(rt.plan.relid, &attnums).keys;
            // Read through its parent, a partition's privileges are the parent's.
            let keys_visible = keys_visible
                || rt.latched.as_ref().filter(|l| l.root != rt.plan.relid).is_some_and(|l| {
                    let root_attnums: Vec<i16> = crate::registry::lookup(l.root)
                        .map(|r| r.key.cols.iter().map(|c| c.attnum).collect())
                        .unwrap_or_default();
                    crate::pg::acl::may_see(l.root, &root_attnums).keys
                });
            const HIDDEN: &str = "(keys hidden: requires SELECT on every row of the key)";
            if !keys_visible {
                ex.text(c"Declared Span", HIDDEN);
            } else if analyze || !bounds_run_functions() {
                let declared = rt.declared(node);
                ex.text(c"Declared Span", &spans_text(&key, &declared.spans));
            } else {
                ex.text(c"Declared Span", "computed when the statement runs");
            }
            let Some(st) = st.filter(|_| analyze) else { return };
            let st = st.borrow();
            if st.mode == ReadPath::Off {
                return;
            }
            let touched = rt.touched(node);
            ex.text(c"Touched Span", &if keys_visible { spans_text(&key, &touched) } else { HIDDEN.to_string() });
            let r = &st.report;
            let outcome = if r.conflicts == 0 { "clean" } else { "conflicts resolved" };
            ex.text(c"Validation", outcome);
            ex.int(c"Validations", i64::from(r.validations));
            ex.int(c"Conflicts", i64::from(r.conflicts));
            ex.int(c"Retries", i64::from(r.retries));
            if r.cuts > 0 {
                ex.int(c"Stopped Before Later Writers", i64::from(r.cuts));
            }
            if r.probes > 0 {
                // The span fenced is the one the probe found (`Fenced Span`).
                ex.int(c"Probes", i64::from(r.probes));
                let fenced: Vec<Span> =
                    r.checked.iter().flatten().filter(|(rel, _)| *rel == rt.rel).map(|(_, s)| *s).collect();
                ex.text(c"Fenced Span", &if keys_visible { spans_text(&key, &fenced) } else { HIDDEN.to_string() });
            }
            if r.fresh_snapshots > 0 {
                ex.int(c"Fresh Snapshots", i64::from(r.fresh_snapshots));
            }
            ex.int(c"Waits", i64::from(r.waits));
            if ex.timing() {
                ex.millis(c"Wait Time", st.wait_us as f64 / 1000.0);
            }
            let mine: Vec<_> = st.waited.iter().filter(|w| w.rel == rt.rel).collect();
            if !mine.is_empty() {
                let named: Vec<String> = mine.iter().map(|w| waited_for(&key, w, keys_visible)).collect();
                ex.text(c"Waited For", &named.join("; "));
            }
        })
    }
}

/// One writer a statement waited for, as EXPLAIN ANALYZE names it: its xid
/// (as `pg_locks` and `pg_stat_activity.backend_xid` show it), its pid and
/// its first latch in the span the read checked -- looked up now: the
/// holder's released latch is kept while this statement's snapshot lives,
/// unless it was coalesced under pressure (then the checked span is shown).
/// Spans only when the caller may see keys (`keys_visible`).
fn waited_for(key: &KeyDesc, w: &crate::read::run::Waited, keys_visible: bool) -> String {
    let mut first: Option<(i32, Span)> = None;
    crate::shmem::table().reader().for_each_latch_of(w.rel, &w.checked, &mut |l| {
        if l.xid == w.xid && first.is_none_or(|(_, s)| l.span.start < s.start) {
            first = Some((l.pid, l.span));
        }
    });
    let at = |span: &Span| if keys_visible { key.format_span(span) } else { "(keys hidden)".to_string() };
    match first {
        Some((pid, span)) => format!("pid {pid} xid {} at {}", w.xid.0, at(&span)),
        None => format!("xid {} in {}", w.xid.0, at(&w.checked)),
    }
}
