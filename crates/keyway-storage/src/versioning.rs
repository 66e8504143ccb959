//! Versioning rules shared by every engine: how local writes ([`crate::Engine::apply`])
//! and records from another node's change log ([`crate::Engine::apply_foreign`])
//! change a key's state, and what goes to this node's own change log.
//!
//! Both engines run the same `Planner` over their current state and then
//! commit the resulting `Plan` atomically, so they cannot disagree.
//!
//! # Per-key state
//!
//! A key is either
//! * **live**: a value in the `data` keyspace with `version` (seq of the write
//!   that produced the value as a whole) and `base_version` (seq of the write
//!   that produced its *data*; equal to `version` except after a foreign
//!   `SetExpiry` overrode the expiry of an older foreign `Put`), or
//! * **absent with a marker**: an entry in the `tombstones` keyspace holding
//!   `deleted_at` (seq of the newest foreign `Delete`, 0 if none) and an optional
//!   *pending expiry* (a foreign `SetExpiry` that arrived while the key was
//!   absent and is newer than `deleted_at`), or
//! * **absent**: neither (version 0).
//!
//! A key never has both a value and a marker.
//!
//! # Local writes (`apply`) — authoritative, unconditional
//!
//! Every mutation gets the next seq and is logged exactly as given.
//! * `Put` stores the value with `version = base_version = seq` and removes any marker.
//! * `Delete` removes the value **and** any marker (local deletes leave no
//!   tombstone, so normal operation never accumulates markers).
//! * `SetExpiry` on a live key sets the expiry and `version = base_version = seq`;
//!   on an absent key it changes nothing (marker untouched) but is still logged.
//!
//! So a local write resets the key's version history; a foreign record that
//! arrives later is compared numerically with the local seq. Foreign and local
//! seqs come from different nodes and are not comparable in general: the node
//! must not mix local writes and foreign records for the same key (during a
//! migration the target takes only foreign records until it owns the range;
//! a replica takes only foreign records).
//!
//! # Foreign records (`apply_foreign`) — last writer by source seq wins
//!
//! Let `b` be the key's base seq (`base_version` if live, `deleted_at` if
//! marked, else 0) and `v` its version (`version` if live, else `b`).
//! * `Put` with seq `s > b` replaces the data (`base_version = s`); if a newer
//!   expiry override is pending (`version > s` when live, or a pending expiry
//!   with seq `> s` in the marker) the override's expiry and seq are kept,
//!   otherwise `version = s` and the record's expiry is used.
//! * `Delete` with seq `s > b` removes the value and leaves a marker
//!   `deleted_at = s`, keeping a pending expiry only if it is newer than `s`.
//! * `SetExpiry` with seq `s`: on a live key, applied iff `s > version`; on an
//!   absent key, recorded as the pending expiry iff `s > deleted_at` and `s` is
//!   newer than any pending expiry (so a `Put` that is older than the
//!   `SetExpiry` but arrives after it still ends up with the right expiry).
//! * Anything else is stale and ignored. Re-applying a record is a no-op.
//!
//! This makes the final state a function of the *set* of records received
//! (as long as one seq names one record): applying any permutation yields the
//! state that applying them in seq order yields. It is tested in
//! [`crate::conformance`].
//!
//! Each foreign record that changes the key's **visible** state (value or
//! absence, including `version`) is appended to this node's log with a fresh
//! local seq, as its *effect*: `Delete` if the key disappeared, a full `Put`
//! (with the effective expiry) for a `Put` record, `SetExpiry` for a
//! `SetExpiry` record (only the expiry and version changed). A `Put` that
//! rewrites the same data is logged whole too: the path that skips the read
//! (below) cannot know the data was the same, and both paths must log alike.
//! Stale records and marker-only changes are not logged. Hence a node that
//! replays this node's log in order (e.g. a replica, via `apply_foreign`)
//! reaches the same visible state (up to versions).
//!
//! A foreign `Put` newer than the engine's bound on the key's versions
//! (`version_bounds.rs`: ranges found empty, raised by every commit) ends
//! in a plain replace, so it is planned without reading the value.
//!
//! Markers are removed by a local `Put`/`Delete` of the key and by
//! [`crate::Engine::delete_range_chunk`]; otherwise they stay.

use std::collections::HashMap;

use bytes::Bytes;

use crate::error::StorageError;
use crate::value::{ChangeRecord, Mutation, Reader, Seq, StoredValue, Value, corrupt};

/// Version marker of an absent key (the `tombstones` keyspace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Marker {
    /// Seq of the newest foreign `Delete` (0 = none).
    pub deleted_at: Seq,
    /// Newest foreign `SetExpiry` that arrived while the key was absent and is
    /// newer than `deleted_at`: `(seq, expire_at_ms)`.
    pub pending_expiry: Option<(Seq, Option<u64>)>,
}

const MARKER_PENDING: u8 = 1;
const MARKER_PENDING_EXPIRY: u8 = 2;

impl Marker {
    /// `flags u8 | deleted_at u64 | [pending_seq u64 | [pending_expire u64]]`
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(25);
        let flags = match self.pending_expiry {
            None => 0,
            Some((_, None)) => MARKER_PENDING,
            Some((_, Some(_))) => MARKER_PENDING | MARKER_PENDING_EXPIRY,
        };
        buf.push(flags);
        buf.extend_from_slice(&self.deleted_at.to_be_bytes());
        if let Some((seq, exp)) = self.pending_expiry {
            buf.extend_from_slice(&seq.to_be_bytes());
            if let Some(at) = exp {
                buf.extend_from_slice(&at.to_be_bytes());
            }
        }
        buf
    }

    pub(crate) fn decode(buf: &Bytes) -> Result<Self, StorageError> {
        let mut r = Reader::new(buf, "tombstone marker");
        let flags = r.u8()?;
        if flags & !(MARKER_PENDING | MARKER_PENDING_EXPIRY) != 0 {
            return Err(corrupt("tombstone marker", format!("bad flags {flags:#x}")));
        }
        let deleted_at = r.u64()?;
        let pending_expiry = if flags & MARKER_PENDING != 0 {
            let seq = r.u64()?;
            let exp = if flags & MARKER_PENDING_EXPIRY != 0 {
                Some(r.u64()?)
            } else {
                None
            };
            Some((seq, exp))
        } else {
            None
        };
        r.finish()?;
        Ok(Marker {
            deleted_at,
            pending_expiry,
        })
    }
}

/// Read access to the committed state, implemented by each engine.
pub(crate) trait StateSource {
    fn load_value(&self, key: &[u8]) -> Result<Option<StoredValue>, StorageError>;
    fn load_marker(&self, key: &[u8]) -> Result<Option<Marker>, StorageError>;
    /// An upper bound of every version stored for `key` (value `version` and
    /// `base_version`, marker `deleted_at` and pending seq), if the engine
    /// knows one (`version_bounds.rs`).
    fn version_bound(&self, _key: &[u8]) -> Option<Seq> {
        None
    }
}

/// One physical write of a [`Plan`].
#[derive(Debug)]
pub(crate) enum Write {
    PutValue(Bytes, StoredValue),
    DeleteValue(Bytes),
    PutMarker(Bytes, Marker),
    DeleteMarker(Bytes),
}

/// Everything one `apply`/`apply_foreign` call must commit atomically.
#[derive(Debug)]
pub(crate) struct Plan {
    pub writes: Vec<Write>,
    pub log: Vec<ChangeRecord>,
    /// The node's last seq after this plan (unchanged if `log` is empty).
    pub last_seq: Seq,
    /// Foreign `Put`s applied without reading the key's value (newer than
    /// the engine's version bound).
    pub reads_skipped: u64,
}

struct Slot {
    /// `None` = not loaded yet (only possible before the first read or a blind overwrite).
    value: Option<Option<StoredValue>>,
    /// Whether the value existed before this plan; `None` = unknown (never loaded).
    value_existed: Option<bool>,
    value_dirty: bool,
    marker: Option<Marker>,
    marker_existed: bool,
    marker_dirty: bool,
}

/// Computes a [`Plan`] from a sequence of operations against committed state
/// plus the plan's own earlier effects (several mutations of one key in one
/// call compose as if applied one by one). Each touched key appears at most
/// once in the resulting writes.
pub(crate) struct Planner<'a, S: StateSource> {
    src: &'a S,
    slots: HashMap<Bytes, Slot>,
    order: Vec<Bytes>,
    log: Vec<ChangeRecord>,
    last_seq: Seq,
    reads_skipped: u64,
}

impl<'a, S: StateSource> Planner<'a, S> {
    pub(crate) fn new(src: &'a S, last_seq: Seq) -> Self {
        Planner {
            src,
            slots: HashMap::new(),
            order: Vec::new(),
            log: Vec::new(),
            last_seq,
            reads_skipped: 0,
        }
    }

    fn slot(&mut self, key: &Bytes) -> Result<&mut Slot, StorageError> {
        if !self.slots.contains_key(key) {
            let marker = self.src.load_marker(key)?;
            let marker_existed = marker.is_some();
            // Invariant: a marked key has no value, no need to read it.
            let (value, value_existed) = if marker_existed {
                (Some(None), Some(false))
            } else {
                (None, None)
            };
            self.slots.insert(
                key.clone(),
                Slot {
                    value,
                    value_existed,
                    value_dirty: false,
                    marker,
                    marker_existed,
                    marker_dirty: false,
                },
            );
            self.order.push(key.clone());
        }
        Ok(self.slots.get_mut(key).expect("just inserted"))
    }

    fn current_value(&mut self, key: &Bytes) -> Result<Option<StoredValue>, StorageError> {
        let src = self.src;
        let slot = self.slot(key)?;
        if slot.value.is_none() {
            let v = src.load_value(key)?;
            slot.value_existed = Some(v.is_some());
            slot.value = Some(v);
        }
        Ok(slot.value.clone().expect("loaded"))
    }

    fn set_value(&mut self, key: &Bytes, v: Option<StoredValue>) -> Result<(), StorageError> {
        let slot = self.slot(key)?;
        slot.value = Some(v);
        slot.value_dirty = true;
        Ok(())
    }

    fn set_marker(&mut self, key: &Bytes, m: Option<Marker>) -> Result<(), StorageError> {
        let slot = self.slot(key)?;
        if slot.marker != m {
            slot.marker = m;
            slot.marker_dirty = true;
        }
        Ok(())
    }

    fn next_seq(&mut self) -> Seq {
        self.last_seq += 1;
        self.last_seq
    }

    /// A local write (see the module docs).
    pub(crate) fn local(&mut self, m: &Mutation) -> Result<(), StorageError> {
        let seq = self.next_seq();
        match m {
            Mutation::Put {
                key,
                kind,
                expire_at_ms,
                data,
            } => {
                self.set_value(
                    key,
                    Some(StoredValue::local(*kind, *expire_at_ms, data.clone(), seq)),
                )?;
                self.set_marker(key, None)?;
            }
            Mutation::Delete { key } => {
                self.set_value(key, None)?;
                self.set_marker(key, None)?;
            }
            Mutation::SetExpiry { key, expire_at_ms } => {
                if let Some(mut sv) = self.current_value(key)? {
                    sv.value.expire_at_ms = *expire_at_ms;
                    sv.value.version = seq;
                    sv.base_version = seq;
                    self.set_value(key, Some(sv))?;
                }
            }
        }
        self.log.push(ChangeRecord::single(seq, m.clone()));
        Ok(())
    }

    /// A record from another node's log (see the module docs).
    pub(crate) fn foreign(&mut self, rec: &ChangeRecord) -> Result<(), StorageError> {
        let key = rec.mutation.key();
        let s = rec.seq;
        // A key this plan has not touched yet, whose stored versions are all
        // older than `s`: the rule below would replace it, so skip the read.
        if let Mutation::Put {
            kind,
            expire_at_ms,
            data,
            ..
        } = &rec.mutation
            && !self.slots.contains_key(key)
            && self.src.version_bound(key).is_some_and(|bound| bound < s)
        {
            return self.foreign_put_newer(key, s, *kind, *expire_at_ms, data);
        }
        let before = self.current_value(key)?;
        let marker = self.slot(key)?.marker.clone();
        let base = match (&before, &marker) {
            (Some(sv), _) => sv.base_version,
            (None, Some(m)) => m.deleted_at,
            (None, None) => 0,
        };
        // Pending expiry override newer than the base write.
        let pending = match (&before, &marker) {
            (Some(sv), _) if sv.value.version > sv.base_version => {
                Some((sv.value.version, sv.value.expire_at_ms))
            }
            (Some(_), _) => None,
            (None, Some(m)) => m.pending_expiry,
            (None, None) => None,
        };
        match &rec.mutation {
            Mutation::Put {
                kind,
                expire_at_ms,
                data,
                ..
            } => {
                if s <= base {
                    return Ok(());
                }
                let (expire_at_ms, version) = match pending {
                    Some((ps, pe)) if ps > s => (pe, ps),
                    _ => (*expire_at_ms, s),
                };
                let after = StoredValue {
                    value: Value {
                        kind: *kind,
                        expire_at_ms,
                        version,
                        data: data.clone(),
                    },
                    base_version: s,
                };
                self.set_value(key, Some(after))?;
                self.set_marker(key, None)?;
            }
            Mutation::Delete { .. } => {
                if s <= base {
                    return Ok(());
                }
                self.set_value(key, None)?;
                self.set_marker(
                    key,
                    Some(Marker {
                        deleted_at: s,
                        pending_expiry: pending.filter(|&(ps, _)| ps > s),
                    }),
                )?;
            }
            Mutation::SetExpiry { expire_at_ms, .. } => match before.clone() {
                Some(mut sv) => {
                    if s <= sv.value.version {
                        return Ok(());
                    }
                    sv.value.expire_at_ms = *expire_at_ms;
                    sv.value.version = s;
                    self.set_value(key, Some(sv))?;
                }
                None => {
                    let newest = pending.map_or(base, |(ps, _)| ps.max(base));
                    if s <= newest {
                        return Ok(());
                    }
                    self.set_marker(
                        key,
                        Some(Marker {
                            deleted_at: base,
                            pending_expiry: Some((s, *expire_at_ms)),
                        }),
                    )?;
                }
            },
        }
        let after = self.current_value(key)?;
        let put = matches!(rec.mutation, Mutation::Put { .. });
        if let Some(effect) = effect(key, put, before.as_ref(), after.as_ref()) {
            let seq = self.next_seq();
            self.log.push(ChangeRecord::single(seq, effect));
        }
        Ok(())
    }

    /// A foreign `Put` at `s` of a key whose every stored version is older
    /// (the engine's bound): what the rule in [`Self::foreign`] does then,
    /// a plain replace with version and base `s`, no pending expiry (its
    /// seq is below `s` too) and the marker removed, without reading the
    /// value. Its effect is a full `Put`, as the full rule logs it.
    fn foreign_put_newer(
        &mut self,
        key: &Bytes,
        s: Seq,
        kind: crate::value::ValueKind,
        expire_at_ms: Option<u64>,
        data: &Bytes,
    ) -> Result<(), StorageError> {
        // The bound's consumer side of its assertion pair (the producer is
        // the engine's commit): the read it saves, in debug builds.
        #[cfg(debug_assertions)]
        {
            let value = self.src.load_value(key)?;
            let marker = self.src.load_marker(key)?;
            assert!(
                value
                    .as_ref()
                    .is_none_or(|sv| sv.value.version < s && sv.base_version < s),
                "version bound broken: {key:?} holds {value:?}, a foreign Put at {s} skipped the read"
            );
            assert!(
                marker.as_ref().is_none_or(
                    |m| m.deleted_at < s && m.pending_expiry.is_none_or(|(ps, _)| ps < s)
                ),
                "version bound broken: {key:?} has marker {marker:?}, a foreign Put at {s} skipped the read"
            );
        }
        self.reads_skipped += 1;
        self.set_value(
            key,
            Some(StoredValue {
                value: Value {
                    kind,
                    expire_at_ms,
                    version: s,
                    data: data.clone(),
                },
                base_version: s,
            }),
        )?;
        self.set_marker(key, None)?;
        let seq = self.next_seq();
        self.log.push(ChangeRecord::single(
            seq,
            Mutation::Put {
                key: key.clone(),
                kind,
                expire_at_ms,
                data: data.clone(),
            },
        ));
        Ok(())
    }

    pub(crate) fn finish(self) -> Plan {
        let mut slots = self.slots;
        let mut writes = Vec::new();
        for key in self.order {
            let slot = slots.remove(&key).expect("slot of ordered key");
            if slot.value_dirty {
                match slot.value.expect("dirty value is known") {
                    Some(sv) => writes.push(Write::PutValue(key.clone(), sv)),
                    // Skip deleting what is known not to exist.
                    None if slot.value_existed == Some(false) => {}
                    None => writes.push(Write::DeleteValue(key.clone())),
                }
            }
            if slot.marker_dirty {
                match slot.marker {
                    Some(m) => writes.push(Write::PutMarker(key, m)),
                    None if slot.marker_existed => writes.push(Write::DeleteMarker(key)),
                    None => {}
                }
            }
        }
        // One commit is one atomic batch: every record but the last says so.
        let mut log = self.log;
        let n = log.len();
        for r in log.iter_mut().take(n.saturating_sub(1)) {
            r.batch_continues = true;
        }
        Plan {
            writes,
            log,
            last_seq: self.last_seq,
            reads_skipped: self.reads_skipped,
        }
    }
}

/// What to log for a foreign record (a `Put` if `put`) that turned
/// `before` into `after` (`None` if the visible state did not change).
fn effect(
    key: &Bytes,
    put: bool,
    before: Option<&StoredValue>,
    after: Option<&StoredValue>,
) -> Option<Mutation> {
    let (before, after) = (before.map(|sv| &sv.value), after.map(|sv| &sv.value));
    if before == after {
        return None;
    }
    Some(match (before, after) {
        (_, None) => Mutation::Delete { key: key.clone() },
        (Some(b), Some(a)) if !put && b.kind == a.kind && b.data == a.data => Mutation::SetExpiry {
            key: key.clone(),
            expire_at_ms: a.expire_at_ms,
        },
        (_, Some(a)) => Mutation::Put {
            key: key.clone(),
            kind: a.kind,
            expire_at_ms: a.expire_at_ms,
            data: a.data.clone(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_roundtrip() {
        for m in [
            Marker {
                deleted_at: 5,
                pending_expiry: None,
            },
            Marker {
                deleted_at: 0,
                pending_expiry: Some((9, None)),
            },
            Marker {
                deleted_at: 3,
                pending_expiry: Some((9, Some(1234))),
            },
        ] {
            assert_eq!(Marker::decode(&Bytes::from(m.encode())).unwrap(), m);
        }
        assert!(Marker::decode(&Bytes::from_static(b"\x01\0\0\0\0\0\0\0\x01")).is_err());
    }
}
