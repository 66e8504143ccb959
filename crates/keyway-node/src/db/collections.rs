//! The collection side of the per-command overlay: metas and sub-entries
//! (layout in [`crate::coll`]).
//!
//! A collection's meta is its key's top-level entry, held in the same
//! per-key slots as strings (so TTLs, lazy expiry and DEL work unchanged).
//! Sub-entries are buffered in a sorted map (`None` = deleted) that the
//! range reads merge with the engine's, so a command reads its own writes.

use std::collections::VecDeque;
use std::ops::Bound;

use bytes::Bytes;
use keyway_storage::{KeyRange, MAX_KEY_LEN, StorageError, Value, ValueKind, prefix_successor};

use super::{Db, Pending};
use crate::cmd::{CmdError, errors, reply_err};
use crate::coll::layout::{self, Meta};
use crate::coll::whole::{Contents, Whole};

/// Entries one engine scan of a collection range reads at a time.
const SUB_SCAN_CHUNK_ENTRIES: usize = 512;

impl<'a> Db<'a> {
    /// The type of the live value of `key` (`None` = absent or expired).
    pub fn kind_of(&mut self, key: &[u8]) -> Result<Option<ValueKind>, StorageError> {
        Ok(self.slot(key)?.value.as_ref().map(|v| v.kind))
    }

    /// The meta of `key` if it is a live collection of `kind`; `Ok(None)` if
    /// absent; `WRONGTYPE` if it holds anything else.
    pub(crate) fn meta(&mut self, key: &[u8], kind: ValueKind) -> Result<Option<Meta>, CmdError> {
        debug_assert!(kind.is_collection());
        let Some(value) = self.slot(key)?.value.as_ref() else {
            return Ok(None);
        };
        if value.kind != kind {
            return Err(reply_err(errors::WRONGTYPE));
        }
        match Meta::decode(kind, &value.data) {
            Some(meta) => Ok(Some(meta)),
            None => Err(CmdError::Storage(StorageError::Corrupt {
                what: "collection meta",
                detail: format!("{} bytes of {kind:?} meta", value.data.len()),
            })),
        }
    }

    /// An empty collection of `kind` with a fresh version (write it with
    /// [`Db::put_meta`] once it holds something).
    pub fn new_meta(&self, kind: ValueKind) -> Meta {
        Meta::fresh(kind)
    }

    /// Writes `meta` as `key`'s top-level entry, keeping the key's TTL if it
    /// already holds this very collection (same version); a meta of size 0
    /// deletes the key (Redis has no empty collections), but for a stream
    /// (an empty stream exists, with its ids and groups).
    pub fn put_meta(&mut self, key: &[u8], meta: &Meta) -> Result<(), StorageError> {
        let slot = self.slot(key)?;
        if meta.size == 0 && meta.kind != ValueKind::Stream {
            if slot.value.take().is_some() || slot.pending != Pending::Clean {
                slot.pending = Pending::Delete;
            }
            return Ok(());
        }
        let (expire_at_ms, version) = match &slot.value {
            Some(v)
                if v.kind == meta.kind
                    && Meta::decode(v.kind, &v.data).is_some_and(|m| m.version == meta.version) =>
            {
                (v.expire_at_ms, v.version)
            }
            Some(v) => (None, v.version),
            None => (None, 0),
        };
        slot.value = Some(Value {
            kind: meta.kind,
            expire_at_ms,
            version,
            data: meta.encode(),
        });
        slot.pending = Pending::Put;
        Ok(())
    }

    fn sub_storage_key(&self, key: &[u8], meta: &Meta, suffix: &[u8]) -> Result<Bytes, CmdError> {
        let prefix = layout::sub_prefix(self.keyspace, key, meta.version);
        if prefix.len() + suffix.len() > MAX_KEY_LEN {
            return Err(reply_err(format!(
                "ERR field or member is too long (max {} bytes with this key)",
                MAX_KEY_LEN - prefix.len()
            )));
        }
        let mut out = Vec::with_capacity(prefix.len() + suffix.len());
        out.extend_from_slice(&prefix);
        out.extend_from_slice(suffix);
        Ok(Bytes::from(out))
    }

    /// The data of one sub-entry of `key`'s collection `meta`.
    pub(crate) fn sub_get(
        &mut self,
        key: &[u8],
        meta: &Meta,
        suffix: &[u8],
    ) -> Result<Option<Bytes>, CmdError> {
        let Ok(sk) = self.sub_storage_key(key, meta, suffix) else {
            // Too long to have been stored.
            return Ok(None);
        };
        if let Some(pending) = self.subs.get(&sk) {
            return Ok(pending.clone());
        }
        Ok(self.engine.get(&sk)?.map(|v| v.data))
    }

    /// Creates or replaces one sub-entry (the caller keeps `meta.size` right).
    pub(crate) fn sub_put(
        &mut self,
        key: &[u8],
        meta: &Meta,
        suffix: &[u8],
        data: Bytes,
    ) -> Result<(), CmdError> {
        let sk = self.sub_storage_key(key, meta, suffix)?;
        self.subs.insert(sk, Some(data));
        Ok(())
    }

    /// Deletes one sub-entry (the caller keeps `meta.size` right).
    pub(crate) fn sub_delete(
        &mut self,
        key: &[u8],
        meta: &Meta,
        suffix: &[u8],
    ) -> Result<(), CmdError> {
        if let Ok(sk) = self.sub_storage_key(key, meta, suffix) {
            self.subs.insert(sk, None);
        }
        Ok(())
    }

    /// Sub-entries of `meta` whose suffix is in `[from, to)` (`None` =
    /// unbounded), ascending, at most `limit`, as `(suffix, data)`, this
    /// command's own writes included.
    pub(crate) fn sub_range(
        &mut self,
        key: &[u8],
        meta: &Meta,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>, CmdError> {
        let (prefix, range) = self.sub_key_range(key, meta, from, to);
        let lower = Bound::Included(range.start.clone());
        let upper = range.end.clone().map_or(Bound::Unbounded, Bound::Excluded);
        let mut overlay = self.subs.range((lower, upper)).peekable();
        let mut from_engine: VecDeque<(Bytes, Value)> = VecDeque::new();
        let mut after: Option<Bytes> = None;
        let mut engine_done = false;
        let mut out = Vec::new();
        while out.len() < limit {
            if from_engine.is_empty() && !engine_done {
                let chunk = self
                    .engine
                    .scan(&range, after.as_deref(), SUB_SCAN_CHUNK_ENTRIES)?;
                engine_done = chunk.next.is_none();
                after = chunk.next;
                from_engine.extend(chunk.entries);
            }
            let (take_overlay, shadowed) = match (from_engine.front(), overlay.peek()) {
                (None, None) => break,
                (Some(_), None) => (false, false),
                (None, Some(_)) => (true, false),
                (Some((ek, _)), Some((ok, _))) => (*ok <= ek, *ok == ek),
            };
            if shadowed {
                // The command's own write shadows the engine's entry.
                from_engine.pop_front();
            }
            let (sk, data) = if take_overlay {
                let (k, v) = overlay.next().expect("peeked");
                match v {
                    Some(d) => (k.clone(), d.clone()),
                    None => continue,
                }
            } else {
                let (k, v) = from_engine.pop_front().expect("checked");
                (k, v.data)
            };
            debug_assert!(sk.starts_with(&prefix), "a sub-entry outside its prefix");
            out.push((sk.slice(prefix.len()..), data));
        }
        Ok(out)
    }

    /// The storage-key prefix of `meta`'s sub-entries, and the storage range
    /// of those whose suffix is in `[from, to)` (`None` = unbounded): what
    /// [`Db::sub_range`] and `Db::sub_range_rev` read.
    pub(super) fn sub_key_range(
        &self,
        key: &[u8],
        meta: &Meta,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
    ) -> (Bytes, KeyRange) {
        let prefix = layout::sub_prefix(self.keyspace, key, meta.version);
        let with = |s: &[u8]| -> Bytes {
            let mut v = prefix.to_vec();
            v.extend_from_slice(s);
            Bytes::from(v)
        };
        let start = from.map_or_else(|| prefix.clone(), with);
        let end = match to {
            Some(t) => Some(with(t)),
            None => prefix_successor(&prefix),
        };
        (prefix, KeyRange { start, end })
    }

    /// Every sub-entry of `meta` (ascending suffix order).
    pub(crate) fn sub_all(
        &mut self,
        key: &[u8],
        meta: &Meta,
    ) -> Result<Vec<(Bytes, Bytes)>, CmdError> {
        self.sub_range(key, meta, None, None, usize::MAX)
    }

    /// The whole value of `key` (any type), for commands that copy or
    /// serialise keys (RENAME, COPY, DUMP, SORT, the *STORE commands).
    pub fn read_whole(&mut self, key: &[u8]) -> Result<Option<Whole>, StorageError> {
        let Some(value) = self.slot(key)?.value.clone() else {
            return Ok(None);
        };
        let storage = |e: CmdError| match e {
            CmdError::Storage(e) => e,
            CmdError::Reply(f) => StorageError::Corrupt {
                what: "collection",
                detail: format!("{f:?}"),
            },
        };
        let contents = match value.kind {
            ValueKind::String => Contents::String(value.data),
            ValueKind::Sub => unreachable!("a sub-entry is never a user key's top-level entry"),
            kind => {
                let meta = self
                    .meta(key, kind)
                    .map_err(storage)?
                    .expect("live: read above");
                if kind == ValueKind::Hash {
                    let pairs = self.hash_all(key, &meta).map_err(storage)?;
                    return Ok(Some(Whole {
                        contents: Contents::Hash(pairs),
                        expire_at_ms: value.expire_at_ms,
                    }));
                }
                let subs = self.sub_all(key, &meta).map_err(storage)?;
                match kind {
                    ValueKind::Stream => Contents::Stream(meta.stream, subs),
                    ValueKind::Hash => unreachable!("read above"),
                    ValueKind::Set => Contents::Set(subs.into_iter().map(|(m, _)| m).collect()),
                    ValueKind::List => Contents::List(subs.into_iter().map(|(_, e)| e).collect()),
                    _ => Contents::ZSet(
                        subs.into_iter()
                            .filter_map(|(s, _)| {
                                let (score, member) = layout::zset_score_parts(&s)?;
                                Some((s.slice_ref(member), score))
                            })
                            .collect(),
                    ),
                }
            }
        };
        Ok(Some(Whole {
            contents,
            expire_at_ms: value.expire_at_ms,
        }))
    }

    /// Replaces whatever `key` holds with `whole` (an empty collection but a
    /// stream deletes the key). O(size): every sub-entry is written.
    pub(crate) fn write_whole(&mut self, key: &[u8], whole: Whole) -> Result<(), CmdError> {
        self.delete(key)?;
        let kind = whole.contents.kind();
        let mut meta = match whole.contents {
            Contents::String(data) => {
                self.set(key, data, whole.expire_at_ms);
                return Ok(());
            }
            _ => self.new_meta(kind),
        };
        match whole.contents {
            Contents::String(_) => unreachable!("handled above"),
            Contents::Hash(pairs) => {
                for (f, v) in pairs {
                    self.hash_put(key, &mut meta, &f, &v)?;
                }
            }
            Contents::Set(members) => {
                for m in members {
                    if self.sub_get(key, &meta, &m)?.is_none() {
                        meta.size += 1;
                    }
                    self.sub_put(key, &meta, &m, Bytes::new())?;
                }
            }
            Contents::List(elements) => {
                for e in elements {
                    self.sub_put(key, &meta, &layout::list_suffix(meta.tail), e)?;
                    meta.tail += 1;
                    meta.size += 1;
                }
            }
            Contents::Stream(stream, subs) => {
                meta.stream = stream;
                for (suffix, data) in subs {
                    if crate::coll::stream::entry_id(&suffix).is_some() {
                        meta.size += 1;
                    }
                    self.sub_put(key, &meta, &suffix, data)?;
                }
            }
            Contents::ZSet(members) => {
                for (m, score) in members {
                    let ms = layout::zset_member_suffix(&m);
                    if let Some(old) = self.sub_get(key, &meta, &ms)? {
                        let old = layout::decode_score(&old).unwrap_or(0.0);
                        self.sub_delete(key, &meta, &layout::zset_score_suffix(old, &m))?;
                    } else {
                        meta.size += 1;
                    }
                    self.sub_put(key, &meta, &ms, layout::encode_score(score))?;
                    self.sub_put(
                        key,
                        &meta,
                        &layout::zset_score_suffix(score, &m),
                        Bytes::new(),
                    )?;
                }
            }
        }
        self.put_meta(key, &meta)?;
        let exists = meta.size > 0 || kind == ValueKind::Stream;
        if exists && whole.expire_at_ms.is_some() {
            self.set_expiry(key, whole.expire_at_ms)?;
        }
        Ok(())
    }
}
