//! `pgkvx.key_bytes(rel, key)`: the order-preserving encoding of a key, as
//! latches and spans use it.  For debugging spans, and for the tests that
//! check encoded order against `ORDER BY`.

use super::regclass::Regclass;
use crate::keys::KeyDesc;
use crate::registry;
use pgrx::prelude::*;

#[pg_extern(stable, parallel_safe, schema = "pgkvx")]
fn key_bytes(rel: Regclass, key: &str) -> Vec<u8> {
    let desc = match registry::lookup(rel.0) {
        Some(l) => l.key.clone(),
        None => KeyDesc::resolve(rel.0, None),
    };
    desc.parse_bound(key, "key").0.bytes().to_vec()
}
