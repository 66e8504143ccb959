//! Node configuration. Every limit is named with its unit last, has a
//! default, and is checked by [`NodeConfig::validate`] before the node starts.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// The largest `map_history_versions` accepted.
pub const MAX_MAP_HISTORY_VERSIONS: usize = 1_000_000;

/// fjall's smallest journal size cap (`max_journaling_size`).
pub const MIN_JOURNAL_BYTES: u64 = 64 * 1024 * 1024;

/// The default `replica_switchover_grace_ms`: a few stream round trips on
/// one machine or one rack; a replica later than this is copied again.
pub const DEFAULT_REPLICA_SWITCHOVER_GRACE_MS: u64 = 50;

/// Smallest `storage_cache_bytes`.
pub const MIN_STORAGE_CACHE_BYTES: u64 = 1024 * 1024;
/// Default `replica_stream_window_calls`.
pub const DEFAULT_REPLICA_STREAM_WINDOW_CALLS: u64 = 1;
/// Largest `replica_stream_window_calls` (below the replica's
/// remembered answer tokens, `replicate::replica::REMEMBERED_TOKENS`).
pub const MAX_REPLICA_STREAM_WINDOW_CALLS: u64 = 64;
/// Largest `storage_change_tail_bytes`.
pub const MAX_CHANGE_TAIL_BYTES: u64 = 1024 * 1024 * 1024;
/// The default block cache is the machine's memory divided by this.
pub const STORAGE_CACHE_MEMORY_DIVISOR: u64 = 32;
/// The default block cache's bounds, whatever the machine.
pub const DEFAULT_STORAGE_CACHE_BOUNDS_BYTES: (u64, u64) = (16 * 1024 * 1024, 1024 * 1024 * 1024);

/// The default `storage_cache_bytes`: this machine's memory
/// ([`machine_memory_bytes`]) over [`STORAGE_CACHE_MEMORY_DIVISOR`], within
/// [`DEFAULT_STORAGE_CACHE_BOUNDS_BYTES`]; the lower bound if the memory
/// cannot be read.
pub fn default_storage_cache_bytes() -> u64 {
    let (low, high) = DEFAULT_STORAGE_CACHE_BOUNDS_BYTES;
    machine_memory_bytes().map_or(low, |total| {
        (total / STORAGE_CACHE_MEMORY_DIVISOR).clamp(low, high)
    })
}

/// Physical memory (`MemTotal` of `/proc/meminfo`), `None` where it cannot
/// be read (not Linux).
pub fn machine_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// When an acknowledged write is durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// fsync before each acknowledgement.
    Always,
    /// Acknowledge only after a group fsync shared by every write that arrived
    /// meanwhile: acknowledged means durable, one fsync per group (default).
    Group,
    /// Acknowledge at once, fsync every `periodic_sync_ms` (Redis `appendfsync
    /// everysec`). Each batch is handed to the OS before its reply
    /// (`flush_journal_each_batch`), so a process crash loses no acknowledged
    /// write; a machine crash loses up to the last `periodic_sync_ms`.
    Periodic,
    /// Never fsync (Redis `appendfsync no`): each batch is handed to the OS
    /// before its reply, so a process crash loses no acknowledged write; a
    /// machine crash loses what the OS had not written back yet.
    None,
}

impl FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(Durability::Always),
            "group" => Ok(Durability::Group),
            "periodic" => Ok(Durability::Periodic),
            "none" => Ok(Durability::None),
            other => Err(format!(
                "unknown durability '{other}' (expected always, group, periodic or none)"
            )),
        }
    }
}

/// Which storage engine backs the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// fjall 3 on disk: the real one.
    Fjall,
    /// In memory, lost at exit: for unit tests only.
    Memory,
}

impl FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fjall" => Ok(EngineKind::Fjall),
            "memory" => Ok(EngineKind::Memory),
            other => Err(format!(
                "unknown engine '{other}' (expected fjall or memory)"
            )),
        }
    }
}

/// Everything a node needs to start.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Data directory (engine files and the node id).
    pub data_dir: PathBuf,
    /// RESP listener.
    pub listen: SocketAddr,
    /// Address clients are told to dial (`host:port`); defaults to `listen`.
    pub announce: Option<String>,
    /// Zone label (rack, availability zone) registered with the node: a
    /// partition's copies go to distinct zones first. `None` keeps the one
    /// the map has.
    pub zone: Option<String>,
    /// Admin HTTP listener (`/metrics`, `/map`); port 0 picks a free port.
    pub admin_listen: SocketAddr,
    pub engine: EngineKind,
    pub durability: Durability,
    /// fsync interval for `periodic` durability.
    pub periodic_sync_ms: u64,
    /// Storage executor threads (each owns a share of the slots).
    pub executor_threads: usize,
    /// Most commands one executor runs before one group fsync.
    pub max_group_commands: usize,
    /// Lease time-to-live requested from the metadata store.
    pub lease_ttl_ms: u64,
    /// Safety margin subtracted from the lease deadline (clock drift, pauses).
    pub lease_margin_ms: u64,
    /// Redis `proto-max-bulk-len`.
    pub max_bulk_len_bytes: usize,
    /// Most arguments in one multibulk request.
    pub max_multibulk_len: usize,
    /// Longest inline request.
    pub max_inline_len_bytes: usize,
    /// Most concurrent client connections (Redis `maxclients`).
    pub max_clients: usize,
    /// Largest string value a command may produce (APPEND, SETRANGE).
    pub max_value_bytes: usize,
    /// Password clients must send with AUTH (Redis `requirepass`).
    pub requirepass: Option<String>,
    /// Open SCAN cursors remembered per node (oldest forgotten first).
    pub max_scan_cursors: usize,
    /// Longest a request is held behind a migration cutover fence before it
    /// is answered with an error (the manager's fence timeout is far shorter).
    pub max_hold_ms: u64,
    /// Migration source: a dual write waiting longer than this for the
    /// target fails the migration's push (the migration then aborts).
    pub migration_dual_ack_timeout_ms: u64,
    /// Migration source: a target failing every call for this long fails the push.
    pub migration_target_retry_timeout_ms: u64,
    /// Migration source: how long a fence waits for the target to hold every
    /// accepted write before the fence call fails.
    pub migration_fence_drain_timeout_ms: u64,
    /// Migration source: at the fence the target is asked to hold requests
    /// for the partition (instead of redirecting them back here) until it
    /// has installed the flip, for at most this long.
    pub migration_incoming_hold_ms: u64,
    /// Migration source: right before the fence, wait up to this long for
    /// the target to acknowledge every write so far (writes keep flowing),
    /// so the fence's wait inside the write pause covers only what comes
    /// in between; 0 = fence at once. At most 10,000.
    pub migration_fence_catch_up_ms: u64,
    /// `KW.SCAN`: the LIMIT used when the request names none.
    pub kw_scan_default_limit: usize,
    /// `KW.SCAN`: the largest LIMIT a request may ask for (larger is refused);
    /// at most [`crate::kw::MAX_RANGE_SCAN_ENTRIES`].
    pub kw_scan_max_limit: usize,
    /// `KW.SCAN`: how long one call keeps re-locating its cursor (waiting for
    /// a fence to lift, for maps to agree, for an unreachable owner) without
    /// reading a key before it answers what it has, or an error.
    pub kw_scan_reroute_timeout_ms: u64,
    /// `KW.SCAN`: deadline of one `RangeScan` call to another node.
    pub kw_scan_rpc_timeout_ms: u64,
    /// ACL: how often the node reads the metadata store's ACL users and
    /// applies a change (`ACL SETUSER` on another node or the proxy is
    /// enforced here within about this long).
    pub acl_poll_interval_ms: u64,
    /// Load statistics: the window request rates and hot keys are measured over.
    pub stats_window_ms: u64,
    /// Load statistics: about one request in this many is sampled for the
    /// hot keys and the load split key (1 = every request).
    pub stats_sample_every: u32,
    /// Load statistics: hot keys reported per partition (space-saving top-k).
    pub hot_keys_k: usize,
    /// Load statistics: fewest sampled requests in the window for a load split key.
    pub stats_split_min_samples: u64,
    /// Load statistics: no load split key while the busiest key has a larger
    /// share (0..=1) of a partition's sampled requests.
    pub stats_dominant_key_share: f64,
    /// Load statistics: how often each owned partition's size is rescanned
    /// (a newly owned or resized partition is scanned at once).
    pub stats_scan_interval_ms: u64,
    /// Load statistics: entries read per chunk of a size scan (one short
    /// engine snapshot each).
    pub stats_scan_chunk_keys: usize,
    /// `KW.MAP SINCE`: how many map versions' changes the node keeps, so a
    /// client that far behind catches up with a delta (older: the whole map).
    pub map_history_versions: usize,
    /// Testing only: wrap the engine in a fault injector driven over the
    /// admin port (`POST /fault/fsync-fail`, `POST /fault/heal`, `GET /fault`).
    /// Never on in production.
    pub fault_injection: bool,
    /// Change log: how often the background truncator drops the records no
    /// migration (or replica) still needs.
    pub log_truncate_interval_ms: u64,
    /// Change log: records dropped per truncation step (one engine batch);
    /// small steps keep each step short next to foreground writes.
    pub log_truncate_chunk_records: u64,
    /// Change log: most bytes the log may keep for a migration that fell
    /// behind; past it that migration's push fails ("log retention
    /// exceeded") and its hold is released.
    pub log_retention_bytes: u64,
    /// Change log: how long a `LastSeq` answer (a migration's snapshot seq)
    /// keeps the records after it, until the migration's push holds them.
    pub log_snapshot_hold_ms: u64,
    /// Change log: how long after the last hold (a migration, a replica,
    /// a snapshot lease, a `WATCH`) went away writes still keep change
    /// records; past it they are no longer written (a second LSM insert
    /// per write saved) until a reader arms the log again. 0 = always kept.
    pub log_keep_idle_ms: u64,
    /// Change log: how long a `WATCH` keeps the records after its seq, so
    /// `EXEC` can tell a watched key that was absent, created and deleted
    /// again (a `WATCH` held longer counts such a key as unchanged).
    pub log_watch_hold_ms: u64,
    /// fjall: the block cache's capacity, bytes (at least 1 MiB). It holds
    /// the data, index and filter blocks reads touch; memory beyond it is
    /// the memtables (`storage_max_memtable_bytes` per keyspace) and the
    /// process itself. Default: [`default_storage_cache_bytes`] of this
    /// machine's memory.
    pub storage_cache_bytes: u64,
    /// fjall: total journal size past which memtables are flushed so old
    /// journals can be deleted (fjall's minimum is 64 MiB).
    pub storage_max_journal_bytes: u64,
    /// fjall: memtable size per keyspace before it is flushed to a table
    /// (at least 1 MiB); small memtables drop overwritten versions and free
    /// journals sooner. Applies to a new data directory.
    pub storage_max_memtable_bytes: u64,
    /// fjall: the active journal is sealed (and deleted once flushed) past
    /// this size, at least 1 MiB; it bounds the journal a node keeps
    /// however little data it holds.
    pub storage_journal_rotation_bytes: u64,
    /// Bytes of the newest change records kept in memory (at most 1 GiB;
    /// 0 keeps none), so replication streams and migration pushes that
    /// keep up with the log get them without reading it back.
    pub storage_change_tail_bytes: u64,
    /// Active expiry: how often a cycle runs (Redis `hz` 10 = 100 ms).
    pub active_expire_interval_ms: u64,
    /// Active expiry: keys examined per step of a cycle.
    pub active_expire_scan_keys: usize,
    /// Active expiry: longest one cycle may run (at most the interval).
    pub active_expire_cycle_budget_ms: u64,
    /// FLUSHALL/FLUSHDB: most entries one storage task of a slot deletes
    /// (one batch; a slot with more takes several tasks, other commands
    /// of the slot run between them).
    pub flush_chunk_keys: usize,
    /// SLOWLOG: the starting `slowlog-log-slower-than`, microseconds
    /// (negative = off, 0 = every command); `CONFIG SET` changes it.
    pub slowlog_log_slower_than_us: i64,
    /// SLOWLOG: the starting `slowlog-max-len` (entries kept); `CONFIG SET`
    /// changes it.
    pub slowlog_max_len: usize,
    /// WATCH: most change-log records an `EXEC` reads to tell whether a key
    /// absent at `WATCH` and at `EXEC` was created meanwhile (beyond it the
    /// key counts as unchanged).
    pub watch_log_scan_records: usize,
    /// Replication: a reply waiting this long on an in-sync replica makes
    /// the primary remove it from the in-sync set (one CAS); writes wait at
    /// most about this long for a slow or dead replica.
    pub replica_lag_timeout_ms: u64,
    /// Replication: how long a replica may serve `READONLY` reads after its
    /// primary's last vouching call (less than `replica_lag_timeout_ms`).
    pub replica_read_lease_ms: u64,
    /// Replication: the primary's stream sends an empty call this often
    /// when idle, renewing read leases (less than `replica_read_lease_ms`).
    pub replica_heartbeat_ms: u64,
    /// Replication: how many calls each stream to a replica node keeps in
    /// flight (1 = wait for each answer before the next call; at most 64).
    /// A write waits for its replicas, so with one call at a time every
    /// write waits for the round trip before its own; more calls let
    /// batches follow each other as they become durable.
    pub replica_stream_window_calls: u64,
    /// Replication: once a planned switchover's target acknowledged the
    /// last seq at the fence, how much longer the fence waits for the
    /// other in-sync replicas to acknowledge it too, so a replica one
    /// stream batch behind stays in sync instead of being dropped and
    /// copied again (less than `replica_lag_timeout_ms`; 0 = no wait).
    pub replica_switchover_grace_ms: u64,
    /// Replication: the catch-up copy of a replica that is not in sync
    /// (re-replication after a loss, a rejoin, a move's new copy) sends at
    /// most this many snapshot bytes per second per copy; 0 = unlimited.
    /// Recovery's byte-rate limit, so it leaves room for foreground traffic.
    pub replica_copy_max_bytes_per_sec: u64,
    /// How often the stray sweep looks for data of partitions this node
    /// holds no copy of (see [`crate::stray_sweep`]).
    pub stray_sweep_interval_ms: u64,
    /// How long a partition must have been without a copy here before the
    /// sweep drops what this node still stores of it (longer than the
    /// manager's `migration_cleanup_grace_ms`, so a migration's own
    /// cleanup goes first).
    pub stray_sweep_grace_ms: u64,
    /// The replica endpoint (see [`crate::replica_endpoint`]): `auto`
    /// (the `listen` IP, a free port), `off`, or an address. Its connections
    /// start `READONLY`; `CLUSTER SLOTS` lists this node's replica copies there.
    pub replica_listen: crate::replica_endpoint::ReplicaListen,
    /// The cluster secret's file (`--cluster-secret-file`): with it, every
    /// admin path but `/health` and every `Peer` call need the secret, and
    /// this node's own peer and metadata calls send it (see `keyway-auth`).
    pub cluster_secret_file: Option<PathBuf>,
    /// Admin HTTP: request bodies over this get 413 (gRPC calls excepted).
    pub admin_max_body_bytes: u64,
    /// Admin HTTP: a request not answered within this gets 408 (gRPC calls,
    /// whose streams are long-lived, are never timed out here).
    pub admin_request_timeout_ms: u64,
    /// Admin HTTP: requests served at once; more get 503 (gRPC excepted).
    pub admin_max_concurrent_requests: usize,
    /// Allow an admin listener on a non-loopback address without a cluster
    /// secret (`--admin-allow-unauthenticated`); refused at start otherwise.
    pub admin_allow_unauthenticated: bool,
    /// TLS for clients (see [`crate::tls`]), Redis's `tls-port`: a second
    /// client listener on the `listen` IP speaking the same protocol over
    /// TLS (0 = a free port); unset = none.
    pub tls_port: Option<u16>,
    /// TLS: the server certificate chain, PEM (Redis `tls-cert-file`).
    pub tls_cert_file: Option<PathBuf>,
    /// TLS: the certificate's private key, PEM (Redis `tls-key-file`).
    pub tls_key_file: Option<PathBuf>,
    /// TLS: the CA certificates client certificates are checked against,
    /// PEM (Redis `tls-ca-cert-file`).
    pub tls_ca_cert_file: Option<PathBuf>,
    /// TLS: `yes` (a client certificate signed by the CA is required),
    /// `optional` (checked if sent) or `no` (Redis `tls-auth-clients`).
    pub tls_auth_clients: crate::tls::TlsAuthClients,
    /// TLS: longest one connection's handshake may take before the
    /// connection is closed (and counted as a failed handshake).
    pub tls_handshake_timeout_ms: u64,
    /// Redis `protected-mode`: while on and no password is set for the
    /// default user, clients not on the loopback interface get `-DENIED`
    /// and are closed (see [`crate::protected_mode`]).
    pub protected_mode: bool,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            data_dir: PathBuf::from("./keyway-data/node"),
            listen: "127.0.0.1:7001".parse().expect("literal address"),
            announce: None,
            zone: None,
            admin_listen: "127.0.0.1:0".parse().expect("literal address"),
            engine: EngineKind::Fjall,
            durability: Durability::Group,
            periodic_sync_ms: 1000,
            executor_threads: 2,
            max_group_commands: 512,
            lease_ttl_ms: 10_000,
            lease_margin_ms: 1_000,
            max_bulk_len_bytes: 512 * 1024 * 1024,
            max_multibulk_len: 1024 * 1024,
            max_inline_len_bytes: 64 * 1024,
            max_clients: 10_000,
            max_value_bytes: 512 * 1024 * 1024,
            requirepass: None,
            max_scan_cursors: 10_000,
            max_hold_ms: 30_000,
            migration_dual_ack_timeout_ms: 5_000,
            migration_target_retry_timeout_ms: 10_000,
            migration_fence_drain_timeout_ms: 5_000,
            migration_incoming_hold_ms: 10_000,
            migration_fence_catch_up_ms: 50,
            kw_scan_default_limit: 100,
            kw_scan_max_limit: 10_000,
            kw_scan_reroute_timeout_ms: 10_000,
            kw_scan_rpc_timeout_ms: 5_000,
            acl_poll_interval_ms: 1_000,
            stats_window_ms: 10_000,
            stats_sample_every: 16,
            hot_keys_k: 16,
            stats_split_min_samples: 64,
            stats_dominant_key_share: 0.5,
            stats_scan_interval_ms: 30_000,
            stats_scan_chunk_keys: 1_000,
            map_history_versions: crate::map_history::DEFAULT_MAP_HISTORY_VERSIONS,
            fault_injection: false,
            log_truncate_interval_ms: 1_000,
            log_truncate_chunk_records: 4_096,
            log_retention_bytes: 1024 * 1024 * 1024,
            log_snapshot_hold_ms: 60_000,
            log_keep_idle_ms: 1_000,
            log_watch_hold_ms: 60_000,
            storage_cache_bytes: default_storage_cache_bytes(),
            storage_max_journal_bytes: MIN_JOURNAL_BYTES,
            storage_max_memtable_bytes: 4 * 1024 * 1024,
            storage_journal_rotation_bytes: 8 * 1024 * 1024,
            storage_change_tail_bytes: keyway_storage::fjall_options::DEFAULT_CHANGE_TAIL_BYTES
                as u64,
            active_expire_interval_ms: 100,
            active_expire_scan_keys: 200,
            active_expire_cycle_budget_ms: 25,
            flush_chunk_keys: 1_000,
            slowlog_log_slower_than_us: 10_000,
            slowlog_max_len: 128,
            watch_log_scan_records: 10_000,
            replica_lag_timeout_ms: 2_000,
            replica_read_lease_ms: 1_000,
            replica_heartbeat_ms: 200,
            replica_stream_window_calls: DEFAULT_REPLICA_STREAM_WINDOW_CALLS,
            replica_switchover_grace_ms: DEFAULT_REPLICA_SWITCHOVER_GRACE_MS,
            replica_copy_max_bytes_per_sec: crate::peer::Throttle::default().max_bytes_per_sec,
            stray_sweep_interval_ms: 10_000,
            stray_sweep_grace_ms: 60_000,
            replica_listen: crate::replica_endpoint::ReplicaListen::Auto,
            cluster_secret_file: None,
            admin_max_body_bytes: keyway_auth::limits::DEFAULT_ADMIN_MAX_BODY_BYTES,
            admin_request_timeout_ms: keyway_auth::limits::DEFAULT_ADMIN_REQUEST_TIMEOUT_MS,
            admin_max_concurrent_requests:
                keyway_auth::limits::DEFAULT_ADMIN_MAX_CONCURRENT_REQUESTS,
            admin_allow_unauthenticated: false,
            tls_port: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_cert_file: None,
            tls_auth_clients: crate::tls::TlsAuthClients::Yes,
            tls_handshake_timeout_ms: crate::tls::DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS,
            protected_mode: true,
        }
    }
}

impl NodeConfig {
    /// The admin HTTP listener's limits.
    pub fn admin_limits(&self) -> keyway_auth::AdminLimits {
        keyway_auth::AdminLimits {
            max_body_bytes: self.admin_max_body_bytes,
            request_timeout_ms: self.admin_request_timeout_ms,
            max_concurrent_requests: self.admin_max_concurrent_requests,
        }
    }

    /// The cluster secret read from `cluster_secret_file` (checked), if set.
    pub fn cluster_secret(&self) -> Result<Option<keyway_auth::ClusterSecret>, String> {
        self.cluster_secret_file
            .as_deref()
            .map(keyway_auth::ClusterSecret::from_file)
            .transpose()
            .map_err(|e| e.to_string())
    }

    /// Checks every limit; the message names the setting.
    pub fn validate(&self) -> Result<(), String> {
        self.admin_limits().validate()?;
        keyway_auth::check_admin_bind(
            self.admin_listen,
            self.cluster_secret_file.is_some(),
            self.admin_allow_unauthenticated,
        )?;
        self.cluster_secret()?;
        if let Some(z) = &self.zone {
            let ok = !z.is_empty()
                && z.len() <= 64
                && z.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
            if !ok {
                return Err(format!(
                    "zone must be 1-64 bytes of letters, digits, '_', '.' and '-', got {z:?}"
                ));
            }
        }
        let positive = [
            ("executor_threads", self.executor_threads as u64),
            ("max_group_commands", self.max_group_commands as u64),
            ("lease_ttl_ms", self.lease_ttl_ms),
            ("max_bulk_len_bytes", self.max_bulk_len_bytes as u64),
            ("max_multibulk_len", self.max_multibulk_len as u64),
            ("max_inline_len_bytes", self.max_inline_len_bytes as u64),
            ("max_clients", self.max_clients as u64),
            ("max_value_bytes", self.max_value_bytes as u64),
            ("max_scan_cursors", self.max_scan_cursors as u64),
            ("max_hold_ms", self.max_hold_ms),
            (
                "migration_dual_ack_timeout_ms",
                self.migration_dual_ack_timeout_ms,
            ),
            (
                "migration_target_retry_timeout_ms",
                self.migration_target_retry_timeout_ms,
            ),
            (
                "migration_fence_drain_timeout_ms",
                self.migration_fence_drain_timeout_ms,
            ),
            (
                "migration_incoming_hold_ms",
                self.migration_incoming_hold_ms,
            ),
            ("kw_scan_default_limit", self.kw_scan_default_limit as u64),
            ("kw_scan_max_limit", self.kw_scan_max_limit as u64),
            (
                "kw_scan_reroute_timeout_ms",
                self.kw_scan_reroute_timeout_ms,
            ),
            ("kw_scan_rpc_timeout_ms", self.kw_scan_rpc_timeout_ms),
            ("acl_poll_interval_ms", self.acl_poll_interval_ms),
            ("stats_sample_every", u64::from(self.stats_sample_every)),
            ("hot_keys_k", self.hot_keys_k as u64),
            ("stats_split_min_samples", self.stats_split_min_samples),
            ("stats_scan_interval_ms", self.stats_scan_interval_ms),
            ("stats_scan_chunk_keys", self.stats_scan_chunk_keys as u64),
            ("map_history_versions", self.map_history_versions as u64),
            ("log_truncate_interval_ms", self.log_truncate_interval_ms),
            (
                "log_truncate_chunk_records",
                self.log_truncate_chunk_records,
            ),
            ("log_retention_bytes", self.log_retention_bytes),
            ("log_snapshot_hold_ms", self.log_snapshot_hold_ms),
            ("log_watch_hold_ms", self.log_watch_hold_ms),
            ("active_expire_interval_ms", self.active_expire_interval_ms),
            (
                "active_expire_scan_keys",
                self.active_expire_scan_keys as u64,
            ),
            (
                "active_expire_cycle_budget_ms",
                self.active_expire_cycle_budget_ms,
            ),
            ("replica_lag_timeout_ms", self.replica_lag_timeout_ms),
            ("replica_read_lease_ms", self.replica_read_lease_ms),
            ("replica_heartbeat_ms", self.replica_heartbeat_ms),
            (
                "replica_stream_window_calls",
                self.replica_stream_window_calls,
            ),
            ("stray_sweep_interval_ms", self.stray_sweep_interval_ms),
            ("stray_sweep_grace_ms", self.stray_sweep_grace_ms),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be greater than 0"));
        }
        self.replica_listen
            .validate(self.listen, self.admin_listen)?;
        self.validate_tls()?;
        if self.storage_max_journal_bytes < MIN_JOURNAL_BYTES {
            return Err(format!(
                "storage_max_journal_bytes must be at least {MIN_JOURNAL_BYTES} (fjall's minimum)"
            ));
        }
        if self.storage_cache_bytes < MIN_STORAGE_CACHE_BYTES {
            return Err(format!(
                "storage_cache_bytes must be at least {MIN_STORAGE_CACHE_BYTES}"
            ));
        }
        if self.storage_max_memtable_bytes < 1024 * 1024 {
            return Err("storage_max_memtable_bytes must be at least 1048576".into());
        }
        if self.storage_journal_rotation_bytes < 1024 * 1024 {
            return Err("storage_journal_rotation_bytes must be at least 1048576".into());
        }
        if self.migration_fence_catch_up_ms > 10_000 {
            return Err("migration_fence_catch_up_ms must be at most 10000".into());
        }
        if self.storage_change_tail_bytes > MAX_CHANGE_TAIL_BYTES {
            return Err(format!(
                "storage_change_tail_bytes must be at most {MAX_CHANGE_TAIL_BYTES} (1 GiB)"
            ));
        }
        if self.log_truncate_chunk_records > 1_000_000 {
            return Err("log_truncate_chunk_records must be at most 1000000".into());
        }
        if self.acl_poll_interval_ms > 3_600_000 {
            return Err("acl_poll_interval_ms must be at most 3600000 (one hour)".into());
        }
        if self.active_expire_cycle_budget_ms > self.active_expire_interval_ms {
            return Err(format!(
                "active_expire_cycle_budget_ms ({}) must be at most active_expire_interval_ms ({})",
                self.active_expire_cycle_budget_ms, self.active_expire_interval_ms
            ));
        }
        if self.flush_chunk_keys == 0 || self.flush_chunk_keys > 100_000 {
            return Err("flush_chunk_keys must be between 1 and 100000".into());
        }
        if self.watch_log_scan_records > 10_000_000 {
            return Err("watch_log_scan_records must be at most 10000000".into());
        }
        if self.slowlog_max_len > crate::slowlog::MAX_SLOWLOG_LEN {
            return Err(format!(
                "slowlog_max_len must be at most {}",
                crate::slowlog::MAX_SLOWLOG_LEN
            ));
        }
        if self.active_expire_scan_keys > 100_000 {
            return Err("active_expire_scan_keys must be at most 100000".into());
        }
        if self.executor_threads > 256 {
            return Err("executor_threads must be at most 256".into());
        }
        if self.kw_scan_max_limit > crate::kw::MAX_RANGE_SCAN_ENTRIES as usize {
            return Err(format!(
                "kw_scan_max_limit must be at most {}",
                crate::kw::MAX_RANGE_SCAN_ENTRIES
            ));
        }
        if self.kw_scan_default_limit > self.kw_scan_max_limit {
            return Err(format!(
                "kw_scan_default_limit ({}) must be at most kw_scan_max_limit ({})",
                self.kw_scan_default_limit, self.kw_scan_max_limit
            ));
        }
        if self.stats_window_ms < 100 {
            return Err("stats_window_ms must be at least 100".into());
        }
        if self.hot_keys_k > 1024 {
            return Err("hot_keys_k must be at most 1024".into());
        }
        if self.stats_scan_chunk_keys > 100_000 {
            return Err("stats_scan_chunk_keys must be at most 100000".into());
        }
        if self.map_history_versions > MAX_MAP_HISTORY_VERSIONS {
            return Err(format!(
                "map_history_versions must be at most {MAX_MAP_HISTORY_VERSIONS}"
            ));
        }
        if !(self.stats_dominant_key_share > 0.0 && self.stats_dominant_key_share <= 1.0) {
            return Err("stats_dominant_key_share must be in (0, 1]".into());
        }
        if self.lease_margin_ms >= self.lease_ttl_ms {
            return Err(format!(
                "lease_margin_ms ({}) must be less than lease_ttl_ms ({})",
                self.lease_margin_ms, self.lease_ttl_ms
            ));
        }
        if self.replica_read_lease_ms >= self.replica_lag_timeout_ms {
            return Err(format!(
                "replica_read_lease_ms ({}) must be less than replica_lag_timeout_ms ({})",
                self.replica_read_lease_ms, self.replica_lag_timeout_ms
            ));
        }
        if self.replica_switchover_grace_ms >= self.replica_lag_timeout_ms {
            return Err(format!(
                "replica_switchover_grace_ms ({}) must be less than replica_lag_timeout_ms ({})",
                self.replica_switchover_grace_ms, self.replica_lag_timeout_ms
            ));
        }
        if self.replica_heartbeat_ms >= self.replica_read_lease_ms {
            return Err(format!(
                "replica_heartbeat_ms ({}) must be less than replica_read_lease_ms ({})",
                self.replica_heartbeat_ms, self.replica_read_lease_ms
            ));
        }
        if self.replica_stream_window_calls > MAX_REPLICA_STREAM_WINDOW_CALLS {
            return Err(format!(
                "replica_stream_window_calls must be at most {MAX_REPLICA_STREAM_WINDOW_CALLS}"
            ));
        }
        if self.lease_ttl_ms < 300 {
            return Err("lease_ttl_ms must be at least 300".into());
        }
        if self.durability == Durability::Periodic && self.periodic_sync_ms == 0 {
            return Err("periodic_sync_ms must be greater than 0 with periodic durability".into());
        }
        if let Some(addr) = &self.announce
            && addr
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .is_none()
        {
            return Err(format!("announce address '{addr}' must be host:port"));
        }
        Ok(())
    }

    /// The TLS settings (see [`crate::tls`]).
    pub fn tls(&self) -> crate::tls::TlsSettings<'_> {
        crate::tls::TlsSettings {
            port: self.tls_port,
            cert_file: self.tls_cert_file.as_deref(),
            key_file: self.tls_key_file.as_deref(),
            ca_cert_file: self.tls_ca_cert_file.as_deref(),
            auth_clients: self.tls_auth_clients,
            handshake_timeout_ms: self.tls_handshake_timeout_ms,
        }
    }

    /// The TLS settings go together, their files load, and `tls_port`
    /// is not a port the node already listens on.
    fn validate_tls(&self) -> Result<(), String> {
        self.tls().server_config()?;
        if let Some(port) = self.tls_port.filter(|p| *p != 0) {
            let admin = (self.admin_listen.ip() == self.listen.ip()
                || self.admin_listen.ip().is_unspecified())
                && self.admin_listen.port() == port;
            if port == self.listen.port() || admin {
                return Err(format!(
                    "tls_port {port} is already the port of listen or admin_listen"
                ));
            }
        }
        Ok(())
    }

    /// The migration source role's limits.
    pub fn role_limits(&self) -> crate::migrate::RoleLimits {
        use std::time::Duration;
        crate::migrate::RoleLimits {
            push: crate::migrate::PushLimits {
                dual_ack_timeout: Duration::from_millis(self.migration_dual_ack_timeout_ms),
                target_retry_timeout: Duration::from_millis(self.migration_target_retry_timeout_ms),
            },
            fence_drain_timeout: Duration::from_millis(self.migration_fence_drain_timeout_ms),
            incoming_hold: Duration::from_millis(self.migration_incoming_hold_ms),
            fence_catch_up: Duration::from_millis(self.migration_fence_catch_up_ms),
        }
    }

    /// Replication's limits.
    pub fn replication(&self) -> crate::replicate::ReplicationConfig {
        use std::time::Duration;
        crate::replicate::ReplicationConfig {
            lag_timeout: Duration::from_millis(self.replica_lag_timeout_ms),
            read_lease: Duration::from_millis(self.replica_read_lease_ms),
            heartbeat: Duration::from_millis(self.replica_heartbeat_ms),
            stream_window_calls: self.replica_stream_window_calls as usize,
            switchover_grace: Duration::from_millis(self.replica_switchover_grace_ms),
            throttle: crate::peer::Throttle {
                max_bytes_per_sec: self.replica_copy_max_bytes_per_sec,
                ..crate::peer::Throttle::default()
            },
        }
    }

    /// The stray sweep's limits.
    pub fn sweep_limits(&self) -> crate::stray_sweep::SweepLimits {
        use std::time::Duration;
        crate::stray_sweep::SweepLimits {
            interval: Duration::from_millis(self.stray_sweep_interval_ms),
            grace: Duration::from_millis(self.stray_sweep_grace_ms),
        }
    }

    /// The change-log truncator's limits.
    pub fn gc_limits(&self) -> crate::log_gc::GcLimits {
        use std::time::Duration;
        crate::log_gc::GcLimits {
            interval: Duration::from_millis(self.log_truncate_interval_ms),
            chunk_records: self.log_truncate_chunk_records,
            retention_bytes: self.log_retention_bytes,
        }
    }

    /// The active expiry cycle's limits.
    pub fn expire_limits(&self) -> crate::active_expire::ExpireLimits {
        use std::time::Duration;
        crate::active_expire::ExpireLimits {
            interval: Duration::from_millis(self.active_expire_interval_ms),
            scan_keys: self.active_expire_scan_keys,
            cycle_budget: Duration::from_millis(self.active_expire_cycle_budget_ms),
        }
    }

    /// The RESP protocol limits derived from this configuration.
    pub fn resp_limits(&self) -> keyway_resp::Limits {
        keyway_resp::Limits {
            max_bulk_len_bytes: self.max_bulk_len_bytes,
            max_multibulk_len: self.max_multibulk_len,
            max_inline_len_bytes: self.max_inline_len_bytes,
            ..keyway_resp::Limits::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_leases_must_nest_inside_the_lag_timeout() {
        let c = NodeConfig {
            replica_read_lease_ms: 2_000,
            ..NodeConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("replica_read_lease_ms"));
        let c = NodeConfig {
            replica_heartbeat_ms: 1_000,
            ..NodeConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("replica_heartbeat_ms"));
        let c = NodeConfig {
            replica_switchover_grace_ms: 2_000,
            ..NodeConfig::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .contains("replica_switchover_grace_ms")
        );
        NodeConfig {
            replica_switchover_grace_ms: 0,
            ..NodeConfig::default()
        }
        .validate()
        .unwrap();
        let c = NodeConfig {
            replica_lag_timeout_ms: 0,
            ..NodeConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("replica_lag_timeout_ms"));
    }

    #[test]
    fn the_default_block_cache_follows_the_machine_within_its_bounds() {
        let (low, high) = DEFAULT_STORAGE_CACHE_BOUNDS_BYTES;
        let chosen = default_storage_cache_bytes();
        assert!((low..=high).contains(&chosen), "{chosen}");
        if let Some(total) = machine_memory_bytes() {
            assert_eq!(
                chosen,
                (total / STORAGE_CACHE_MEMORY_DIVISOR).clamp(low, high)
            );
        }
        assert!(low >= MIN_STORAGE_CACHE_BYTES);
    }

    #[test]
    fn default_is_valid_and_bad_limits_are_named() {
        NodeConfig::default().validate().unwrap();
        let c = NodeConfig {
            max_clients: 0,
            ..NodeConfig::default()
        };
        assert_eq!(
            c.validate().unwrap_err(),
            "max_clients must be greater than 0"
        );
        let c = NodeConfig {
            lease_margin_ms: 20_000,
            ..NodeConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("lease_margin_ms"));
        let c = NodeConfig {
            announce: Some("nope".into()),
            ..NodeConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("announce"));
        let c = NodeConfig {
            kw_scan_default_limit: 20_000,
            ..NodeConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("kw_scan_default_limit"));
        let c = NodeConfig {
            kw_scan_max_limit: 1_000_000,
            ..NodeConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("kw_scan_max_limit"));
        let c = NodeConfig {
            stats_dominant_key_share: 1.5,
            ..NodeConfig::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .contains("stats_dominant_key_share")
        );
        let c = NodeConfig {
            stats_window_ms: 10,
            ..NodeConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("stats_window_ms"));
        for bad in [0, MAX_MAP_HISTORY_VERSIONS + 1] {
            let c = NodeConfig {
                map_history_versions: bad,
                ..NodeConfig::default()
            };
            assert!(c.validate().unwrap_err().contains("map_history_versions"));
        }
        for (c, name) in [
            (
                NodeConfig {
                    log_retention_bytes: 0,
                    ..NodeConfig::default()
                },
                "log_retention_bytes",
            ),
            (
                NodeConfig {
                    storage_cache_bytes: MIN_STORAGE_CACHE_BYTES - 1,
                    ..NodeConfig::default()
                },
                "storage_cache_bytes",
            ),
            (
                NodeConfig {
                    storage_max_journal_bytes: 1024,
                    ..NodeConfig::default()
                },
                "storage_max_journal_bytes",
            ),
            (
                NodeConfig {
                    active_expire_cycle_budget_ms: 500,
                    ..NodeConfig::default()
                },
                "active_expire_cycle_budget_ms",
            ),
        ] {
            assert!(c.validate().unwrap_err().contains(name), "{name}");
        }
        assert!("sometimes".parse::<Durability>().is_err());
        assert_eq!("group".parse::<Durability>(), Ok(Durability::Group));
    }
}
