//! Hash fields on the overlay: each field's sub-entry holds its insertion
//! sequence beside its value ([`layout::hash_value`]), so whole-hash reads
//! of small hashes answer in insertion order as Redis's listpack does.
//! Every hash read and write goes through these three (the hash commands,
//! and `read_whole`/`write_whole` for RENAME, COPY, DUMP, RESTORE, SORT).

use bytes::Bytes;
use keyway_storage::{StorageError, ValueKind};

use super::Db;
use crate::cmd::CmdError;
use crate::coll::HASH_INSERTION_ORDER_MAX_FIELDS;
use crate::coll::layout::{self, Meta};

fn corrupt(field: &[u8]) -> CmdError {
    CmdError::Storage(StorageError::Corrupt {
        what: "hash field",
        detail: format!(
            "no insertion sequence before the value of a {}-byte field",
            field.len()
        ),
    })
}

impl<'a> Db<'a> {
    /// One field's value (`None`: no such field).
    pub(crate) fn hash_get(
        &mut self,
        key: &[u8],
        meta: &Meta,
        field: &[u8],
    ) -> Result<Option<Bytes>, CmdError> {
        debug_assert_eq!(meta.kind, ValueKind::Hash);
        match self.sub_get(key, meta, field)? {
            Some(data) => Ok(Some(
                layout::hash_value_parts(&data)
                    .ok_or_else(|| corrupt(field))?
                    .1,
            )),
            None => Ok(None),
        }
    }

    /// Sets one field; `true` if it is new (then counted in `meta.size` and
    /// given the next insertion sequence; an overwrite keeps its place).
    pub(crate) fn hash_put(
        &mut self,
        key: &[u8],
        meta: &mut Meta,
        field: &[u8],
        value: &[u8],
    ) -> Result<bool, CmdError> {
        debug_assert_eq!(meta.kind, ValueKind::Hash);
        let old = match self.sub_get(key, meta, field)? {
            Some(data) => Some(
                layout::hash_value_parts(&data)
                    .ok_or_else(|| corrupt(field))?
                    .0,
            ),
            None => None,
        };
        let seq = old.unwrap_or_else(|| {
            let seq = meta.next_seq;
            meta.next_seq += 1;
            meta.size += 1;
            seq
        });
        self.sub_put(key, meta, field, layout::hash_value(seq, value))?;
        Ok(old.is_none())
    }

    /// Every field and value: in insertion order for a hash of up to
    /// [`HASH_INSERTION_ORDER_MAX_FIELDS`] fields, else in field order.
    pub(crate) fn hash_all(
        &mut self,
        key: &[u8],
        meta: &Meta,
    ) -> Result<Vec<(Bytes, Bytes)>, CmdError> {
        debug_assert_eq!(meta.kind, ValueKind::Hash);
        let mut all = Vec::with_capacity(meta.size.min(HASH_INSERTION_ORDER_MAX_FIELDS) as usize);
        for (field, data) in self.sub_all(key, meta)? {
            let (seq, value) = layout::hash_value_parts(&data).ok_or_else(|| corrupt(&field))?;
            all.push((seq, field, value));
        }
        debug_assert_eq!(all.len() as u64, meta.size, "hash meta size out of step");
        if meta.size <= HASH_INSERTION_ORDER_MAX_FIELDS {
            all.sort_unstable_by_key(|(seq, _, _)| *seq);
        }
        Ok(all.into_iter().map(|(_, f, v)| (f, v)).collect())
    }
}
