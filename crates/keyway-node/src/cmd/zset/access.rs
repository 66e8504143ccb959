//! A sorted set's entries over the collection layout: member entries
//! (`0x01 member → score`) and the score index (`0x02 sortable(score)
//! member → ∅`), read in chunks in either direction.
//!
//! Negative zero is stored as `0` (the layout's sortable encoding
//! normalises it), as Redis 7.0 stores it in a listpack-encoded (small)
//! sorted set, where `double2ll` turns `-0` into the integer 0; replies
//! computed on the fly (ZINCRBY of a new member by `-0`, ZUNION with a
//! negative weight) still print `-0`, as Redis's do. (A skiplist-encoded,
//! big Redis sorted set keeps `-0`; Keyway does not.)

use std::collections::VecDeque;

use bytes::Bytes;
use keyway_storage::ValueKind;

use crate::cmd::CmdError;
use crate::coll::layout::{self, Meta};
use crate::db::Db;

/// Index entries one chunked read fetches.
const WALK_CHUNK_ENTRIES: usize = 256;

/// The sorted set at `key`: `None` if absent, WRONGTYPE if another type.
pub(super) fn open(db: &mut Db<'_>, key: &[u8]) -> Result<Option<Meta>, CmdError> {
    db.meta(key, ValueKind::ZSet)
}

/// A member entry's score (a corrupt entry reads as 0).
pub(super) fn decode_member_data(data: &[u8]) -> f64 {
    layout::decode_score(data).unwrap_or(0.0)
}

/// The suffix bound just above every key starting with `suffix`.
pub(super) fn successor(suffix: &[u8]) -> Vec<u8> {
    let mut v = suffix.to_vec();
    v.push(0);
    v
}

/// The index prefix of all members with score bits `bits` (sortable).
pub(super) fn score_prefix(bits: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(9);
    v.push(layout::ZSET_SCORE_TAG);
    v.extend_from_slice(&bits.to_be_bytes());
    v
}

/// The bound above every index entry.
pub(super) fn index_end() -> Vec<u8> {
    vec![layout::ZSET_SCORE_TAG + 1]
}

/// The bound below every index entry.
pub(super) fn index_start() -> Vec<u8> {
    vec![layout::ZSET_SCORE_TAG]
}

/// One member and its score, as the index orders them.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Entry {
    pub member: Bytes,
    pub score: f64,
}

fn decode_index(suffix: &Bytes) -> Option<Entry> {
    let (score, member) = layout::zset_score_parts(suffix)?;
    Some(Entry {
        member: suffix.slice_ref(member),
        score,
    })
}

/// The score of `member`.
pub(super) fn score(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &Meta,
    member: &[u8],
) -> Result<Option<f64>, CmdError> {
    let data = db.sub_get(key, meta, &layout::zset_member_suffix(member))?;
    Ok(data.map(|d| decode_member_data(&d)))
}

/// Sets `member`'s score to `new` (its old score `old`, `None` if new),
/// keeping `meta.size` right. The caller writes the meta.
pub(super) fn put(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &mut Meta,
    member: &[u8],
    old: Option<f64>,
    new: f64,
) -> Result<(), CmdError> {
    debug_assert!(!new.is_nan(), "a score is never NaN");
    match old {
        Some(old) => db.sub_delete(key, meta, &layout::zset_score_suffix(old, member))?,
        None => meta.size += 1,
    }
    db.sub_put(
        key,
        meta,
        &layout::zset_member_suffix(member),
        layout::encode_score(new),
    )?;
    db.sub_put(
        key,
        meta,
        &layout::zset_score_suffix(new, member),
        Bytes::new(),
    )?;
    Ok(())
}

/// Removes `member` (whose score is `score`), keeping `meta.size` right.
pub(super) fn remove(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &mut Meta,
    member: &[u8],
    score: f64,
) -> Result<(), CmdError> {
    db.sub_delete(key, meta, &layout::zset_member_suffix(member))?;
    db.sub_delete(key, meta, &layout::zset_score_suffix(score, member))?;
    debug_assert!(meta.size > 0, "removing from an empty sorted set");
    meta.size -= 1;
    Ok(())
}

/// Replaces whatever `key` holds with a sorted set of `entries` (distinct
/// members); none deletes the key. The key loses its TTL, as Redis's `setKey`.
pub(super) fn store(db: &mut Db<'_>, key: &[u8], entries: &[Entry]) -> Result<(), CmdError> {
    db.delete(key)?;
    let mut meta = db.new_meta(ValueKind::ZSet);
    for e in entries {
        put(db, key, &mut meta, &e.member, None, e.score)?;
    }
    db.put_meta(key, &meta)?;
    Ok(())
}

/// A chunked walk over the score index between suffix bounds `[from, to)`,
/// ascending or descending.
pub(super) struct Walk {
    from: Vec<u8>,
    to: Vec<u8>,
    reverse: bool,
    buf: VecDeque<(Bytes, Bytes)>,
    done: bool,
}

impl Walk {
    /// The whole index.
    pub(super) fn all(reverse: bool) -> Walk {
        Walk::between(index_start(), index_end(), reverse)
    }

    /// Index entries with suffix in `[from, to)`.
    pub(super) fn between(from: Vec<u8>, to: Vec<u8>, reverse: bool) -> Walk {
        Walk {
            from,
            to,
            reverse,
            buf: VecDeque::new(),
            done: false,
        }
    }

    /// The next entry, or `None` at the end.
    pub(super) fn next(
        &mut self,
        db: &mut Db<'_>,
        key: &[u8],
        meta: &Meta,
    ) -> Result<Option<Entry>, CmdError> {
        loop {
            if let Some((suffix, _)) = self.buf.pop_front() {
                match decode_index(&suffix) {
                    Some(e) => return Ok(Some(e)),
                    None => continue,
                }
            }
            if self.done || self.from >= self.to {
                return Ok(None);
            }
            let chunk = if self.reverse {
                db.sub_range_rev(
                    key,
                    meta,
                    Some(&self.from),
                    Some(&self.to),
                    WALK_CHUNK_ENTRIES,
                )?
            } else {
                db.sub_range(
                    key,
                    meta,
                    Some(&self.from),
                    Some(&self.to),
                    WALK_CHUNK_ENTRIES,
                )?
            };
            self.done = chunk.len() < WALK_CHUNK_ENTRIES;
            if let Some((last, _)) = chunk.last() {
                if self.reverse {
                    self.to = last.to_vec();
                } else {
                    self.from = successor(last);
                }
            }
            self.buf.extend(chunk);
        }
    }

    /// Skips up to `n` entries; returns how many were skipped.
    pub(super) fn skip(
        &mut self,
        db: &mut Db<'_>,
        key: &[u8],
        meta: &Meta,
        n: u64,
    ) -> Result<u64, CmdError> {
        let mut skipped = 0;
        while skipped < n {
            if self.next(db, key, meta)?.is_none() {
                break;
            }
            skipped += 1;
        }
        Ok(skipped)
    }
}

/// The first (`last: false`) or last entry of the index.
pub(super) fn end_entry(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &Meta,
    last: bool,
) -> Result<Option<Entry>, CmdError> {
    Walk::all(last).next(db, key, meta)
}

/// The 0-based rank of the index entry `(score, member)` (which must
/// exist): counts from whichever end reaches it first, so ranks near either
/// end are cheap.
pub(super) fn rank(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &Meta,
    score: f64,
    member: &[u8],
) -> Result<u64, CmdError> {
    let target = layout::zset_score_suffix(score, member);
    let mut front = Walk::between(index_start(), target.clone(), false);
    let mut back = Walk::between(successor(&target), index_end(), true);
    let (mut before, mut after) = (0u64, 0u64);
    loop {
        // Alternate one chunk's worth from each side.
        for _ in 0..WALK_CHUNK_ENTRIES {
            if front.next(db, key, meta)?.is_none() {
                return Ok(before);
            }
            before += 1;
        }
        for _ in 0..WALK_CHUNK_ENTRIES {
            if back.next(db, key, meta)?.is_none() {
                return Ok(meta.size.saturating_sub(after + 1));
            }
            after += 1;
        }
    }
}

/// A Redis set's or sorted set's members as set-algebra inputs (a set
/// member's score is 1).
pub(super) enum Source {
    Missing,
    ZSet(Meta),
    Set(Meta),
}

impl Source {
    /// Opens `key` as an input: WRONGTYPE unless it is a set or sorted set.
    pub(super) fn open(db: &mut Db<'_>, key: &[u8]) -> Result<Source, CmdError> {
        match db.kind_of(key)? {
            None => Ok(Source::Missing),
            Some(ValueKind::ZSet) => Ok(open(db, key)?.map_or(Source::Missing, Source::ZSet)),
            Some(ValueKind::Set) => Ok(db
                .meta(key, ValueKind::Set)?
                .map_or(Source::Missing, Source::Set)),
            Some(_) => Err(crate::cmd::reply_err(crate::cmd::errors::WRONGTYPE)),
        }
    }

    pub(super) fn len(&self) -> u64 {
        match self {
            Source::Missing => 0,
            Source::ZSet(m) | Source::Set(m) => m.size,
        }
    }

    /// Every member with its score (sorted sets in score order).
    pub(super) fn entries(&self, db: &mut Db<'_>, key: &[u8]) -> Result<Vec<Entry>, CmdError> {
        match self {
            Source::Missing => Ok(Vec::new()),
            Source::Set(meta) => Ok(db
                .sub_all(key, meta)?
                .into_iter()
                .map(|(member, _)| Entry { member, score: 1.0 })
                .collect()),
            Source::ZSet(meta) => {
                let mut walk = Walk::all(false);
                let mut out = Vec::with_capacity(meta.size.min(1 << 16) as usize);
                while let Some(e) = walk.next(db, key, meta)? {
                    out.push(e);
                }
                Ok(out)
            }
        }
    }

    /// The score of `member` in this input.
    pub(super) fn find(
        &self,
        db: &mut Db<'_>,
        key: &[u8],
        member: &[u8],
    ) -> Result<Option<f64>, CmdError> {
        match self {
            Source::Missing => Ok(None),
            Source::Set(meta) => Ok(db.sub_get(key, meta, member)?.map(|_| 1.0)),
            Source::ZSet(meta) => score(db, key, meta, member),
        }
    }
}
