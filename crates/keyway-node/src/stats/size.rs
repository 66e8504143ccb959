//! Partition sizes: live keys, payload bytes and the size split key of every
//! partition this node owns, from a background scan.
//!
//! The scan reads each partition in chunks of `chunk_keys` entries, each
//! chunk from its own short-lived engine snapshot on the blocking pool (fjall
//! never runs on an async worker, and no snapshot stays open across chunks),
//! and pauses between chunks as long as the chunk took, so a scan uses at
//! most about half of one blocking thread. A partition is rescanned every
//! `interval`, and at once when this node newly owns it or its range changed
//! (a split or a merge).

use super::split::SizeMarkers;
use bytes::Bytes;
use keyway_map::{PartitionId, PartitionRecord, Routing};
use keyway_storage::{Engine, KeyRange, StorageError};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Markers kept while scanning one partition (the size split key is within
/// about `bytes / SIZE_MARKERS` of the half-way point).
pub const SIZE_MARKERS: usize = 256;

/// One partition's size as of its last scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionSize {
    /// The range scanned (keyspace-local bounds): a size is reported only
    /// while the partition still has this range.
    pub start: Bytes,
    pub end: Option<Bytes>,
    pub keys: u64,
    pub bytes: u64,
    pub split_key: Option<Bytes>,
    /// When the scan finished (node clock).
    pub scanned_at: Instant,
}

impl PartitionSize {
    /// Whether this size was measured over `p`'s current range.
    pub fn covers(&self, p: &PartitionRecord) -> bool {
        self.start == p.start && self.end == p.end
    }
}

/// The sizes known, by partition.
#[derive(Default)]
pub struct Sizes {
    inner: Mutex<HashMap<PartitionId, PartitionSize>>,
}

impl Sizes {
    /// The size of `p` if it was measured over `p`'s current range.
    pub fn get(&self, p: &PartitionRecord) -> Option<PartitionSize> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.get(&p.id).filter(|s| s.covers(p)).cloned()
    }

    pub fn put(&self, id: PartitionId, size: PartitionSize) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.insert(id, size);
    }

    pub fn retain(&self, keep: &HashSet<PartitionId>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.retain(|id, _| keep.contains(id));
    }

    /// Of `owned`, the partition to scan next and when: one never measured
    /// over its current range is due now (lowest id first); otherwise the
    /// one measured longest ago, due `interval` after its scan.
    pub fn next_due(
        &self,
        owned: &[PartitionRecord],
        interval: Duration,
    ) -> Option<(PartitionRecord, Option<Instant>)> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut oldest: Option<(&PartitionRecord, Instant)> = None;
        for p in owned {
            match inner.get(&p.id).filter(|s| s.covers(p)) {
                None => return Some((p.clone(), None)),
                Some(s) => {
                    if oldest.is_none_or(|(_, at)| s.scanned_at < at) {
                        oldest = Some((p, s.scanned_at));
                    }
                }
            }
        }
        oldest.map(|(p, at)| (p.clone(), Some(at + interval)))
    }
}

/// Why a scan stopped early.
#[derive(Debug)]
pub enum ScanError {
    /// The engine (or its blocking task) failed.
    Failed(String),
    /// The node is shutting down.
    Stopped,
}

impl From<StorageError> for ScanError {
    fn from(e: StorageError) -> Self {
        ScanError::Failed(e.to_string())
    }
}

/// Scans `p` in chunks (see the module docs) and measures it. `now_ms`
/// (unix ms) decides which keys have expired (not counted).
pub async fn scan_partition(
    engine: &Arc<dyn Engine>,
    p: &PartitionRecord,
    routing: Routing,
    chunk_keys: usize,
    now_ms: u64,
    stop: &mut watch::Receiver<bool>,
) -> Result<(u64, u64, Option<Bytes>), ScanError> {
    let (start, end) = p.storage_bounds();
    let range = KeyRange { start, end };
    let mut markers = SizeMarkers::new(routing, SIZE_MARKERS);
    let mut after: Option<Bytes> = None;
    loop {
        if *stop.borrow() {
            return Err(ScanError::Stopped);
        }
        let started = Instant::now();
        let engine = engine.clone();
        let r = range.clone();
        let cursor = after.clone();
        let chunk = tokio::task::spawn_blocking(move || {
            engine.scan(&r, cursor.as_deref(), chunk_keys.max(1))
        })
        .await
        .map_err(|e| ScanError::Failed(format!("scan task: {e}")))??;
        for (key, value) in &chunk.entries {
            if value.expire_at_ms.is_some_and(|at| at <= now_ms) {
                continue;
            }
            // Storage key = be32(keyspace) ++ local routing key.
            let local = key.get(4..).unwrap_or_default();
            markers.observe(local, (key.len() + value.data.len()) as u64);
        }
        match chunk.next {
            Some(next) => after = Some(next),
            None => break,
        }
        // Throttle: rest as long as the chunk took.
        tokio::select! {
            () = tokio::time::sleep(started.elapsed()) => {}
            _ = stop.changed() => return Err(ScanError::Stopped),
        }
    }
    Ok((markers.keys(), markers.bytes(), markers.split_key()))
}
