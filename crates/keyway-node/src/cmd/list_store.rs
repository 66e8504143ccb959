//! List storage operations over the collection layout (see [`crate::coll`]):
//! elements are sub-entries at suffix `be64(index)` for `index` in the meta's
//! `head..tail`, so pushes and pops at both ends and access by position are
//! O(1), and a range read is one ordered scan of the index window.
//!
//! Every function keeps `meta` in step (head, tail, size); the caller writes
//! it back once with [`Db::put_meta`] (size 0 deletes the key).

use bytes::Bytes;
use keyway_storage::{StorageError, ValueKind};

use super::CmdError;
use crate::coll::layout::{self, Meta};
use crate::db::Db;

/// Elements one range read fetches at a time when scanning a list.
pub(super) const LIST_SCAN_CHUNK_ELEMENTS: u64 = 256;

/// The list at `key` (`None` = absent; `WRONGTYPE` if another type).
pub(super) fn load(db: &mut Db<'_>, key: &[u8]) -> Result<Option<Meta>, CmdError> {
    db.meta(key, ValueKind::List)
}

fn missing(meta: &Meta, index: u64) -> CmdError {
    CmdError::Storage(StorageError::Corrupt {
        what: "list element",
        detail: format!(
            "no element at index {index} of a list with head {} and tail {}",
            meta.head, meta.tail
        ),
    })
}

/// Appends (`left`: prepends) `element`.
pub(super) fn push(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &mut Meta,
    left: bool,
    element: Bytes,
) -> Result<(), CmdError> {
    let index = if left { meta.head - 1 } else { meta.tail };
    db.sub_put(key, meta, &layout::list_suffix(index), element)?;
    if left {
        meta.head -= 1;
    } else {
        meta.tail += 1;
    }
    meta.size += 1;
    debug_assert_eq!(meta.tail - meta.head, meta.size);
    Ok(())
}

/// Removes and returns the first (`left`) or last element; the list must not be empty.
pub(super) fn pop(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &mut Meta,
    left: bool,
) -> Result<Bytes, CmdError> {
    assert!(meta.size > 0, "pop from an empty list");
    let index = if left { meta.head } else { meta.tail - 1 };
    let suffix = layout::list_suffix(index);
    let element = db
        .sub_get(key, meta, &suffix)?
        .ok_or_else(|| missing(meta, index))?;
    db.sub_delete(key, meta, &suffix)?;
    if left {
        meta.head += 1;
    } else {
        meta.tail -= 1;
    }
    meta.size -= 1;
    Ok(element)
}

/// The element at position `pos` (0-based from the head, `pos < size`).
pub(super) fn get(db: &mut Db<'_>, key: &[u8], meta: &Meta, pos: u64) -> Result<Bytes, CmdError> {
    debug_assert!(pos < meta.size);
    let index = meta.head + pos;
    db.sub_get(key, meta, &layout::list_suffix(index))?
        .ok_or_else(|| missing(meta, index))
}

/// Replaces the element at position `pos` (`pos < size`).
pub(super) fn set(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &Meta,
    pos: u64,
    element: Bytes,
) -> Result<(), CmdError> {
    debug_assert!(pos < meta.size);
    db.sub_put(key, meta, &layout::list_suffix(meta.head + pos), element)
}

/// Elements at positions `from..to` (0-based, `to <= size`), head to tail.
pub(super) fn range(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &Meta,
    from: u64,
    to: u64,
) -> Result<Vec<Bytes>, CmdError> {
    debug_assert!(from <= to && to <= meta.size);
    if from == to {
        return Ok(Vec::new());
    }
    let lo = layout::list_suffix(meta.head + from);
    let hi = layout::list_suffix(meta.head + to);
    let want = (to - from) as usize;
    let got = db.sub_range(key, meta, Some(&lo), Some(&hi), want)?;
    if got.len() != want {
        return Err(missing(meta, meta.head + from + got.len() as u64));
    }
    Ok(got.into_iter().map(|(_, e)| e).collect())
}

/// Every element, head to tail.
pub(super) fn all(db: &mut Db<'_>, key: &[u8], meta: &Meta) -> Result<Vec<Bytes>, CmdError> {
    range(db, key, meta, 0, meta.size)
}

/// Calls `visit(pos, element)` from the head (`forward`) or from the tail,
/// one chunk at a time, until it returns `false` or the list ends.
pub(super) fn scan(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &Meta,
    forward: bool,
    mut visit: impl FnMut(u64, &Bytes) -> bool,
) -> Result<(), CmdError> {
    if forward {
        let mut pos = 0;
        while pos < meta.size {
            let end = (pos + LIST_SCAN_CHUNK_ELEMENTS).min(meta.size);
            for (i, e) in range(db, key, meta, pos, end)?.iter().enumerate() {
                if !visit(pos + i as u64, e) {
                    return Ok(());
                }
            }
            pos = end;
        }
    } else {
        let mut end = meta.size;
        while end > 0 {
            let start = end.saturating_sub(LIST_SCAN_CHUNK_ELEMENTS);
            let chunk = range(db, key, meta, start, end)?;
            for (i, e) in chunk.iter().enumerate().rev() {
                if !visit(start + i as u64, e) {
                    return Ok(());
                }
            }
            end = start;
        }
    }
    Ok(())
}

/// Drops `front` elements from the head and `back` from the tail.
pub(super) fn trim(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &mut Meta,
    front: u64,
    back: u64,
) -> Result<(), CmdError> {
    assert!(front + back <= meta.size, "trim beyond the list");
    for index in meta.head..meta.head + front {
        db.sub_delete(key, meta, &layout::list_suffix(index))?;
    }
    for index in meta.tail - back..meta.tail {
        db.sub_delete(key, meta, &layout::list_suffix(index))?;
    }
    meta.head += front;
    meta.tail -= back;
    meta.size -= front + back;
    Ok(())
}

/// Replaces the list's elements `old` (all of them, head to tail) with
/// `new`, writing only what differs: the new elements are aligned either to
/// the current head or to the current tail, whichever rewrites fewer
/// entries, and only positions whose element changes are written or deleted.
pub(super) fn replace(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &mut Meta,
    old: &[Bytes],
    new: Vec<Bytes>,
) -> Result<(), CmdError> {
    assert_eq!(old.len() as u64, meta.size, "replace needs the whole list");
    let (old_len, new_len) = (old.len() as u64, new.len() as u64);
    // Writes if the new list starts at `head` (shift 0) or ends at `tail`.
    let cost = |new_head: u64| -> u64 {
        let mut writes = 0;
        for (i, e) in new.iter().enumerate() {
            let index = new_head + i as u64;
            let same =
                index >= meta.head && index < meta.tail && old[(index - meta.head) as usize] == *e;
            writes += u64::from(!same);
        }
        let new_tail = new_head + new_len;
        writes
            + (meta.head..meta.tail)
                .filter(|&i| i < new_head || i >= new_tail)
                .count() as u64
    };
    let head_aligned = meta.head;
    let tail_aligned = meta.tail - new_len.min(meta.tail);
    let new_head = if cost(tail_aligned) < cost(head_aligned) {
        tail_aligned
    } else {
        head_aligned
    };
    let new_tail = new_head + new_len;
    for (i, e) in new.into_iter().enumerate() {
        let index = new_head + i as u64;
        let same =
            index >= meta.head && index < meta.tail && old[(index - meta.head) as usize] == e;
        if !same {
            db.sub_put(key, meta, &layout::list_suffix(index), e)?;
        }
    }
    for index in meta.head..meta.tail {
        if index < new_head || index >= new_tail {
            db.sub_delete(key, meta, &layout::list_suffix(index))?;
        }
    }
    debug_assert!(old_len > 0, "an existing list is never empty");
    meta.head = new_head;
    meta.tail = new_tail;
    meta.size = new_len;
    Ok(())
}
