//! [`run_one`]: one nemesis run, start to verdict.
//!
//! 1. Start the cluster in `OUT/run-<seed>/` and wait until it serves.
//! 2. Start the clients (half smart, half plain) and the churn workers.
//! 3. Play the seeded fault schedule until the time limit, each fault
//!    started and healed in turn.
//! 4. Stop the churn and the clients' random operations, heal everything,
//!    wait until every key answers again (and, replicated, until every
//!    partition has all its copies in sync), and let each client read
//!    every key.
//! 5. Stop the cluster, judge the history, write it (and keep the logs) if
//!    the run failed.

use crate::NemesisError;
use crate::cluster::{Cluster, ClusterSpec, MetaKind, ctl};
use crate::faults::{self, ChurnCounts, ChurnKind, FaultKind, Target};
use crate::judge::judge;
use crate::resp_client::{ClusterClient, Exec};
use crate::summary::RunReport;
use crate::workload::{self, ClientKind, ClientPlan, Clock, KeySet, Phase, Shared};
use keyway_check::{History, Outcome};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Everything a run is configured by (the CLI's flags; see `keyway nemesis --help`).
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub bin: PathBuf,
    pub out: PathBuf,
    pub meta: MetaKind,
    pub nodes: usize,
    pub managers: usize,
    pub partitions_per_node: u16,
    pub clients: usize,
    pub faults: Vec<FaultKind>,
    /// Length of the fault phase.
    pub time_limit_ms: u64,
    pub op_timeout_ms: u64,
    /// Pause between two operations of one client.
    pub think_ms: u64,
    pub hash_tags: usize,
    pub register_keys: usize,
    pub counter_keys: usize,
    pub node_lease_ttl_ms: u64,
    pub manager_lease_ttl_ms: u64,
    /// Churn actions in flight at once.
    pub churn_workers: usize,
    /// A run with fewer successful operations than this failed (the
    /// workload did not really run).
    pub min_ok_ops: u64,
    /// How long the cluster may take to start, and to serve again after healing.
    pub settle_timeout_ms: u64,
    /// Keep the run's directory (logs, data) even when it passed.
    pub keep: bool,
    /// Keyspace 0's replication factor (1: no replication flag is passed).
    pub replication_factor: u8,
    /// Keyspace 0's `min_in_sync` (copies, the primary included).
    pub min_in_sync: u8,
    /// The nodes' `--replica-lag-timeout-ms` (and what `replica-pause` holds past).
    pub replica_lag_timeout_ms: u64,
    /// The nodes' `--replica-read-lease-ms`.
    pub replica_read_lease_ms: u64,
    /// The nodes' `--replica-stream-window-calls`.
    pub replica_stream_window_calls: u64,
    /// Percent of the plain clients' reads sent to a replica on a
    /// `READONLY` connection (when `CLUSTER SLOTS` lists one).
    pub replica_read_pct: u32,
    /// The managers' `--rebalance-down-grace-ms` when `permanent-loss` is
    /// scheduled: a node down this long is re-replicated. Short, so a run
    /// stays short, yet above every other fault's outage (a kill is down
    /// at most 3 s plus the restart, a pause or cut at most the lease TTL
    /// + 2 s), so only a permanent loss crosses it.
    pub down_grace_ms: u64,
    /// A `permanent-loss` not re-replicated within this long of the kill
    /// fails the run (`judge::judge_recoveries`).
    pub recovery_timeout_ms: u64,
}

impl RunConfig {
    /// Refuses settings that cannot make a meaningful run.
    pub fn validate(&self) -> Result<(), String> {
        let check = |ok: bool, what: &str| if ok { Ok(()) } else { Err(what.to_string()) };
        check((1..=16).contains(&self.nodes), "--nodes must be 1..=16")?;
        check((1..=4).contains(&self.managers), "managers must be 1..=4")?;
        check(
            self.partitions_per_node > 0,
            "--partitions-per-node must be > 0",
        )?;
        check((1..=64).contains(&self.clients), "--clients must be 1..=64")?;
        check(
            self.time_limit_ms >= 1_000,
            "--time-limit must be at least 1 s",
        )?;
        check(
            (100..=60_000).contains(&self.op_timeout_ms),
            "--op-timeout-ms must be 100..=60000",
        )?;
        check(self.think_ms <= 10_000, "--think-ms must be at most 10000")?;
        check(
            (1..=64).contains(&self.hash_tags),
            "--hash-tags must be 1..=64",
        )?;
        check(
            self.register_keys + self.counter_keys > 0,
            "the workload needs at least one key",
        )?;
        check(
            self.register_keys <= 256 && self.counter_keys <= 256,
            "--register-keys and --counter-keys must be at most 256",
        )?;
        check(
            self.node_lease_ttl_ms >= 500 && self.manager_lease_ttl_ms >= 100,
            "--node-lease-ttl-ms must be at least 500 and the manager's at least 100",
        )?;
        check(self.churn_workers <= 8, "--churn-workers must be at most 8")?;
        check(
            self.settle_timeout_ms >= 5_000,
            "--settle-timeout-ms must be at least 5000",
        )?;
        check(
            !(self.needs_network() && self.meta == MetaKind::Etcd),
            "the partition faults need --meta embedded (the etcd members listen on 127.0.0.1, which a node's network namespace cannot reach)",
        )?;
        keyway_map::check_replication(self.replication_factor, self.min_in_sync)
            .map_err(|e| format!("--replication-factor/--min-in-sync: {e}"))?;
        check(
            usize::from(self.replication_factor) <= self.nodes,
            "--replication-factor must be at most --nodes",
        )?;
        check(
            self.replica_read_lease_ms < self.replica_lag_timeout_ms,
            "--replica-read-lease-ms must be below --replica-lag-timeout-ms",
        )?;
        check(
            (1..=64).contains(&self.replica_stream_window_calls),
            "--replica-stream-window-calls must be 1..=64",
        )?;
        check(
            self.replica_lag_timeout_ms >= 100,
            "--replica-lag-timeout-ms must be at least 100",
        )?;
        check(
            self.replica_read_pct <= 100,
            "--replica-read-pct must be 0..=100",
        )?;
        check(
            (1_000..=600_000).contains(&self.down_grace_ms),
            "--down-grace-ms must be 1000..=600000",
        )?;
        check(
            self.recovery_timeout_ms > self.down_grace_ms + self.node_lease_ttl_ms
                && self.recovery_timeout_ms <= 3_600_000,
            "--recovery-timeout-ms must exceed --down-grace-ms plus the node lease TTL (re-replication starts only then), and be at most 3600000",
        )?;
        Ok(())
    }

    /// The kinds the run injects: `--faults` without those that need
    /// replication (`permanent-loss`) when the replication factor is 1 or
    /// leaves no survivor to take a lost node's copies (factor = nodes).
    pub fn scheduled_faults(&self) -> Vec<FaultKind> {
        let replicated =
            self.replication_factor >= 2 && self.nodes > usize::from(self.replication_factor);
        self.faults
            .iter()
            .copied()
            .filter(|k| replicated || !k.needs_replication())
            .collect()
    }

    /// What `--faults` asked for that [`RunConfig::scheduled_faults`] leaves out.
    pub fn dropped_faults(&self) -> Vec<FaultKind> {
        let kept = self.scheduled_faults();
        self.faults
            .iter()
            .copied()
            .filter(|k| !kept.contains(k))
            .collect()
    }

    /// Whether a fault asks for network namespaces (the `partition` family).
    pub fn needs_network(&self) -> bool {
        self.faults.iter().any(|k| k.needs_network())
    }
}

/// Live counters of the run in progress (a progress bar reads them).
#[derive(Debug, Default)]
pub struct Progress {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub unknown: AtomicU64,
    pub faults: AtomicU64,
    pub final_reads: AtomicU64,
    /// Milliseconds into the fault phase.
    pub elapsed_ms: AtomicU64,
}

impl Progress {
    pub(crate) fn count(&self, outcome: &Outcome) {
        let c = match outcome {
            Outcome::Ok(_) => &self.ok,
            Outcome::Failed => &self.failed,
            Outcome::Unknown => &self.unknown,
        };
        c.fetch_add(1, Relaxed);
    }
}

/// The run's `faults.log`: every fault and churn action, stamped with the
/// history's clock (microseconds), so it lines up with the events.
pub struct FaultLog {
    clock: Clock,
    file: Mutex<std::fs::File>,
}

impl FaultLog {
    fn create(path: &std::path::Path, clock: Clock) -> Result<FaultLog, NemesisError> {
        let file = std::fs::File::create(path)
            .map_err(|e| NemesisError::io(format!("create {}", path.display()), e))?;
        Ok(FaultLog {
            clock,
            file: Mutex::new(file),
        })
    }

    pub fn note(&self, what: &str) {
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(f, "{:>12} {what}", self.clock.now_us());
    }
}

/// One whole run with `seed`. `Err` only when the run could not be carried
/// out at all (the cluster did not start); a run that found a violation,
/// starved, or did not recover is a failing [`RunReport`].
pub async fn run_one(
    cfg: &RunConfig,
    seed: u64,
    progress: Arc<Progress>,
) -> Result<RunReport, NemesisError> {
    cfg.validate().map_err(NemesisError::Invalid)?;
    let started = Instant::now();
    let dir = cfg.out.join(format!("run-{seed}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| NemesisError::io(format!("remove {}", dir.display()), e))?;
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| NemesisError::io(format!("create {}", dir.display()), e))?;
    let faults_kinds = cfg.scheduled_faults();
    let spec = ClusterSpec {
        bin: cfg.bin.clone(),
        dir: dir.clone(),
        meta: cfg.meta,
        nodes: cfg.nodes,
        managers: cfg.managers,
        partitions_per_node: cfg.partitions_per_node,
        node_lease_ttl_ms: cfg.node_lease_ttl_ms,
        node_lease_margin_ms: spec_margin_ms(cfg),
        manager_lease_ttl_ms: cfg.manager_lease_ttl_ms,
        start_timeout: Duration::from_millis(cfg.settle_timeout_ms),
        network: cfg.needs_network(),
        fault_injection: faults_kinds.contains(&FaultKind::Disk),
        replication_factor: cfg.replication_factor,
        min_in_sync: cfg.min_in_sync,
        replica_lag_timeout_ms: cfg.replica_lag_timeout_ms,
        replica_read_lease_ms: cfg.replica_read_lease_ms,
        replica_stream_window_calls: cfg.replica_stream_window_calls,
        down_grace_ms: faults_kinds
            .contains(&FaultKind::PermanentLoss)
            .then_some(cfg.down_grace_ms),
    };
    let cluster = tokio::task::spawn_blocking(move || Cluster::start(spec))
        .await
        .map_err(|e| NemesisError::Invalid(format!("cluster start panicked: {e}")))??;
    let seeds = cluster.node_addrs().to_vec();
    let meta_url = cluster.meta_url().to_string();
    let secret_file = cluster.secret_file().to_path_buf();
    let etcd_members = cluster.etcd_members();
    let cluster = Arc::new(Mutex::new(cluster));
    let clock = Clock::start();
    let log = Arc::new(FaultLog::create(&dir.join("faults.log"), clock)?);
    let target = Target {
        cluster: cluster.clone(),
        bin: cfg.bin.clone(),
        meta_url: meta_url.clone(),
        secret_file: secret_file.clone(),
        log: log.clone(),
        recoveries: Arc::default(),
        recovery_timeout: Duration::from_millis(cfg.recovery_timeout_ms),
    };
    let dropped = cfg.dropped_faults();
    if !dropped.is_empty() {
        let names: Vec<&str> = dropped.iter().map(|k| k.name()).collect();
        log.note(&format!(
            "not injected at replication factor {} on {} nodes: {}",
            cfg.replication_factor,
            cfg.nodes,
            names.join(",")
        ));
    }
    let keys = KeySet::new(cfg.hash_tags, cfg.register_keys, cfg.counter_keys);
    let settle = Duration::from_millis(cfg.settle_timeout_ms);
    let mut failures = Vec::new();
    if let Err(why) = wait_serving(&seeds, &keys, settle).await {
        failures.push(format!("the new cluster never served: {why}"));
    }
    log.note("cluster serving; workload starts");

    let shared = Arc::new(Shared::new(clock, progress.clone()));
    let (phase_tx, phase_rx) = tokio::sync::watch::channel(Phase::Work);
    let op_timeout = Duration::from_millis(cfg.op_timeout_ms);
    let clients: Vec<_> = (0..cfg.clients)
        .map(|i| {
            let plan = ClientPlan {
                index: i,
                kind: kind_of_index(i),
                seed: faults::sub_seed(seed, faults::CLIENT_STREAM + i as u64),
                seeds: seeds.clone(),
                keys: keys.clone(),
                op_timeout,
                think: Duration::from_millis(cfg.think_ms),
                final_read_timeout: settle,
                replica_read_pct: cfg.replica_read_pct,
            };
            tokio::spawn(workload::client_task(
                plan,
                shared.clone(),
                phase_rx.clone(),
            ))
        })
        .collect();

    let churn_kinds: Vec<ChurnKind> = faults_kinds
        .iter()
        .filter_map(|k| match k {
            FaultKind::Move => Some(ChurnKind::Move),
            FaultKind::Split => Some(ChurnKind::Split),
            FaultKind::Merge => Some(ChurnKind::Merge),
            _ => None,
        })
        .collect();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (observer_stop, observer_rx) = tokio::sync::watch::channel(false);
    let observer = tokio::spawn(crate::observe::observe_map(target.clone(), observer_rx));
    let churn: Vec<_> = (0..cfg.churn_workers)
        .map(|w| {
            tokio::spawn(faults::churn_worker(
                target.clone(),
                faults::sub_seed(seed, faults::CHURN_STREAM + w as u64),
                churn_kinds.clone(),
                stop_rx.clone(),
            ))
        })
        .collect();

    // The fault phase.
    let mut injected: BTreeMap<FaultKind, u64> = BTreeMap::new();
    let steps = faults::schedule(
        seed,
        &faults_kinds,
        cfg.nodes,
        etcd_members,
        faults::Timings {
            node_lease_ttl_ms: cfg.node_lease_ttl_ms,
            node_lease_margin_ms: spec_margin_ms(cfg),
            replica_lag_timeout_ms: cfg.replica_lag_timeout_ms,
            down_grace_ms: cfg.down_grace_ms,
        },
        cfg.time_limit_ms,
    );
    let phase_start = Instant::now();
    let limit = Duration::from_millis(cfg.time_limit_ms);
    let ticker = {
        let progress = progress.clone();
        tokio::spawn(async move {
            loop {
                progress
                    .elapsed_ms
                    .store(phase_start.elapsed().as_millis() as u64, Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    for step in &steps {
        let quiet = Duration::from_millis(step.quiet_ms);
        if phase_start.elapsed() + quiet >= limit {
            break;
        }
        tokio::time::sleep(quiet).await;
        *injected.entry(step.fault.kind()).or_default() += 1;
        progress.faults.fetch_add(1, Relaxed);
        if let Err(e) = faults::inject(&target, &step.fault).await {
            failures.push(format!(
                "fault {:?} could not be carried out: {e}",
                step.fault
            ));
            log.note(&format!("fault {:?} failed: {e}", step.fault));
            break;
        }
    }
    let rest = limit.saturating_sub(phase_start.elapsed());
    tokio::time::sleep(rest).await;
    ticker.abort();

    // Heal, settle, read everything.
    log.note("fault phase over: stopping churn and the random operations");
    let _ = stop_tx.send(true);
    let _ = phase_tx.send(Phase::Hold);
    let mut churned = ChurnCounts::default();
    for w in churn {
        if let Ok(c) = w.await {
            for (k, n) in c.requested {
                *churned.requested.entry(k).or_default() += n;
            }
            for (k, n) in c.failed {
                *churned.failed.entry(k).or_default() += n;
            }
        }
    }
    let healed = target.blocking(|c| c.heal_all()).await;
    match healed {
        Ok(what) => log.note(&format!("healed: {}", what.join(", "))),
        Err(e) => failures.push(format!("healing failed: {e}")),
    }
    // The nodes' addresses now (a permanent loss gives its replacement new ones).
    let now_addrs = target.blocking(|c| Ok(c.node_addrs().to_vec())).await?;
    match wait_serving(&now_addrs, &keys, settle).await {
        Ok(took) => log.note(&format!("serving again after {took:?}")),
        Err(why) => failures.push(format!("the cluster did not serve again: {why}")),
    }
    if cfg.replication_factor > 1 {
        // Every copy caught up and rejoined the in-sync set (catch-up works).
        match crate::observe::wait_in_sync(&target, cfg.replication_factor, settle).await {
            Ok(took) => log.note(&format!("every partition in sync again after {took:?}")),
            Err(why) => failures.push(format!(
                "the replicas did not all catch up after healing: {why}"
            )),
        }
    }
    log.note("final reads");
    let _ = phase_tx.send(Phase::FinalRead);
    let mut events = Vec::new();
    for c in clients {
        match c.await {
            Ok(mut e) => events.append(&mut e),
            Err(e) => failures.push(format!("a client task panicked: {e}")),
        }
    }
    let _ = std::fs::write(dir.join("clients.txt"), shared.client_table());
    let _ = observer_stop.send(true);
    let map_changes = observer.await.unwrap_or_default();
    let migrations = migration_states(&cfg.bin, &meta_url, &secret_file).await;
    // How the map came to be, change by change, for reading a failure
    // (`keyway ctl map --since 0`; the store keeps 4,096 versions).
    if let Ok(text) = ctl(
        &cfg.bin,
        &meta_url,
        &secret_file,
        &["map", "--since", "0"],
        faults::CTL_TIMEOUT,
    )
    .await
    {
        let _ = std::fs::write(dir.join("map-history.txt"), text);
    }
    let crashes = {
        let mut c = cluster.lock().unwrap_or_else(|e| e.into_inner());
        c.note_crashes();
        let crashes = c.crashes().to_vec();
        c.copy_store_logs();
        c.stop();
        crashes
    };
    failures.extend(crashes.iter().map(|c| format!("crash: {c}")));
    log.note("cluster stopped");

    events.sort_by_key(|e| (e.invoke_us, e.id));
    let history = History::new(events);
    let (verdict, check) = judge(&history);
    let mut report = RunReport::new(seed, &history, verdict, injected, churned, migrations);
    report.final_reads = progress.final_reads.load(Relaxed);
    report.replica_reads = shared.replica_reads.load(Relaxed);
    report.map = map_changes;
    report.losses = target.recoveries.losses();
    failures.extend(crate::judge::judge_recoveries(
        &report.losses,
        cfg.recovery_timeout_ms,
    ));
    report.replication_factor = cfg.replication_factor;
    report.duration = started.elapsed();
    if report.ops_ok < cfg.min_ok_ops {
        failures.push(format!(
            "only {} successful operations (at least {} required): the workload did not really run",
            report.ops_ok, cfg.min_ok_ops
        ));
    }
    // Both libraries must really have run: a smart client that never
    // connected would leave a run that tested only the plain one.
    for kind in [ClientKind::Smart, ClientKind::Plain] {
        let clients = (0..cfg.clients)
            .filter(|i| kind_of_index(*i) == kind)
            .count();
        if clients == 0 {
            continue;
        }
        let ok = history
            .events
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Ok(_)))
            .filter(|e| shared.kind_of(e.client) == Some(kind))
            .count() as u64;
        report
            .ops_ok_by_kind
            .insert(format!("{kind:?}").to_lowercase(), ok);
        let want = cfg.min_ok_ops / 4;
        if ok < want {
            failures.push(format!(
                "only {ok} successful operations of the {kind:?} clients (at least {want} required)"
            ));
        }
    }
    // Replica reads must really have happened on a replicated run (else
    // the run did not test them; at RF 1 CLUSTER SLOTS lists no replica).
    let plain_clients = (0..cfg.clients)
        .filter(|i| kind_of_index(*i) == ClientKind::Plain)
        .count();
    if cfg.replication_factor > 1
        && cfg.replica_read_pct > 0
        && plain_clients > 0
        && report.replica_reads == 0
    {
        failures.push(
            "replication is on and replica reads were asked for, but no replica answered a read"
                .to_string(),
        );
    }
    let want_final = (cfg.clients * keys.all().len()) as u64;
    if report.final_reads < want_final {
        failures.push(format!(
            "only {} of {want_final} final reads succeeded",
            report.final_reads
        ));
    }
    report.failures = failures;
    if !report.passed() || cfg.keep {
        let path = cfg.out.join(format!("run-{seed}.jsonl"));
        let file = std::fs::File::create(&path)
            .map_err(|e| NemesisError::io(format!("create {}", path.display()), e))?;
        history.write_jsonl(std::io::BufWriter::new(file))?;
        report.history_file = Some(path);
        if !report.verdict.ok {
            // The failing key's events, cut small enough to read.
            let options = keyway_check::CheckOptions::default();
            match check.write_failure(&history, &options, &cfg.out, &format!("run-{seed}-failure"))
            {
                Ok(Some(files)) => report.failure_file = Some(files.text),
                Ok(None) => {}
                Err(e) => report
                    .failures
                    .push(format!("writing the failing history: {e}")),
            }
        }
        report.kept_dir = Some(dir);
    } else {
        drop(cluster);
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(report)
}

/// The nodes' `--lease-margin-ms` (and the managers' failover margin).
fn spec_margin_ms(cfg: &RunConfig) -> u64 {
    cfg.node_lease_ttl_ms / 4
}

/// Even clients use the smart client, odd ones the plain one.
fn kind_of_index(i: usize) -> ClientKind {
    if i.is_multiple_of(2) {
        ClientKind::Smart
    } else {
        ClientKind::Plain
    }
}

/// Waits until every key answers a GET through the plain client (so every
/// partition holding one is served); how long it took.
async fn wait_serving(
    seeds: &[String],
    keys: &KeySet,
    within: Duration,
) -> Result<Duration, String> {
    let started = Instant::now();
    let mut client = ClusterClient::new(seeds.to_vec());
    let mut last = String::new();
    for key in keys.all() {
        let slot = keyway_map::key_hash_slot(key.as_bytes());
        loop {
            let left = within.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(format!("{key} never answered: {last}"));
            }
            let get = [b"GET".to_vec(), key.as_bytes().to_vec()];
            match client
                .exec(slot, &get, left.min(Duration::from_secs(2)))
                .await
            {
                Exec::Reply(keyway_resp::Frame::Error(e)) => last = e,
                Exec::Reply(_) => break,
                Exec::Failed(e) | Exec::Unknown(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(started.elapsed())
}

/// Migration records by state (`DONE`, `ABORTED`, ...), per `keyway ctl migrations`.
async fn migration_states(
    bin: &std::path::Path,
    meta_url: &str,
    secret_file: &std::path::Path,
) -> BTreeMap<String, u64> {
    let mut states = BTreeMap::new();
    let Ok(out) = ctl(
        bin,
        meta_url,
        secret_file,
        &["--json", "migrations"],
        faults::CTL_TIMEOUT,
    )
    .await
    else {
        states.insert("unreadable".to_string(), 1);
        return states;
    };
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap_or_default();
    for r in rows {
        let state = r
            .get("state")
            .and_then(|s| s.as_str())
            .unwrap_or("?")
            .to_string();
        *states.entry(state).or_default() += 1;
    }
    states
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(replication_factor: u8, nodes: usize) -> RunConfig {
        RunConfig {
            bin: "keyway".into(),
            out: "out".into(),
            meta: MetaKind::Embedded,
            nodes,
            managers: 2,
            partitions_per_node: 4,
            clients: 6,
            faults: FaultKind::DEFAULT.to_vec(),
            time_limit_ms: 15_000,
            op_timeout_ms: 2_000,
            think_ms: 5,
            hash_tags: 4,
            register_keys: 8,
            counter_keys: 4,
            node_lease_ttl_ms: 2_000,
            manager_lease_ttl_ms: 2_000,
            churn_workers: 2,
            min_ok_ops: 200,
            settle_timeout_ms: 60_000,
            keep: false,
            replication_factor,
            min_in_sync: 1,
            replica_lag_timeout_ms: 1_500,
            replica_read_lease_ms: 750,
            replica_stream_window_calls: 4,
            replica_read_pct: 30,
            down_grace_ms: 5_000,
            recovery_timeout_ms: 60_000,
        }
    }

    #[test]
    fn permanent_loss_is_scheduled_only_with_a_survivor_for_every_copy() {
        let rf2 = config(2, 3);
        assert!(rf2.validate().is_ok());
        assert!(rf2.scheduled_faults().contains(&FaultKind::PermanentLoss));
        assert!(rf2.dropped_faults().is_empty());
        for (rf, nodes) in [(1, 3), (3, 3)] {
            let c = config(rf, nodes);
            assert!(!c.scheduled_faults().contains(&FaultKind::PermanentLoss));
            assert_eq!(c.dropped_faults(), vec![FaultKind::PermanentLoss]);
            assert_eq!(c.scheduled_faults().len(), FaultKind::DEFAULT.len() - 1);
        }
    }

    #[test]
    fn the_recovery_bound_must_leave_room_for_the_grace() {
        let mut c = config(2, 3);
        c.recovery_timeout_ms = c.down_grace_ms + c.node_lease_ttl_ms;
        assert!(c.validate().unwrap_err().contains("--recovery-timeout-ms"));
        let mut c = config(2, 3);
        c.down_grace_ms = 500;
        assert!(c.validate().unwrap_err().contains("--down-grace-ms"));
    }
}
