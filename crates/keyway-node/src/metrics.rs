//! The node's Prometheus metrics, served as text on the admin port's `/metrics`.
//!
//! Counters are registered without a `_total` suffix: prometheus-client adds
//! it (and panics in debug builds if the name already ends with it).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Mutex;

/// Label of a rejection counter: which kind of rejection.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// Label of the replica read counter: what became of a `READONLY` read
/// of a partition this node does not own.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// Every metric a node exports.
pub struct Metrics {
    registry: Mutex<Registry>,
    pub commands: Counter,
    pub rejections: Family<KindLabel, Counter>,
    pub protocol_errors: Counter,
    pub connections: Gauge,
    pub connections_refused: Counter,
    pub fsync_seconds: Histogram,
    pub fsync_errors: Counter,
    pub group_commit_size: Histogram,
    pub read_groups_released_at_once: Counter,
    pub inline_runs: Counter,
    pub map_version: Gauge,
    pub partitions_owned: Gauge,
    pub lease_remaining_ms: Gauge,
    /// The engine's memory ([`keyway_storage::EngineMemory`]), set at each scrape.
    pub storage_cache_bytes: Gauge,
    pub storage_cache_capacity_bytes: Gauge,
    pub storage_write_buffer_bytes: Gauge,
    pub storage_change_tail_bytes: Gauge,
    pub storage_foreign_reads_skipped: Counter,
    /// Held while `storage_foreign_reads_skipped` follows the engine's count.
    storage_foreign_reads_follow: Mutex<()>,
    pub lease_renewal_failures: Counter,
    /// Requests parked behind a migration fence (each park counted).
    pub held: Counter,
    /// Parked requests answered with an error after `max_hold_ms`.
    pub held_expired: Counter,
    /// Requests parked without running because an earlier request of their
    /// slot was parked (so they cannot overtake it).
    pub held_in_order: Counter,
    /// Snapshot bytes this node pushed to migration targets.
    pub migration_copied_bytes: Counter,
    /// Change records this node forwarded to migration targets.
    pub migration_forwarded_records: Counter,
    /// Times a streaming push moved its checkpoint forward (the rolling
    /// checkpoint that keeps the cutover's digest small).
    pub migration_checkpoint_refreshes: Counter,
    /// Times a snapshot copy backed off for foreground latency.
    pub migration_backoffs: Counter,
    /// Migrations this node is the source of (pushes running).
    pub migration_pushes: Gauge,
    /// Largest lag (source seq − target-acknowledged seq) over running pushes.
    pub migration_lag_records: Gauge,
    /// Time a dual write waited for the target's acknowledgement.
    pub migration_dual_wait_seconds: Histogram,
    /// The source's fence, step by step (`lease_wait`, `drain`, `acked`,
    /// `digests`, `hold_wait`): where the fence part of a cutover's pause
    /// goes.
    pub migration_fence_step_seconds: Family<KindLabel, Histogram, fn() -> Histogram>,
    /// `KW.MAP SINCE` replies, by kind (`delta`, `full`).
    pub map_since_replies: Family<KindLabel, Counter>,
    /// Data-changing peer calls (`ApplyForeign`, `DropRangeChunk`,
    /// `MigrateReceive`) refused, by reason (`not_receiving`, `owned`, ...).
    pub peer_refusals: Family<KindLabel, Counter>,
    /// `READONLY` reads of partitions this node is a replica of, by outcome:
    /// `served` (admitted by the replica read lease) or `moved` (answered
    /// `-MOVED` to the primary: not in sync, no valid read lease, no copy).
    pub replica_reads: Family<OutcomeLabel, Counter>,
    /// Open client connections on the replica endpoint (also counted in
    /// `connections`).
    pub replica_endpoint_connections: Gauge,
    /// The admin guard's refusals (`keyway_auth_refused`, `keyway_admin_limited`).
    pub auth: keyway_auth::AuthMetrics,
    /// Failed TLS handshakes and protected-mode refusals ([`crate::tls::AccessMetrics`]).
    pub access: crate::tls::AccessMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let m = Metrics {
            registry: Mutex::new(Registry::with_prefix("keyway")),
            commands: Counter::default(),
            rejections: Family::default(),
            protocol_errors: Counter::default(),
            connections: Gauge::default(),
            connections_refused: Counter::default(),
            fsync_seconds: seconds_histogram(),
            fsync_errors: Counter::default(),
            group_commit_size: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            read_groups_released_at_once: Counter::default(),
            inline_runs: Counter::default(),
            map_version: Gauge::default(),
            partitions_owned: Gauge::default(),
            lease_remaining_ms: Gauge::default(),
            storage_cache_bytes: Gauge::default(),
            storage_cache_capacity_bytes: Gauge::default(),
            storage_write_buffer_bytes: Gauge::default(),
            storage_change_tail_bytes: Gauge::default(),
            storage_foreign_reads_skipped: Counter::default(),
            storage_foreign_reads_follow: Mutex::new(()),
            lease_renewal_failures: Counter::default(),
            held: Counter::default(),
            held_expired: Counter::default(),
            held_in_order: Counter::default(),
            migration_copied_bytes: Counter::default(),
            migration_forwarded_records: Counter::default(),
            migration_checkpoint_refreshes: Counter::default(),
            migration_backoffs: Counter::default(),
            migration_pushes: Gauge::default(),
            migration_lag_records: Gauge::default(),
            migration_dual_wait_seconds: seconds_histogram(),
            migration_fence_step_seconds: Family::new_with_constructor(seconds_histogram),
            map_since_replies: Family::default(),
            peer_refusals: Family::default(),
            replica_reads: Family::default(),
            replica_endpoint_connections: Gauge::default(),
            auth: keyway_auth::AuthMetrics::default(),
            access: Default::default(),
        };
        {
            let mut r = m.registry.lock().expect("fresh mutex");
            m.auth.register(&mut r);
            r.register(
                "commands",
                "Commands executed on storage threads",
                m.commands.clone(),
            );
            r.register(
                "rejections",
                "Requests rejected by the ownership check, by kind",
                m.rejections.clone(),
            );
            r.register(
                "protocol_errors",
                "Malformed requests (connection closed)",
                m.protocol_errors.clone(),
            );
            r.register(
                "connections",
                "Open client connections",
                m.connections.clone(),
            );
            r.register(
                "connections_refused",
                "Connections refused at max_clients",
                m.connections_refused.clone(),
            );
            r.register(
                "fsync_seconds",
                "Duration of one storage fsync (group commits, `always` writes, a replica's calls)",
                m.fsync_seconds.clone(),
            );
            r.register(
                "fsync_errors",
                "Failed storage fsyncs",
                m.fsync_errors.clone(),
            );
            r.register(
                "group_commit_commands",
                "Commands released per group fsync",
                m.group_commit_size.clone(),
            );
            r.register(
                "read_groups_released_at_once",
                "Read-only groups (durability group) a shard thread released itself, without the syncer: every write of its thread was already durable",
                m.read_groups_released_at_once.clone(),
            );
            r.register(
                "inline_runs",
                "Requests a connection ran inline on its own shard thread (no queue, no wake-up)",
                m.inline_runs.clone(),
            );
            r.register(
                "map_version",
                "Version of the partition map this node routes by",
                m.map_version.clone(),
            );
            r.register(
                "partitions_owned",
                "Partitions this node owns in its map",
                m.partitions_owned.clone(),
            );
            r.register(
                "lease_remaining_ms",
                "Milliseconds left on this node's lease",
                m.lease_remaining_ms.clone(),
            );
            r.register(
                "storage_cache_bytes",
                "Bytes the storage engine's block cache holds",
                m.storage_cache_bytes.clone(),
            );
            r.register(
                "storage_cache_capacity_bytes",
                "The block cache's capacity (storage_cache_bytes setting)",
                m.storage_cache_capacity_bytes.clone(),
            );
            r.register(
                "storage_write_buffer_bytes",
                "Bytes of memtables (active and sealed) not yet flushed",
                m.storage_write_buffer_bytes.clone(),
            );
            r.register(
                "storage_change_tail_bytes",
                "Bytes of the newest change records kept in memory for streams and pushes (storage_change_tail_bytes setting)",
                m.storage_change_tail_bytes.clone(),
            );
            r.register(
                "storage_foreign_reads_skipped",
                "Replicated (foreign) writes applied without reading the key's current version: newer than every version stored in the key's range",
                m.storage_foreign_reads_skipped.clone(),
            );
            r.register(
                "lease_renewal_failures",
                "Lease renewals that failed",
                m.lease_renewal_failures.clone(),
            );
            r.register(
                "held_requests",
                "Requests parked behind a migration cutover fence",
                m.held.clone(),
            );
            r.register(
                "held_expired",
                "Parked requests answered with an error after max_hold_ms",
                m.held_expired.clone(),
            );
            r.register(
                "held_in_order",
                "Requests parked without running behind an earlier parked request of their slot",
                m.held_in_order.clone(),
            );
            r.register(
                "migration_copied_bytes",
                "Snapshot bytes pushed to migration targets",
                m.migration_copied_bytes.clone(),
            );
            r.register(
                "migration_forwarded_records",
                "Change records forwarded to migration targets (catch-up and dual writes)",
                m.migration_forwarded_records.clone(),
            );
            r.register(
                "migration_checkpoint_refreshes",
                "Times a migration push moved its checkpoint forward (keys written since digested on both sides)",
                m.migration_checkpoint_refreshes.clone(),
            );
            r.register(
                "migration_fence_step_seconds",
                "The source's fence by step: lease_wait (read leases run out, before the fence), drain (the fence taken, in-flight requests done), acked (the target has every write), digests (both sides' digests taken), hold_wait (the rest of the wait for the target's incoming hold, asked for at the start)",
                m.migration_fence_step_seconds.clone(),
            );
            r.register(
                "migration_backoffs",
                "Snapshot copy back-offs for foreground latency",
                m.migration_backoffs.clone(),
            );
            r.register(
                "migration_pushes",
                "Migrations this node is the source of",
                m.migration_pushes.clone(),
            );
            r.register(
                "migration_lag_records",
                "Largest change-log lag of a running push",
                m.migration_lag_records.clone(),
            );
            r.register(
                "migration_dual_wait_seconds",
                "Wait of a dual write for the target's acknowledgement",
                m.migration_dual_wait_seconds.clone(),
            );
            r.register(
                "map_since_replies",
                "KW.MAP SINCE replies, by kind (delta, full)",
                m.map_since_replies.clone(),
            );
            r.register(
                "peer_refusals",
                "Migration writes from peers refused by this node's map and incoming migrations, by reason",
                m.peer_refusals.clone(),
            );
            r.register(
                "replica_reads",
                "READONLY reads of partitions this node does not own, by outcome (served as an in-sync replica, moved to the primary)",
                m.replica_reads.clone(),
            );
            r.register(
                "replica_endpoint_connections",
                "Open client connections on the replica endpoint (--replica-listen)",
                m.replica_endpoint_connections.clone(),
            );
            m.access.register(&mut r);
        }
        m
    }

    /// Registers a metric kept by another module (each keeps its own
    /// metrics in its own file and registers them here once, at start).
    pub fn register(
        &self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .register(name, help, metric);
    }

    /// Counts one rejection of `kind`.
    pub fn rejected(&self, kind: &'static str) {
        self.rejections.get_or_create(&KindLabel { kind }).inc();
    }

    /// Counts one `READONLY` read of a partition this node does not own.
    pub fn replica_read(&self, served: bool) {
        let outcome = if served { "served" } else { "moved" };
        self.replica_reads
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// Counts one `READONLY` read served here as a replica; `switched`:
    /// the partition's `reads_from` is this node (outcome
    /// `served_reads_from`, else `served`).
    pub fn replica_read_served(&self, switched: bool) {
        let outcome = if switched {
            "served_reads_from"
        } else {
            "served"
        };
        self.replica_reads
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// `READONLY` reads this node served (`true`, either outcome) or
    /// redirected (`false`) as a replica so far.
    pub fn replica_reads_count(&self, served: bool) -> u64 {
        let get = |outcome| {
            self.replica_reads
                .get_or_create(&OutcomeLabel { outcome })
                .get()
        };
        match served {
            true => get("served") + get("served_reads_from"),
            false => get("moved"),
        }
    }

    /// `READONLY` reads served here because the partition's `reads_from`
    /// is this node (the smart client and the proxy route them here).
    pub fn reads_from_served_count(&self) -> u64 {
        self.replica_reads
            .get_or_create(&OutcomeLabel {
                outcome: "served_reads_from",
            })
            .get()
    }

    /// Counts one `KW.MAP SINCE` reply.
    pub fn map_since(&self, answer: &crate::map_history::HistoryAnswer) {
        let kind = match answer {
            crate::map_history::HistoryAnswer::Delta(_) => "delta",
            crate::map_history::HistoryAnswer::Full(_) => "full",
        };
        self.map_since_replies
            .get_or_create(&KindLabel { kind })
            .inc();
    }

    /// Sets the storage memory gauges from `engine`.
    pub fn observe_storage(&self, engine: &dyn keyway_storage::Engine) {
        let mem = engine.memory();
        self.storage_cache_bytes.set(mem.cache_bytes as i64);
        self.storage_cache_capacity_bytes
            .set(mem.cache_capacity_bytes as i64);
        self.storage_write_buffer_bytes
            .set(mem.write_buffer_bytes as i64);
        self.storage_change_tail_bytes
            .set(mem.change_tail_bytes as i64);
        // The engine counts since it opened, as this counter does since the
        // node started: it follows by the difference, under a lock so two
        // scrapes at once never add the same difference twice (only this
        // code moves the counter).
        let _following = self
            .storage_foreign_reads_follow
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let skipped = engine.foreign_reads_skipped();
        let shown = self.storage_foreign_reads_skipped.get();
        if skipped > shown {
            self.storage_foreign_reads_skipped.inc_by(skipped - shown);
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// A latency histogram in seconds, 50 µs to about 1.6 s (every latency
/// histogram of the node).
pub(crate) fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}
