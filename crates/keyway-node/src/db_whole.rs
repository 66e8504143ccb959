//! INTERIM (replaced by main's `db_coll` once the collection core lands):
//! whole-key read/write over strings, with the API of DESIGN14.md.

use bytes::Bytes;
use keyway_storage::{StorageError, ValueKind};

use crate::db::Db;

/// A key's whole value and TTL.
#[derive(Clone, Debug, PartialEq)]
pub struct Whole {
    pub contents: Contents,
    pub expire_at_ms: Option<u64>,
}

/// A key's whole value.
#[derive(Clone, Debug, PartialEq)]
pub enum Contents {
    String(Bytes),
    Hash(Vec<(Bytes, Bytes)>),
    List(Vec<Bytes>),
    Set(Vec<Bytes>),
    ZSet(Vec<(Bytes, f64)>),
}

impl Db<'_> {
    /// The whole live value of `key`.
    pub fn read_whole(&mut self, key: &[u8]) -> Result<Option<Whole>, StorageError> {
        Ok(self.get(key)?.map(|v| match v.kind {
            ValueKind::String => Whole {
                contents: Contents::String(v.data),
                expire_at_ms: v.expire_at_ms,
            },
        }))
    }

    /// Replaces whatever `key` held with `whole`.
    pub fn write_whole(&mut self, key: &[u8], whole: Whole) -> Result<(), StorageError> {
        match whole.contents {
            Contents::String(s) => self.set(key, s, whole.expire_at_ms),
            _ => {
                return Err(StorageError::Corrupt {
                    what: "whole value",
                    detail: "collections are not stored before the collection core".into(),
                });
            }
        }
        Ok(())
    }
}
