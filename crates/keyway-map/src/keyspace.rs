//! Keyspaces and routing keys.
//!
//! A *routing key* is what partitions are ranges over. Inside a keyspace it is
//! `be16(slot) ++ key` for a `hash` keyspace and the key itself for a `range`
//! keyspace (the *local* routing key). On disk it is prefixed by the keyspace
//! id, `be32(keyspace) ++ local`, so one storage engine holds every keyspace
//! in partition order.

use crate::{KeyspaceId, key_hash_slot};
use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// The default keyspace: id 0, `hash` routing, what Redis commands address.
pub const DEFAULT_KEYSPACE: KeyspaceId = KeyspaceId(0);

/// How a keyspace maps keys to routing keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Routing {
    /// Redis-compatible: routing key `be16(CRC16(hash tag or key) & 16383) ++ key`.
    Hash,
    /// Byte-ordered keys: the routing key is the key, so range scans stay ordered.
    Range,
}

/// A named key namespace with one routing function.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keyspace {
    pub id: KeyspaceId,
    pub name: String,
    pub routing: Routing,
    /// Copies per partition (the owner and `replication_factor - 1`
    /// replicas), [`MIN_REPLICATION_FACTOR`]..=[`MAX_REPLICATION_FACTOR`].
    #[serde(default = "one")]
    pub replication_factor: u8,
    /// In-sync copies (owner included) a write needs: below it writes are
    /// refused with `-NOREPLICAS` and reads still served. 1..=replication_factor.
    #[serde(default = "one")]
    pub min_in_sync: u8,
}

fn one() -> u8 {
    1
}

/// Fewest copies per partition.
pub const MIN_REPLICATION_FACTOR: u8 = 1;
/// Most copies per partition.
pub const MAX_REPLICATION_FACTOR: u8 = 5;

/// Why a replication setting is invalid (checked where it is set).
pub fn check_replication(replication_factor: u8, min_in_sync: u8) -> Result<(), String> {
    if !(MIN_REPLICATION_FACTOR..=MAX_REPLICATION_FACTOR).contains(&replication_factor) {
        return Err(format!(
            "replication factor must be {MIN_REPLICATION_FACTOR}..={MAX_REPLICATION_FACTOR}, got {replication_factor}"
        ));
    }
    if min_in_sync == 0 || min_in_sync > replication_factor {
        return Err(format!(
            "min_in_sync must be 1..={replication_factor} (the replication factor), got {min_in_sync}"
        ));
    }
    Ok(())
}

impl Keyspace {
    /// A keyspace with one copy per partition.
    pub fn new(id: KeyspaceId, name: impl Into<String>, routing: Routing) -> Self {
        Keyspace {
            id,
            name: name.into(),
            routing,
            replication_factor: 1,
            min_in_sync: 1,
        }
    }

    /// The keyspace-local routing key of `key`.
    pub fn local_routing_key(&self, key: &[u8]) -> Bytes {
        match self.routing {
            Routing::Hash => {
                let mut out = BytesMut::with_capacity(2 + key.len());
                out.put_u16(key_hash_slot(key));
                out.put_slice(key);
                out.freeze()
            }
            Routing::Range => Bytes::copy_from_slice(key),
        }
    }

    /// The storage key of `key`: `be32(keyspace id) ++ local routing key`.
    pub fn storage_key(&self, key: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(6 + key.len());
        out.put_u32(self.id.0);
        if self.routing == Routing::Hash {
            out.put_u16(key_hash_slot(key));
        }
        out.put_slice(key);
        out.freeze()
    }

    /// The lowest local routing key of the keyspace (where its first partition starts).
    pub fn min_bound(&self) -> Bytes {
        match self.routing {
            Routing::Hash => Bytes::from_static(&[0, 0]),
            Routing::Range => Bytes::new(),
        }
    }
}

/// Storage-key prefix of a keyspace.
pub fn keyspace_prefix(id: KeyspaceId) -> [u8; 4] {
    id.0.to_be_bytes()
}

/// Splits a storage key into keyspace id and user key (dropping the slot of a
/// hash keyspace). Returns `None` for a key too short to be a storage key.
pub fn split_storage_key(storage_key: &[u8], routing: Routing) -> Option<(KeyspaceId, &[u8])> {
    let (ks, rest) = storage_key.split_first_chunk::<4>()?;
    let ks = KeyspaceId(u32::from_be_bytes(*ks));
    match routing {
        Routing::Hash => rest.get(2..).map(|key| (ks, key)),
        Routing::Range => Some((ks, rest)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_key_round_trips() {
        let ks = Keyspace::new(KeyspaceId(7), "t", Routing::Hash);
        let sk = ks.storage_key(b"foo");
        assert_eq!(&sk[..4], &[0, 0, 0, 7]);
        assert_eq!(u16::from_be_bytes([sk[4], sk[5]]), 12182);
        assert_eq!(
            split_storage_key(&sk, Routing::Hash),
            Some((KeyspaceId(7), &b"foo"[..]))
        );
        assert_eq!(&sk[4..], &ks.local_routing_key(b"foo")[..]);
    }
}
