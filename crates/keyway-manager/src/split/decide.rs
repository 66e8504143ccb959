//! The split policy, as a pure function of the map, one round's load, the
//! live migrations and the birth history: which partitions to split, where,
//! and why — and for each partition that needs attention but is left alone,
//! why not.
//!
//! Rules, in order, for a partition whose owner reported it at its current
//! epoch (a missing or stale report resets its load window):
//! - nothing to say unless it is *big* (`bytes > split_max_bytes`) or *hot*
//!   (`requests/s > split_max_requests_per_sec`; the first snapshot where it
//!   is hot starts its window, any snapshot where it is not ends it);
//! - `migrating`: it has a live migration — never split;
//! - `cooldown`: born by a split or merge less than `split_cooldown_ms` ago;
//! - hot for at least `split_load_window_ms`: split at the owner's
//!   `load_split_key` (reason `load`), unless one key carries more than
//!   `split_single_key_share` of the sampled requests (`single_key`: no
//!   split point divides one key's load), no key was reported
//!   (`no_split_key`), or the partition is a single slot (`single_slot`);
//! - big: split at the owner's `size_split_key` (reason `size`);
//! - otherwise hot but not for long enough yet: `warming`.
//!
//! A hash partition splits only between slots: the reported routing key is
//! rounded to a slot boundary strictly inside ([`hash_split_slot`]).

use super::{Busy, History, SplitAt, SplitConfig, hash_split_slot, resolve_split_point};
use crate::stats::{ClusterLoad, PartitionLoad, key_text};
use keyway_map::{
    Epoch, Keyspace, NodeId, PartitionId, PartitionMap, PartitionRecord, Routing, to_hex,
};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// What to do with one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SplitAction {
    Split(SplitAt),
    /// Leave it alone (the verdict's reason says why).
    Hold,
}

/// One decision about one partition.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitVerdict {
    pub partition: PartitionId,
    /// The `(owner, epoch)` decided on: the split is conditional on it.
    pub expected: (NodeId, Epoch),
    pub action: SplitAction,
    /// `size`, `load`; or why not: `single_key`, `migrating`, `cooldown`,
    /// `warming`, `single_slot`, `no_split_key`, `no_split_point`.
    pub reason: &'static str,
    /// The figures behind it, for people.
    pub detail: String,
}

/// The split policy's memory between rounds: since when each partition has
/// been hot.
#[derive(Default, Debug)]
pub struct SplitPolicy {
    hot_since: HashMap<PartitionId, Instant>,
}

/// `p`'s load, if its owner reported it at its current owner and epoch.
pub(crate) fn usable<'a>(load: &'a ClusterLoad, p: &PartitionRecord) -> Option<&'a PartitionLoad> {
    load.partitions
        .get(&p.id)
        .filter(|l| l.epoch == p.epoch && l.node == p.owner)
}

impl SplitPolicy {
    /// Decides one round (see the module docs). `now` is when the load was
    /// measured.
    pub fn decide(
        &mut self,
        cfg: &SplitConfig,
        map: &PartitionMap,
        load: &ClusterLoad,
        busy: &Busy,
        history: &History,
        now: Instant,
    ) -> Vec<SplitVerdict> {
        self.hot_since
            .retain(|id, _| map.partitions.contains_key(id));
        let window = Duration::from_millis(cfg.split_load_window_ms);
        let cooldown = Duration::from_millis(cfg.split_cooldown_ms);
        let mut out = Vec::new();
        for p in map.partitions.values() {
            let (Some(l), Some(ks)) = (usable(load, p), map.keyspaces.get(&p.keyspace)) else {
                self.hot_since.remove(&p.id);
                continue;
            };
            let rps = l.requests_per_sec();
            let hot_for = if rps > cfg.split_max_requests_per_sec {
                let since = *self.hot_since.entry(p.id).or_insert(now);
                Some(now.saturating_duration_since(since))
            } else {
                self.hot_since.remove(&p.id);
                None
            };
            let big = l.bytes > cfg.split_max_bytes;
            if hot_for.is_none() && !big {
                continue;
            }
            let figures = format!("{rps:.0} requests/s, {} bytes, {} keys", l.bytes, l.keys);
            let verdict = |action, reason, detail: String| SplitVerdict {
                partition: p.id,
                expected: (p.owner, p.epoch),
                action,
                reason,
                detail,
            };
            if let Some((migration, state)) = busy.get(&p.id) {
                let detail = format!("{figures}; migration {migration} is in {state}");
                out.push(verdict(SplitAction::Hold, "migrating", detail));
                continue;
            }
            if let Some(how) = history.born_within(p.id, cooldown, now) {
                let detail = format!("{figures}; born by a {how:?} less than {cooldown:?} ago");
                out.push(verdict(SplitAction::Hold, "cooldown", detail));
                continue;
            }
            let mut hold = None;
            if hot_for.is_some_and(|d| d >= window) {
                match load_point(cfg, ks, p, l) {
                    Ok(at) => {
                        let detail = format!("{figures}, hot for {window:?}; at {at}");
                        out.push(verdict(SplitAction::Split(at), "load", detail));
                        continue;
                    }
                    Err(why) => hold = Some(why),
                }
            }
            if big {
                let point = match &l.size_split_key {
                    Some(key) => point_near(ks, p, key),
                    None => Err((
                        "no_split_key",
                        "the owner reported no size split key".into(),
                    )),
                };
                match point {
                    Ok(at) => {
                        let detail = format!("{figures} > {}; at {at}", cfg.split_max_bytes);
                        out.push(verdict(SplitAction::Split(at), "size", detail));
                        continue;
                    }
                    Err(why) => {
                        hold.get_or_insert(why);
                    }
                }
            }
            let (reason, why) = hold.unwrap_or_else(|| {
                let hot = hot_for.unwrap_or_default();
                ("warming", format!("hot for {hot:?} of {window:?}"))
            });
            out.push(verdict(
                SplitAction::Hold,
                reason,
                format!("{figures}; {why}"),
            ));
        }
        out
    }

    /// The partitions above `split_max_requests_per_sec` in the last round.
    pub fn hot(&self) -> HashSet<PartitionId> {
        self.hot_since.keys().copied().collect()
    }

    /// Forgets every window (the manager stopped leading).
    pub fn clear(&mut self) {
        self.hot_since.clear();
    }
}

type Why = (&'static str, String);

/// Where the sampled load splits evenly, unless one key dominates.
fn load_point(
    cfg: &SplitConfig,
    ks: &Keyspace,
    p: &PartitionRecord,
    l: &PartitionLoad,
) -> Result<SplitAt, Why> {
    if l.top_key_share > cfg.split_single_key_share {
        let key = l.hot_keys.first().map(|k| key_text(&k.key));
        return Err((
            "single_key",
            format!(
                "key {} carries {:.0}% of the sampled requests (> {:.0}%): splitting cannot divide it",
                key.as_deref().unwrap_or("?"),
                l.top_key_share * 100.0,
                cfg.split_single_key_share * 100.0
            ),
        ));
    }
    match &l.load_split_key {
        Some(key) => point_near(ks, p, key),
        None => Err((
            "no_split_key",
            "the owner reported no load split key (too few samples)".into(),
        )),
    }
}

/// The split point for a reported routing key: a slot boundary next to it
/// (hash), or the key itself (range), strictly inside `p`.
fn point_near(ks: &Keyspace, p: &PartitionRecord, key: &[u8]) -> Result<SplitAt, Why> {
    match ks.routing {
        Routing::Hash => {
            let (first, last) = p.slot_span();
            if first == last {
                return Err(("single_slot", format!("it covers slot {first} only")));
            }
            hash_split_slot(p, key).map(SplitAt::Slot).ok_or_else(|| {
                let why = format!("no slot boundary near 0x{} inside", to_hex(key));
                ("no_split_point", why)
            })
        }
        Routing::Range => {
            let at = SplitAt::Bound(bytes::Bytes::copy_from_slice(key));
            match resolve_split_point(ks, p, &at, None) {
                Ok(_) => Ok(at),
                Err(e) => Err(("no_split_point", e.to_string())),
            }
        }
    }
}
