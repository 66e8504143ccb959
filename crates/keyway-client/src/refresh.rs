//! Map refreshes: `KW.MAP SINCE <version>` (a delta, or the whole map when
//! the node's history does not reach back), single-flight and rate-limited.
//!
//! Single flight: a caller passes the cache generation it routed by. Under
//! the refresh lock, a generation that has moved on means a refresh began
//! after the caller routed (and has finished), so the caller uses that one
//! ([`Refresh::Coalesced`]); concurrent callers therefore wait for the one
//! refresh in flight rather than start their own. Rate limit: a refresh
//! asked for by a rejection within `min_refresh_interval_ms` of the last
//! one's start is skipped ([`Refresh::Suppressed`]); the caller patches from
//! the rejection instead.

use crate::{Client, ClientError};
use bytes::Bytes;
use keyway_map::{MapChange, MapSince, MapVersion, PartitionMap};
use keyway_resp::Frame;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a refresh request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refresh {
    /// This caller refreshed the map.
    Done,
    /// A refresh that began after the caller routed served it.
    Coalesced,
    /// Within `min_refresh_interval_ms` of the last refresh: skipped.
    Suppressed,
}

/// The refresh lock and the rate limit's clock.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    lock: tokio::sync::Mutex<()>,
    last_start: Mutex<Option<Instant>>,
}

/// Applies `entries` (consecutive versions, oldest first; versions `map`
/// already has are skipped) to a copy of `map`, validating the result.
pub fn apply_delta(
    map: &PartitionMap,
    entries: &[(MapVersion, Vec<MapChange>)],
) -> Result<PartitionMap, String> {
    let mut next = map.clone();
    for (version, changes) in entries {
        if *version <= next.version {
            continue;
        }
        if version.0 != next.version.0 + 1 {
            return Err(format!(
                "delta jumps from map version {} to {version}",
                next.version
            ));
        }
        next.apply(*version, changes).map_err(|e| e.to_string())?;
    }
    next.validate().map_err(|e| e.to_string())?;
    Ok(next)
}

impl Client {
    /// Refreshes the cached map now (by delta when a node's history reaches
    /// back to the cache's version), unless a refresh that began after this
    /// call is already running, in which case it waits for that one.
    pub async fn refresh(&self) -> Result<(), ClientError> {
        let seen = self.cache.generation();
        self.refresh_from(seen, false, None).await.map(|_| ())
    }

    /// Refreshes on behalf of a caller that routed by cache generation
    /// `seen`: coalesced with any refresh begun since, and, when `limited`,
    /// skipped within `min_refresh_interval_ms` of the last one. `prefer`:
    /// a node to ask first (the one that just rejected, whose map holds the
    /// record it rejected with).
    pub(crate) async fn refresh_from(
        &self,
        seen: u64,
        limited: bool,
        prefer: Option<&str>,
    ) -> Result<Refresh, ClientError> {
        let _flight = self.gate.lock.lock().await;
        if self.cache.generation() != seen {
            self.stats.refreshes_coalesced.fetch_add(1, RELAXED);
            return Ok(Refresh::Coalesced);
        }
        let interval = Duration::from_millis(self.config.min_refresh_interval_ms);
        let now = Instant::now();
        {
            let mut last = self
                .gate
                .last_start
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if limited && last.is_some_and(|t| now.duration_since(t) < interval) {
                self.stats.refreshes_suppressed.fetch_add(1, RELAXED);
                return Ok(Refresh::Suppressed);
            }
            *last = Some(now);
        }
        self.fetch_map(prefer).await?;
        Ok(Refresh::Done)
    }

    /// Asks `prefer`, the seeds, then every node in the cached map (each
    /// once) for the changes since the cache's version; installs the first
    /// usable answer. A whole map older than the cache (a node that lags)
    /// is not usable.
    async fn fetch_map(&self, prefer: Option<&str>) -> Result<(), ClientError> {
        let base = self.cache.base();
        let mut candidates: Vec<String> = Vec::new();
        let known = self.cache.view();
        let addrs = prefer
            .map(str::to_string)
            .into_iter()
            .chain(self.seeds.iter().cloned())
            .chain(known.nodes.values().map(|n| n.resp_addr.clone()));
        for addr in addrs {
            if !candidates.contains(&addr) {
                candidates.push(addr);
            }
        }
        let request = if base.version.0 == 0 {
            vec![Bytes::from_static(b"KW.MAP")]
        } else {
            vec![
                Bytes::from_static(b"KW.MAP"),
                Bytes::from_static(b"SINCE"),
                Bytes::from(base.version.0.to_string()),
            ]
        };
        let mut last_err = String::from("no node to ask");
        for addr in &candidates {
            self.stats.extra_round_trips.fetch_add(1, RELAXED);
            let bytes = match self.request(addr, request.clone()).await {
                Ok(Frame::Bulk(bytes)) => bytes,
                Ok(other) => {
                    last_err = format!("{addr}: unexpected reply {other:?}");
                    continue;
                }
                Err(e) => {
                    if matches!(
                        e,
                        ClientError::Io { .. } | ClientError::UnknownOutcome { .. }
                    ) {
                        self.stats.io_errors.fetch_add(1, RELAXED);
                        self.forget(addr);
                    }
                    last_err = e.to_string();
                    continue;
                }
            };
            let (next, full) = match keyway_map::decode_since(&bytes) {
                Ok(MapSince::Full(map)) => match map.validate() {
                    Ok(()) if map.version >= base.version => (map, true),
                    Ok(()) => {
                        last_err = format!(
                            "{addr}: its map (version {}) is older than the cache's ({})",
                            map.version, base.version
                        );
                        continue;
                    }
                    Err(e) => {
                        last_err = format!("{addr}: invalid map: {e}");
                        continue;
                    }
                },
                Ok(MapSince::Delta(entries)) => match apply_delta(&base, &entries) {
                    Ok(map) => (map, false),
                    Err(e) => {
                        last_err = format!("{addr}: {e}");
                        continue;
                    }
                },
                Err(e) => {
                    last_err = format!("{addr}: undecodable map reply: {e}");
                    continue;
                }
            };
            let (from, to) = (base.version.0, next.version.0);
            if !full && from == to {
                self.cache.confirm(Instant::now());
            } else {
                self.cache.install(next, Some(Instant::now()));
            }
            self.stats.refreshed(full, from, to);
            if let Some(warm) = &self.warm {
                warm.save_throttled(self.cache.base());
            }
            return Ok(());
        }
        Err(ClientError::Unreachable(last_err))
    }
}

const RELAXED: std::sync::atomic::Ordering = std::sync::atomic::Ordering::Relaxed;

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{Epoch, NodeId, NodeInfo};

    #[test]
    fn deltas_apply_in_order_and_gaps_are_refused() {
        let nodes: Vec<NodeInfo> = (1..=2)
            .map(|i| NodeInfo::up(NodeId(i), format!("h:{i}")))
            .collect();
        let map = PartitionMap::bootstrap(&nodes, 2).unwrap();
        let mut p = map.partitions.values().next().unwrap().clone();
        p.owner = NodeId(2);
        p.epoch = Epoch(2);
        let two = (MapVersion(2), vec![MapChange::UpsertPartition(p.clone())]);
        p.epoch = Epoch(3);
        let three = (MapVersion(3), vec![MapChange::UpsertPartition(p.clone())]);
        let next = apply_delta(&map, &[two.clone(), three.clone()]).unwrap();
        assert_eq!(next.version, MapVersion(3));
        assert_eq!(next.partitions[&p.id], p);
        // Versions the map has are skipped; a gap is refused.
        assert_eq!(
            apply_delta(&next, &[two.clone(), three.clone()]).unwrap(),
            next
        );
        assert!(apply_delta(&map, &[three]).is_err());
        // A delta that breaks coverage is refused.
        let broken = (MapVersion(2), vec![MapChange::RemovePartition { id: p.id }]);
        assert!(apply_delta(&map, &[broken]).is_err());
    }
}
