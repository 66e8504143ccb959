//! The stray sweep: drops data this node keeps for partitions it no longer
//! holds a copy of, so a node that comes back after it was replaced (or a
//! replica the manager moved away) does not keep dead data for ever.
//!
//! Process overview:
//! 1. Every `stray_sweep_interval_ms` the sweep reads the map and, per
//!    partition, whether this node *keeps a copy*: it is the owner, it is
//!    listed among the replicas, or it receives the partition under an
//!    incoming migration (registered or held). [`Timers::due`] (pure) starts
//!    a timer when a partition is first seen without a copy here and names
//!    the partitions that stayed so for `stray_sweep_grace_ms` — longer
//!    than a migration's own `cleanup_grace_ms`, so the driver's
//!    accounted cleanup of an old source runs first and the sweep only
//!    catches what nobody else drops.
//! 2. For each due partition, the range is deleted chunk by chunk on the
//!    blocking pool. Each chunk is checked and deleted **under the routing
//!    read guard**: the map cannot change between the check and the delete
//!    (installs and incoming registrations take the write side), so a copy
//!    that starts arriving (this node added as a replica, or registered as
//!    a migration target) is never deleted behind its back: the chunk sees
//!    the new row and the sweep of that partition stops.
//!
//! Nothing here is served: a partition without a copy here is answered
//! with `-MOVED` whatever the engine holds, so the sweep is about space and
//! about figures (key counts), never about what clients read.

use crate::routing::Routing;
use crate::server::Shared;
use keyway_map::{PartitionId, PartitionMap, PartitionRecord};
use keyway_storage::Engine;
use prometheus_client::metrics::counter::Counter;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Entries deleted per guarded engine call.
const SWEEP_CHUNK_ENTRIES: usize = 1_000;

/// The sweep's limits (from the node configuration).
#[derive(Clone, Copy, Debug)]
pub struct SweepLimits {
    pub interval: Duration,
    pub grace: Duration,
}

/// Since when each partition has been seen without a copy here (pure).
#[derive(Default, Debug)]
pub struct Timers {
    since: HashMap<PartitionId, Instant>,
}

impl Timers {
    /// Updates the timers from `map` at `now` and returns the partitions
    /// without a copy here (per `keeps`) for at least `grace`, by id.
    pub fn due(
        &mut self,
        map: &PartitionMap,
        keeps: impl Fn(&PartitionRecord) -> bool,
        now: Instant,
        grace: Duration,
    ) -> Vec<PartitionId> {
        let strays: Vec<PartitionId> = map
            .partitions
            .values()
            .filter(|p| !keeps(p))
            .map(|p| p.id)
            .collect();
        self.since.retain(|id, _| strays.contains(id));
        let mut due: Vec<PartitionId> = strays
            .into_iter()
            .filter(|id| now.duration_since(*self.since.entry(*id).or_insert(now)) >= grace)
            .collect();
        due.sort();
        due
    }

    /// Restarts `id`'s timer (its range was swept; a copy arriving later
    /// and leaving again gets a whole grace).
    pub fn swept(&mut self, id: PartitionId, now: Instant) {
        self.since.insert(id, now);
    }
}

/// The sweep's metrics.
#[derive(Clone, Default)]
pub struct SweepMetrics {
    /// Entries (keys and version markers) dropped by the sweep.
    pub dropped_entries: Counter,
    /// Partition ranges the sweep found data in and emptied.
    pub swept_ranges: Counter,
}

impl SweepMetrics {
    pub fn register(metrics: &crate::metrics::Metrics) -> Self {
        let m = SweepMetrics::default();
        metrics.register(
            "stray_sweep_dropped_entries",
            "Entries dropped by the stray sweep (data of partitions this node holds no copy of)",
            m.dropped_entries.clone(),
        );
        metrics.register(
            "stray_sweep_ranges",
            "Partition ranges the stray sweep found data in and emptied",
            m.swept_ranges.clone(),
        );
        m
    }
}

/// Runs the sweep until shutdown (see the module docs).
pub async fn run(shared: Arc<Shared>, limits: SweepLimits, mut shutdown: watch::Receiver<bool>) {
    assert!(!limits.interval.is_zero() && !limits.grace.is_zero());
    let metrics = SweepMetrics::register(&shared.metrics);
    let mut timers = Timers::default();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(limits.interval) => {}
            _ = shutdown.changed() => return,
        }
        let map = shared.routing.map();
        let due = {
            let guard = shared.routing.read();
            timers.due(&map, |p| guard.keeps_copy(p), Instant::now(), limits.grace)
        };
        for id in due {
            let (routing, engine) = (shared.routing.clone(), shared.engine.clone());
            let swept = tokio::task::spawn_blocking(move || sweep(&routing, &*engine, id)).await;
            match swept {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => {
                    metrics.dropped_entries.inc_by(n);
                    metrics.swept_ranges.inc();
                    tracing::info!(partition = %id, entries = n, "stray sweep: dropped the data of a partition this node holds no copy of");
                }
                Ok(Err(e)) => {
                    tracing::warn!(partition = %id, %e, "stray sweep failed; retrying next interval")
                }
                Err(e) => tracing::warn!(partition = %id, %e, "stray sweep task failed"),
            }
            timers.swept(id, Instant::now());
        }
    }
}

/// Empties partition `id`'s range while this node still holds no copy of
/// it, chunk by chunk under the routing read guard. Returns the entries
/// dropped.
pub fn sweep(
    routing: &Routing,
    engine: &dyn Engine,
    id: PartitionId,
) -> Result<u64, keyway_storage::StorageError> {
    let mut dropped = 0u64;
    loop {
        let guard = routing.read();
        let Some(p) = guard.map().partitions.get(&id) else {
            return Ok(dropped);
        };
        if guard.keeps_copy(p) {
            return Ok(dropped);
        }
        let range = crate::migrate::receive::storage_range(p);
        let n = engine.delete_range_chunk(&range, SWEEP_CHUNK_ENTRIES)?;
        drop(guard);
        dropped += n as u64;
        if n < SWEEP_CHUNK_ENTRIES {
            return Ok(dropped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{NodeId, NodeInfo};

    fn map() -> PartitionMap {
        let nodes = [
            NodeInfo::up(NodeId(1), "a:1".into()),
            NodeInfo::up(NodeId(2), "b:1".into()),
        ];
        PartitionMap::bootstrap(&nodes, 2).unwrap()
    }

    #[test]
    fn only_partitions_without_a_copy_for_the_whole_grace_are_due() {
        let m = map();
        let grace = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut timers = Timers::default();
        let keeps = |p: &PartitionRecord| p.owner == NodeId(1);
        assert!(
            timers.due(&m, keeps, t0, grace).is_empty(),
            "nothing before the grace"
        );
        let strays: Vec<PartitionId> = m
            .partitions
            .values()
            .filter(|p| !keeps(p))
            .map(|p| p.id)
            .collect();
        assert!(!strays.is_empty());
        assert!(timers.due(&m, keeps, t0 + grace / 2, grace).is_empty());
        assert_eq!(timers.due(&m, keeps, t0 + grace, grace), strays);
        // A copy arriving resets the timer: it takes a whole grace again.
        assert!(timers.due(&m, |_| true, t0 + grace, grace).is_empty());
        assert!(timers.due(&m, keeps, t0 + grace * 3 / 2, grace).is_empty());
        assert_eq!(timers.due(&m, keeps, t0 + grace * 5 / 2, grace), strays);
        timers.swept(strays[0], t0 + grace * 5 / 2);
        assert_eq!(timers.due(&m, keeps, t0 + grace * 3, grace), strays[1..]);
    }
}
