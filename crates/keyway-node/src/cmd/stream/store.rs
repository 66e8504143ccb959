//! A stream on the overlay: its meta and its sub-entries (entries, groups,
//! pending entries, consumers; layout in [`crate::coll::stream`]). Every
//! stream command reads and writes through [`Stream`].

use bytes::Bytes;
use keyway_resp::Frame;
use keyway_storage::{StorageError, ValueKind};

use super::super::{CmdError, errors, reply_err};
use crate::coll::layout::Meta;
use crate::coll::stream::{
    self as layout, CONSUMER_TAG, GROUP_TAG, Group, PEL_TAG, Pending, StreamId,
};
use crate::db::Db;

pub const KIND: ValueKind = ValueKind::Stream;

/// One stream entry: its id and field/value pairs.
pub type Entry = (StreamId, Vec<(Bytes, Bytes)>);

fn corrupt(what: &'static str) -> CmdError {
    CmdError::Storage(StorageError::Corrupt {
        what,
        detail: "undecodable stream sub-entry".into(),
    })
}

/// An open stream: its key and meta (write it back with [`Stream::save`]).
pub struct Stream {
    pub key: Bytes,
    pub meta: Meta,
}

impl Stream {
    /// The stream at `key`; `None` if absent; WRONGTYPE for another type.
    pub fn open(db: &mut Db<'_>, key: &Bytes) -> Result<Option<Stream>, CmdError> {
        Ok(db.meta(key, KIND)?.map(|meta| Stream {
            key: key.clone(),
            meta,
        }))
    }

    /// Whether `key` holds a value of another type (WRONGTYPE then).
    pub fn check_type(db: &mut Db<'_>, key: &[u8]) -> Result<(), CmdError> {
        match db.kind_of(key)? {
            Some(k) if k != KIND => Err(reply_err(errors::WRONGTYPE)),
            _ => Ok(()),
        }
    }

    /// A new empty stream at `key` (not written until [`Stream::save`]).
    pub fn create(db: &mut Db<'_>, key: &Bytes) -> Stream {
        Stream {
            key: key.clone(),
            meta: db.new_meta(KIND),
        }
    }

    /// Writes the meta (an empty stream stays: streams may be empty).
    pub fn save(&self, db: &mut Db<'_>) -> Result<(), CmdError> {
        db.put_meta(&self.key, &self.meta)?;
        Ok(())
    }

    pub fn len(&self) -> u64 {
        self.meta.size
    }

    // --- entries ---

    /// Entries with ids in `start..=end`, ascending (or descending with
    /// `rev`), at most `count` (0 = all).
    pub fn range(
        &self,
        db: &mut Db<'_>,
        start: StreamId,
        end: StreamId,
        count: usize,
        rev: bool,
    ) -> Result<Vec<Entry>, CmdError> {
        if start > end {
            return Ok(Vec::new());
        }
        let from = layout::entry_suffix(start);
        let to = layout::successor(&layout::entry_suffix(end)).expect("an entry tag is below 0xff");
        let limit = if count == 0 { usize::MAX } else { count };
        let subs = if rev {
            db.sub_range_rev(&self.key, &self.meta, Some(&from), Some(&to), limit)?
        } else {
            db.sub_range(&self.key, &self.meta, Some(&from), Some(&to), limit)?
        };
        subs.into_iter()
            .map(|(s, d)| {
                let id = layout::entry_id(&s).ok_or_else(|| corrupt("stream entry id"))?;
                let (_, fields) =
                    layout::decode_entry(&d).ok_or_else(|| corrupt("stream entry"))?;
                Ok((id, fields))
            })
            .collect()
    }

    /// The ids and nodes of the first `count` entries from `start` on.
    pub fn front_nodes(
        &self,
        db: &mut Db<'_>,
        start: StreamId,
        count: usize,
    ) -> Result<Vec<(StreamId, u64)>, CmdError> {
        let from = layout::entry_suffix(start);
        let to = [layout::ENTRY_TAG + 1];
        db.sub_range(&self.key, &self.meta, Some(&from), Some(&to), count)?
            .into_iter()
            .map(|(s, d)| {
                let id = layout::entry_id(&s).ok_or_else(|| corrupt("stream entry id"))?;
                let node = layout::entry_node(&d).ok_or_else(|| corrupt("stream entry"))?;
                Ok((id, node))
            })
            .collect()
    }

    /// The entry with `id`, if present.
    pub fn get(&self, db: &mut Db<'_>, id: StreamId) -> Result<Option<Entry>, CmdError> {
        Ok(self.range(db, id, id, 1, false)?.pop())
    }

    pub fn exists(&self, db: &mut Db<'_>, id: StreamId) -> Result<bool, CmdError> {
        Ok(db
            .sub_get(&self.key, &self.meta, &layout::entry_suffix(id))?
            .is_some())
    }

    /// The first or last entry's id.
    pub fn edge(&self, db: &mut Db<'_>, last: bool) -> Result<Option<StreamId>, CmdError> {
        if self.meta.size == 0 {
            return Ok(None);
        }
        Ok(self
            .range(db, StreamId::MIN, StreamId::MAX, 1, last)?
            .pop()
            .map(|(id, _)| id))
    }

    /// Redis's `streamLastValidID`: the last entry's id, `0-0` if empty.
    pub fn last_valid_id(&self, db: &mut Db<'_>) -> Result<StreamId, CmdError> {
        Ok(self.edge(db, true)?.unwrap_or_default())
    }

    /// Appends an entry (the caller checked the id is above `last_id`).
    pub fn append(
        &mut self,
        db: &mut Db<'_>,
        id: StreamId,
        fields: &[(Bytes, Bytes)],
    ) -> Result<(), CmdError> {
        let max = db.limits().stream_node_max_entries;
        let st = &mut self.meta.stream;
        if self.meta.size == 0 || st.node_count == u64::MAX || (max > 0 && st.node_count >= max) {
            // Redis opens a new node when the tail one is full or gone.
            st.node += 1;
            st.node_count = 0;
        }
        st.node_count += 1;
        let node = st.node;
        db.sub_put(
            &self.key,
            &self.meta,
            &layout::entry_suffix(id),
            layout::encode_entry(node, fields),
        )?;
        self.meta.size += 1;
        self.meta.stream.entries_added += 1;
        self.meta.stream.last_id = id;
        if self.meta.size == 1 {
            self.meta.stream.first_id = id;
        }
        Ok(())
    }

    /// Removes the entry `id` if present (`first_id` is the caller's).
    pub fn remove(&mut self, db: &mut Db<'_>, id: StreamId) -> Result<bool, CmdError> {
        if !self.exists(db, id)? {
            return Ok(false);
        }
        db.sub_delete(&self.key, &self.meta, &layout::entry_suffix(id))?;
        self.meta.size -= 1;
        Ok(true)
    }

    /// After deletes: if no entry is left in the tail node, Redis freed it
    /// and the next append opens a new one.
    pub fn refresh_tail_node(&mut self, db: &mut Db<'_>) -> Result<(), CmdError> {
        let last = self.range(db, StreamId::MIN, StreamId::MAX, 1, true)?.pop();
        let in_tail = match last {
            Some((id, _)) => self
                .front_nodes(db, id, 1)?
                .first()
                .is_some_and(|(_, node)| *node == self.meta.stream.node),
            None => false,
        };
        if !in_tail {
            self.meta.stream.node_count = u64::MAX;
        }
        Ok(())
    }

    /// Sets `first_id` from the entries (`0-0` when empty).
    pub fn refresh_first_id(&mut self, db: &mut Db<'_>) -> Result<(), CmdError> {
        self.meta.stream.first_id = self.edge(db, false)?.unwrap_or_default();
        Ok(())
    }

    // --- groups ---

    pub fn group(&self, db: &mut Db<'_>, name: &[u8]) -> Result<Option<Group>, CmdError> {
        match db.sub_get(&self.key, &self.meta, &layout::group_suffix(name))? {
            Some(d) => Ok(Some(
                Group::decode(&d).ok_or_else(|| corrupt("stream group"))?,
            )),
            None => Ok(None),
        }
    }

    pub fn put_group(&self, db: &mut Db<'_>, name: &[u8], g: &Group) -> Result<(), CmdError> {
        db.sub_put(
            &self.key,
            &self.meta,
            &layout::group_suffix(name),
            g.encode(),
        )
    }

    /// Every group, by name.
    pub fn groups(&self, db: &mut Db<'_>) -> Result<Vec<(Bytes, Group)>, CmdError> {
        db.sub_range(
            &self.key,
            &self.meta,
            Some(&[GROUP_TAG]),
            Some(&[GROUP_TAG + 1]),
            usize::MAX,
        )?
        .into_iter()
        .map(|(s, d)| {
            let g = Group::decode(&d).ok_or_else(|| corrupt("stream group"))?;
            Ok((s.slice(1..), g))
        })
        .collect()
    }

    /// Deletes a group with its pending entries and consumers.
    pub fn destroy_group(&self, db: &mut Db<'_>, name: &[u8]) -> Result<(), CmdError> {
        for tag in [PEL_TAG, CONSUMER_TAG] {
            let prefix = layout::group_scoped(tag, name);
            for (s, _) in self.scoped(db, &prefix, None, usize::MAX)? {
                db.sub_delete(&self.key, &self.meta, &s)?;
            }
        }
        db.sub_delete(&self.key, &self.meta, &layout::group_suffix(name))
    }

    /// Sub-entries whose suffix starts with `prefix`, from `prefix ++ after` on.
    fn scoped(
        &self,
        db: &mut Db<'_>,
        prefix: &[u8],
        from: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>, CmdError> {
        let start = match from {
            Some(f) => [prefix, f].concat(),
            None => prefix.to_vec(),
        };
        let end = layout::successor(prefix);
        db.sub_range(&self.key, &self.meta, Some(&start), end.as_deref(), limit)
    }

    // --- pending entries ---

    pub fn pending(
        &self,
        db: &mut Db<'_>,
        group: &[u8],
        id: StreamId,
    ) -> Result<Option<Pending>, CmdError> {
        match db.sub_get(&self.key, &self.meta, &layout::pel_suffix(group, id))? {
            Some(d) => Ok(Some(
                Pending::decode(&d).ok_or_else(|| corrupt("stream pending entry"))?,
            )),
            None => Ok(None),
        }
    }

    pub fn put_pending(
        &self,
        db: &mut Db<'_>,
        group: &[u8],
        id: StreamId,
        p: &Pending,
    ) -> Result<(), CmdError> {
        db.sub_put(
            &self.key,
            &self.meta,
            &layout::pel_suffix(group, id),
            p.encode(),
        )
    }

    pub fn delete_pending(
        &self,
        db: &mut Db<'_>,
        group: &[u8],
        id: StreamId,
    ) -> Result<(), CmdError> {
        db.sub_delete(&self.key, &self.meta, &layout::pel_suffix(group, id))
    }

    /// The group's pending entries with ids from `from` on, ascending, at
    /// most `limit`.
    pub fn pel(
        &self,
        db: &mut Db<'_>,
        group: &[u8],
        from: StreamId,
        limit: usize,
    ) -> Result<Vec<(StreamId, Pending)>, CmdError> {
        let prefix = layout::group_scoped(PEL_TAG, group);
        let plen = prefix.len();
        self.scoped(db, &prefix, Some(&from.to_bytes()), limit)?
            .into_iter()
            .map(|(s, d)| {
                let id =
                    StreamId::from_bytes(&s[plen..]).ok_or_else(|| corrupt("stream pel id"))?;
                let p = Pending::decode(&d).ok_or_else(|| corrupt("stream pending entry"))?;
                Ok((id, p))
            })
            .collect()
    }

    /// The whole pending list of a group.
    pub fn pel_all(
        &self,
        db: &mut Db<'_>,
        group: &[u8],
    ) -> Result<Vec<(StreamId, Pending)>, CmdError> {
        self.pel(db, group, StreamId::MIN, usize::MAX)
    }

    // --- consumers ---

    /// A consumer's seen-time, if it exists.
    pub fn consumer(
        &self,
        db: &mut Db<'_>,
        group: &[u8],
        name: &[u8],
    ) -> Result<Option<u64>, CmdError> {
        match db.sub_get(&self.key, &self.meta, &layout::consumer_suffix(group, name))? {
            Some(d) => Ok(Some(u64::from_be_bytes(
                d[..].try_into().map_err(|_| corrupt("stream consumer"))?,
            ))),
            None => Ok(None),
        }
    }

    pub fn put_consumer(
        &self,
        db: &mut Db<'_>,
        group: &[u8],
        name: &[u8],
        seen: u64,
    ) -> Result<(), CmdError> {
        db.sub_put(
            &self.key,
            &self.meta,
            &layout::consumer_suffix(group, name),
            Bytes::copy_from_slice(&seen.to_be_bytes()),
        )
    }

    pub fn delete_consumer(
        &self,
        db: &mut Db<'_>,
        group: &[u8],
        name: &[u8],
    ) -> Result<(), CmdError> {
        db.sub_delete(&self.key, &self.meta, &layout::consumer_suffix(group, name))
    }

    /// Redis's `streamLookupConsumer` + `streamCreateConsumer`: the
    /// consumer's seen-time refreshed to now, created if missing. `true` if
    /// it was created.
    pub fn touch_consumer(
        &self,
        db: &mut Db<'_>,
        group: &[u8],
        name: &[u8],
    ) -> Result<bool, CmdError> {
        let created = self.consumer(db, group, name)?.is_none();
        let now = db.now_ms();
        self.put_consumer(db, group, name, now)?;
        Ok(created)
    }

    /// Every consumer of a group, by name, with its seen-time.
    pub fn consumers(&self, db: &mut Db<'_>, group: &[u8]) -> Result<Vec<(Bytes, u64)>, CmdError> {
        let prefix = layout::group_scoped(CONSUMER_TAG, group);
        let plen = prefix.len();
        self.scoped(db, &prefix, None, usize::MAX)?
            .into_iter()
            .map(|(s, d)| {
                let seen =
                    u64::from_be_bytes(d[..].try_into().map_err(|_| corrupt("stream consumer"))?);
                Ok((s.slice(plen..), seen))
            })
            .collect()
    }

    // --- counters (Redis's `streamEstimateDistanceFromFirstEverEntry` and lag) ---

    /// Whether `start..` holds a tombstone (`streamRangeHasTombstones`, end unbounded).
    pub fn has_tombstones_from(&self, start: StreamId) -> bool {
        let s = &self.meta.stream;
        if self.meta.size == 0 || s.max_deleted.is_zero() {
            return false;
        }
        if s.first_id > s.max_deleted {
            return false;
        }
        start <= s.max_deleted
    }

    /// The logical read counter of `id` (`None`: not obtainable).
    pub fn estimate_distance(&self, id: StreamId) -> Option<i64> {
        let s = &self.meta.stream;
        let added = s.entries_added as i64;
        if s.entries_added == 0 {
            return Some(0);
        }
        if self.meta.size == 0 && id <= s.last_id {
            return Some(added);
        }
        if id == s.last_id {
            return Some(added);
        } else if id > s.last_id {
            return None;
        }
        if s.max_deleted.is_zero() || s.max_deleted < s.first_id {
            if id < s.first_id {
                return Some(added - self.meta.size as i64);
            } else if id == s.first_id {
                return Some(added - self.meta.size as i64 + 1);
            }
        }
        None
    }

    /// A group's lag (`None`: unknown, a null reply).
    pub fn lag(&self, g: &Group) -> Option<i64> {
        let added = self.meta.stream.entries_added as i64;
        if added == 0 {
            return Some(0);
        }
        if g.entries_read != -1 && !self.has_tombstones_from(g.last_id) {
            return Some(added - g.entries_read);
        }
        self.estimate_distance(g.last_id).map(|read| added - read)
    }
}

/// `[id, [field, value, ...]]`.
pub fn entry_frame((id, fields): Entry) -> Frame {
    Frame::Array(vec![
        Frame::Bulk(id.text()),
        Frame::Array(
            fields
                .into_iter()
                .flat_map(|(f, v)| [Frame::Bulk(f), Frame::Bulk(v)])
                .collect(),
        ),
    ])
}

/// An array of entries.
pub fn entries_frame(entries: Vec<Entry>) -> Frame {
    Frame::Array(entries.into_iter().map(entry_frame).collect())
}

/// `-NOGROUP No such key 'k' or consumer group 'g'` and its variants.
pub fn nogroup(msg: String) -> CmdError {
    reply_err(format!("NOGROUP {msg}"))
}

/// Bytes as Redis's `%s` prints them.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
