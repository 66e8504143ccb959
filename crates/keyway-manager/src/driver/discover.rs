//! Discovery: while the seat leads, list the migration records and run
//! one task per live record (one per partition range at a time), then one
//! short cleanup task per record over with a `stray` copy whose retry is
//! due (see the module docs of `driver`).

use super::{DriverError, Shared, load, now_ms, ranges_overlap, run, storage_range};
use keyway_map::NodeState;
use keyway_meta::Leadership;
use keyway_migration::{Event, Migration, MigrationConfig, MigrationId, MigrationState};
use keyway_storage::KeyRange;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

struct Running {
    /// The partition's storage range: a split or merge can give another id
    /// an overlapping range, and two tasks never work on one range at once.
    range: KeyRange,
    handle: JoinHandle<()>,
    /// A record over, driven only to drop the copy it left behind.
    cleanup: bool,
}

pub(super) async fn discover_loop(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut running: HashMap<MigrationId, Running> = HashMap::new();
    let mut term: Option<Leadership> = None;
    // Ids never to look at again: terminal (final) or undrivable records.
    let mut skip: HashSet<u64> = HashSet::new();
    // Records over with a stray copy: when their cleanup is next tried.
    let mut stray_next: HashMap<u64, tokio::time::Instant> = HashMap::new();
    let mut seat_rx = shared.seat.subscribe();
    let mut seat_alive = true;
    let interval = Duration::from_millis(shared.config.discover_interval_ms);
    while !*stop.borrow_and_update() {
        let leading = shared.seat.leading();
        if leading != term {
            stop_all(&shared, &mut running).await;
            stray_next.clear();
            if leading.is_some() {
                tracing::info!("migration driver: leading, loading migration records");
            } else {
                tracing::info!("migration driver: not leading, stopped every migration task");
            }
            term = leading;
        }
        running.retain(|_, r| !r.handle.is_finished());
        if let Some(leadership) = &term {
            discover(
                &shared,
                leadership,
                &mut running,
                &mut skip,
                &mut stray_next,
            )
            .await;
        }
        tokio::select! {
            changed = stop.changed() => if changed.is_err() { break },
            changed = seat_rx.changed(), if seat_alive => seat_alive = changed.is_ok(),
            () = tokio::time::sleep(interval) => {}
        }
    }
    stop_all(&shared, &mut running).await;
}

async fn stop_all(shared: &Shared, running: &mut HashMap<MigrationId, Running>) {
    for (id, r) in running.drain() {
        r.handle.abort();
        let _ = r.handle.await;
        shared.live.remove(&shared.metrics, id);
    }
}

/// Spawns a task for every non-terminal record not driven yet (one per
/// partition range at a time), then one cleanup task for every record over
/// with a stray copy whose retry is due (see the module docs).
async fn discover(
    shared: &Arc<Shared>,
    leadership: &Leadership,
    running: &mut HashMap<MigrationId, Running>,
    skip: &mut HashSet<u64>,
    stray_next: &mut HashMap<u64, tokio::time::Instant>,
) {
    let stored = match shared.meta.migrations().await {
        Ok(stored) => stored,
        Err(err) => {
            tracing::debug!(%err, "migration driver: cannot list migration records");
            return;
        }
    };
    let mut busy: Vec<KeyRange> = running.values().map(|r| r.range.clone()).collect();
    let mut strays: Vec<Migration> = Vec::new();
    for s in &stored {
        let id = MigrationId(s.id);
        if running.contains_key(&id) || skip.contains(&s.id) {
            continue;
        }
        if crate::replication::moves::is_replica_move(s) {
            // The replication loop's (a replica move), not a migration.
            skip.insert(s.id);
            continue;
        }
        let machine = load(s).and_then(|rec| {
            Migration::new(rec, shared.config.migration.clone()).map_err(|e| {
                DriverError::BadRecord {
                    id,
                    detail: e.to_string(),
                }
            })
        });
        let machine = match machine {
            Ok(m) => m,
            Err(err) => {
                tracing::error!(%err, "migration driver: cannot drive this record");
                skip.insert(s.id);
                continue;
            }
        };
        let rec = machine.record();
        if rec.state.is_terminal() {
            if rec.stray.is_some() {
                strays.push(machine);
            } else {
                stray_next.remove(&s.id);
                skip.insert(s.id);
            }
            continue;
        }
        let range = storage_range(rec);
        if busy.iter().any(|b| ranges_overlap(b, &range)) {
            continue;
        }
        busy.push(range.clone());
        let now = now_ms();
        let first = if rec.state == MigrationState::Pending {
            Event::Started { now }
        } else {
            Event::Recovered { now }
        };
        tracing::info!(
            migration = %id, state = %rec.state, partition = %rec.partition_id(),
            event = first.name(), "migration driver: driving migration"
        );
        let task = run::Task::new(shared.clone(), leadership.clone(), machine);
        let handle = tokio::spawn(task.run(first));
        let cleanup = false;
        running.insert(
            id,
            Running {
                range,
                handle,
                cleanup,
            },
        );
    }
    let driven_strays = running.values().filter(|r| r.cleanup).count();
    let count = (strays.len() + driven_strays) as u64;
    shared
        .live
        .stray_copies
        .store(count, std::sync::atomic::Ordering::Relaxed);
    shared
        .metrics
        .migration_stray_copies
        .set(i64::try_from(count).unwrap_or(i64::MAX));
    if strays.is_empty() {
        return;
    }
    let map = match shared.meta.get_map().await {
        Ok(map) => map,
        Err(err) => {
            tracing::debug!(%err, "migration driver: cannot read the map for cleanups");
            return;
        }
    };
    let now = tokio::time::Instant::now();
    let retry = Duration::from_millis(shared.config.stray_retry_interval_ms);
    for machine in strays {
        let rec = machine.record().clone();
        let node = rec.stray.expect("a stray copy");
        if stray_next.get(&rec.id.0).is_some_and(|at| now < *at) {
            continue;
        }
        // A node marked down is not tried; a decommissioned one is (its
        // copy went with it: the record forgets it).
        if map
            .nodes
            .get(&node)
            .is_some_and(|n| n.state == NodeState::Down)
        {
            continue;
        }
        let range = storage_range(&rec);
        if busy.iter().any(|b| ranges_overlap(b, &range)) {
            continue;
        }
        busy.push(range.clone());
        stray_next.insert(rec.id.0, now + retry);
        // One attempt per round: the retries are these rounds.
        let config = MigrationConfig {
            cleanup_attempts: 1,
            ..shared.config.migration.clone()
        };
        let machine = match Migration::new(rec.clone(), config) {
            Ok(m) => m,
            Err(err) => {
                tracing::error!(%err, "migration driver: cannot drive this record");
                continue;
            }
        };
        tracing::info!(
            migration = %rec.id, state = %rec.state, %node,
            "migration driver: dropping a copy a migration left behind"
        );
        let task = run::Task::new(shared.clone(), leadership.clone(), machine);
        let handle = tokio::spawn(task.run(Event::Recovered { now: now_ms() }));
        let cleanup = true;
        running.insert(
            rec.id,
            Running {
                range,
                handle,
                cleanup,
            },
        );
    }
}
