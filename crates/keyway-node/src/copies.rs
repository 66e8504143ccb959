//! Copy cost accounting (issue 13 item 5, seed 003: "recovery time is the
//! data over the bandwidth", so every copy's bytes and time are measured).
//!
//! A *copy* is the bulk phase that brings a partition's data to another
//! node, on the node that sends it:
//! - kind `migration`: a single-owner migration's push (`migrate/push.rs`),
//!   from its start through the target's clean, the snapshot chunks, the
//!   closing fsync and the checkpoint (the records streamed up to the
//!   checkpoint seq count too); it ends when the push reports `copy_done`.
//!   The catch-up and dual streaming after it belong to the migration, not
//!   the copy.
//! - kind `replica`: a replica catch-up (`replicate/copy.rs`): the clean,
//!   the chunks, the closing fsync; it ends when the replica joins (the
//!   replication stream carries the partition from then on).
//!
//! Per copy: `bytes_sent` (payload bytes, key + data as
//! `Engine::range_stats` counts them, of every record in a call the
//! receiver acknowledged), `bytes_written` (the sum of what the receiver
//! reported it applied: `ApplyForeignResponse.bytes_written`,
//! `ReplicateResponse.bytes_written`; the records that passed its checks
//! and went to `apply_foreign`, whose versioning may still keep a newer
//! value: it measures the write load put on the receiver, not the bytes
//! that changed), `started_at_ms` (wall clock), the duration, and
//! `bytes_total_estimate`: the partition's payload bytes as of this node's
//! last size scan (`crate::stats`, every `stats_scan_interval_ms`), `None`
//! while the partition has not been sized over its current range. An
//! estimate: writes since the scan change it.
//!
//! [`Copies`] keeps the running copies and the last
//! [`FINISHED_COPIES_KEPT`] finished ones (`/status` `copies`, the
//! `PartitionStats` RPC's `copies`, which the manager polls), and feeds the
//! metrics `keyway_copy_bytes_sent{kind}`, `keyway_copy_bytes_written{kind}`
//! (counted as the calls are answered) and `keyway_copy_duration_seconds{kind}`
//! (observed when a copy completes; failed copies are not observed).

use crate::clock::Clock;
use crate::metrics::{KindLabel, Metrics};
use keyway_map::{NodeId, PartitionId, PartitionRecord};
use keyway_storage::{ChangeRecord, Mutation};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Finished copies kept for `/status` and the manager.
pub const FINISHED_COPIES_KEPT: usize = 64;

/// Buckets of `keyway_copy_duration_seconds`.
const DURATION_BUCKETS_SECONDS: [f64; 14] = [
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

pub use keyway_peer::copies::{CopyKind, CopyOutcome, CopyReport};

/// The copy metrics (registered once with the node's registry).
struct CopyMetrics {
    bytes_sent: Family<KindLabel, Counter>,
    bytes_written: Family<KindLabel, Counter>,
    duration_seconds: Family<KindLabel, Histogram, fn() -> Histogram>,
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS_SECONDS)
}

impl CopyMetrics {
    fn register(m: &Metrics) -> CopyMetrics {
        let c = CopyMetrics {
            bytes_sent: Family::default(),
            bytes_written: Family::default(),
            duration_seconds: Family::new_with_constructor(duration_histogram),
        };
        m.register(
            "copy_bytes_sent",
            "Payload bytes (key + data) this node shipped in copies (migration push, replica catch-up), by kind",
            c.bytes_sent.clone(),
        );
        m.register(
            "copy_bytes_written",
            "Payload bytes the receivers of this node's copies reported applied, by kind",
            c.bytes_written.clone(),
        );
        m.register(
            "copy_duration_seconds",
            "Duration of this node's completed copies (start to the copy's closing fsync), by kind",
            c.duration_seconds.clone(),
        );
        c
    }
}

struct Running {
    partition: PartitionId,
    peer: NodeId,
    kind: CopyKind,
    migration: u64,
    estimate: Option<u64>,
    started_at_ms: u64,
    started: Instant,
    sent: AtomicU64,
    written: AtomicU64,
}

impl Running {
    fn report(&self, clock: &dyn Clock) -> CopyReport {
        CopyReport {
            partition: self.partition,
            peer: self.peer,
            kind: self.kind,
            migration: self.migration,
            bytes_sent: self.sent.load(Ordering::Relaxed),
            bytes_written: self.written.load(Ordering::Relaxed),
            bytes_total_estimate: self.estimate,
            started_at_ms: self.started_at_ms,
            finished_at_ms: None,
            duration_ms: clock
                .now()
                .saturating_duration_since(self.started)
                .as_millis() as u64,
            outcome: CopyOutcome::Running,
            error: None,
        }
    }
}

#[derive(Default)]
struct Lists {
    next_id: u64,
    running: BTreeMap<u64, Arc<Running>>,
    /// Oldest first.
    finished: VecDeque<CopyReport>,
}

/// This node's copies (see the module docs). Cheap to share.
pub struct Copies {
    clock: Arc<dyn Clock>,
    /// The partition sizes behind the estimate (`None` in tests without one).
    stats: Option<Arc<crate::stats::Stats>>,
    metrics: CopyMetrics,
    lists: Mutex<Lists>,
}

impl Copies {
    pub fn new(
        metrics: &Metrics,
        clock: Arc<dyn Clock>,
        stats: Option<Arc<crate::stats::Stats>>,
    ) -> Arc<Copies> {
        Arc::new(Copies {
            clock,
            stats,
            metrics: CopyMetrics::register(metrics),
            lists: Mutex::new(Lists::default()),
        })
    }

    fn lists(&self) -> std::sync::MutexGuard<'_, Lists> {
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a copy of `partition` (as this node's map has it) to
    /// `peer`; ends as failed when the guard is dropped without
    /// [`CopyGuard::done`].
    pub fn start(
        self: &Arc<Self>,
        kind: CopyKind,
        partition: &PartitionRecord,
        peer: NodeId,
        migration: u64,
    ) -> CopyGuard {
        let estimate = self
            .stats
            .as_ref()
            .and_then(|s| s.size(partition))
            .map(|s| s.bytes);
        self.start_with(kind, partition.id, peer, migration, estimate)
    }

    /// [`Self::start`] with the estimate given.
    pub fn start_with(
        self: &Arc<Self>,
        kind: CopyKind,
        partition: PartitionId,
        peer: NodeId,
        migration: u64,
        estimate: Option<u64>,
    ) -> CopyGuard {
        let running = Arc::new(Running {
            partition,
            peer,
            kind,
            migration,
            estimate,
            started_at_ms: self.clock.unix_ms(),
            started: self.clock.now(),
            sent: AtomicU64::new(0),
            written: AtomicU64::new(0),
        });
        let mut lists = self.lists();
        lists.next_id += 1;
        let id = lists.next_id;
        lists.running.insert(id, running.clone());
        drop(lists);
        CopyGuard {
            copies: self.clone(),
            id,
            running,
            ended: false,
        }
    }

    /// The running copies, then the finished ones (newest last).
    pub fn list(&self) -> Vec<CopyReport> {
        let lists = self.lists();
        let mut out: Vec<CopyReport> = lists
            .running
            .values()
            .map(|r| r.report(&*self.clock))
            .collect();
        out.extend(lists.finished.iter().cloned());
        out
    }

    fn end(&self, id: u64, running: &Running, error: Option<String>) -> CopyReport {
        let mut report = running.report(&*self.clock);
        report.finished_at_ms = Some(self.clock.unix_ms());
        report.outcome = match error {
            None => CopyOutcome::Done,
            Some(_) => CopyOutcome::Failed,
        };
        report.error = error;
        if report.outcome == CopyOutcome::Done {
            self.metrics
                .duration_seconds
                .get_or_create(&KindLabel {
                    kind: running.kind.label(),
                })
                .observe(report.duration_ms as f64 / 1000.0);
        }
        let mut lists = self.lists();
        lists.running.remove(&id);
        lists.finished.push_back(report.clone());
        while lists.finished.len() > FINISHED_COPIES_KEPT {
            lists.finished.pop_front();
        }
        report
    }
}

/// One running copy: count its bytes here; [`CopyGuard::done`] or
/// [`CopyGuard::failed`] ends it (dropping it unended counts as failed).
pub struct CopyGuard {
    copies: Arc<Copies>,
    id: u64,
    running: Arc<Running>,
    ended: bool,
}

impl CopyGuard {
    /// `bytes` of payload were shipped and acknowledged; the receiver
    /// reported `written` of them applied.
    pub fn shipped(&self, bytes: u64, written: u64) {
        let kind = KindLabel {
            kind: self.running.kind.label(),
        };
        self.running.sent.fetch_add(bytes, Ordering::Relaxed);
        self.running.written.fetch_add(written, Ordering::Relaxed);
        let m = &self.copies.metrics;
        m.bytes_sent.get_or_create(&kind).inc_by(bytes);
        m.bytes_written.get_or_create(&kind).inc_by(written);
    }

    /// The copy as reported while it runs.
    pub fn report(&self) -> CopyReport {
        self.running.report(&*self.copies.clock)
    }

    /// Bytes sent and written so far.
    pub fn totals(&self) -> (u64, u64) {
        (
            self.running.sent.load(Ordering::Relaxed),
            self.running.written.load(Ordering::Relaxed),
        )
    }

    /// The copy completed.
    pub fn done(mut self) -> CopyReport {
        self.ended = true;
        self.copies.end(self.id, &self.running, None)
    }

    /// The copy failed.
    pub fn failed(mut self, why: String) -> CopyReport {
        self.ended = true;
        self.copies.end(self.id, &self.running, Some(why))
    }
}

impl Drop for CopyGuard {
    fn drop(&mut self) {
        if !self.ended {
            self.copies
                .end(self.id, &self.running, Some("abandoned".into()));
        }
    }
}

/// The payload bytes of change records (key + data, as the copy chunks and
/// `Engine::range_stats` count them): what [`CopyGuard::shipped`] counts
/// and the receivers report as written.
pub fn payload_bytes(records: &[ChangeRecord]) -> u64 {
    records
        .iter()
        .map(|r| {
            let data = match &r.mutation {
                Mutation::Put { data, .. } => data.len(),
                Mutation::Delete { .. } | Mutation::SetExpiry { .. } => 0,
            };
            (r.mutation.key().len() + data) as u64
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn copies() -> Arc<Copies> {
        Copies::new(&Metrics::new(), Arc::new(crate::clock::SystemClock), None)
    }

    fn put(key: &'static [u8], data: &'static [u8]) -> ChangeRecord {
        ChangeRecord {
            batch_continues: false,
            seq: 1,
            mutation: Mutation::Put {
                key: Bytes::from_static(key),
                kind: keyway_storage::ValueKind::String,
                expire_at_ms: None,
                data: Bytes::from_static(data),
            },
        }
    }

    #[test]
    fn payload_bytes_count_key_and_data() {
        let del = ChangeRecord {
            batch_continues: false,
            seq: 2,
            mutation: Mutation::Delete {
                key: Bytes::from_static(b"abc"),
            },
        };
        assert_eq!(payload_bytes(&[put(b"k1", b"hello"), del]), 2 + 5 + 3);
        assert_eq!(payload_bytes(&[]), 0);
    }

    #[test]
    fn a_copy_counts_its_bytes_and_moves_to_the_finished_list() {
        let c = copies();
        let g = c.start_with(CopyKind::Replica, PartitionId(7), NodeId(2), 0, Some(1_000));
        g.shipped(300, 300);
        g.shipped(200, 150);
        let running = c.list();
        assert_eq!(running.len(), 1);
        let r = &running[0];
        assert_eq!(
            (r.bytes_sent, r.bytes_written, r.outcome),
            (500, 450, CopyOutcome::Running)
        );
        assert_eq!(r.bytes_total_estimate, Some(1_000));
        assert!(r.finished_at_ms.is_none());
        let done = g.done();
        assert_eq!(done.outcome, CopyOutcome::Done);
        assert_eq!((done.bytes_sent, done.bytes_written), (500, 450));
        assert!(done.finished_at_ms.unwrap() >= done.started_at_ms);
        let listed = c.list();
        assert_eq!(listed, vec![done]);
        let text = c
            .metrics
            .bytes_sent
            .get_or_create(&KindLabel { kind: "replica" })
            .get();
        assert_eq!(text, 500);
        assert_eq!(
            c.metrics
                .bytes_written
                .get_or_create(&KindLabel { kind: "replica" })
                .get(),
            450
        );
    }

    #[test]
    fn a_dropped_copy_is_failed_and_only_the_last_finished_are_kept() {
        let c = copies();
        drop(c.start_with(CopyKind::Migration, PartitionId(1), NodeId(3), 9, None));
        let l = c.list();
        assert_eq!(l[0].outcome, CopyOutcome::Failed);
        assert_eq!(l[0].migration, 9);
        for i in 0..(FINISHED_COPIES_KEPT as u64 + 10) {
            let g = c.start_with(CopyKind::Replica, PartitionId(i), NodeId(2), 0, None);
            g.shipped(i, i);
            g.done();
        }
        let l = c.list();
        assert_eq!(l.len(), FINISHED_COPIES_KEPT);
        assert_eq!(
            l.last().unwrap().partition,
            PartitionId(FINISHED_COPIES_KEPT as u64 + 9)
        );
        assert!(l.iter().all(|r| r.outcome == CopyOutcome::Done));
    }
}
