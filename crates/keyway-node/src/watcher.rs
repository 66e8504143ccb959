//! Keeps the node's map fresh: watches the metadata store from the last
//! version seen, applies deltas (or a full map when the store's history no
//! longer reaches back), and re-watches after any error. The deltas it
//! installs feed the node's map history ([`crate::map_history`]).

use crate::server::Shared;
use futures::StreamExt;
use keyway_map::PartitionMap;
use keyway_meta::MapUpdate;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Spawns the watch loop.
pub async fn start(shared: &Arc<Shared>, tasks: &mut JoinSet<()>, shutdown: watch::Receiver<bool>) {
    tasks.spawn(watch_loop(shared.clone(), shutdown));
}

async fn watch_loop(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let since = shared.routing.map().version;
        let stream = tokio::select! {
            s = shared.meta.watch(since) => s,
            _ = shutdown.changed() => return,
        };
        match stream {
            Ok(mut stream) => loop {
                let item = tokio::select! {
                    item = stream.next() => item,
                    _ = shutdown.changed() => return,
                };
                match item {
                    Some(Ok(update)) => {
                        backoff = Duration::from_millis(50);
                        apply(&shared, update).await;
                    }
                    Some(Err(err)) => {
                        tracing::warn!(%err, "map watch broke; re-watching");
                        break;
                    }
                    None => break,
                }
            },
            Err(err) => tracing::warn!(%err, "cannot watch the map"),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Applies one update; on any inconsistency falls back to a full reload.
/// Deltas are installed with their changes, which the node keeps (a bounded
/// history) to answer `KW.MAP SINCE`; a whole map resets that history.
pub async fn apply(shared: &Shared, update: MapUpdate) {
    let (next, changes) = match update {
        MapUpdate::Full(map) => (Some(map), None),
        MapUpdate::Delta(deltas) => {
            let next = apply_deltas(&shared.routing.map(), &deltas);
            let changes = deltas
                .into_iter()
                .map(|(v, c)| (v, Arc::new(c)))
                .collect::<Vec<_>>();
            (next, Some(changes))
        }
    };
    let (next, changes) = match next {
        Some(map) => (map, changes),
        None => match shared.meta.get_map().await {
            Ok(map) => (map, None),
            Err(err) => {
                tracing::warn!(%err, "cannot reload the map");
                return;
            }
        },
    };
    if next.version <= shared.routing.map().version && next.version.0 != 0 {
        return;
    }
    let installed = match changes {
        Some(changes) => shared.routing.install_delta(next, changes),
        None => shared.routing.install(next),
    };
    if let Err(err) = installed {
        tracing::error!(%err, "refusing a map that fails validation");
    }
    publish_gauges(shared);
}

fn apply_deltas(
    current: &PartitionMap,
    deltas: &[(keyway_map::MapVersion, Vec<keyway_map::MapChange>)],
) -> Option<PartitionMap> {
    let mut map = current.clone();
    for (version, changes) in deltas {
        if *version <= map.version {
            continue;
        }
        if version.0 != map.version.0 + 1 {
            return None; // a gap: reload the whole map
        }
        map.apply(*version, changes).ok()?;
    }
    Some(map)
}

/// Updates the map gauges.
pub fn publish_gauges(shared: &Shared) {
    let map = shared.routing.map();
    shared.metrics.map_version.set(map.version.0 as i64);
    shared
        .metrics
        .partitions_owned
        .set(map.owned_by(shared.me).count() as i64);
}
