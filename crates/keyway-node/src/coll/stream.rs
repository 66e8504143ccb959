//! The layout of streams (see the module docs of [`crate::coll`]): the
//! stream part of the meta ([`StreamMeta`]) and the suffixes and data of its
//! four kinds of sub-entry, each under its own tag byte so each kind sorts
//! as one range:
//!
//! - entry `0x01 be64(ms) be64(seq)` → `leb128(node) leb128(n)
//!   (leb128(len) bytes){2n}` (the emulated radix-tree node it was appended
//!   to, see [`StreamMeta::node`], then its field/value pairs in order; ids
//!   sort as Redis compares them);
//! - group `0x02 name` → `be64(last.ms) be64(last.seq) be64(entries_read)`
//!   (`entries_read` as two's complement: `-1` = unknown);
//! - pending entry (PEL) `0x03 be16(group_len) group be64(ms) be64(seq)` →
//!   `be64(delivery_time) be64(delivery_count) consumer`;
//! - consumer `0x04 be16(group_len) group consumer` → `be64(seen_time)`.

use bytes::{BufMut, Bytes, BytesMut};

/// A stream entry id: milliseconds and sequence, compared in that order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId {
    pub ms: u64,
    pub seq: u64,
}

impl StreamId {
    pub const MIN: StreamId = StreamId { ms: 0, seq: 0 };
    pub const MAX: StreamId = StreamId {
        ms: u64::MAX,
        seq: u64::MAX,
    };

    pub const fn new(ms: u64, seq: u64) -> StreamId {
        StreamId { ms, seq }
    }

    /// The next id (Redis's `streamIncrID`); `None` past the last one.
    pub fn incr(self) -> Option<StreamId> {
        if self.seq == u64::MAX {
            if self.ms == u64::MAX {
                return None;
            }
            return Some(StreamId::new(self.ms + 1, 0));
        }
        Some(StreamId::new(self.ms, self.seq + 1))
    }

    /// The previous id (`streamDecrID`); `None` before `0-0`.
    pub fn decr(self) -> Option<StreamId> {
        if self.seq == 0 {
            if self.ms == 0 {
                return None;
            }
            return Some(StreamId::new(self.ms - 1, u64::MAX));
        }
        Some(StreamId::new(self.ms, self.seq - 1))
    }

    pub fn is_zero(self) -> bool {
        self == StreamId::MIN
    }

    /// `ms-seq`, as Redis prints it.
    pub fn text(self) -> Bytes {
        Bytes::from(format!("{}-{}", self.ms, self.seq))
    }

    /// The 16 sortable bytes of this id.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.ms.to_be_bytes());
        out[8..].copy_from_slice(&self.seq.to_be_bytes());
        out
    }

    /// Inverse of [`StreamId::to_bytes`] (the first 16 bytes of `b`).
    pub fn from_bytes(b: &[u8]) -> Option<StreamId> {
        Some(StreamId::new(
            u64::from_be_bytes(b.get(..8)?.try_into().ok()?),
            u64::from_be_bytes(b.get(8..16)?.try_into().ok()?),
        ))
    }
}

/// What a stream's meta holds beyond `version | size` (size = entries).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamMeta {
    /// The last id ever generated (`last-generated-id`).
    pub last_id: StreamId,
    /// The greatest id XDEL removed (`max-deleted-entry-id`).
    pub max_deleted: StreamId,
    /// The first entry's id, `0-0` when empty (`recorded-first-entry-id`).
    pub first_id: StreamId,
    /// Entries ever added (`entries-added`).
    pub entries_added: u64,
    /// The number of the node appends go to. Redis keeps entries in
    /// radix-tree nodes of up to `stream-node-max-entries` appends, and
    /// approximate trimming removes whole nodes only; Keyway numbers them
    /// the same way (a new node when the tail one is full or gone) and
    /// records each entry's node in its data.
    pub node: u64,
    /// Entries appended to node `node` so far (deleted ones included, as
    /// Redis counts them).
    pub node_count: u64,
}

/// Bytes the stream part adds to a meta.
pub const STREAM_META_BYTES: usize = 9 * 8;

impl StreamMeta {
    pub fn encode_into(&self, out: &mut BytesMut) {
        for id in [self.last_id, self.max_deleted, self.first_id] {
            out.put_u64(id.ms);
            out.put_u64(id.seq);
        }
        out.put_u64(self.entries_added);
        out.put_u64(self.node);
        out.put_u64(self.node_count);
    }

    /// Inverse of [`StreamMeta::encode_into`].
    pub fn decode(b: &[u8]) -> Option<StreamMeta> {
        if b.len() != STREAM_META_BYTES {
            return None;
        }
        Some(StreamMeta {
            last_id: StreamId::from_bytes(&b[0..16])?,
            max_deleted: StreamId::from_bytes(&b[16..32])?,
            first_id: StreamId::from_bytes(&b[32..48])?,
            entries_added: u64::from_be_bytes(b[48..56].try_into().ok()?),
            node: u64::from_be_bytes(b[56..64].try_into().ok()?),
            node_count: u64::from_be_bytes(b[64..72].try_into().ok()?),
        })
    }
}

pub const ENTRY_TAG: u8 = 0x01;
pub const GROUP_TAG: u8 = 0x02;
pub const PEL_TAG: u8 = 0x03;
pub const CONSUMER_TAG: u8 = 0x04;

/// An entry's suffix.
pub fn entry_suffix(id: StreamId) -> Vec<u8> {
    let mut out = Vec::with_capacity(17);
    out.push(ENTRY_TAG);
    out.extend_from_slice(&id.to_bytes());
    out
}

/// The id an entry suffix names.
pub fn entry_id(suffix: &[u8]) -> Option<StreamId> {
    let rest = suffix.strip_prefix(&[ENTRY_TAG])?;
    if rest.len() != 16 {
        return None;
    }
    StreamId::from_bytes(rest)
}

fn put_leb(out: &mut BytesMut, mut n: u64) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.put_u8(byte);
            return;
        }
        out.put_u8(byte | 0x80);
    }
}

fn take_leb(data: &[u8], at: &mut usize) -> Option<u64> {
    let mut n = 0u64;
    for i in 0..10 {
        let byte = *data.get(*at)?;
        *at += 1;
        n |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(n);
        }
    }
    None
}

/// An entry's data: its node and field/value pairs.
pub fn encode_entry(node: u64, pairs: &[(Bytes, Bytes)]) -> Bytes {
    let len: usize = pairs.iter().map(|(f, v)| f.len() + v.len() + 4).sum();
    let mut out = BytesMut::with_capacity(len + 12);
    put_leb(&mut out, node);
    put_leb(&mut out, pairs.len() as u64);
    for (f, v) in pairs {
        put_leb(&mut out, f.len() as u64);
        out.put_slice(f);
        put_leb(&mut out, v.len() as u64);
        out.put_slice(v);
    }
    out.freeze()
}

/// An entry's node (the start of its data).
pub fn entry_node(data: &[u8]) -> Option<u64> {
    take_leb(data, &mut 0)
}

/// Inverse of [`encode_entry`].
pub fn decode_entry(data: &Bytes) -> Option<(u64, Vec<(Bytes, Bytes)>)> {
    let mut at = 0;
    let node = take_leb(data, &mut at)?;
    let n = take_leb(data, &mut at)?;
    let mut out = Vec::with_capacity(n.min(1024) as usize);
    let one = |at: &mut usize| -> Option<Bytes> {
        let len = take_leb(data, at)? as usize;
        let end = at.checked_add(len)?;
        let b = data.get(*at..end)?;
        *at = end;
        Some(data.slice_ref(b))
    };
    for _ in 0..n {
        let f = one(&mut at)?;
        let v = one(&mut at)?;
        out.push((f, v));
    }
    (at == data.len()).then_some((node, out))
}

/// A consumer group's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    pub last_id: StreamId,
    /// `-1`: unknown (Redis's `SCG_INVALID_ENTRIES_READ`).
    pub entries_read: i64,
}

pub fn group_suffix(name: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + name.len());
    out.push(GROUP_TAG);
    out.extend_from_slice(name);
    out
}

impl Group {
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(24);
        out.put_u64(self.last_id.ms);
        out.put_u64(self.last_id.seq);
        out.put_i64(self.entries_read);
        out.freeze()
    }

    pub fn decode(b: &[u8]) -> Option<Group> {
        if b.len() != 24 {
            return None;
        }
        Some(Group {
            last_id: StreamId::from_bytes(b)?,
            entries_read: i64::from_be_bytes(b[16..24].try_into().ok()?),
        })
    }
}

/// `tag be16(len) group`: the common start of a group's PEL or consumer suffixes.
pub fn group_scoped(tag: u8, group: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(3 + group.len() + 16);
    out.push(tag);
    out.extend_from_slice(&(group.len() as u16).to_be_bytes());
    out.extend_from_slice(group);
    out
}

pub fn pel_suffix(group: &[u8], id: StreamId) -> Vec<u8> {
    let mut out = group_scoped(PEL_TAG, group);
    out.extend_from_slice(&id.to_bytes());
    out
}

pub fn consumer_suffix(group: &[u8], consumer: &[u8]) -> Vec<u8> {
    let mut out = group_scoped(CONSUMER_TAG, group);
    out.extend_from_slice(consumer);
    out
}

/// A pending (delivered, not acknowledged) entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    pub delivery_time: u64,
    pub delivery_count: u64,
    pub consumer: Bytes,
}

impl Pending {
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(16 + self.consumer.len());
        out.put_u64(self.delivery_time);
        out.put_u64(self.delivery_count);
        out.put_slice(&self.consumer);
        out.freeze()
    }

    pub fn decode(b: &Bytes) -> Option<Pending> {
        Some(Pending {
            delivery_time: u64::from_be_bytes(b.get(..8)?.try_into().ok()?),
            delivery_count: u64::from_be_bytes(b.get(8..16)?.try_into().ok()?),
            consumer: b.slice(16..),
        })
    }
}

/// The suffix of the first sub-entry after every one starting with `prefix`
/// (`None`: there is none, `prefix` is all `0xff`).
pub fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut out = prefix.to_vec();
    while let Some(last) = out.pop() {
        if last < 0xff {
            out.push(last + 1);
            return Some(out);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn ids_sort_as_their_suffixes(a in any::<(u64, u64)>(), b in any::<(u64, u64)>()) {
            let (x, y) = (StreamId::new(a.0, a.1), StreamId::new(b.0, b.1));
            prop_assert_eq!(x.cmp(&y), entry_suffix(x).cmp(&entry_suffix(y)));
            prop_assert_eq!(entry_id(&entry_suffix(x)), Some(x));
        }

        #[test]
        fn fields_round_trip(pairs in proptest::collection::vec((any::<Vec<u8>>(), any::<Vec<u8>>()), 0..6)) {
            let pairs: Vec<(Bytes, Bytes)> = pairs.into_iter().map(|(f, v)| (f.into(), v.into())).collect();
            prop_assert_eq!(decode_entry(&encode_entry(7, &pairs)), Some((7, pairs)));
        }
    }

    #[test]
    fn metas_groups_and_pending_round_trip() {
        let m = StreamMeta {
            last_id: StreamId::new(5, 6),
            max_deleted: StreamId::new(3, 0),
            first_id: StreamId::new(1, 1),
            entries_added: 9,
            node: 4,
            node_count: 2,
        };
        let mut b = BytesMut::new();
        m.encode_into(&mut b);
        assert_eq!(StreamMeta::decode(&b), Some(m));
        let g = Group {
            last_id: StreamId::MAX,
            entries_read: -1,
        };
        assert_eq!(Group::decode(&g.encode()), Some(g));
        let p = Pending {
            delivery_time: 7,
            delivery_count: 2,
            consumer: Bytes::from_static(b"alice"),
        };
        assert_eq!(Pending::decode(&p.encode()), Some(p));
        assert_eq!(StreamId::MAX.incr(), None);
        assert_eq!(StreamId::MIN.decr(), None);
        assert_eq!(StreamId::new(1, u64::MAX).incr(), Some(StreamId::new(2, 0)));
        assert_eq!(successor(&[1, 0xff]), Some(vec![2]));
    }
}
