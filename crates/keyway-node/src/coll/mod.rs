//! Collections (hashes, lists, sets, sorted sets, streams) on a key → value engine
//! that moves data by key range.
//!
//! # Layout
//! A key has one **top-level entry** at its usual storage key
//! `be32(keyspace) ++ be16(slot) ++ key`, whose [`ValueKind`] is its type.
//! For a collection that entry is the **meta** ([`layout::Meta`]):
//! `version u64 | size u64`, then `| head u64 | tail u64` for a list and
//! `| next_seq u64` for a hash, with the key's TTL as the
//! entry's expiry, so EXPIRE/TTL/PERSIST/DEL and lazy and active expiry treat
//! every type alike.
//!
//! Each field, member or element is one **sub-entry** of kind
//! [`ValueKind::Sub`] at
//! `be32(ks) ++ be16(slot) ++ "{kw}" ++ be16(key_len) ++ key ++ be64(version) ++ suffix`.
//! It is stored under its key's slot, so it sorts inside the slot's range and
//! every mechanism that moves a range (migration copy and catch-up, replica
//! copies, digests, splits) moves a big collection in chunks like any other
//! data. Its user part starts with the hash tag `{kw}` (`{KW}` in the slot
//! `kw` hashes to), so it hashes to another slot than the one it is stored
//! under: a user key `k` is only ever stored under `slot(k)`, hence no user
//! key can collide with a sub-entry, and no top-level key decodes as one.
//!
//! Suffixes: hash `field → leb128(seq) value` (`seq`: the field's insertion
//! sequence, so hashes of up to [`HASH_INSERTION_ORDER_MAX_FIELDS`] fields
//! answer in insertion order, as Redis's listpack encoding does); set `member → ∅`; list `be64(index) →
//! element` (meta `head..tail`, starting at 2^63, so pushes and pops at both
//! ends are O(1)); sorted set `0x01 member → score` plus the score index
//! `0x02 sortable(score) member → ∅` (score order, then member order);
//! stream: entries, consumer groups, pending entries and consumers under four
//! tag bytes (see [`stream`]).
//!
//! # Versions and reclamation
//! A new collection gets a fresh version ([`layout::fresh_version`]). Delete,
//! overwrite or expiry replaces or removes only the meta, O(1) at the command;
//! commands only ever read under the current version's prefix, so the old
//! incarnation's sub-entries are invisible **garbage**. The active expiry walk
//! ([`crate::active_expire`]) deletes garbage it passes with logged deletes on
//! the owner, so replicas and migration targets follow.
//!
//! Collections exist only in the Redis keyspace (hash routing); `KW.*`
//! commands see strings only.

pub mod layout;

/// Whole-hash reads (HGETALL, HKEYS, HVALS, DUMP, ...) of hashes with up to
/// this many fields answer in insertion order, as Redis 7.0 does for a hash
/// in its listpack encoding (whose default `hash-max-listpack-entries` is
/// 512); bigger hashes answer in field order (Redis: its hash table's).
pub const HASH_INSERTION_ORDER_MAX_FIELDS: u64 = 512;

pub mod stream;
pub mod whole;

pub use layout::{Meta, SubKey};
pub use whole::{Contents, Whole};

#[allow(unused_imports)]
use keyway_storage::ValueKind;
