//! Reverse reads of a collection's sub-entries (sorted sets read from the
//! top: ZPOPMAX, ZREVRANGE, ZREVRANK, the last member of a lex range), the
//! mirror of [`Db::sub_range`] over [`keyway_storage::Engine::scan_rev`],
//! merged with the command's own pending writes.

use std::collections::VecDeque;
use std::ops::Bound;

use bytes::Bytes;
use keyway_storage::Value;

use super::Db;
use crate::cmd::CmdError;
use crate::coll::layout::Meta;

/// Entries one engine reverse scan of a collection range reads at a time.
const SUB_SCAN_REV_CHUNK_ENTRIES: usize = 512;

impl<'a> Db<'a> {
    /// Sub-entries of `meta` whose suffix is in `[from, to)` (`None` =
    /// unbounded), **descending**, at most `limit`, as `(suffix, data)`,
    /// this command's own writes included.
    pub(crate) fn sub_range_rev(
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
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let mut overlay = self.subs.range((lower, upper)).rev().peekable();
        let mut from_engine: VecDeque<(Bytes, Value)> = VecDeque::new();
        let mut before: Option<Bytes> = None;
        let mut engine_done = false;
        let mut out = Vec::new();
        while out.len() < limit {
            if from_engine.is_empty() && !engine_done {
                let chunk =
                    self.engine
                        .scan_rev(&range, before.as_deref(), SUB_SCAN_REV_CHUNK_ENTRIES)?;
                engine_done = chunk.next.is_none();
                before = chunk.next;
                from_engine.extend(chunk.entries);
            }
            let (take_overlay, shadowed) = match (from_engine.front(), overlay.peek()) {
                (None, None) => break,
                (Some(_), None) => (false, false),
                (None, Some(_)) => (true, false),
                (Some((ek, _)), Some((ok, _))) => (*ok >= ek, *ok == ek),
            };
            if shadowed {
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
}
