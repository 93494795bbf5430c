//! Postgres chores every part needs, each done one way, one file per
//! concern: `rel` (relations opened for a scope, tuple descriptors),
//! `names` (naming and quoting), `list` (`List`s, `Bitmapset`s, node tags),
//! `walk` (expression and query tree walkers), `datum` (varlenas, values
//! from text, times), `settings` (settings pinned around SQL of ours),
//! `xact` (whether the transaction is live), `acl` (privileges), `catalog` (catalog rows by attribute number), `memcx` (memory-context callbacks), `index_scan`,
//! `recovery` (what a hot standby's startup process waits for), `wal` (our WAL records),
//! `wait_event` (pg_stat_activity's wait event for a wait of ours),
//! `boundary` and `raw` (calling Postgres), and `compat`: every difference
//! between the majors, one function each.

pub mod acl;
pub mod boundary;
pub mod catalog;
pub mod compat;
pub mod datum;
pub mod index_scan;
pub mod list;
pub mod memcx;
pub mod names;
pub mod raw;
pub mod recovery;
pub mod rel;
pub mod settings;
pub mod wait_event;
pub mod wal;
pub mod walk;
pub mod xact;

pub use compat::{
    copy_has_default_marker, copy_path_disabled_nodes, copy_plan_disabled_nodes, executor_run, form_attrs,
    json_result_type, latest_completed_xid, local_xact_id, my_proc_number, ordering_op_properties, pathkey_descending,
    row_compare_lower_bound,
};
pub use datum::{collation_is_bytewise, input_datum, timestamptz, varlena_bytes};
pub use list::{bitmapset_members, list_ints, list_iter, list_len, list_nth, list_oids, make_list, node_tag};
pub use names::{qualified_name, quote_ident, quote_literal, regclass_text, rel_name, relation_named};
pub use rel::{tupdesc_attrs, Attr, OpenRel};
pub use settings::{with_pinned_settings, with_settings};
pub use wait_event::WaitEvent;
pub use xact::in_live_transaction;

#[cfg(feature = "pg_test")]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::pg_sys::Oid;
    use pgrx::prelude::*;

    const AWKWARD: &[&str] = &["plain", "Mixed Case", "with \"quotes\"", "select", "it's", "back\\slash", "é", ""];

    #[pg_test]
    fn quoted_names_and_literals_read_back_as_themselves() {
        for &s in AWKWARD {
            let back = Spi::get_one::<String>(&format!("SELECT {}", quote_literal(s))).unwrap();
            assert_eq!(back.as_deref(), Some(s), "literal {}", quote_literal(s));
            if s.is_empty() {
                continue; // no identifier is empty
            }
            Spi::run(&format!("CREATE TEMP TABLE quoting ({} int)", quote_ident(s))).unwrap();
            let name = Spi::get_one::<String>(
                "SELECT attname::text FROM pg_catalog.pg_attribute WHERE attrelid = 'quoting'::pg_catalog.regclass AND attnum = 1",
            )
            .unwrap();
            assert_eq!(name.as_deref(), Some(s), "identifier {}", quote_ident(s));
            Spi::run("DROP TABLE quoting").unwrap();
        }
        // Backslashes make an E'' literal, right whatever standard_conforming_strings says.
        Spi::run("SET LOCAL standard_conforming_strings = off").unwrap();
        let back = Spi::get_one::<String>(&format!("SELECT {}", quote_literal("back\\slash"))).unwrap();
        assert_eq!(back.as_deref(), Some("back\\slash"));
    }

    #[pg_test]
    fn relation_names_for_messages_and_for_sql() {
        Spi::run("CREATE SCHEMA \"Other Schema\"; CREATE TABLE \"Other Schema\".\"My Table\" (k int)").unwrap();
        let oid = Spi::get_one::<Oid>("SELECT '\"Other Schema\".\"My Table\"'::pg_catalog.regclass::pg_catalog.oid")
            .unwrap()
            .unwrap();
        assert_eq!(rel_name(oid), "My Table");
        assert_eq!(qualified_name(oid), "\"Other Schema\".\"My Table\"");
        // Not on the search_path: qualified; on it: the bare (quoted) name.
        assert_eq!(regclass_text(oid), "\"Other Schema\".\"My Table\"");
        Spi::run("SET LOCAL search_path = \"Other Schema\", public").unwrap();
        assert_eq!(regclass_text(oid), "\"My Table\"");
        let gone = Oid::from(4_000_000_000);
        assert_eq!(rel_name(gone), "4000000000");
    }

    #[pg_test]
    fn input_datum_applies_the_type_and_its_typmod() {
        assert_eq!(input_datum(pg_sys::INT4OID, -1, "-42").value() as i32, -42);
        // char(4): the input function pads to the typmod's length.
        let d = input_datum(pg_sys::BPCHAROID, 4 + pg_sys::VARHDRSZ as i32, "ab");
        // SAFETY: a non-null bpchar datum.
        assert_eq!(unsafe { varlena_bytes(d) }, b"ab  ");
    }

    #[pg_test(error = "invalid input syntax for type integer: \"forty-two\"")]
    fn input_datum_raises_the_types_own_error() {
        input_datum(pg_sys::INT4OID, -1, "forty-two");
    }

    /// Varlenas come short (1-byte header), plain, compressed inline and
    /// toasted out of line; each reads back as the bytes stored.
    #[pg_test]
    fn varlena_bytes_reads_every_storage_form() {
        let long: String = (0..20_000u32).map(|i| char::from(b'a' + (i.wrapping_mul(7919) % 26) as u8)).collect();
        let values = ["short".to_string(), "p".repeat(500), "ab".repeat(3000), long];
        Spi::run("CREATE TABLE vb (id int, v text)").unwrap();
        for (id, v) in values.iter().enumerate() {
            // Storage applies to values as they are written.
            let storage = ["MAIN", "MAIN", "MAIN", "EXTERNAL"][id];
            Spi::run(&format!("ALTER TABLE vb ALTER COLUMN v SET STORAGE {storage}")).unwrap();
            Spi::run_with_args("INSERT INTO vb VALUES ($1, $2)", &[(id as i32).into(), v.clone().into()]).unwrap();
        }
        let mut forms = Vec::new();
        Spi::connect(|c| {
            let mut rows = c.select("SELECT v FROM vb ORDER BY id", None, &[]).unwrap();
            let mut id = 0;
            while rows.next().is_some() {
                let d = rows.get_datum_by_ordinal(1).unwrap().unwrap();
                // SAFETY: a non-null text datum of the result; its first
                // byte is the varlena header.
                let (header, bytes) = unsafe { (*d.cast_mut_ptr::<u8>(), varlena_bytes(d)) };
                forms.push(match header {
                    0x01 => "external",
                    h if h & 0x01 == 0x01 => "short",
                    h if h & 0x03 == 0x02 => "compressed",
                    _ => "plain",
                });
                assert_eq!(bytes, values[id].as_bytes(), "value {id} ({})", forms[id]);
                id += 1;
            }
        });
        assert_eq!(forms, ["short", "plain", "compressed", "external"]);
    }

    #[pg_test]
    fn lists_are_walked_and_built_in_order() {
        // SAFETY: makeInteger pallocs a node.
        let nodes: Vec<*mut pg_sys::Node> = (1..=5).map(|i| unsafe { pg_sys::makeInteger(i) } as *mut _).collect();
        let list = make_list(nodes.iter().copied());
        // SAFETY: a List we just built, and NIL.
        unsafe {
            assert_eq!((*list).length, 5);
            assert_eq!(list_iter::<pg_sys::Node>(list).collect::<Vec<_>>(), nodes);
            assert_eq!(list_nth::<pg_sys::Node>(list, 4), Some(nodes[4]));
            assert_eq!(list_nth::<pg_sys::Node>(list, 5), None);
            assert_eq!(list_iter::<pg_sys::Node>(std::ptr::null_mut()).count(), 0);
            assert!(make_list::<pg_sys::Node>([]).is_null(), "an empty List is NIL");
        }
        let oids = [Oid::from(7), Oid::from(9), Oid::from(4_000_000_000)];
        // SAFETY: lappend_oid builds an OidList in the current context.
        let list = oids.iter().fold(std::ptr::null_mut(), |l, &o| unsafe { pg_sys::lappend_oid(l, o) });
        // SAFETY: the OidList just built.
        assert_eq!(unsafe { list_oids(list) }.collect::<Vec<_>>(), oids);
    }

    /// Whether this backend holds `mode` on `relid`.
    fn holds(relid: Oid, mode: &str) -> bool {
        Spi::get_one_with_args::<bool>(
            "SELECT count(*) > 0 FROM pg_catalog.pg_locks
              WHERE locktype = 'relation' AND relation = $1 AND mode = $2 AND pid = pg_catalog.pg_backend_pid()",
            &[relid.into(), mode.into()],
        )
        .unwrap()
        .unwrap()
    }

    #[pg_test]
    fn open_rel_releases_its_lock_unless_asked_to_keep_it() {
        // A catalog nothing else in this transaction touches.
        let relid = Spi::get_one::<Oid>("SELECT 'pg_catalog.pg_seclabel'::pg_catalog.regclass::pg_catalog.oid")
            .unwrap()
            .unwrap();
        assert!(!holds(relid, "RowShareLock"));
        {
            let rel = OpenRel::open(relid, pg_sys::RowShareLock);
            assert_eq!((rel.oid(), rel.name(), rel.relkind()), (relid, "pg_seclabel".to_string(), b'r'));
            assert!(rel.index().is_none());
            assert!(!rel.index_oids().is_empty());
            assert!(holds(relid, "RowShareLock"));
        }
        assert!(!holds(relid, "RowShareLock"), "dropping the handle released the lock");
        OpenRel::open(relid, pg_sys::RowShareLock).keeping_lock().close();
        assert!(holds(relid, "RowShareLock"), "kept to the end of the transaction");
        assert!(OpenRel::try_open(Oid::from(4_000_000_000), pg_sys::AccessShareLock).is_none());
        let index =
            OpenRel::open(OpenRel::open(relid, pg_sys::AccessShareLock).index_oids()[0], pg_sys::AccessShareLock);
        assert_eq!(index.index().map(|i| i.indrelid), Some(relid));
    }
}
