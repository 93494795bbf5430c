//! Keys: how a latched table's key becomes order-preserving bytes.
//!
//! `codec` is pure Rust (encode/decode, property-tested); `desc` reads a
//! table's key index from the catalogs and refuses keys whose index order the
//! codec cannot reproduce; `datum` encodes keys from tuples and from text
//! bounds, and decodes them back for display.

pub mod codec;
pub mod datum;
pub mod desc;

pub use codec::{KeyKind, KeyValue, KeyWriter};
pub use desc::KeyDesc;
