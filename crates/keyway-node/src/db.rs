//! The per-command storage overlay that data commands run against.
//!
//! A [`Db`] lives for exactly one command. Reads go to the engine once per key
//! and are cached; writes are buffered and become visible to later reads of
//! the same command (read-your-own-writes) without touching the engine. After
//! the command, [`Db::into_mutations`] hands back at most one [`Mutation`] per
//! touched key, in first-touch order, for the caller to apply in **one**
//! atomic [`Engine::apply`] batch.
//!
//! Methods take *user* keys (what the client sent); the overlay turns them
//! into storage keys with [`Keyspace::storage_key`].
//!
//! Expiry is lazy, as in Redis: a value whose `expire_at_ms <= now_ms` (see
//! [`Value::is_expired_at`]) reads as absent and queues a `Delete`, the way
//! Redis propagates a `DEL` when it expires a key on access. So even a
//! read-only command may return mutations; the caller applies them like any
//! other.
//!
//! The overlay never checks value types or sizes: commands do, using
//! [`Db::limits`].

mod collections;
mod collections_rev;
mod hash_fields;

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use keyway_map::Keyspace;
use keyway_storage::{Engine, Mutation, StorageError, Value, ValueKind};

/// Redis's default `proto-max-bulk-len`: 512 MiB.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 512 * 1024 * 1024;

/// Limits the data commands enforce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DbLimits {
    /// Largest string a command may create (SETRANGE, APPEND), like Redis's
    /// `proto-max-bulk-len`; beyond it the command fails with
    /// `ERR string exceeds maximum allowed size (proto-max-bulk-len)`.
    pub max_value_bytes: usize,
    /// `stream-node-max-entries`: entries per emulated stream node, which
    /// approximate trimming removes whole (0 = unlimited).
    pub stream_node_max_entries: u64,
}

/// Redis's default `stream-node-max-entries`.
pub const DEFAULT_STREAM_NODE_MAX_ENTRIES: u64 = 100;

impl Default for DbLimits {
    fn default() -> Self {
        DbLimits {
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            stream_node_max_entries: DEFAULT_STREAM_NODE_MAX_ENTRIES,
        }
    }
}

/// What will be written for a key when the command ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    /// Only read: nothing to write.
    Clean,
    /// `Put` of the current value.
    Put,
    /// `Delete` (explicit or lazy expiry).
    Delete,
    /// `SetExpiry` to the current value's expiry (data unchanged).
    Expiry,
}

/// One key's state in the overlay.
#[derive(Clone, Debug)]
struct Slot {
    /// The value this command sees (`None` = absent).
    value: Option<Value>,
    pending: Pending,
}

/// Most commands touch one to a few keys: up to this many are found by a
/// scan (no hashing: the SipHash of a `HashMap` per command was about 2 %
/// of a node's samples under `GET -P 16`); past it, an index is built.
const SLOTS_SCANNED_MAX: usize = 8;

/// The overlay's keys in first-touch order, with an index once there are
/// more than [`SLOTS_SCANNED_MAX`] (SipHash: keys are the client's).
#[derive(Default)]
struct Slots {
    entries: Vec<(Bytes, Slot)>,
    index: Option<HashMap<Bytes, usize>>,
}

impl Slots {
    fn find(&self, key: &[u8]) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(key).copied(),
            None => self.entries.iter().position(|(k, _)| k == key),
        }
    }

    fn at(&mut self, i: usize) -> &mut Slot {
        &mut self.entries[i].1
    }

    /// Adds `key` (not present: the caller looked) and returns its slot.
    fn push(&mut self, key: Bytes, slot: Slot) -> &mut Slot {
        debug_assert!(self.find(&key).is_none(), "a key is pushed once");
        let i = self.entries.len();
        match &mut self.index {
            Some(index) => {
                index.insert(key.clone(), i);
            }
            None if i == SLOTS_SCANNED_MAX => {
                let mut index: HashMap<Bytes, usize> = self
                    .entries
                    .iter()
                    .enumerate()
                    .map(|(i, (k, _))| (k.clone(), i))
                    .collect();
                index.insert(key.clone(), i);
                self.index = Some(index);
            }
            None => {}
        }
        self.entries.push((key, slot));
        &mut self.entries[i].1
    }
}

/// A per-command overlay over an [`Engine`]; see the module docs.
pub struct Db<'a> {
    engine: &'a dyn Engine,
    keyspace: &'a Keyspace,
    now_ms: u64,
    limits: &'a DbLimits,
    /// The touched keys, in first-touch order (for a deterministic
    /// mutation order).
    slots: Slots,
    /// Pending sub-entry writes of collections (`None` = delete), by storage key.
    subs: BTreeMap<Bytes, Option<Bytes>>,
    /// Where HSCAN/SSCAN/ZSCAN park positions a cursor cannot carry (the
    /// node's SCAN cursor table); `None` = cursors carry what they can.
    cursors: Option<&'a std::sync::Mutex<crate::scan::ScanCursors>>,
}

impl<'a> Db<'a> {
    /// An empty overlay for one command executed at `now_ms` (unix milliseconds).
    pub fn new(
        engine: &'a dyn Engine,
        keyspace: &'a Keyspace,
        now_ms: u64,
        limits: &'a DbLimits,
    ) -> Self {
        Db {
            engine,
            keyspace,
            now_ms,
            limits,
            slots: Slots::default(),
            subs: BTreeMap::new(),
            cursors: None,
        }
    }

    /// Lets collection scans keep positions in the node's cursor table.
    pub fn with_cursors(mut self, cursors: &'a std::sync::Mutex<crate::scan::ScanCursors>) -> Self {
        self.cursors = Some(cursors);
        self
    }

    /// The cursor table, if any ([`Db::with_cursors`]).
    pub(crate) fn cursors(&self) -> Option<&'a std::sync::Mutex<crate::scan::ScanCursors>> {
        self.cursors
    }

    /// The command's clock: unix milliseconds, fixed for the whole command
    /// (Redis's `commandTimeSnapshot`).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The limits the commands enforce.
    pub fn limits(&self) -> &DbLimits {
        self.limits
    }

    /// The engine under the overlay (reads that bypass it: the change log).
    pub fn engine(&self) -> &'a dyn Engine {
        self.engine
    }

    /// The keyspace the user keys belong to.
    pub fn keyspace(&self) -> &Keyspace {
        self.keyspace
    }

    /// The slot of `key`, loaded from the engine on first touch. An expired
    /// value (in the engine or written earlier by this command) becomes absent
    /// with a pending `Delete`.
    fn slot(&mut self, key: &[u8]) -> Result<&mut Slot, StorageError> {
        let storage_key = self.keyspace.storage_key(key);
        let engine = self.engine;
        let now = self.now_ms;
        let slot = match self.slots.find(&storage_key) {
            Some(i) => self.slots.at(i),
            None => {
                let value = engine.get(&storage_key)?;
                self.slots.push(
                    storage_key,
                    Slot {
                        value,
                        pending: Pending::Clean,
                    },
                )
            }
        };
        if slot.value.as_ref().is_some_and(|v| v.is_expired_at(now)) {
            slot.value = None;
            slot.pending = Pending::Delete;
        }
        Ok(slot)
    }

    /// The live value of `key`, or `None` if it is absent or expired.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Value>, StorageError> {
        Ok(self.slot(key)?.value.clone())
    }

    /// Whether `key` holds a live value.
    pub fn exists(&mut self, key: &[u8]) -> Result<bool, StorageError> {
        Ok(self.slot(key)?.value.is_some())
    }

    /// Creates or replaces `key` with a string value and the given absolute
    /// expiry (`None` = persistent). Never reads the engine.
    ///
    /// The overlay's copy carries the version of the value it replaces when
    /// known (`0` otherwise); the engine assigns the real one on apply.
    pub fn set(&mut self, key: &[u8], data: Bytes, expire_at_ms: Option<u64>) {
        let storage_key = self.keyspace.storage_key(key);
        let slot = match self.slots.find(&storage_key) {
            Some(i) => self.slots.at(i),
            None => self.slots.push(
                storage_key,
                Slot {
                    value: None,
                    pending: Pending::Clean,
                },
            ),
        };
        let version = slot.value.as_ref().map_or(0, |v| v.version);
        slot.value = Some(Value {
            kind: ValueKind::String,
            expire_at_ms,
            version,
            data,
        });
        slot.pending = Pending::Put;
    }

    /// Deletes `key`; `true` if it held a live value.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool, StorageError> {
        let slot = self.slot(key)?;
        let existed = slot.value.take().is_some();
        if existed {
            slot.pending = Pending::Delete;
        }
        Ok(existed)
    }

    /// Sets (`Some`) or removes (`None`) the expiry of `key`, keeping its
    /// data; `true` if the key holds a live value. An expiry at or before
    /// `now_ms` makes the key read as absent from then on.
    pub fn set_expiry(
        &mut self,
        key: &[u8],
        expire_at_ms: Option<u64>,
    ) -> Result<bool, StorageError> {
        let slot = self.slot(key)?;
        let Some(value) = slot.value.as_mut() else {
            return Ok(false);
        };
        value.expire_at_ms = expire_at_ms;
        slot.pending = match slot.pending {
            Pending::Put => Pending::Put,
            Pending::Clean | Pending::Expiry | Pending::Delete => Pending::Expiry,
        };
        Ok(true)
    }

    /// Whether the command has queued any write (including lazy-expiry deletes).
    pub fn has_mutations(&self) -> bool {
        !self.subs.is_empty()
            || self
                .slots
                .entries
                .iter()
                .any(|(_, s)| s.pending != Pending::Clean)
    }

    /// The command's writes, at most one per key, in first-touch order: apply
    /// them in one [`Engine::apply`] batch.
    pub fn into_mutations(self) -> Vec<Mutation> {
        let mut out = Vec::new();
        for (key, slot) in self.slots.entries {
            let mutation = match (slot.pending, slot.value) {
                (Pending::Clean, _) => continue,
                (Pending::Delete, _) | (Pending::Put | Pending::Expiry, None) => {
                    Mutation::Delete { key }
                }
                (Pending::Put, Some(v)) => Mutation::Put {
                    key,
                    kind: v.kind,
                    expire_at_ms: v.expire_at_ms,
                    data: v.data,
                },
                (Pending::Expiry, Some(v)) => Mutation::SetExpiry {
                    key,
                    expire_at_ms: v.expire_at_ms,
                },
            };
            out.push(mutation);
        }
        // Sub-entries after the top-level entries, in key order.
        for (key, data) in self.subs {
            out.push(match data {
                Some(data) => Mutation::Put {
                    key,
                    kind: ValueKind::Sub,
                    expire_at_ms: None,
                    data,
                },
                None => Mutation::Delete { key },
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{DEFAULT_KEYSPACE, Routing};
    use keyway_storage::MemEngine;

    fn keyspace() -> Keyspace {
        Keyspace {
            id: DEFAULT_KEYSPACE,
            name: "default".into(),
            routing: Routing::Hash,
            replication_factor: 1,
            min_in_sync: 1,
        }
    }

    fn put(
        engine: &MemEngine,
        ks: &Keyspace,
        key: &[u8],
        data: &'static [u8],
        expire_at_ms: Option<u64>,
    ) {
        engine
            .apply(&[Mutation::Put {
                key: ks.storage_key(key),
                kind: ValueKind::String,
                expire_at_ms,
                data: Bytes::from_static(data),
            }])
            .unwrap();
    }

    #[test]
    fn many_keys_keep_first_touch_order_and_one_write_each_past_the_scanned_limit() {
        let engine = MemEngine::new();
        let ks = keyspace();
        let limits = DbLimits::default();
        let mut db = Db::new(&engine, &ks, 1_000, &limits);
        let n = 3 * SLOTS_SCANNED_MAX;
        for round in 0..2 {
            for i in (0..n).rev() {
                let data = Bytes::from(format!("{round}-{i}"));
                db.set(format!("k{i}").as_bytes(), data, None);
            }
        }
        for i in 0..n {
            let got = db.get(format!("k{i}").as_bytes()).unwrap().unwrap();
            assert_eq!(got.data, Bytes::from(format!("1-{i}")));
        }
        let keys: Vec<Bytes> = db
            .into_mutations()
            .into_iter()
            .map(|m| match m {
                Mutation::Put { key, .. } => key,
                other => panic!("{other:?}"),
            })
            .collect();
        let want: Vec<Bytes> = (0..n)
            .rev()
            .map(|i| ks.storage_key(format!("k{i}").as_bytes()))
            .collect();
        assert_eq!(keys, want);
    }

    #[test]
    fn reads_see_own_writes_and_nothing_reaches_the_engine_before_apply() {
        let engine = MemEngine::new();
        let ks = keyspace();
        let limits = DbLimits::default();
        let mut db = Db::new(&engine, &ks, 1_000, &limits);
        assert_eq!(db.get(b"k").unwrap(), None);
        db.set(b"k", Bytes::from_static(b"v"), None);
        assert_eq!(db.get(b"k").unwrap().unwrap().data, &b"v"[..]);
        assert!(db.exists(b"k").unwrap());
        assert_eq!(engine.get(&ks.storage_key(b"k")).unwrap(), None);
        assert!(db.delete(b"k").unwrap());
        assert!(!db.delete(b"k").unwrap());
        db.set(b"k", Bytes::from_static(b"w"), Some(5_000));
        let muts = db.into_mutations();
        assert_eq!(
            muts,
            vec![Mutation::Put {
                key: ks.storage_key(b"k"),
                kind: ValueKind::String,
                expire_at_ms: Some(5_000),
                data: Bytes::from_static(b"w")
            }]
        );
        engine.apply(&muts).unwrap();
        let mut db = Db::new(&engine, &ks, 1_000, &limits);
        assert_eq!(db.get(b"k").unwrap().unwrap().expire_at_ms, Some(5_000));
        assert!(db.into_mutations().is_empty());
    }

    #[test]
    fn lazy_expiry_reads_absent_and_queues_a_delete() {
        let engine = MemEngine::new();
        let ks = keyspace();
        let limits = DbLimits::default();
        put(&engine, &ks, b"k", b"v", Some(2_000));
        let mut db = Db::new(&engine, &ks, 1_999, &limits);
        assert!(db.get(b"k").unwrap().is_some());
        assert!(!db.has_mutations());
        let mut db = Db::new(&engine, &ks, 2_000, &limits);
        assert_eq!(db.get(b"k").unwrap(), None);
        assert!(!db.delete(b"k").unwrap());
        assert_eq!(
            db.into_mutations(),
            vec![Mutation::Delete {
                key: ks.storage_key(b"k")
            }]
        );
    }

    #[test]
    fn expiry_only_changes_become_set_expiry_and_merge_into_puts() {
        let engine = MemEngine::new();
        let ks = keyspace();
        let limits = DbLimits::default();
        put(&engine, &ks, b"a", b"1", None);
        let mut db = Db::new(&engine, &ks, 10, &limits);
        assert!(db.set_expiry(b"a", Some(100)).unwrap());
        assert!(!db.set_expiry(b"missing", Some(100)).unwrap());
        db.set(b"b", Bytes::from_static(b"2"), None);
        assert!(db.set_expiry(b"b", Some(200)).unwrap());
        assert_eq!(
            db.into_mutations(),
            vec![
                Mutation::SetExpiry {
                    key: ks.storage_key(b"a"),
                    expire_at_ms: Some(100)
                },
                Mutation::Put {
                    key: ks.storage_key(b"b"),
                    kind: ValueKind::String,
                    expire_at_ms: Some(200),
                    data: Bytes::from_static(b"2")
                },
            ]
        );
    }

    #[test]
    fn an_expiry_in_the_past_deletes_on_next_read() {
        let engine = MemEngine::new();
        let ks = keyspace();
        let limits = DbLimits::default();
        put(&engine, &ks, b"a", b"1", None);
        let mut db = Db::new(&engine, &ks, 10, &limits);
        assert!(db.set_expiry(b"a", Some(10)).unwrap());
        assert!(!db.exists(b"a").unwrap());
        assert_eq!(
            db.into_mutations(),
            vec![Mutation::Delete {
                key: ks.storage_key(b"a")
            }]
        );
    }

    #[test]
    fn default_limit_is_redis_proto_max_bulk_len() {
        assert_eq!(DbLimits::default().max_value_bytes, 512 * 1024 * 1024);
    }
}
