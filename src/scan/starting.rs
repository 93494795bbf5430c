//! The statement whose executor is starting, as its guard nodes see it.
//!
//! `Guards::of` decodes every guard's plan data and looks its table up
//! once, before the executor starts.  While it starts, each guard node
//! that begins takes its guard from here rather than decoding and looking
//! up again, and is noted, so that the statement knows its nodes without
//! walking the plan-state tree: both run for every guarded statement.
//!
//! A node that begins with no statement starting (EXPLAIN without ANALYZE,
//! a second executor for the same plan) decodes its own plan data.

use super::guards::Guards;
use super::plan_data::GuardPlan;
use crate::registry::Latched;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::rc::Rc;

struct Starting {
    /// The statement starting: only nodes of its own executor claim.
    /// Another executor can begin nodes of the same plan while it starts
    /// (a function its partition pruning calls runs the same cached plan;
    /// an optimistic read's second executor), and those nodes go when
    /// that executor ends.
    qd: *mut pg_sys::QueryDesc,
    /// The statement's guards.  They outlive the scope: the statement owns
    /// them and does not touch them until its executor has started.
    guards: *const Guards,
    nodes: Vec<*mut pg_sys::CustomScanState>,
}

thread_local! {
    /// The statement starting now, if one is.  A statement started while
    /// another starts (a hook running SQL) has a scope of its own, and the
    /// outer one is put back when it ends.
    static STARTING: RefCell<Option<Starting>> = const { RefCell::new(None) };
}

/// The time one statement's executor starts; ended by [`Scope::nodes`], or
/// by dropping it when the start fails.
pub struct Scope {
    outer: Option<Starting>,
}

impl Scope {
    /// Opens the scope of statement `qd` with `guards`, which must stay
    /// where they are until the scope ends.
    pub fn enter(qd: *mut pg_sys::QueryDesc, guards: &Guards) -> Scope {
        let mine = Starting { qd, guards, nodes: Vec::with_capacity(guards.0.len()) };
        Scope { outer: STARTING.with(|s| s.replace(Some(mine))) }
    }

    /// Ends the scope: the guard nodes that began in it.
    pub fn nodes(mut self) -> Vec<*mut pg_sys::CustomScanState> {
        let outer = self.outer.take();
        let mine = STARTING.with(|s| s.replace(outer));
        std::mem::forget(self);
        mine.map(|m| m.nodes).unwrap_or_default()
    }
}

impl Drop for Scope {
    /// A start that failed: nothing of it may be seen by a later one,
    /// whose plan nodes can lie where this one's did.
    fn drop(&mut self) {
        let outer = self.outer.take();
        STARTING.with(|s| drop(s.replace(outer)));
    }
}

/// The decoded guard of plan node `cs`, for its node `node` beginning now
/// in executor `estate`; None unless that is the executor of the statement
/// starting and its guards hold `cs`.
pub fn claim(
    cs: *mut pg_sys::CustomScan,
    node: *mut pg_sys::CustomScanState,
    estate: *mut pg_sys::EState,
) -> Option<(Rc<GuardPlan>, Option<Rc<Latched>>)> {
    STARTING.with(|s| {
        let mut s = s.try_borrow_mut().ok()?;
        let st = s.as_mut()?;
        // SAFETY: the statement is starting: its QueryDesc is live, and
        // standard_ExecutorStart sets its estate before any node begins.
        if unsafe { (*st.qd).estate } != estate {
            return None;
        }
        // SAFETY: the guards outlive the scope (Scope::enter).
        let guards = unsafe { &*st.guards };
        let g = guards.0.iter().find(|g| std::ptr::eq(g.cs, cs))?;
        st.nodes.push(node);
        Some((g.plan.clone(), g.latched.clone()))
    })
}
