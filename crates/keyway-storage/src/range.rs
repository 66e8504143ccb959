//! Half-open ranges of routing keys, `[start, end)`.
//!
//! Routing keys sort in partition order, so a partition (e.g. one slot of one
//! keyspace) is a contiguous [`KeyRange`]; the engine never interprets keys.

use std::ops::Bound;

use bytes::Bytes;

/// Borrowed `(lower, upper)` bounds, as accepted by `BTreeMap::range` and fjall's `range`.
pub(crate) type Bounds<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// The half-open key range `[start, end)`; `end == None` means unbounded.
///
/// A range with `end <= start` is empty (never an error).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeyRange {
    /// Inclusive lower bound (the empty key = from the very beginning).
    pub start: Bytes,
    /// Exclusive upper bound, `None` = unbounded.
    pub end: Option<Bytes>,
}

impl KeyRange {
    /// `[start, end)`.
    pub fn new(start: impl Into<Bytes>, end: Option<Bytes>) -> Self {
        KeyRange {
            start: start.into(),
            end,
        }
    }

    /// Every key.
    pub fn all() -> Self {
        KeyRange {
            start: Bytes::new(),
            end: None,
        }
    }

    /// All keys starting with `prefix`.
    pub fn prefix(prefix: impl Into<Bytes>) -> Self {
        let start: Bytes = prefix.into();
        let end = prefix_successor(&start);
        KeyRange { start, end }
    }

    /// Whether `key` lies in `[start, end)`.
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= &self.start[..] && self.end.as_ref().is_none_or(|end| key < &end[..])
    }

    /// Whether the range can contain no key at all (`end <= start`).
    pub fn is_empty(&self) -> bool {
        self.end
            .as_ref()
            .is_some_and(|end| end[..] <= self.start[..])
    }

    /// Bounds of the keys of this range that are `> after` (or `>= start` when
    /// `after` is `None` or below `start`); `None` if that set is empty.
    /// Always safe to pass to `BTreeMap::range` / fjall `range` (never inverted).
    pub(crate) fn bounds_after<'a>(&'a self, after: Option<&'a [u8]>) -> Option<Bounds<'a>> {
        let lower = match after {
            Some(a) if a >= &self.start[..] => Bound::Excluded(a),
            _ => Bound::Included(&self.start[..]),
        };
        let upper = match &self.end {
            Some(end) => {
                let end = &end[..];
                let empty = match lower {
                    Bound::Included(l) => end <= l,
                    Bound::Excluded(l) => end <= l,
                    Bound::Unbounded => false,
                };
                if empty {
                    return None;
                }
                Bound::Excluded(end)
            }
            None => Bound::Unbounded,
        };
        Some((lower, upper))
    }
}

impl KeyRange {
    /// Bounds of the keys of this range that are `< before` (or `< end` when
    /// `before` is `None` or beyond `end`); `None` if that set is empty.
    /// The mirror of [`KeyRange::bounds_after`], for reverse scans.
    pub(crate) fn bounds_before<'a>(&'a self, before: Option<&'a [u8]>) -> Option<Bounds<'a>> {
        let upper: &[u8] = match (before, &self.end) {
            (Some(b), Some(end)) if b < &end[..] => b,
            (Some(b), None) => b,
            (_, Some(end)) => end,
            (None, None) => {
                return Some((Bound::Included(&self.start[..]), Bound::Unbounded));
            }
        };
        if upper <= &self.start[..] {
            return None;
        }
        Some((Bound::Included(&self.start[..]), Bound::Excluded(upper)))
    }
}

/// The smallest key greater than every key starting with `prefix`, or `None`
/// if there is none (prefix empty or all `0xff`).
pub fn prefix_successor(prefix: &[u8]) -> Option<Bytes> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(Bytes::from(end));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &'static [u8]) -> Bytes {
        Bytes::from_static(s)
    }

    #[test]
    fn contains_and_empty() {
        let r = KeyRange::new(b(b"b"), Some(b(b"d")));
        assert!(!r.contains(b"a"));
        assert!(r.contains(b"b"));
        assert!(r.contains(b"c\xff"));
        assert!(!r.contains(b"d"));
        assert!(!r.is_empty());
        assert!(KeyRange::new(b(b"d"), Some(b(b"d"))).is_empty());
        assert!(KeyRange::new(b(b"e"), Some(b(b"d"))).is_empty());
        assert!(KeyRange::all().contains(b""));
        assert!(KeyRange::all().contains(b"\xff\xff"));
        assert!(!KeyRange::all().is_empty());
    }

    #[test]
    fn prefix_ranges() {
        assert_eq!(prefix_successor(b"ab"), Some(b(b"ac")));
        assert_eq!(prefix_successor(b"a\xff"), Some(b(b"b")));
        assert_eq!(prefix_successor(b"\xff\xff"), None);
        assert_eq!(prefix_successor(b""), None);
        let r = KeyRange::prefix(b(b"a\xff"));
        assert!(r.contains(b"a\xff"));
        assert!(r.contains(b"a\xff\xff\xff"));
        assert!(!r.contains(b"b"));
    }

    #[test]
    fn bounds() {
        let r = KeyRange::new(b(b"b"), Some(b(b"d")));
        assert_eq!(
            r.bounds_after(None),
            Some((Bound::Included(&b"b"[..]), Bound::Excluded(&b"d"[..])))
        );
        assert_eq!(
            r.bounds_after(Some(b"a")),
            Some((Bound::Included(&b"b"[..]), Bound::Excluded(&b"d"[..])))
        );
        assert_eq!(
            r.bounds_after(Some(b"c")),
            Some((Bound::Excluded(&b"c"[..]), Bound::Excluded(&b"d"[..])))
        );
        assert_eq!(r.bounds_after(Some(b"d")), None);
        assert_eq!(r.bounds_after(Some(b"z")), None);
        assert_eq!(
            KeyRange::new(b(b"d"), Some(b(b"b"))).bounds_after(None),
            None
        );
    }
}
