//! `keyway server`: one storage node.

use keyway_node::{Durability, EngineKind, Node, NodeConfig};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Node settings shared by `keyway server` and `keyway dev`.
#[derive(clap::Args)]
pub struct NodeFlags {
    /// TOML file with any NodeConfig field; flags given on the command line win.
    #[arg(long)]
    config: Option<PathBuf>,
    /// When an acknowledged write is durable: always, group (default), periodic, none.
    ///
    /// always: fsync after each write, before its reply. group: one fsync
    /// per group of writes, before any of their replies. Neither loses an
    /// acknowledged write to a process crash or a machine crash (CONFIG GET
    /// appendfsync: always). periodic: reply at once; each write is handed
    /// to the OS before its reply and fsynced every --periodic-sync-ms: a
    /// process crash (kill -9) loses no acknowledged write, a machine crash
    /// loses up to the last period (appendfsync everysec). none: the same
    /// without the fsync: a process crash loses no acknowledged write, a
    /// machine crash loses what the OS had not written back yet (Linux: up
    /// to about 30 s by default) (appendfsync no).
    #[arg(long)]
    durability: Option<Durability>,
    /// fsync interval for --durability periodic.
    #[arg(long)]
    periodic_sync_ms: Option<u64>,
    /// Storage executor threads (default 2; under `keyway dev`, unless set
    /// here or in --config, the cores divided among the nodes, 1 to 2).
    #[arg(long)]
    executor_threads: Option<usize>,
    /// Lease time-to-live.
    #[arg(long)]
    lease_ttl_ms: Option<u64>,
    /// Safety margin subtracted from the lease deadline.
    #[arg(long)]
    lease_margin_ms: Option<u64>,
    /// Redis requirepass.
    #[arg(long, env = "KEYWAY_REQUIREPASS")]
    requirepass: Option<String>,
    /// ACL: how often the metadata store's ACL users are read and applied,
    /// milliseconds (default 1000).
    #[arg(long)]
    acl_poll_interval_ms: Option<u64>,
    /// Most client connections per node.
    #[arg(long)]
    max_clients: Option<usize>,
    /// Largest bulk string a request may carry.
    #[arg(long)]
    max_bulk_len_bytes: Option<usize>,
    /// Storage engine: fjall (default) or memory (tests only).
    #[arg(long)]
    engine: Option<EngineKind>,
    /// Load statistics: window of the request rates and hot keys (default 10000).
    #[arg(long)]
    stats_window_ms: Option<u64>,
    /// Load statistics: sample about one request in this many (default 16).
    #[arg(long)]
    stats_sample_every: Option<u32>,
    /// Load statistics: hot keys reported per partition (default 16).
    #[arg(long)]
    hot_keys_k: Option<usize>,
    /// Load statistics: rescan each owned partition's size this often (default 30000).
    #[arg(long)]
    stats_scan_interval_ms: Option<u64>,
    /// Change log: truncate what no migration needs this often (default 1000).
    #[arg(long)]
    log_truncate_interval_ms: Option<u64>,
    /// Change log: most bytes kept for a migration that fell behind; past it
    /// the migration aborts with "log retention exceeded" (default 1 GiB).
    #[arg(long)]
    log_retention_bytes: Option<u64>,
    /// Change log: stop writing change records this long after the last
    /// reader (migration, replica, WATCH) went away; 0 = always write them
    /// (default 1000).
    #[arg(long)]
    log_keep_idle_ms: Option<u64>,
    /// fjall: block cache capacity in bytes, at least 1 MiB (default the
    /// machine's memory / 32, 16 MiB to 1 GiB; under `keyway dev`, unless
    /// set here or in --config, that divided among the nodes).
    #[arg(long)]
    storage_cache_bytes: Option<u64>,
    /// fjall: journal size cap before memtables are flushed (default and
    /// minimum 64 MiB).
    #[arg(long)]
    storage_max_journal_bytes: Option<u64>,
    /// fjall: memtable size per keyspace, for a new data directory (default
    /// 4 MiB, at least 1 MiB).
    #[arg(long)]
    storage_max_memtable_bytes: Option<u64>,
    /// fjall: seal the active journal past this size so it can be deleted
    /// once flushed (default 8 MiB, at least 1 MiB).
    #[arg(long)]
    storage_journal_rotation_bytes: Option<u64>,
    /// Bytes of the newest change records kept in memory for replication
    /// streams and migration pushes that keep up (default 4 MiB, 0 = none,
    /// at most 1 GiB).
    #[arg(long)]
    storage_change_tail_bytes: Option<u64>,
    /// Active expiry: run a cycle this often, Redis `hz` (default 100 = hz 10).
    #[arg(long)]
    active_expire_interval_ms: Option<u64>,
    /// FLUSHALL/FLUSHDB: most entries one storage task of a slot deletes in
    /// one batch, 1..=100000 (default 1000).
    #[arg(long)]
    flush_chunk_keys: Option<usize>,
    /// SLOWLOG: log commands slower than this many microseconds; negative
    /// turns the log off, 0 logs every command; CONFIG SET
    /// slowlog-log-slower-than changes it at run time (default 10000).
    #[arg(long, allow_hyphen_values = true)]
    slowlog_log_slower_than_us: Option<i64>,
    /// SLOWLOG: entries kept, at most 1000000; CONFIG SET slowlog-max-len
    /// changes it at run time (default 128).
    #[arg(long)]
    slowlog_max_len: Option<usize>,
    /// WATCH: most change-log records an EXEC reads to tell whether a key
    /// absent at WATCH and at EXEC was created (and deleted) meanwhile,
    /// at most 10000000 (default 10000).
    #[arg(long)]
    watch_log_scan_records: Option<usize>,
    /// Replication: a write waiting this long on an in-sync replica makes
    /// the primary drop it from the in-sync set, by one CAS (default 2000).
    #[arg(long)]
    replica_lag_timeout_ms: Option<u64>,
    /// Replication: a replica serves READONLY reads this long after its
    /// primary's last vouching call; less than --replica-lag-timeout-ms
    /// (default 1000).
    #[arg(long)]
    replica_read_lease_ms: Option<u64>,
    /// Replication: an idle stream's heartbeat interval, renewing read
    /// leases; less than --replica-read-lease-ms (default 200).
    #[arg(long)]
    replica_heartbeat_ms: Option<u64>,
    /// Replication: calls each stream to a replica keeps in flight, 1 to
    /// 64 (default 1: one call at a time, which batches best when the
    /// machine's cores are the limit; more pays where the round trip is).
    #[arg(long)]
    replica_stream_window_calls: Option<u64>,
    /// Replication: once a planned switchover's target caught up, how long
    /// the fence waits for the partition's other in-sync replicas to catch
    /// up too before they leave the in-sync set (and are copied again);
    /// less than --replica-lag-timeout-ms, 0 = no wait (default 50).
    #[arg(long)]
    replica_switchover_grace_ms: Option<u64>,
    /// Replication: the byte-rate limit of one replica catch-up copy
    /// (re-replication, rejoin, a move's new copy), bytes per second;
    /// 0 = unlimited (default 67108864, the migration copy's default).
    #[arg(long)]
    replica_copy_max_bytes_per_sec: Option<u64>,
    /// How often the stray sweep looks for data of partitions this node
    /// holds no copy of any more (a node back after it was replaced, a
    /// replica moved away), milliseconds (default 10000).
    #[arg(long)]
    stray_sweep_interval_ms: Option<u64>,
    /// How long a partition must have had no copy here before the sweep
    /// drops what this node still stores of it, milliseconds; keep it above
    /// the manager's --migration-cleanup-grace-ms (default 60000).
    #[arg(long)]
    stray_sweep_grace_ms: Option<u64>,
    /// The cluster secret and the admin listener's limits.
    #[command(flatten)]
    pub admin: crate::secret_flags::AdminFlags,
    /// Client TLS and protected mode.
    #[command(flatten)]
    pub tls: crate::tls_flags::TlsFlags,
}

impl NodeFlags {
    /// Whether the executor thread count was chosen (`--executor-threads`,
    /// or a config file).
    pub fn executor_threads_chosen(&self) -> bool {
        self.executor_threads.is_some() || self.config.is_some()
    }

    /// Whether the block cache size was chosen (`--storage-cache-bytes`, or
    /// a config file).
    pub fn storage_cache_chosen(&self) -> bool {
        self.storage_cache_bytes.is_some() || self.config.is_some()
    }

    /// The configuration: defaults, then the TOML file, then the flags.
    pub fn to_config(&self) -> anyhow::Result<NodeConfig> {
        let mut c = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    crate::cli_error::UserError(format!("cannot read {}: {e}", path.display()))
                })?;
                toml::from_str(&text).map_err(|e: toml::de::Error| {
                    // One line: where, then what (toml's Display adds a
                    // multi-line excerpt of the file).
                    let at = e.span().map_or(String::new(), |span| {
                        let before = &text[..span.start.min(text.len())];
                        let line = before.matches('\n').count() + 1;
                        let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                        format!(" line {line}, column {column}:")
                    });
                    crate::cli_error::UserError(format!(
                        "invalid config {}:{at} {}",
                        path.display(),
                        e.message().trim_end()
                    ))
                })?
            }
            None => NodeConfig::default(),
        };
        macro_rules! set {
            ($($field:ident),*) => { $( if let Some(v) = &self.$field { c.$field = v.clone(); } )* };
        }
        set!(
            durability,
            periodic_sync_ms,
            executor_threads,
            lease_ttl_ms,
            lease_margin_ms,
            max_clients,
            max_bulk_len_bytes,
            engine,
            stats_window_ms,
            stats_sample_every,
            hot_keys_k,
            stats_scan_interval_ms,
            log_truncate_interval_ms,
            log_retention_bytes,
            log_keep_idle_ms,
            storage_cache_bytes,
            storage_max_journal_bytes,
            storage_max_memtable_bytes,
            storage_journal_rotation_bytes,
            storage_change_tail_bytes,
            active_expire_interval_ms,
            flush_chunk_keys,
            slowlog_log_slower_than_us,
            slowlog_max_len,
            watch_log_scan_records,
            replica_lag_timeout_ms,
            replica_read_lease_ms,
            replica_heartbeat_ms,
            replica_stream_window_calls,
            replica_switchover_grace_ms,
            replica_copy_max_bytes_per_sec,
            stray_sweep_interval_ms,
            stray_sweep_grace_ms,
            acl_poll_interval_ms
        );
        if self.requirepass.is_some() {
            c.requirepass = self.requirepass.clone();
        }
        self.admin.apply_to_node(&mut c);
        self.tls.apply_to_node(&mut c);
        c.validate()
            .map_err(|e| crate::cli_error::UserError(format!("invalid configuration: {e}")))?;
        Ok(c)
    }
}

#[derive(clap::Args)]
pub struct ServerArgs {
    /// Metadata store URL: keyway://HOST:PORT (a `keyway meta` or `keyway dev`).
    #[arg(long, env = "KEYWAY_META")]
    meta: String,
    /// RESP listen address.
    #[arg(long, default_value = "127.0.0.1:7001")]
    listen: SocketAddr,
    /// Address clients are told to dial, if not the listen address.
    #[arg(long)]
    announce: Option<String>,
    /// The replica endpoint: a second RESP listener for this node's replica
    /// role. `auto` (default): the --listen IP, a free port; `off`: none (the
    /// node's copies are not advertised as read targets); or IP:PORT.
    /// CLUSTER SLOTS/SHARDS/NODES list the node's in-sync replica copies at
    /// this address under a node id of their own, so Redis clients see one
    /// master plus one replica process per node. Its connections start
    /// READONLY; writes there are -MOVED to the primary. With --announce the
    /// announced host is advertised with this port.
    #[arg(long)]
    replica_listen: Option<keyway_node::replica_endpoint::ReplicaListen>,
    /// Admin HTTP listen address (`/metrics`, `/map`, `/status`).
    #[arg(long, default_value = "127.0.0.1:8001")]
    admin_listen: SocketAddr,
    /// With a metadata store that has no map yet (e.g. a fresh etcd prefix),
    /// create it once this many nodes have registered. Safe on every node:
    /// creation is one compare-and-set, so exactly one wins.
    #[arg(long)]
    bootstrap_nodes: Option<usize>,
    /// Partitions per node in that initial map.
    #[arg(long, default_value_t = 4)]
    partitions_per_node: u16,
    /// Keyspace 0's replication in that initial map (with `--bootstrap-nodes`).
    #[command(flatten)]
    replication: crate::meta_cmd::BootstrapReplication,
    /// This node's zone (rack, availability zone): a partition's copies go
    /// to distinct zones first. 1-64 bytes of letters, digits, `_.-`.
    #[arg(long)]
    zone: Option<String>,
    /// Data directory of this node.
    #[arg(long, default_value = "./keyway-data/node-1")]
    data: PathBuf,
    /// FOR TESTING ONLY (the nemesis harness): wrap the storage engine in a
    /// fault injector driven over the admin port: `POST /fault/fsync-fail`
    /// makes every later fsync fail (the node then stops serving for good),
    /// `POST /fault/heal`, `GET /fault`. Off by default; without it those
    /// paths answer 404. Never use it in production.
    #[arg(long, hide_short_help = true)]
    fault_injection: bool,
    #[command(flatten)]
    node: NodeFlags,
}

pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    let mut config = args.node.to_config()?;
    config.listen = args.listen;
    config.announce = args.announce;
    config.admin_listen = args.admin_listen;
    if let Some(replica_listen) = args.replica_listen {
        config.replica_listen = replica_listen;
    }
    config.data_dir = args.data;
    config.fault_injection = config.fault_injection || args.fault_injection;
    config.zone = args.zone.clone().or(config.zone);
    config
        .validate()
        .map_err(|e| crate::cli_error::UserError(format!("invalid configuration: {e}")))?;
    user_ensure!(
        args.bootstrap_nodes != Some(0),
        "--bootstrap-nodes must be greater than 0"
    );
    user_ensure!(
        args.partitions_per_node > 0,
        "--partitions-per-node must be greater than 0"
    );
    let replication = args.replication.to_replication()?;
    // This node's own peer and metadata calls carry the secret too.
    crate::secret_flags::load_and_install(config.cluster_secret_file.as_deref())?;
    let meta = keyway_meta::connect(&args.meta).await?;
    let node = Node::start(config, meta.clone()).await?;
    let bootstrap = args.bootstrap_nodes.map(|nodes| {
        tokio::spawn(crate::meta_cmd::bootstrap_when_ready(
            meta.clone(),
            nodes,
            args.partitions_per_node,
            replication,
        ))
    });
    println!(
        "keyway server {} serving redis://{} (admin http://{})",
        node.id(),
        node.resp_addr(),
        node.admin_addr()
    );
    if let Some(tls) = node.tls_addr() {
        println!("keyway server {} serving rediss://{tls} (TLS)", node.id());
    }
    tokio::select! {
        _ = crate::shutdown_signal() => {}
        _ = node.shutdown_requested() => println!("SHUTDOWN requested by a client"),
    }
    if let Some(task) = bootstrap {
        task.abort();
    }
    node.shutdown().await;
    Ok(())
}
