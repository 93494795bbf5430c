//! `pgkvx.key_bytes(rel, key)`: the order-preserving encoding of a key, as
//! latches and spans use it.  For debugging spans, and for the tests that
//! check encoded order against `ORDER BY`.

use crate::args::Regclass;
use crate::keys::KeyDesc;
use crate::registry;
use pgrx::prelude::*;

#[pg_extern(stable, parallel_safe, schema = "pgkvx")]
fn key_bytes(rel: Regclass, key: &str) -> Vec<u8> {
    let relid = crate::args::required(Some(rel), "rel");
    let desc = match registry::lookup(relid) {
        Some(l) => l.key.clone(),
        None => KeyDesc::resolve(relid, None),
    };
    desc.parse_bound(key, "key").0.bytes().to_vec()
}
