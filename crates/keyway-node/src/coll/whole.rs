//! A key's whole value, whatever its type: what RENAME, COPY, DUMP/RESTORE,
//! SORT and the `*STORE` commands read and write in one piece.

use bytes::Bytes;
use keyway_storage::ValueKind;

use super::stream::StreamMeta;

/// A key's contents.
#[derive(Clone, Debug, PartialEq)]
pub enum Contents {
    String(Bytes),
    /// `(field, value)` in field byte order.
    Hash(Vec<(Bytes, Bytes)>),
    /// Elements head to tail.
    List(Vec<Bytes>),
    /// Members in byte order.
    Set(Vec<Bytes>),
    /// `(member, score)` in (score, member) order.
    ZSet(Vec<(Bytes, f64)>),
    /// A stream's counters and its raw sub-entries `(suffix, data)`
    /// (entries, groups, pending entries, consumers: see
    /// [`crate::coll::stream`]), in suffix order.
    Stream(StreamMeta, Vec<(Bytes, Bytes)>),
}

impl Contents {
    /// The value kind of these contents.
    pub fn kind(&self) -> ValueKind {
        match self {
            Contents::String(_) => ValueKind::String,
            Contents::Hash(_) => ValueKind::Hash,
            Contents::List(_) => ValueKind::List,
            Contents::Set(_) => ValueKind::Set,
            Contents::ZSet(_) => ValueKind::ZSet,
            Contents::Stream(..) => ValueKind::Stream,
        }
    }
}

/// A key's contents and its TTL.
#[derive(Clone, Debug, PartialEq)]
pub struct Whole {
    pub contents: Contents,
    /// Absolute expiry, unix ms; `None` = persistent.
    pub expire_at_ms: Option<u64>,
}
