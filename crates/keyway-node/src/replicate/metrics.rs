//! Replication metrics (registered once with the node's registry).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::Arc;

/// Label: a partition id.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabel {
    pub partition: u64,
}

/// Label: why the in-sync set changed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// A latency histogram ([`crate::metrics::seconds_histogram`]).
#[derive(Clone)]
pub struct Seconds(pub Histogram);

impl Default for Seconds {
    fn default() -> Self {
        Seconds(crate::metrics::seconds_histogram())
    }
}

impl Seconds {
    pub fn since(&self, start: std::time::Instant) {
        self.0.observe(start.elapsed().as_secs_f64());
    }
}

/// The replication metrics of one node.
#[derive(Default)]
pub struct ReplicationMetrics {
    /// Per owned partition: last seq minus the slowest replica stream's acked seq.
    pub lag_records: Family<PartitionLabel, Gauge>,
    /// Per owned partition: age of the oldest reply waiting for replicas.
    pub lag_ms: Family<PartitionLabel, Gauge>,
    /// Per owned partition with replicas: in-sync copies (with the primary).
    pub in_sync_copies: Family<PartitionLabel, Gauge>,
    /// Writes refused with -NOREPLICAS.
    pub norepl_refusals: Counter,
    /// In-sync set changes this node committed, by reason.
    pub in_sync_changes: Family<ReasonLabel, Counter>,
    /// Replies answered "replication not confirmed".
    pub not_confirmed: Counter,
    /// Records and bytes shipped by this node's streams and catch-ups.
    pub stream_records: Counter,
    pub stream_bytes: Counter,
    /// `Replicate` calls of the streams that carried records (records per
    /// call = `stream_records` / this, catch-ups aside).
    pub stream_calls: Counter,
    /// Round trip of a stream's `Replicate` call that carried records,
    /// from the request's send to its answer.
    pub stream_call_seconds: Seconds,
    /// Stream calls sent and not answered yet, all streams
    /// (`replica_stream_window_calls` bounds each stream's).
    pub stream_calls_in_flight: Gauge,
    /// `ReplicateStream`s opened by this node's streams: one per stream
    /// start, and one after each failure (a refusal, a broken connection, a
    /// call unanswered past the lag timeout).
    pub stream_opens: Counter,
    /// A replica's time on one `Replicate` call, from its arrival to the
    /// answer (order, check, apply, fsync when asked).
    pub replica_serve_seconds: Seconds,
    /// Records applied here as a replica.
    pub replica_applied_records: Counter,
    /// Replicate calls refused here as a replica.
    pub replica_refusals: Counter,
    /// Stream calls applied here that continued a call their sender sent
    /// before (a pipelined stream, `after_call` ≠ 0).
    pub replica_continued_calls: Counter,
    /// Of those, calls that arrived before the call they continue had been
    /// applied here, and waited for it.
    pub replica_continuation_waits: Counter,
    /// Catch-up copies started by this node as primary.
    pub copies_started: Counter,
    /// Old primaries that switchovers to this node kept in sync, no copy.
    pub switchover_kept_in_sync: Counter,
    /// Other in-sync replicas a switchover from this node dropped from the
    /// in-sync set: they had not acknowledged the fence's seq within
    /// `replica_switchover_grace_ms` (the new owner copies them again).
    pub switchover_dropped: Counter,
}

impl ReplicationMetrics {
    pub fn register(m: &crate::metrics::Metrics) -> Arc<Self> {
        let r = Arc::new(ReplicationMetrics::default());
        m.register(
            "replication_lag_records",
            "Per owned partition: last seq minus the slowest replica stream's acknowledged seq",
            r.lag_records.clone(),
        );
        m.register(
            "replication_lag_ms",
            "Per owned partition: age of the oldest reply waiting for its replicas",
            r.lag_ms.clone(),
        );
        m.register(
            "replication_in_sync_copies",
            "Per owned partition with replicas: copies in the in-sync set, the primary included",
            r.in_sync_copies.clone(),
        );
        m.register(
            "replication_norepl_refusals",
            "Writes refused with NOREPLICAS (fewer in-sync copies than min_in_sync)",
            r.norepl_refusals.clone(),
        );
        m.register(
            "replication_in_sync_changes",
            "In-sync set changes committed by this node as primary, by reason",
            r.in_sync_changes.clone(),
        );
        m.register(
            "replication_not_confirmed",
            "Replies answered 'replication not confirmed' (a CAS failed, deposed, or lease lost)",
            r.not_confirmed.clone(),
        );
        m.register(
            "replication_stream_records",
            "Change records shipped to replicas (streams and catch-up copies)",
            r.stream_records.clone(),
        );
        m.register(
            "replication_stream_bytes",
            "Encoded bytes shipped to replicas (streams and catch-up copies)",
            r.stream_bytes.clone(),
        );
        m.register(
            "replication_stream_calls",
            "Replicate calls of the streams that carried records (heartbeats and catch-ups not counted)",
            r.stream_calls.clone(),
        );
        m.register(
            "replication_stream_call_seconds",
            "Round trip of a stream's Replicate call that carried records",
            r.stream_call_seconds.0.clone(),
        );
        m.register(
            "replication_stream_calls_in_flight",
            "Stream Replicate calls sent and not answered yet (each stream at most replica_stream_window_calls)",
            r.stream_calls_in_flight.clone(),
        );
        m.register(
            "replication_stream_opens",
            "ReplicateStream calls opened by this node's replication streams (a start, or again after a failure)",
            r.stream_opens.clone(),
        );
        m.register(
            "replica_serve_seconds",
            "Time a replica spends on one Replicate call, arrival to answer",
            r.replica_serve_seconds.0.clone(),
        );
        m.register(
            "replica_applied_records",
            "Records applied on this node as a replica",
            r.replica_applied_records.clone(),
        );
        m.register(
            "replica_refusals",
            "Replicate calls refused on this node as a replica",
            r.replica_refusals.clone(),
        );
        m.register(
            "replica_continued_calls",
            "Stream Replicate calls applied here that continued an earlier call of a pipelined stream",
            r.replica_continued_calls.clone(),
        );
        m.register(
            "replica_continuation_waits",
            "Pipelined stream calls that arrived here before the call they continue was applied, and waited for it",
            r.replica_continuation_waits.clone(),
        );
        m.register(
            "replica_copies_started",
            "Catch-up copies of a partition to a replica started by this node as primary",
            r.copies_started.clone(),
        );
        m.register(
            "replication_switchover_kept_in_sync",
            "Old primaries that a switchover to this node kept in sync (streamed to with no copy)",
            r.switchover_kept_in_sync.clone(),
        );
        m.register(
            "replication_switchover_dropped",
            "In-sync replicas a switchover from this node dropped (no ack of the fence's seq within replica_switchover_grace_ms)",
            r.switchover_dropped.clone(),
        );
        r
    }
}
