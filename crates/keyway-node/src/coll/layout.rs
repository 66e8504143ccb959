//! The on-disk layout of collections: the meta encoding, sub-entry keys and
//! the per-type suffixes (see the module docs of [`crate::coll`]).

use bytes::{BufMut, Bytes, BytesMut};
use keyway_map::{Keyspace, Routing, key_hash_slot};
use keyway_storage::ValueKind;
use std::sync::OnceLock;

use super::stream::{STREAM_META_BYTES, StreamMeta};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes a sub-entry key adds around the user key and its suffix:
/// keyspace (4), slot (2), `{kw}` (4), key length (2), version (8).
pub const SUB_KEY_OVERHEAD_BYTES: usize = 4 + 2 + 4 + 2 + 8;

/// The index of the first element of a new list (head and tail start here,
/// so a list can grow 2^63 elements either way).
pub const LIST_START_INDEX: u64 = 1 << 63;

/// The hidden hash tags: a sub-entry's user part starts with `{kw}`, or
/// `{KW}` in the one slot `kw` itself hashes to, so it never hashes to the
/// slot it is stored under (and so never equals a user key of that slot).
const TAG_A: &[u8] = b"{kw}";
const TAG_B: &[u8] = b"{KW}";

/// The hidden tag for sub-entries stored under `slot`.
fn tag_for(slot: u16) -> &'static [u8] {
    if key_hash_slot(TAG_A) == slot {
        TAG_B
    } else {
        TAG_A
    }
}

/// The meta of a collection: what its top-level entry's data holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// Hash, List, Set or ZSet.
    pub kind: ValueKind,
    /// Names this incarnation of the key: sub-entries of any other version are garbage.
    pub version: u64,
    /// Fields / elements / members.
    pub size: u64,
    /// Lists only: index of the first element.
    pub head: u64,
    /// Lists only: one past the index of the last element.
    pub tail: u64,
    /// Hashes only: the insertion sequence the next new field gets (see
    /// [`hash_value`]).
    pub next_seq: u64,
    /// Streams only: ids and counters (see [`crate::coll::stream`]).
    pub stream: StreamMeta,
}

impl Meta {
    /// An empty collection of `kind` with a fresh version.
    pub fn fresh(kind: ValueKind) -> Meta {
        assert!(kind.is_collection(), "{kind:?} is not a collection");
        Meta {
            kind,
            version: fresh_version(),
            size: 0,
            head: LIST_START_INDEX,
            tail: LIST_START_INDEX,
            next_seq: 0,
            stream: StreamMeta::default(),
        }
    }

    /// The top-level entry's data: `version u64 | size u64`, then for a
    /// list `| head u64 | tail u64`, for a hash `| next_seq u64`, for a
    /// stream [`StreamMeta`] (`| last_id | max_deleted | first_id` as
    /// `ms u64 | seq u64` each, `| entries_added u64`).
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(32);
        out.put_u64(self.version);
        out.put_u64(self.size);
        if self.kind == ValueKind::List {
            debug_assert_eq!(self.tail - self.head, self.size, "list meta out of step");
            out.put_u64(self.head);
            out.put_u64(self.tail);
        }
        if self.kind == ValueKind::Hash {
            out.put_u64(self.next_seq);
        }
        if self.kind == ValueKind::Stream {
            self.stream.encode_into(&mut out);
        }
        out.freeze()
    }

    /// Inverse of [`Meta::encode`]; `None` if `data` is not a meta of `kind`.
    pub fn decode(kind: ValueKind, data: &[u8]) -> Option<Meta> {
        if !kind.is_collection() {
            return None;
        }
        let word = |i: usize| -> Option<u64> {
            Some(u64::from_be_bytes(
                data.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        let (version, size) = (word(0)?, word(1)?);
        let (head, tail) = match kind {
            ValueKind::List => (word(2)?, word(3)?),
            _ => (LIST_START_INDEX, LIST_START_INDEX),
        };
        let next_seq = match kind {
            ValueKind::Hash => word(2)?,
            _ => 0,
        };
        let stream = match kind {
            ValueKind::Stream => StreamMeta::decode(data.get(16..)?)?,
            _ => StreamMeta::default(),
        };
        let want_len = match kind {
            ValueKind::List => 32,
            ValueKind::Hash => 24,
            ValueKind::Stream => 16 + STREAM_META_BYTES,
            _ => 16,
        };
        if data.len() != want_len
            || (kind == ValueKind::List && tail.checked_sub(head) != Some(size))
        {
            return None;
        }
        Some(Meta {
            kind,
            version,
            size,
            head,
            tail,
            next_seq,
            stream,
        })
    }
}

/// A hash field's sub-entry data: `leb128(seq) ++ value`, where `seq` is
/// the field's insertion sequence (from [`Meta::next_seq`], kept when the
/// field is overwritten), so a small hash can answer in insertion order as
/// Redis's listpack does.
pub fn hash_value(seq: u64, value: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(10 + value.len());
    let mut n = seq;
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.put_u8(byte);
            break;
        }
        out.put_u8(byte | 0x80);
    }
    out.put_slice(value);
    out.freeze()
}

/// Inverse of [`hash_value`]: `(seq, value)`; `None` if `data` is not one.
pub fn hash_value_parts(data: &Bytes) -> Option<(u64, Bytes)> {
    let mut seq = 0u64;
    for (i, byte) in data.iter().enumerate().take(10) {
        seq |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((seq, data.slice(i + 1..)));
        }
    }
    None
}

/// A version no live or dead incarnation of any key has had (with
/// overwhelming probability across processes, certainly within one):
/// a bijective mix of a per-process random seed and a counter.
pub fn fresh_version() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let addr = &COUNTER as *const AtomicU64 as u64;
        splitmix64(nanos ^ (u64::from(std::process::id()) << 32) ^ addr)
    });
    loop {
        let v = splitmix64(seed.wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed)));
        if v != 0 {
            return v;
        }
    }
}

/// splitmix64's finaliser: a bijection on `u64`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The storage-key prefix of every sub-entry of `key` at `version`:
/// `be32(ks) ++ be16(slot) ++ {kw} ++ be16(key_len) ++ key ++ be64(version)`.
/// Collections exist only in hash-routed keyspaces (the Redis keyspace).
pub fn sub_prefix(keyspace: &Keyspace, key: &[u8], version: u64) -> Bytes {
    debug_assert_eq!(keyspace.routing, Routing::Hash);
    let slot = key_hash_slot(key);
    let mut out = BytesMut::with_capacity(SUB_KEY_OVERHEAD_BYTES + key.len());
    out.put_u32(keyspace.id.0);
    out.put_u16(slot);
    out.put_slice(tag_for(slot));
    out.put_u16(u16::try_from(key.len()).expect("user keys are shorter than 64 KiB"));
    out.put_slice(key);
    out.put_u64(version);
    out.freeze()
}

/// What a sub-entry's storage key names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubKey<'a> {
    /// The slot it is stored under (its key's slot).
    pub slot: u16,
    pub user_key: &'a [u8],
    pub version: u64,
    pub suffix: &'a [u8],
}

impl<'a> SubKey<'a> {
    /// Decodes a sub-entry storage key; `None` if it is not one.
    pub fn decode(storage_key: &'a [u8]) -> Option<SubKey<'a>> {
        let rest = storage_key.get(4..)?;
        let slot = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?);
        let rest = rest.get(2..)?;
        let rest = rest.strip_prefix(tag_for(slot))?;
        let len = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?) as usize;
        let user_key = rest.get(2..2 + len)?;
        let version = u64::from_be_bytes(rest.get(2 + len..2 + len + 8)?.try_into().ok()?);
        let suffix = rest.get(2 + len + 8..)?;
        Some(SubKey {
            slot,
            user_key,
            version,
            suffix,
        })
    }
}

/// A list element's suffix: its index.
pub fn list_suffix(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// Inverse of [`list_suffix`].
pub fn list_index(suffix: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(suffix.try_into().ok()?))
}

/// Sorted sets: the member entry's suffix tag (`member -> score`).
pub const ZSET_MEMBER_TAG: u8 = 0x01;
/// Sorted sets: the score index's suffix tag (`score ++ member -> empty`).
pub const ZSET_SCORE_TAG: u8 = 0x02;

/// A zset member entry's suffix.
pub fn zset_member_suffix(member: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + member.len());
    out.push(ZSET_MEMBER_TAG);
    out.extend_from_slice(member);
    out
}

/// A zset score-index entry's suffix: score order, then member order (as Redis sorts).
pub fn zset_score_suffix(score: f64, member: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + member.len());
    out.push(ZSET_SCORE_TAG);
    out.extend_from_slice(&score_to_sortable(score).to_be_bytes());
    out.extend_from_slice(member);
    out
}

/// Splits a score-index suffix into `(score, member)`.
pub fn zset_score_parts(suffix: &[u8]) -> Option<(f64, &[u8])> {
    let rest = suffix.strip_prefix(&[ZSET_SCORE_TAG])?;
    let bits = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    Some((sortable_to_score(bits), rest.get(8..)?))
}

/// The member entry's data: the score, as sortable bits.
pub fn encode_score(score: f64) -> Bytes {
    Bytes::copy_from_slice(&score_to_sortable(score).to_be_bytes())
}

/// Inverse of [`encode_score`].
pub fn decode_score(data: &[u8]) -> Option<f64> {
    Some(sortable_to_score(u64::from_be_bytes(data.try_into().ok()?)))
}

/// Order-preserving bits of a score (`-0.0` is `0.0`; scores are never NaN).
pub fn score_to_sortable(score: f64) -> u64 {
    debug_assert!(!score.is_nan(), "a score is never NaN");
    let score = if score == 0.0 { 0.0 } else { score };
    let bits = score.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | (1 << 63)
    }
}

/// Inverse of [`score_to_sortable`].
pub fn sortable_to_score(bits: u64) -> f64 {
    if bits >> 63 == 1 {
        f64::from_bits(bits & !(1 << 63))
    } else {
        f64::from_bits(!bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::DEFAULT_KEYSPACE;
    use proptest::prelude::*;

    fn ks() -> Keyspace {
        Keyspace::new(DEFAULT_KEYSPACE, "default", Routing::Hash)
    }

    #[test]
    fn metas_round_trip_and_reject_what_they_are_not() {
        let mut m = Meta::fresh(ValueKind::List);
        m.head -= 2;
        m.size = 2;
        assert_eq!(Meta::decode(ValueKind::List, &m.encode()), Some(m));
        let h = Meta {
            size: 7,
            next_seq: 9,
            ..Meta::fresh(ValueKind::Hash)
        };
        assert_eq!(Meta::decode(ValueKind::Hash, &h.encode()), Some(h));
        assert_eq!(Meta::decode(ValueKind::String, &h.encode()), None);
        assert_eq!(Meta::decode(ValueKind::List, &h.encode()), None);
        assert_eq!(Meta::decode(ValueKind::Hash, b"short"), None);
        let s = Meta {
            size: 3,
            ..Meta::fresh(ValueKind::Set)
        };
        assert_eq!(Meta::decode(ValueKind::Set, &s.encode()), Some(s));
        assert_eq!(Meta::decode(ValueKind::Hash, &s.encode()), None);
    }

    proptest! {
        #[test]
        fn hash_values_round_trip(seq in any::<u64>(), value in proptest::collection::vec(any::<u8>(), 0..40)) {
            let data = hash_value(seq, &value);
            prop_assert_eq!(hash_value_parts(&data), Some((seq, Bytes::from(value))));
        }
    }

    #[test]
    fn versions_are_distinct_and_never_zero() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let v = fresh_version();
            assert_ne!(v, 0);
            assert!(seen.insert(v));
        }
    }

    #[test]
    fn a_sub_entry_lies_in_its_keys_slot_but_never_equals_a_user_key_of_that_slot() {
        let ks = ks();
        assert_ne!(key_hash_slot(b"kw"), key_hash_slot(b"KW"));
        // "kw" hashes to some slot: keys of that slot use the other tag.
        let kw_slot = key_hash_slot(b"kw");
        let mut same_slot_key = None;
        for i in 0..200_000u32 {
            let k = format!("k{i}");
            if key_hash_slot(k.as_bytes()) == kw_slot {
                same_slot_key = Some(k);
                break;
            }
        }
        for key in [
            b"user".to_vec(),
            b"{kw}x".to_vec(),
            same_slot_key.unwrap().into_bytes(),
        ] {
            let slot = key_hash_slot(&key);
            let mut sk = sub_prefix(&ks, &key, 42).to_vec();
            sk.extend_from_slice(b"field");
            let top = ks.storage_key(&key);
            assert_eq!(sk[..6], top[..6], "same keyspace and slot prefix");
            // The user part of the sub-entry key hashes elsewhere.
            assert_ne!(key_hash_slot(&sk[6..]), slot);
            let d = SubKey::decode(&sk).unwrap();
            assert_eq!(
                (d.slot, d.user_key, d.version, d.suffix),
                (slot, &key[..], 42, &b"field"[..])
            );
            // And a top-level key never decodes as a sub-entry.
            assert!(SubKey::decode(&top).is_none());
        }
    }

    proptest! {
        #[test]
        fn sortable_scores_keep_order(a in any::<f64>(), b in any::<f64>()) {
            prop_assume!(!a.is_nan() && !b.is_nan());
            let (sa, sb) = (score_to_sortable(a), score_to_sortable(b));
            prop_assert_eq!(a.partial_cmp(&b).unwrap(), sa.cmp(&sb));
            let back = sortable_to_score(sa);
            prop_assert!(back == a);
        }
    }
}
