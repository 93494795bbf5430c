//! Names for the PostgreSQL majors a build is for, so that a version
//! difference is spelled one way: ranges (`pg16_up`, `pg17_up`, `pg18_up`,
//! `pre_pg16`, `pre_pg17`, `pre_pg18`), used only under `src/pg/` (each
//! difference is one function in `src/pg/compat.rs`), and the few
//! behaviours tests elsewhere need to know of, by what they are, never by
//! major (`scripts/layers` refuses a major named outside `src/pg/`).

/// The majors this crate builds for, lowest first (its `pgNN` features).
const MAJORS: [u32; 4] = [15, 16, 17, 18];

/// Behaviours of PostgreSQL that tests outside `src/pg/` depend on, and the
/// first major that has each.
const SINCE: [(&str, u32); 2] = [
    // A partition shares its root's identity sequence (getIdentitySequence
    // takes the relation and answers with the root's).
    ("identity_shared_with_partitions", 17),
    // `ALTER TABLE ... ADD CONSTRAINT ... NOT NULL ... NOT VALID`.
    ("not_valid_not_null", 18),
];

fn main() {
    let major = MAJORS.iter().copied().find(|m| std::env::var_os(format!("CARGO_FEATURE_PG{m}")).is_some());
    for m in &MAJORS[1..] {
        println!("cargo::rustc-check-cfg=cfg(pg{m}_up)");
        println!("cargo::rustc-check-cfg=cfg(pre_pg{m})");
        if let Some(v) = major {
            if v >= *m {
                println!("cargo::rustc-cfg=pg{m}_up");
            } else {
                println!("cargo::rustc-cfg=pre_pg{m}");
            }
        }
    }
    for (name, since) in SINCE {
        println!("cargo::rustc-check-cfg=cfg({name})");
        if major.is_some_and(|v| v >= since) {
            println!("cargo::rustc-cfg={name}");
        }
    }
    println!("cargo::rerun-if-changed=build.rs");
}
