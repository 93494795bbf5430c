//! What bypasses the planner, checked in ProcessUtility: COPY that leaves
//! a gapless identity key to its default, and DDL that moves a gapless
//! key's sequence backwards or ties another sequence to the key.

use super::sequence::{gapless_identity_sequence, gapless_key, gapless_table_of, identity_sequence, position};
use crate::errors;
use crate::pg::{list_iter, node_tag, qualified_name, quote_ident, quote_literal, rel_name};
use crate::registry;
use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;
use std::ffi::CStr;

// ---- ProcessUtility: what bypasses the planner ----------------------------

fn refuse_move(table: Oid, seq: Oid, what: String) -> ! {
    let name = quote_literal(&crate::pg::regclass_text(table));
    errors::raise_full(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("cannot {what} of sequence {}: it feeds the key of gapless table \"{}\"", qualified_name(seq), rel_name(table)),
        Some(
            "A key sequence moved backwards draws keys behind consumers' cursors, and consumers never see those rows."
                .to_string(),
        ),
        Some(format!(
            "Only RESTART WITH a value past the last key drawn is allowed; to reset the key space, SELECT pgkvx.disable({name}) first and pgkvx.enable({name}, gapless => true) after."
        )),
    )
}

/// Refuses a CACHE other than 1 on `seq`, the key sequence of gapless
/// table `table`: a session that cached values hands out a smaller one
/// after another committed a larger, and `next_key`, which checks the
/// setting, cannot see what a session cached while it was set.
fn refuse_cache(table: Oid, seq: Oid, cache: i64) -> ! {
    errors::raise_hint(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "cannot set CACHE {cache} of sequence {}: it feeds the key of gapless table \"{}\", whose keys need CACHE 1",
            qualified_name(seq),
            rel_name(table)
        ),
        "A sequence that caches values per session hands out a key behind one another session already committed.",
    )
}

/// Refuses a change to which sequence feeds gapless table `table`'s key.
fn refuse_key_sequence_change(table: Oid, what: &str) -> ! {
    let name = quote_literal(&crate::pg::regclass_text(table));
    errors::raise_full(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("cannot {what} of gapless table \"{}\"", rel_name(table)),
        Some("Another sequence for the key, or one no longer tied to it, can draw keys behind consumers' cursors, and consumers never see those rows.".to_string()),
        Some(format!("SELECT pgkvx.disable({name}) first and pgkvx.enable({name}, gapless => true) after.")),
    )
}

/// The OWNED BY option of a sequence statement's options, if any.
///
/// # Safety
/// `options` is a List of DefElem.
unsafe fn owned_by(options: *mut pg_sys::List) -> Option<*mut pg_sys::List> {
    // SAFETY: the caller passes a sequence statement's option list, which holds only DefElem nodes, each
    // with a defname from the grammar; OWNED BY's argument is a List of String names (gram.y).
    unsafe {
        list_iter::<pg_sys::DefElem>(options)
            .find(|&d| CStr::from_ptr((*d).defname).to_bytes() == b"owned_by")
            .map(|d| (*d).arg as *mut pg_sys::List)
    }
}

/// Refuses OWNED BY naming a gapless table's key column: a second sequence
/// tied to the key (or one swapped in for it) is one consumers' cursors do
/// not follow.
///
/// # Safety
/// `options` is a List of DefElem.
unsafe fn refuse_owned_by_gapless_key(options: *mut pg_sys::List) {
    // SAFETY: the caller passes a sequence option list (DefElem nodes); OWNED BY's List holds String
    // nodes, the last the column, so list_nth(n - 1) is a String; the prefix is copied before truncating.
    unsafe {
        let Some(names) = owned_by(options) else { return };
        let n = pg_sys::list_length(names);
        if n < 2 {
            return; // OWNED BY NONE
        }
        let col = pg_sys::list_nth(names, n - 1) as *mut pg_sys::String;
        let Ok(col) = CStr::from_ptr((*col).sval).to_str() else { return };
        let table = pg_sys::list_truncate(pg_sys::list_copy(names), n - 1);
        let Some(relid) = crate::pg::relation_named(pg_sys::makeRangeVarFromNameList(table)) else { return };
        if gapless_key(relid).is_some_and(|(_, key)| key == col) {
            refuse_key_sequence_change(relid, "tie another sequence (OWNED BY) to the key");
        }
    }
}

/// Refuses sequence options that move `seq` (the key sequence of gapless
/// table `table`) backwards, now or later: RESTART at or below the last
/// value handed out, a negative INCREMENT and CYCLE; and a CACHE other than
/// 1, which next_key also refuses where keys are drawn (a sequence set so
/// before the table became gapless).
///
/// # Safety
/// `options` is a List of DefElem.
unsafe fn check_sequence_options(table: Oid, seq: Oid, options: *mut pg_sys::List) {
    // SAFETY: the caller passes a list of sequence option DefElems with defnames from the grammar; the
    // defGet* helpers raise Postgres's own errors for malformed values, as the statement would.
    unsafe {
        let defs: Vec<*mut pg_sys::DefElem> = list_iter(options).collect();
        let name = |d: *mut pg_sys::DefElem| CStr::from_ptr((*d).defname).to_bytes();
        let mut restart = None;
        let mut new_start = None;
        for &d in &defs {
            match name(d) {
                b"restart" => restart = Some(d),
                b"start" => new_start = Some(pg_sys::defGetInt64(d)),
                b"increment" if pg_sys::defGetInt64(d) < 0 => {
                    refuse_move(table, seq, "set a negative INCREMENT".into())
                }
                b"cycle" if pg_sys::defGetBoolean(d) => refuse_move(table, seq, "set CYCLE".into()),
                b"cache" => {
                    let cache = pg_sys::defGetInt64(d);
                    if cache != 1 {
                        refuse_cache(table, seq, cache);
                    }
                }
                _ => {}
            }
        }
        let Some(restart) = restart else { return };
        // Its lock first (what the DDL takes, before its own checks): no
        // draw moves the position between this check and the change.
        pg_sys::LockRelationOid(seq, pg_sys::ShareRowExclusiveLock as pg_sys::LOCKMODE);
        let Some(pos) = position(seq) else { return };
        let to = if (*restart).arg.is_null() { new_start.unwrap_or(pos.start) } else { pg_sys::defGetInt64(restart) };
        let forward = if pos.increment >= 0 { to > pos.last } else { to < pos.last };
        if !forward {
            refuse_move(table, seq, format!("RESTART at {to}, not past the last value handed out ({})", pos.last));
        }
    }
}

/// Refuses, before Postgres runs it, a utility statement that would draw a
/// gapless key unlatched or move a gapless key sequence backwards.
///
/// # Safety
/// `pstmt` is the PlannedStmt handed to ProcessUtility.
#[pg_guard]
pub unsafe extern "C-unwind" fn check_utility(pstmt: *mut pg_sys::PlannedStmt) {
    // SAFETY: ProcessUtility's PlannedStmt (the caller's contract), read only inside a live transaction;
    // each utility statement is cast after its tag is checked, and their lists hold what parsenodes.h
    // says: AlterTableCmd nodes in `cmds`, DefElem nodes in `options` and in AT_SetIdentity's `def`.
    unsafe {
        if pstmt.is_null() || !crate::pg::in_live_transaction() {
            return;
        }
        let stmt = (*pstmt).utilityStmt;
        if stmt.is_null() {
            return;
        }
        match node_tag(stmt) {
            pg_sys::NodeTag::T_CopyStmt => check_copy(&*(stmt as *mut pg_sys::CopyStmt)),
            pg_sys::NodeTag::T_AlterSeqStmt => {
                let s = &*(stmt as *mut pg_sys::AlterSeqStmt);
                let Some(seq) = crate::pg::relation_named(s.sequence) else { return };
                if !crate::pg::acl::is_owner(seq) {
                    return; // Postgres refuses it
                }
                if let Some(table) = gapless_table_of(seq) {
                    if owned_by(s.options).is_some() {
                        // Moved off the key, the sequence could be restarted
                        // (and moved back) unchecked.
                        refuse_key_sequence_change(table, "change OWNED BY of the key sequence");
                    }
                    check_sequence_options(table, seq, s.options);
                }
                refuse_owned_by_gapless_key(s.options);
            }
            pg_sys::NodeTag::T_CreateSeqStmt => {
                let s = &*(stmt as *mut pg_sys::CreateSeqStmt);
                refuse_owned_by_gapless_key(s.options);
            }
            pg_sys::NodeTag::T_AlterTableStmt => {
                let s = &*(stmt as *mut pg_sys::AlterTableStmt);
                let Some(relid) = crate::pg::relation_named(s.relation) else { return };
                // Only identity options name the key's sequence here.
                let touches_identity = list_iter::<pg_sys::AlterTableCmd>(s.cmds).any(|c| {
                    matches!(
                        (*c).subtype,
                        pg_sys::AlterTableType::AT_SetIdentity
                            | pg_sys::AlterTableType::AT_DropIdentity
                            | pg_sys::AlterTableType::AT_AddIdentity
                    )
                });
                if !touches_identity || !crate::pg::acl::is_owner(relid) {
                    return;
                }
                let Some((attnum, key)) = gapless_key(relid) else { return };
                for cmd in list_iter::<pg_sys::AlterTableCmd>(s.cmds) {
                    let c = &*cmd;
                    if c.name.is_null() || CStr::from_ptr(c.name).to_str() != Ok(key.as_str()) {
                        continue;
                    }
                    if matches!(
                        c.subtype,
                        pg_sys::AlterTableType::AT_DropIdentity | pg_sys::AlterTableType::AT_AddIdentity
                    ) {
                        // A new identity starts a new sequence at its start
                        // value: keys behind every consumer's cursor.
                        refuse_key_sequence_change(relid, "drop or add the identity of the key");
                    }
                    if c.subtype != pg_sys::AlterTableType::AT_SetIdentity {
                        continue;
                    }
                    let seq = identity_sequence(relid, attnum);
                    if seq != pg_sys::InvalidOid {
                        check_sequence_options(relid, seq, c.def as *mut pg_sys::List);
                    }
                }
            }
            pg_sys::NodeTag::T_TruncateStmt => {
                let s = &*(stmt as *mut pg_sys::TruncateStmt);
                if !s.restart_seqs {
                    return;
                }
                for relid in truncated_relations(s) {
                    if registry::registration(relid).is_some_and(|r| r.gapless) {
                        let name = quote_literal(&crate::pg::regclass_text(relid));
                        errors::raise_full(
                            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                            format!("cannot TRUNCATE gapless table \"{}\" with RESTART IDENTITY", rel_name(relid)),
                            Some("Restarting its key sequence draws keys behind consumers' cursors, and consumers never see those rows."),
                            Some(format!(
                                "TRUNCATE it with CONTINUE IDENTITY; to reset the key space, SELECT pgkvx.disable({name}) first and pgkvx.enable({name}, gapless => true) after."
                            )),
                        );
                    }
                }
            }
            _ => {}
        }
    }
}

/// Every table a TRUNCATE restarts the sequences of, as ExecuteTruncate
/// collects them: the named ones, their inheritance children and
/// partitions (unless ONLY), and with CASCADE every table referencing one
/// of them by a foreign key, until no new one turns up.  A gapless table
/// reached any of these ways would have its key sequence restarted.
///
/// # Safety
/// `s` is a valid TruncateStmt.
unsafe fn truncated_relations(s: &pg_sys::TruncateStmt) -> Vec<Oid> {
    let mut out: Vec<Oid> = Vec::new();
    let add = |out: &mut Vec<Oid>, relid: Oid, inh: bool| {
        if !out.contains(&relid) {
            out.push(relid);
        }
        if inh {
            for m in registry::partitions::members(relid) {
                if !out.contains(&m) {
                    out.push(m);
                }
            }
        }
    };
    // SAFETY: the caller passes a valid TruncateStmt, whose `relations` holds only RangeVar nodes
    // (parsenodes.h), alive as long as the statement.
    unsafe {
        for rv in list_iter::<pg_sys::RangeVar>(s.relations) {
            if let Some(relid) = crate::pg::relation_named(rv) {
                add(&mut out, relid, (*rv).inh);
            }
        }
    }
    if s.behavior == pg_sys::DropBehavior::DROP_CASCADE {
        loop {
            let before = out.len();
            let list = out.iter().fold(std::ptr::null_mut(), |l, &o| {
                // SAFETY: appends to a fresh OidList.
                unsafe { pg_sys::lappend_oid(l, o) }
            });
            // SAFETY: a pg_constraint scan returning a fresh OidList.
            let referencing: Vec<Oid> = unsafe { crate::pg::list_oids(pg_sys::heap_truncate_find_FKs(list)).collect() };
            for relid in referencing {
                add(&mut out, relid, true);
            }
            if out.len() == before {
                break;
            }
        }
    }
    out
}

/// `COPY FROM` evaluates column defaults itself, without the planner: an
/// identity key left to its default would be drawn unlatched.  Refused up
/// front (the row trigger would refuse the first row anyway, with a less
/// helpful message); so is COPY with a DEFAULT marker (16 on), which a
/// field of the listed key may hold.  COPY with the key column given is hand-drawn keys,
/// which the row trigger refuses unless this transaction drew them with
/// `pgkvx.next_key`.
///
/// # Safety
/// `s` is a valid CopyStmt.
unsafe fn check_copy(s: &pg_sys::CopyStmt) {
    if !s.is_from {
        return;
    }
    // SAFETY: the caller passes a valid CopyStmt; its `relation` is a RangeVar of the parsed statement
    // (or null), which relation_named accepts.
    let Some(relid) = (unsafe { crate::pg::relation_named(s.relation) }) else { return };
    if gapless_identity_sequence(relid).is_none() {
        return;
    }
    let Some((_, key)) = gapless_key(relid) else { return };
    // SAFETY: attlist is a List of String nodes.
    let listed = s.attlist.is_null()
        || unsafe {
            list_iter::<pg_sys::String>(s.attlist).any(|n| CStr::from_ptr((*n).sval).to_str() == Ok(key.as_str()))
        };
    // SAFETY: options is the statement's DefElem list.
    if listed && !unsafe { crate::pg::copy_has_default_marker(s.options) } {
        return;
    }
    let name = crate::pg::regclass_text(relid);
    errors::raise_full(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!("COPY into gapless table \"{}\" cannot draw its identity key {}", rel_name(relid), quote_ident(&key)),
        Some("COPY draws identity values without the planner, so the keys it draws would not be latched."),
        Some(format!(
            "COPY into a staging table and INSERT INTO {name} (...) SELECT ... FROM it, or list {} in COPY with keys drawn by pgkvx.next_key({}) in the same transaction.",
            quote_ident(&key),
            quote_literal(&name)
        )),
    )
}
