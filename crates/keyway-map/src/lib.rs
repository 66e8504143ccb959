//! The partition map: which node owns which range of routing keys, at which epoch.
//!
//! This crate owns the vocabulary every other Keyway crate routes with:
//! keyspaces and their routing functions, routing keys, partition records with
//! per-partition epochs, the versioned [`PartitionMap`] with O(log P) lookup,
//! the [`MapChange`]s that move it from one version to the next, and its
//! compact binary encoding.
//!
//! It must never do I/O, never talk to a metadata store, and never decide who
//! *should* own a partition: it only describes who does. Every map it hands
//! out has passed [`PartitionMap::validate`] (each keyspace covered exactly
//! once, no gap, no overlap), and every map it accepts is validated again
//! where it is applied.
//!
//! # Layout
//! - `ids.rs`: [`NodeId`], [`PartitionId`], [`KeyspaceId`], [`Epoch`], [`MapVersion`].
//! - `slot.rs`: Redis Cluster hash slots (CRC16-XMODEM, `{hash tags}`).
//! - `keyspace.rs`: [`Keyspace`], [`Routing`] and routing-key construction.
//! - `partition.rs`: [`PartitionRecord`], [`PartitionState`], [`NodeInfo`].
//! - `map.rs`: [`PartitionMap`]: lookup, validation, bootstrap.
//! - `change.rs`: [`MapChange`] and [`OwnershipCondition`], applying changes.
//! - `codec.rs`: the compact binary encoding of maps, changes and deltas
//!   ([`MapSince`], the answer to `KW.MAP SINCE`).
//! - `kwmoved.rs`: [`KwMoved`], the `-KWMOVED` rejection's text, written
//!   and parsed in one place.
//! - `wire.rs`: varint wire primitives shared with other compact encodings.
//! - `error.rs`: [`MapError`].

mod change;
mod codec;
mod error;
mod ids;
mod keyspace;
mod kwmoved;
mod map;
mod partition;
mod slot;
pub mod wire;

pub use change::{MapChange, OwnershipCondition};
pub use codec::{
    MapSince, decode_changes, decode_map, decode_since, encode_changes, encode_delta, encode_map,
    encode_since,
};
pub use error::MapError;
pub use ids::{Epoch, KeyspaceId, MapVersion, NodeId, PartitionId};
pub use keyspace::{
    DEFAULT_KEYSPACE, Keyspace, MAX_REPLICATION_FACTOR, MIN_REPLICATION_FACTOR, Routing,
    check_replication, keyspace_prefix, split_storage_key,
};
pub use kwmoved::{KwMoved, KwReads};
pub use map::{PartitionMap, place_replicas};
pub use partition::{
    DEFAULT_NODE_WEIGHT, NodeInfo, NodeState, PartitionRecord, PartitionState, from_hex, to_hex,
};
pub use slot::{SLOT_COUNT, key_hash_slot, slot_bound};
