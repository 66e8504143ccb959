//! Active expiry: expired keys that nobody reads are removed in the
//! background, so a cache workload (`SET ... EX`, never read) does not grow
//! without bound. Lazy expiry (`crate::db`) alone only removes keys on access.
//!
//! Modelled on Redis's adaptive active-expire cycle: every
//! `active_expire_interval_ms` (Redis's `hz`) a cycle examines keys and
//! deletes the expired ones; it goes on while more than 25 % of the examined
//! keys with a TTL had expired (there is probably more to do), and never for
//! longer than `active_expire_cycle_budget_ms`.
//!
//! **Which keys are examined.** Redis samples a dictionary of the keys with
//! a TTL. Keyway keeps no such index: it would add a write (and a delete of
//! the old entry) to every `SET EX`/`EXPIRE`/`PERSIST` and to every
//! foreign apply, and would have to move with migrations like the data. The
//! cycle instead walks the owned partitions with a cursor, in chunks of
//! `active_expire_scan_keys` (each one short engine snapshot, like the size
//! scan in `crate::stats`), resuming where the last cycle stopped. A cache
//! workload, where most keys carry a TTL, is served as well as by sampling;
//! a store of persistent keys with a few TTLs pays a read-only walk of one
//! chunk per interval, so the interval and chunk size bound both its cost
//! and its speed (it finds every expired key within one pass, which a
//! random sample does not promise).
//!
//! **Deleting.** Each expired key is deleted by a task on the storage thread
//! that owns its key, exactly like a client's `DEL`: admitted under the
//! routing read guard (lease valid, owned here, not fenced: otherwise it is
//! left for a later pass), re-read there and deleted only if still expired,
//! applied as a logged `Delete` (so a migration carries it: "expiry moves
//! with the value") and, in a dual-written partition, acknowledged by the
//! target before the task completes.

use crate::executor::{Task, TaskOutput};
use crate::node_cmd::{apply_and_reply, storage_failure};
use crate::server::Shared;
use bytes::Bytes;
use keyway_map::{KeyspaceId, PartitionId, Routing as KeyRouting, key_hash_slot};
use keyway_resp::Frame;
use keyway_storage::{KeyRange, Mutation};
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// A cycle goes on while more than 1 in this many examined keys with a TTL
/// had expired (Redis: 25 %).
const GO_ON_EXPIRED_ONE_IN: usize = 4;

/// Limits of the active expiry cycle, from the node configuration.
#[derive(Clone, Copy, Debug)]
pub struct ExpireLimits {
    pub interval: Duration,
    pub scan_keys: usize,
    pub cycle_budget: Duration,
}

/// Active expiry metrics.
#[derive(Clone, Default)]
pub struct ExpiryMetrics {
    /// Keys deleted by the active cycle.
    pub removed: Counter,
    /// Keys the active cycle examined.
    pub examined: Counter,
    /// Garbage sub-entries (of deleted, overwritten or expired collections) deleted.
    pub garbage_reclaimed: Counter,
}

impl ExpiryMetrics {
    pub fn register(metrics: &crate::metrics::Metrics) -> Self {
        let m = ExpiryMetrics::default();
        metrics.register(
            "expired_keys_removed_actively",
            "Expired keys deleted by the background active expiry cycle",
            m.removed.clone(),
        );
        metrics.register(
            "active_expire_examined_keys",
            "Keys examined by the active expiry cycle",
            m.examined.clone(),
        );
        metrics.register(
            "collection_garbage_reclaimed_entries",
            "Sub-entries of deleted, overwritten or expired collections deleted by the active expiry walk",
            m.garbage_reclaimed.clone(),
        );
        m
    }
}

/// Where the walk stands: in which owned partition, after which key.
#[derive(Default)]
struct Cursor {
    partition: Option<PartitionId>,
    after: Option<Bytes>,
}

/// The active expiry task; returns at shutdown.
pub async fn run(shared: Arc<Shared>, limits: ExpireLimits, mut shutdown: watch::Receiver<bool>) {
    let mut cursor = Cursor::default();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(limits.interval) => {}
            _ = shutdown.changed() => return,
        }
        if let Err(e) = cycle(&shared, limits, &mut cursor).await {
            tracing::warn!(%e, "active expiry cycle failed");
        }
    }
}

/// One cycle (see the module docs). Returns how many keys it deleted.
async fn cycle(
    shared: &Arc<Shared>,
    limits: ExpireLimits,
    cursor: &mut Cursor,
) -> Result<u64, String> {
    let started = Instant::now();
    let mut removed = 0u64;
    let mut visited = 0usize;
    while started.elapsed() < limits.cycle_budget {
        let map = shared.routing.map();
        let mut owned: Vec<_> = map.owned_by(shared.me).collect();
        if owned.is_empty() {
            break;
        }
        owned.sort_by_key(|p| p.id);
        let p = match cursor.partition {
            Some(id) => match owned.iter().find(|p| p.id >= id) {
                Some(p) => *p,
                None => owned[0],
            },
            None => owned[0],
        };
        if cursor.partition != Some(p.id) {
            cursor.partition = Some(p.id);
            cursor.after = None;
            visited += 1;
        }
        let routing = map.keyspaces.get(&p.keyspace).map(|k| k.routing);
        let (start, end) = p.storage_bounds();
        let range = KeyRange { start, end };
        let engine = shared.engine.clone();
        let after = cursor.after.clone();
        let (chunk, garbage) = tokio::task::spawn_blocking(move || {
            let chunk = engine.scan(&range, after.as_deref(), limits.scan_keys)?;
            let garbage = find_garbage(&*engine, &chunk.entries)?;
            Ok::<_, keyway_storage::StorageError>((chunk, garbage))
        })
        .await
        .map_err(|e| format!("scan task: {e}"))?
        .map_err(|e| e.to_string())?;
        match chunk.next {
            Some(next) => cursor.after = Some(next),
            None => {
                cursor.partition = Some(PartitionId(p.id.0 + 1));
                cursor.after = None;
            }
        }
        let now = shared.clock.unix_ms();
        let with_ttl = chunk
            .entries
            .iter()
            .filter(|(_, v)| v.expire_at_ms.is_some())
            .count();
        let expired: Vec<Bytes> = chunk
            .entries
            .iter()
            .filter(|(_, v)| v.kind.is_user_key() && v.is_expired_at(now))
            .map(|(k, _)| k.clone())
            .collect();
        shared
            .active_expiry
            .examined
            .inc_by(chunk.entries.len() as u64);
        // Queue every deletion first: each storage thread then commits
        // them as one group (one fsync), not one fsync per key.
        let mut pending = Vec::with_capacity(expired.len());
        if let Some(routing) = routing {
            for key in &expired {
                let Some(shard) = user_key(key, routing).map(key_hash_slot) else {
                    continue;
                };
                let task = expire_task(shared.clone(), key.clone(), routing);
                if let Ok(rx) = shared.executor.submit(shard, task).await {
                    pending.push(rx);
                }
            }
        }
        let mut reclaiming = Vec::new();
        for (slot, keys) in garbage {
            let task = reclaim_task(shared.clone(), p.keyspace, slot, keys);
            if let Ok(rx) = shared.executor.submit(slot, task).await {
                reclaiming.push(rx);
            }
        }
        for rx in pending {
            if matches!(rx.await, Ok(Frame::Integer(1))) {
                removed += 1;
                shared.active_expiry.removed.inc();
            }
        }
        for rx in reclaiming {
            if let Ok(Frame::Integer(n)) = rx.await {
                shared.active_expiry.garbage_reclaimed.inc_by(n as u64);
            }
        }
        // Walk on only while the chunk suggests more to do (Redis's rule:
        // over a quarter of the keys with a TTL had expired). A chunk with
        // few or no expired keys ends the cycle: a store of persistent keys
        // then pays one chunk per interval, not the whole cycle budget
        // (which, walking on through keys without a TTL, took a quarter of
        // a core per node under a SET load: issue 15's profile).
        let worth_going_on = expired.len() * GO_ON_EXPIRED_ONE_IN > with_ttl && with_ttl > 0;
        if !worth_going_on || visited > owned.len() {
            break;
        }
    }
    Ok(removed)
}

/// The user key inside a storage key (`be32(keyspace) ++ [be16 slot] ++ key`).
fn user_key(storage_key: &[u8], routing: KeyRouting) -> Option<&[u8]> {
    keyway_map::split_storage_key(storage_key, routing).map(|(_, k)| k)
}

/// The storage-thread task: admit like a client write, re-check the
/// expiry, delete through the same apply path as `DEL`.
fn expire_task(shared: Arc<Shared>, key: Bytes, routing: KeyRouting) -> Task {
    Box::new(move |engine| {
        let skip = || TaskOutput::reply(Frame::Integer(0), false);
        let Some((ks, local)) = key.split_first_chunk::<4>() else {
            return skip();
        };
        let ks = KeyspaceId(u32::from_be_bytes(*ks));
        let slot = match routing {
            KeyRouting::Hash => match local {
                [a, b, ..] => u16::from_be_bytes([*a, *b]),
                _ => return skip(),
            },
            KeyRouting::Range => 0,
        };
        let guard = shared.routing.read();
        let Ok(partition) = guard.admit(ks, local, slot, None).map(|p| p.id) else {
            return skip();
        };
        match engine.get(&key) {
            Ok(Some(v)) if v.is_expired_at(shared.clock.unix_ms()) => {}
            Ok(_) => return skip(),
            Err(e) => return storage_failure(e),
        }
        apply_and_reply(
            &shared,
            engine,
            &guard,
            partition,
            vec![Mutation::Delete { key: key.clone() }],
            Frame::Integer(1),
        )
    })
}

/// The garbage among `entries`: sub-entries whose collection's meta is gone
/// or has another version (see [`crate::coll`]), grouped by slot. Read
/// after the scan: a sub-entry in the scan's snapshot was written in the
/// same batch as its meta or later, so its meta is visible unless it was
/// deleted or replaced since, and a version is never reused, so a
/// sub-entry found garbage stays garbage (its deletion can race nothing).
/// An expired meta still counts as live: its deletion comes first.
fn find_garbage(
    engine: &dyn keyway_storage::Engine,
    entries: &[(Bytes, keyway_storage::Value)],
) -> Result<Vec<(u16, Vec<Bytes>)>, keyway_storage::StorageError> {
    let mut out: Vec<(u16, Vec<Bytes>)> = Vec::new();
    let mut last: Option<(Bytes, u64, bool)> = None;
    for (key, value) in entries {
        if value.kind != keyway_storage::ValueKind::Sub {
            continue;
        }
        let Some(sub) = crate::coll::SubKey::decode(key) else {
            continue;
        };
        let meta_key = {
            let mut k = key[..6].to_vec();
            k.extend_from_slice(sub.user_key);
            Bytes::from(k)
        };
        let dead = match &last {
            Some((k, v, dead)) if *k == meta_key && *v == sub.version => *dead,
            _ => {
                let dead = !engine.get(&meta_key)?.is_some_and(|m| {
                    crate::coll::Meta::decode(m.kind, &m.data)
                        .is_some_and(|m| m.version == sub.version)
                });
                last = Some((meta_key, sub.version, dead));
                dead
            }
        };
        if dead {
            match out.last_mut() {
                Some((slot, keys)) if *slot == sub.slot => keys.push(key.clone()),
                _ => out.push((sub.slot, vec![key.clone()])),
            }
        }
    }
    Ok(out)
}

/// The storage-thread task that deletes garbage sub-entries of one slot:
/// admitted like a client write (owned here, lease valid, not fenced,
/// else left for a later pass), logged deletes through the apply path.
/// Replies with how many it deleted.
fn reclaim_task(shared: Arc<Shared>, ks: KeyspaceId, slot: u16, keys: Vec<Bytes>) -> Task {
    Box::new(move |engine| {
        let guard = shared.routing.read();
        let Ok(partition) = guard.admit_slot(ks, slot, None).map(|p| p.id) else {
            return TaskOutput::reply(Frame::Integer(0), false);
        };
        let n = keys.len() as i64;
        let deletes = keys
            .into_iter()
            .map(|key| Mutation::Delete { key })
            .collect();
        apply_and_reply(
            &shared,
            engine,
            &guard,
            partition,
            deletes,
            Frame::Integer(n),
        )
    })
}
