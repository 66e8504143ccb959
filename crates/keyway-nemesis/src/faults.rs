//! Faults: what can be injected ([`FaultKind`], chosen with `--faults`),
//! the seeded schedule of process faults ([`schedule`]: one at a time, each
//! started and healed by the schedule, with random quiet gaps and
//! durations), and their injection into a [`Cluster`]. The topology churn
//! that runs beside the schedule is `churn.rs`.
//!
//! Adding a fault is one [`FaultKind`], one [`Fault`] variant with its
//! duration, a line in [`schedule`]'s draw and an arm in [`inject`] that
//! starts it and heals it (`disk` and `partition` are the latest).

use crate::NemesisError;
use crate::cluster::{Cluster, ctl};
use keyway_map::PartitionMap;

pub use crate::churn::{ChurnCounts, ChurnKind, churn_worker};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The kinds `--faults` chooses from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// `kill -9` of a node, restarted (same data dir and ports) after a while.
    Kill,
    /// SIGSTOP of a node past its lease TTL, then SIGCONT.
    Pause,
    /// `kill -9` of the leading manager, restarted after a while.
    Manager,
    /// `kill -9` of the metadata store (`keyway meta`, or one etcd member).
    Meta,
    /// Live moves (`keyway ctl move`), throughout.
    Move,
    /// Splits (`keyway ctl split`), throughout.
    Split,
    /// Merges (`keyway ctl merge`), throughout.
    Merge,
    /// A node's fsyncs fail (`--fault-injection`, `POST /fault/fsync-fail`):
    /// it stops serving for good; healed by kill -9 and restart.
    Disk,
    /// A node is cut off from the store, its peers and the clients (its own
    /// network namespace; its veth taken down), then reconnected. Needs
    /// root and iproute2, so it is not in [`FaultKind::DEFAULT`].
    Partition,
    /// `kill -9` of the node that is primary of the most partitions (per
    /// the map at that moment), restarted after a while: a failover.
    PrimaryKill,
    /// SIGSTOP of the node that is an in-sync replica of the most
    /// partitions, past `replica_lag_timeout_ms`, then SIGCONT: its
    /// primaries must drop it from the in-sync set and re-sync it.
    ReplicaPause,
    /// A node cut from the metadata store only (a blackhole route in its
    /// namespace); it still reaches its peers and its clients. Network
    /// namespaces, like `partition`.
    PartitionStore,
    /// A node cut from the other nodes only (the replication streams);
    /// the store and the clients still reach it. Network namespaces.
    PartitionPeers,
    /// `kill -9` of a node and deletion of its data directory, kept down
    /// past the failover and the managers' down grace until every
    /// partition is back at its replication factor on the survivors; then
    /// `keyway ctl decommission --force` and a new empty node (new id) in
    /// its place (`permanent_loss.rs`). Replicated runs only
    /// ([`FaultKind::needs_replication`]).
    PermanentLoss,
}

impl FaultKind {
    pub const ALL: [FaultKind; 14] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Manager,
        FaultKind::Meta,
        FaultKind::Move,
        FaultKind::Split,
        FaultKind::Merge,
        FaultKind::Disk,
        FaultKind::Partition,
        FaultKind::PrimaryKill,
        FaultKind::ReplicaPause,
        FaultKind::PartitionStore,
        FaultKind::PartitionPeers,
        FaultKind::PermanentLoss,
    ];

    /// What `--faults default` (the default) injects: every kind that
    /// needs nothing of the machine (all but the `partition` family).
    pub const DEFAULT: [FaultKind; 11] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Manager,
        FaultKind::Meta,
        FaultKind::Move,
        FaultKind::Split,
        FaultKind::Merge,
        FaultKind::Disk,
        FaultKind::PrimaryKill,
        FaultKind::ReplicaPause,
        FaultKind::PermanentLoss,
    ];

    /// The kinds that need network namespaces (each node in its own).
    pub fn needs_network(self) -> bool {
        matches!(
            self,
            FaultKind::Partition | FaultKind::PartitionStore | FaultKind::PartitionPeers
        )
    }

    /// The kinds that lose data at replication factor 1 (and need a
    /// survivor to take every copy): scheduled only when the run's
    /// replication factor is at least 2 and below the node count
    /// (`RunConfig::scheduled_faults`).
    pub fn needs_replication(self) -> bool {
        matches!(self, FaultKind::PermanentLoss)
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::Manager => "manager",
            FaultKind::Meta => "meta",
            FaultKind::Move => "move",
            FaultKind::Split => "split",
            FaultKind::Merge => "merge",
            FaultKind::Disk => "disk",
            FaultKind::Partition => "partition",
            FaultKind::PrimaryKill => "primary-kill",
            FaultKind::ReplicaPause => "replica-pause",
            FaultKind::PartitionStore => "partition-store",
            FaultKind::PartitionPeers => "partition-peers",
            FaultKind::PermanentLoss => "permanent-loss",
        }
    }

    /// Whether the schedule injects it (else the churn does).
    pub fn is_process_fault(self) -> bool {
        matches!(
            self,
            FaultKind::Kill
                | FaultKind::Pause
                | FaultKind::Manager
                | FaultKind::Meta
                | FaultKind::Disk
                | FaultKind::Partition
                | FaultKind::PrimaryKill
                | FaultKind::ReplicaPause
                | FaultKind::PartitionStore
                | FaultKind::PartitionPeers
                | FaultKind::PermanentLoss
        )
    }

    /// `kill,pause,move` (or `default`, or `all`).
    pub fn parse_list(s: &str) -> Result<Vec<FaultKind>, String> {
        match s.trim() {
            "all" => return Ok(FaultKind::ALL.to_vec()),
            "default" => return Ok(FaultKind::DEFAULT.to_vec()),
            _ => {}
        }
        let mut kinds: Vec<FaultKind> = s
            .split(',')
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        kinds.sort();
        kinds.dedup();
        Ok(kinds)
    }
}

impl std::str::FromStr for FaultKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!("unknown fault '{s}' (expected kill, pause, manager, meta, move, split, merge, disk, partition, primary-kill, replica-pause, partition-store, partition-peers, permanent-loss, default or all)")
            })
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One process fault, with everything the schedule drew for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Kill node `node`; restart it `down_ms` later.
    KillNode { node: usize, down_ms: u64 },
    /// Freeze node `node` for `hold_ms`: past its lease TTL, or (a short
    /// pause) a fraction of it.
    PauseNode { node: usize, hold_ms: u64 },
    /// Kill the leading manager (any, if none leads); restart it `down_ms` later.
    KillManager { down_ms: u64 },
    /// Kill the metadata store (etcd: member `member`); restart it `down_ms` later.
    KillMeta { member: usize, down_ms: u64 },
    /// Fail node `node`'s fsyncs; `down_ms` later kill -9 and restart it.
    DiskFail { node: usize, down_ms: u64 },
    /// Cut node `node` off for `hold_ms`: past its lease TTL, or (a short
    /// partition) a fraction of it.
    Partition { node: usize, hold_ms: u64 },
    /// Kill the node that is primary of the most partitions when the fault
    /// starts (`fallback` if the map cannot be read); restart it `down_ms` later.
    KillPrimary { fallback: usize, down_ms: u64 },
    /// Freeze the node that is an in-sync replica of the most partitions
    /// (`fallback` if none is: replication factor 1) for `hold_ms`, past
    /// `replica_lag_timeout_ms`.
    PauseReplica { fallback: usize, hold_ms: u64 },
    /// Cut node `node` from the metadata store only, for `hold_ms` (past
    /// its lease TTL, or a fraction of it).
    CutStore { node: usize, hold_ms: u64 },
    /// Cut node `node` from the other nodes only, for `hold_ms` (past
    /// `replica_lag_timeout_ms`, or a fraction of it).
    CutPeers { node: usize, hold_ms: u64 },
    /// Kill node `node` and delete its data; it stays down until every
    /// partition is back at its replication factor without it (at least
    /// `expected_ms`: lease TTL + margin + the managers' down grace; the
    /// schedule plans with that), then a new empty node takes its place.
    LoseNode { node: usize, expected_ms: u64 },
}

impl Fault {
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::KillNode { .. } => FaultKind::Kill,
            Fault::PauseNode { .. } => FaultKind::Pause,
            Fault::KillManager { .. } => FaultKind::Manager,
            Fault::KillMeta { .. } => FaultKind::Meta,
            Fault::DiskFail { .. } => FaultKind::Disk,
            Fault::Partition { .. } => FaultKind::Partition,
            Fault::KillPrimary { .. } => FaultKind::PrimaryKill,
            Fault::PauseReplica { .. } => FaultKind::ReplicaPause,
            Fault::CutStore { .. } => FaultKind::PartitionStore,
            Fault::CutPeers { .. } => FaultKind::PartitionPeers,
            Fault::LoseNode { .. } => FaultKind::PermanentLoss,
        }
    }

    /// How long the fault lasts once started (`LoseNode`: at least; it
    /// lasts until the re-replication is seen, bounded by
    /// `RunConfig::recovery_timeout_ms`).
    pub fn duration_ms(&self) -> u64 {
        match self {
            Fault::KillNode { down_ms, .. }
            | Fault::KillManager { down_ms }
            | Fault::KillMeta { down_ms, .. }
            | Fault::DiskFail { down_ms, .. }
            | Fault::KillPrimary { down_ms, .. } => *down_ms,
            Fault::PauseNode { hold_ms, .. }
            | Fault::Partition { hold_ms, .. }
            | Fault::PauseReplica { hold_ms, .. }
            | Fault::CutStore { hold_ms, .. }
            | Fault::CutPeers { hold_ms, .. } => *hold_ms,
            Fault::LoseNode { expected_ms, .. } => *expected_ms,
        }
    }
}

/// One step of the schedule: wait `quiet_ms`, then inject `fault` (which
/// heals itself after its duration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub quiet_ms: u64,
    pub fault: Fault,
}

/// The random streams one run's seed is split into (so no two share draws).
pub const SCHEDULE_STREAM: u64 = 1;
pub const CHURN_STREAM: u64 = 1_000;
pub const CLIENT_STREAM: u64 = 2_000;

/// An independent seed for `stream` of the run `seed` (SplitMix64 of both).
pub fn sub_seed(seed: u64, stream: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Quiet time between two process faults, milliseconds.
const QUIET_MS: std::ops::Range<u64> = 500..2_500;
/// How long a killed process stays down, milliseconds.
const DOWN_MS: std::ops::Range<u64> = 0..3_000;
/// How far past the lease TTL a paused node is held, milliseconds.
const PAST_LEASE_MS: std::ops::Range<u64> = 200..2_000;
/// Share (percent) of pauses that are short instead: held for a fraction
/// of the lease TTL (a GC-like stall the node's lease survives), so
/// requests time out at the client and may be re-sent while the first copy
/// still waits in the frozen node's socket.
const SHORT_PAUSE_PCT: u32 = 50;
/// A short pause's length, in percent of the lease TTL.
const SHORT_PAUSE_OF_TTL_PCT: std::ops::Range<u64> = 30..50;
/// Share (percent) of partitions that are short (a fraction of the lease
/// TTL: the node keeps its lease, requests in flight time out and may be
/// re-sent); the rest last past the TTL, so the node must stop serving.
const SHORT_PARTITION_PCT: u32 = 50;

/// How far past `replica_lag_timeout_ms` a paused replica is held, milliseconds.
const PAST_LAG_MS: std::ops::Range<u64> = 200..1_500;

/// A hold drawn like a pause's: past the lease TTL, or `short_pct` percent
/// of the time a fraction of it.
fn lease_hold_ms(rng: &mut StdRng, node_lease_ttl_ms: u64, short_pct: u32) -> u64 {
    if rng.random_range(0..100) < short_pct {
        node_lease_ttl_ms * rng.random_range(SHORT_PAUSE_OF_TTL_PCT) / 100
    } else {
        node_lease_ttl_ms + rng.random_range(PAST_LEASE_MS)
    }
}

/// Share (percent) of primary kills kept down past the failover (lease
/// TTL + margin + a manager round, then [`PAST_LEASE_MS`]), so the node
/// comes back as a replica of the partitions it owned and must rejoin;
/// the rest are restarted within [`DOWN_MS`], mostly before it.
const PAST_FAILOVER_PCT: u32 = 50;
/// A manager's replication round (`--replication-interval-ms`, default)
/// on top of the margin, before a failover is certain.
const FAILOVER_ROUND_MS: u64 = 250;

/// The timings a schedule's holds are drawn around.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    pub node_lease_ttl_ms: u64,
    /// The nodes' `--lease-margin-ms` (= the managers' failover margin).
    pub node_lease_margin_ms: u64,
    pub replica_lag_timeout_ms: u64,
    /// The managers' `--rebalance-down-grace-ms` (`permanent-loss`).
    pub down_grace_ms: u64,
}

impl Timings {
    /// When a failover of a killed primary is certain, ms after the kill.
    pub fn failover_after_ms(&self) -> u64 {
        self.node_lease_ttl_ms + self.node_lease_margin_ms + FAILOVER_ROUND_MS
    }
}

/// The process faults of one run, drawn from `seed`, enough to fill
/// `time_limit_ms` (the run stops starting them once its time is up).
/// The same arguments give the same schedule.
pub fn schedule(
    seed: u64,
    kinds: &[FaultKind],
    nodes: usize,
    etcd_members: usize,
    timings: Timings,
    time_limit_ms: u64,
) -> Vec<Step> {
    let node_lease_ttl_ms = timings.node_lease_ttl_ms;
    let lag_ms = timings.replica_lag_timeout_ms;
    let kinds: Vec<FaultKind> = kinds
        .iter()
        .copied()
        .filter(|k| k.is_process_fault())
        .collect();
    let mut rng = StdRng::seed_from_u64(sub_seed(seed, SCHEDULE_STREAM));
    let mut steps = Vec::new();
    let mut planned = 0u64;
    while !kinds.is_empty() && planned < time_limit_ms {
        let quiet_ms = rng.random_range(QUIET_MS);
        let fault = match kinds[rng.random_range(0..kinds.len())] {
            FaultKind::Kill => Fault::KillNode {
                node: rng.random_range(0..nodes),
                down_ms: rng.random_range(DOWN_MS),
            },
            FaultKind::Pause => Fault::PauseNode {
                node: rng.random_range(0..nodes),
                hold_ms: lease_hold_ms(&mut rng, node_lease_ttl_ms, SHORT_PAUSE_PCT),
            },
            FaultKind::Disk => Fault::DiskFail {
                node: rng.random_range(0..nodes),
                down_ms: rng.random_range(DOWN_MS),
            },
            FaultKind::Partition => Fault::Partition {
                node: rng.random_range(0..nodes),
                hold_ms: lease_hold_ms(&mut rng, node_lease_ttl_ms, SHORT_PARTITION_PCT),
            },
            FaultKind::Manager => Fault::KillManager {
                down_ms: rng.random_range(DOWN_MS),
            },
            FaultKind::Meta => Fault::KillMeta {
                member: rng.random_range(0..etcd_members.max(1)),
                down_ms: rng.random_range(DOWN_MS),
            },
            FaultKind::PrimaryKill => Fault::KillPrimary {
                fallback: rng.random_range(0..nodes),
                down_ms: if rng.random_range(0..100) < PAST_FAILOVER_PCT {
                    timings.failover_after_ms() + rng.random_range(PAST_LEASE_MS)
                } else {
                    rng.random_range(DOWN_MS)
                },
            },
            FaultKind::ReplicaPause => Fault::PauseReplica {
                fallback: rng.random_range(0..nodes),
                hold_ms: lag_ms + rng.random_range(PAST_LAG_MS),
            },
            FaultKind::PartitionStore => Fault::CutStore {
                node: rng.random_range(0..nodes),
                hold_ms: lease_hold_ms(&mut rng, node_lease_ttl_ms, SHORT_PARTITION_PCT),
            },
            FaultKind::PartitionPeers => Fault::CutPeers {
                node: rng.random_range(0..nodes),
                hold_ms: lease_hold_ms(&mut rng, lag_ms, SHORT_PARTITION_PCT),
            },
            FaultKind::PermanentLoss => Fault::LoseNode {
                node: rng.random_range(0..nodes),
                expected_ms: timings.failover_after_ms() + timings.down_grace_ms,
            },
            churn => unreachable!("{churn} is not a process fault"),
        };
        planned += quiet_ms + fault.duration_ms();
        steps.push(Step { quiet_ms, fault });
    }
    steps
}

/// What the injectors share: the cluster (behind a mutex: it is driven from
/// `spawn_blocking`), the binary for `ctl`, the fault log, and what the
/// faults report for the summary (losses, restarts to time).
#[derive(Clone)]
pub struct Target {
    pub cluster: Arc<Mutex<Cluster>>,
    pub bin: PathBuf,
    pub meta_url: String,
    /// The cluster secret's file (`ctl --cluster-secret-file`).
    pub secret_file: PathBuf,
    pub log: Arc<crate::run::FaultLog>,
    pub recoveries: Arc<crate::observe::Recoveries>,
    /// How long a `permanent-loss` waits for re-replication
    /// (`RunConfig::recovery_timeout_ms`).
    pub recovery_timeout: Duration,
}

impl Target {
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Cluster) -> Result<T, NemesisError> + Send + 'static,
    ) -> Result<T, NemesisError> {
        let cluster = self.cluster.clone();
        tokio::task::spawn_blocking(move || {
            let mut c = cluster.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut c)
        })
        .await
        .map_err(|e| NemesisError::Invalid(format!("fault task panicked: {e}")))?
    }
}

/// Starts `fault`, holds it for its duration, heals it.
pub async fn inject(target: &Target, fault: &Fault) -> Result<(), NemesisError> {
    let hold = Duration::from_millis(fault.duration_ms());
    match fault.clone() {
        Fault::KillNode { node, .. } => {
            let owned = owned_by_slot(target, node).await;
            target.log.note(&format!("kill -9 node{node}"));
            target.blocking(move |c| c.kill_node(node)).await?;
            tokio::time::sleep(hold).await;
            restart_timed(target, node, owned).await?;
        }
        Fault::PauseNode { node, .. } => {
            target.log.note(&format!("SIGSTOP node{node} for {hold:?}"));
            target.blocking(move |c| c.pause_node(node)).await?;
            tokio::time::sleep(hold).await;
            target.blocking(move |c| c.resume_node(node)).await?;
            target.log.note(&format!("SIGCONT node{node}"));
        }
        Fault::KillManager { .. } => {
            let leader = leading_manager(target).await;
            let managers = target.blocking(|c| Ok(c.managers())).await?;
            let i = leader.unwrap_or(0) % managers;
            let was = if leader.is_some() {
                "leading"
            } else {
                "no leader known;"
            };
            target.log.note(&format!("kill -9 mgr{i} ({was} manager)"));
            target.blocking(move |c| c.kill_manager(i)).await?;
            tokio::time::sleep(hold).await;
            target.blocking(move |c| c.restart_manager(i)).await?;
            target.log.note(&format!("mgr{i} restarted"));
        }
        Fault::KillMeta { member, .. } => {
            let what = if target.blocking(|c| Ok(c.etcd_members())).await? > 0 {
                format!("kill -9 etcd member {member}")
            } else {
                "kill -9 keyway meta".to_string()
            };
            target.log.note(&what);
            target.blocking(move |c| c.kill_meta(member)).await?;
            tokio::time::sleep(hold).await;
            target.blocking(|c| c.restart_meta()).await?;
            target.log.note("metadata store restarted");
        }
        Fault::DiskFail { node, .. } => {
            target
                .log
                .note(&format!("fsync failure on node{node} for {hold:?}"));
            target.blocking(move |c| c.fail_disk(node)).await?;
            tokio::time::sleep(hold).await;
            target.blocking(move |c| c.restart_node(node)).await?;
            target
                .log
                .note(&format!("node{node} restarted on healthy storage"));
        }
        Fault::Partition { node, .. } => {
            target
                .log
                .note(&format!("partition node{node} off for {hold:?}"));
            target.blocking(move |c| c.partition_node(node)).await?;
            tokio::time::sleep(hold).await;
            target.blocking(move |c| c.heal_partition(node)).await?;
            target.log.note(&format!("node{node} reconnected"));
        }
        Fault::KillPrimary { fallback, .. } => {
            let (node, why) = match busiest(target, Role::Primary).await {
                Some((node, n)) => (node, format!("primary of {n} partitions")),
                None => (fallback, "map unreadable: drawn node".to_string()),
            };
            let owned = owned_by_slot(target, node).await;
            target.log.note(&format!("kill -9 node{node} ({why})"));
            target.blocking(move |c| c.kill_node(node)).await?;
            tokio::time::sleep(hold).await;
            restart_timed(target, node, owned).await?;
        }
        Fault::PauseReplica { fallback, .. } => {
            let (node, why) = match busiest(target, Role::InSyncReplica).await {
                Some((node, n)) => (node, format!("in-sync replica of {n} partitions")),
                None => (
                    fallback,
                    "no in-sync replica in the map: drawn node".to_string(),
                ),
            };
            target
                .log
                .note(&format!("SIGSTOP node{node} ({why}) for {hold:?}"));
            target.blocking(move |c| c.pause_node(node)).await?;
            tokio::time::sleep(hold).await;
            target.blocking(move |c| c.resume_node(node)).await?;
            target.log.note(&format!("SIGCONT node{node}"));
        }
        Fault::CutStore { node, .. } | Fault::CutPeers { node, .. } => {
            let peers = matches!(fault, Fault::CutPeers { .. });
            let from = if peers {
                "the other nodes"
            } else {
                "the metadata store"
            };
            target
                .log
                .note(&format!("cut node{node} from {from} for {hold:?}"));
            target.blocking(move |c| c.cut_node(node, peers)).await?;
            tokio::time::sleep(hold).await;
            target.blocking(move |c| c.heal_cut(node)).await?;
            target
                .log
                .note(&format!("node{node} reconnected to {from}"));
        }
        Fault::LoseNode { node, .. } => {
            let record = crate::permanent_loss::lose_node(target, node).await?;
            target.recoveries.lost(record);
        }
    }
    Ok(())
}

/// How many partitions node `node` owns now (`None`: map or id unknown).
async fn owned_by_slot(target: &Target, node: usize) -> Option<usize> {
    let id = target.blocking(move |c| Ok(c.node_id(node))).await.ok()??;
    Some(current_map(target).await?.owned_by(id).count())
}

/// Restarts node `node` (old data) and hands the restart to the map
/// observer, which times it to in sync; `owned` is what it owned when killed.
async fn restart_timed(
    target: &Target,
    node: usize,
    owned: Option<usize>,
) -> Result<(), NemesisError> {
    let at = std::time::Instant::now();
    target.blocking(move |c| c.restart_node(node)).await?;
    let now = owned_by_slot(target, node).await;
    let after_failover = owned.zip(now).map(|(before, now)| now < before);
    let failed_over = match after_failover {
        Some(true) => " (after a failover: it rejoins as a replica)",
        _ => "",
    };
    target
        .log
        .note(&format!("node{node} restarted{failed_over}"));
    if let Some(id) = target.blocking(move |c| Ok(c.node_id(node))).await? {
        target.recoveries.restarted(crate::observe::Restart {
            node,
            id,
            at,
            after_failover,
        });
    }
    Ok(())
}

/// Whose partitions [`busiest`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Primary,
    InSyncReplica,
}

/// The map as `keyway ctl map` reads it now (indexed), if it can.
pub(crate) async fn current_map(target: &Target) -> Option<PartitionMap> {
    let out = ctl(
        &target.bin,
        &target.meta_url,
        &target.secret_file,
        &["--json", "map"],
        CTL_TIMEOUT,
    )
    .await
    .ok()?;
    let mut map: PartitionMap = serde_json::from_str(&out).ok()?;
    map.reindex();
    Some(map)
}

/// The node (cluster index) holding `role` for the most partitions, and how
/// many; `None` if the map cannot be read or no node holds the role.
async fn busiest(target: &Target, role: Role) -> Option<(usize, usize)> {
    let map = current_map(target).await?;
    let mut per_node: BTreeMap<keyway_map::NodeId, usize> = BTreeMap::new();
    for p in map.partitions.values() {
        match role {
            Role::Primary => *per_node.entry(p.owner).or_default() += 1,
            Role::InSyncReplica => {
                for r in &p.in_sync {
                    *per_node.entry(*r).or_default() += 1;
                }
            }
        }
    }
    let (id, n) = per_node
        .into_iter()
        .max_by_key(|(id, n)| (*n, std::cmp::Reverse(*id)))?;
    let addr = map.nodes.get(&id)?.resp_addr.clone();
    let cluster = target.cluster.lock().unwrap_or_else(|e| e.into_inner());
    Some((cluster.node_index(&addr)?, n))
}

/// The index of the manager holding the seat, per `keyway ctl manager`.
async fn leading_manager(target: &Target) -> Option<usize> {
    let out = ctl(
        &target.bin,
        &target.meta_url,
        &target.secret_file,
        &["--json", "manager"],
        CTL_TIMEOUT,
    )
    .await
    .ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    let name = v.get("leader")?.as_str()?.to_string();
    let cluster = target.cluster.lock().unwrap_or_else(|e| e.into_inner());
    cluster.manager_index(&name)
}

/// Longest a `keyway ctl` call may take (killed past it; counted as failed).
pub const CTL_TIMEOUT: Duration = Duration::from_secs(10);
#[cfg(test)]
mod tests {
    use super::*;

    const T: Timings = Timings {
        node_lease_ttl_ms: 2000,
        node_lease_margin_ms: 500,
        replica_lag_timeout_ms: 1500,
        down_grace_ms: 5000,
    };

    #[test]
    fn the_schedule_is_a_function_of_its_seed() {
        let kinds = FaultKind::ALL.to_vec();
        let a = schedule(42, &kinds, 3, 0, T, 30_000);
        assert_eq!(a, schedule(42, &kinds, 3, 0, T, 30_000));
        assert_ne!(a, schedule(43, &kinds, 3, 0, T, 30_000));
        let planned: u64 = a.iter().map(|s| s.quiet_ms + s.fault.duration_ms()).sum();
        assert!(planned >= 30_000, "{planned}");
        for s in &a {
            if let Fault::PauseNode { hold_ms, node } | Fault::Partition { hold_ms, node } = s.fault
            {
                assert!(node < 3);
                assert!(
                    hold_ms > 2000 || (600..1000).contains(&hold_ms),
                    "{hold_ms}"
                );
            }
            if let Fault::DiskFail { node, down_ms } = s.fault {
                assert!(node < 3 && down_ms < 3_000);
            }
            if let Fault::PauseReplica { hold_ms, fallback } = s.fault {
                assert!(fallback < 3);
                assert!(
                    (1700..3000).contains(&hold_ms),
                    "past the lag timeout: {hold_ms}"
                );
            }
            if let Fault::CutPeers { hold_ms, .. } = s.fault {
                assert!(hold_ms > 1500 || (450..750).contains(&hold_ms), "{hold_ms}");
            }
            if let Fault::LoseNode { node, expected_ms } = s.fault {
                assert!(node < 3);
                assert_eq!(expected_ms, 2000 + 500 + FAILOVER_ROUND_MS + 5000);
            }
        }
        // Over a few seeds, every process fault is drawn, and partitions
        // both past the lease and short of it.
        let many: Vec<Step> = (0..20)
            .flat_map(|seed| schedule(seed, &kinds, 3, 0, T, 30_000))
            .collect();
        for kind in FaultKind::ALL.into_iter().filter(|k| k.is_process_fault()) {
            assert!(many.iter().any(|s| s.fault.kind() == kind), "{kind}");
        }
        let holds = |long: bool| {
            many.iter().any(
                |s| matches!(s.fault, Fault::Partition { hold_ms, .. } if (hold_ms > 2000) == long),
            )
        };
        assert!(holds(true) && holds(false));
        // Primary kills: some restarted before the failover, some past it.
        let kill_down = |past: bool| {
            many.iter().any(|s| {
                matches!(s.fault, Fault::KillPrimary { down_ms, .. }
                    if (down_ms >= T.failover_after_ms() + 200) == past)
            })
        };
        assert!(kill_down(true) && kill_down(false));
        for s in &many {
            if let Fault::KillPrimary { down_ms, .. } = s.fault {
                assert!(down_ms < T.failover_after_ms() + 2_000, "{down_ms}");
            }
        }
        assert!(schedule(1, &[FaultKind::Move], 3, 0, T, 30_000).is_empty());
        let only_kill = schedule(1, &[FaultKind::Kill], 3, 0, T, 10_000);
        assert!(only_kill.iter().all(|s| s.fault.kind() == FaultKind::Kill));
    }

    #[test]
    fn fault_lists_parse() {
        assert_eq!(
            FaultKind::parse_list("pause, kill,kill").unwrap(),
            vec![FaultKind::Kill, FaultKind::Pause]
        );
        assert_eq!(FaultKind::parse_list("all").unwrap().len(), 14);
        let default = FaultKind::parse_list("default").unwrap();
        assert_eq!(default, FaultKind::DEFAULT.to_vec());
        assert!(default.contains(&FaultKind::Disk) && !default.contains(&FaultKind::Partition));
        assert!(default.iter().all(|k| !k.needs_network()));
        assert!(default.contains(&FaultKind::PermanentLoss));
        assert_eq!(
            FaultKind::parse_list("permanent-loss").unwrap(),
            vec![FaultKind::PermanentLoss]
        );
        assert!(FaultKind::PermanentLoss.is_process_fault());
        assert!(FaultKind::PermanentLoss.needs_replication());
        assert!(!FaultKind::PermanentLoss.needs_network());
        let only_loss = schedule(3, &[FaultKind::PermanentLoss], 3, 0, T, 30_000);
        assert!(!only_loss.is_empty());
        assert!(
            only_loss
                .iter()
                .all(|s| s.fault.kind() == FaultKind::PermanentLoss)
        );
        assert_eq!(
            FaultKind::parse_list("replica-pause,primary-kill,partition-store,partition-peers")
                .unwrap(),
            vec![
                FaultKind::PrimaryKill,
                FaultKind::ReplicaPause,
                FaultKind::PartitionStore,
                FaultKind::PartitionPeers
            ]
        );
        assert_eq!(
            FaultKind::parse_list("disk,partition").unwrap(),
            vec![FaultKind::Disk, FaultKind::Partition]
        );
        assert!(FaultKind::parse_list("kill,flood").is_err());
    }
}
