//! [`Cluster`]: the run's processes. A metadata store (`keyway meta`, or a
//! 3-member etcd), `nodes` `keyway server`s and `managers` `keyway
//! manager`s, each a [`Daemon`] that can be killed -9 and restarted with
//! the same arguments (same data directory, same ports), or frozen and
//! thawed. Each process's stderr (its log) and stdout are appended to
//! `logs/<label>.log` in the run's directory. The API is blocking (std):
//! the run calls it from `spawn_blocking`. Everything is killed on drop.
//!
//! With [`ClusterSpec::network`] each node runs in its own network
//! namespace (`ip netns exec`, see `netns.rs`) on its own address, and the
//! metadata store listens on the bridge's address, so a node can be cut
//! off ([`Cluster::partition_node`]). With [`ClusterSpec::fault_injection`]
//! the nodes run with `--fault-injection`, so their fsyncs can be failed
//! over the admin port ([`Cluster::fail_disk`]).

use crate::NemesisError;
pub use crate::ctl::ctl;
use crate::netns::Network;
pub use crate::replication_flags::ReplicationFlags;
use keyway_testkit::{EtcdCluster, HarnessError, Proc};
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The processes' log filter: info, without the libraries' chatter.
const LOG_FILTER: &str = "info,fjall=warn,lsm_tree=warn,h2=warn,tower=warn,hyper=warn";
/// Times a process that exits before printing its ready line is started
/// again (a port still held by the killed incarnation, say).
const MAX_SPAWN_ATTEMPTS: u32 = 3;
/// A namespaced node's RESP and admin ports (its address is its own).
const NETNS_RESP_PORT: u16 = 7001;
const NETNS_ADMIN_PORT: u16 = 8001;
/// How far a namespaced node's ports move per replacement
/// ([`Cluster::replace_node`]): its IP stays, its addresses are new.
const NETNS_REPLACEMENT_PORT_STEP: u16 = 100;
/// Longest wait for a node's admin port to answer a fault request.
const ADMIN_HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// Which metadata store the cluster runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaKind {
    /// One `keyway meta` process (the embedded store over RPC).
    Embedded,
    /// A 3-member etcd (`keyway_testkit::EtcdCluster`); the servers bootstrap the map.
    Etcd,
}

impl std::str::FromStr for MetaKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "embedded" | "keyway" => Ok(MetaKind::Embedded),
            "etcd" => Ok(MetaKind::Etcd),
            _ => Err(format!(
                "unknown metadata store '{s}' (expected embedded or etcd)"
            )),
        }
    }
}

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// The `keyway` binary.
    pub bin: PathBuf,
    /// The run's directory: `logs/` and each process's data directory.
    pub dir: PathBuf,
    pub meta: MetaKind,
    pub nodes: usize,
    pub managers: usize,
    pub partitions_per_node: u16,
    /// `keyway server --lease-ttl-ms`: a node paused past it stops serving.
    pub node_lease_ttl_ms: u64,
    pub node_lease_margin_ms: u64,
    /// `keyway manager --lease-ttl-ms`: a dead leader's seat passes on within about it.
    pub manager_lease_ttl_ms: u64,
    /// How long a process may take to print its ready line.
    pub start_timeout: Duration,
    /// Run each node in its own network namespace (the `partition` fault).
    pub network: bool,
    /// Start the nodes with `--fault-injection` (the `disk` fault).
    pub fault_injection: bool,
    /// Keyspace 0's replication factor (`--replication-factor` of `keyway
    /// meta`, or of the servers' bootstrap on etcd). 1 passes no replication
    /// flag at all.
    pub replication_factor: u8,
    /// Keyspace 0's `min_in_sync` (copies, the primary included).
    pub min_in_sync: u8,
    /// `keyway server --replica-lag-timeout-ms` (passed when replicated).
    pub replica_lag_timeout_ms: u64,
    /// `keyway server --replica-read-lease-ms` (passed when replicated).
    pub replica_read_lease_ms: u64,
    /// `keyway server --replica-stream-window-calls` (passed when replicated).
    pub replica_stream_window_calls: u64,
    /// `keyway manager --rebalance-down-grace-ms` (the `permanent-loss`
    /// fault: a node down this long is re-replicated); `None` keeps the
    /// manager's default.
    pub down_grace_ms: Option<u64>,
}

impl ClusterSpec {
    fn replication(&self) -> ReplicationFlags {
        ReplicationFlags {
            replication_factor: self.replication_factor,
            min_in_sync: self.min_in_sync,
            node_lease_margin_ms: self.node_lease_margin_ms,
            replica_lag_timeout_ms: self.replica_lag_timeout_ms,
            replica_read_lease_ms: self.replica_read_lease_ms,
            replica_stream_window_calls: self.replica_stream_window_calls,
        }
    }
}

/// One `keyway` process, restartable with the same arguments.
pub struct Daemon {
    label: String,
    args: Vec<String>,
    /// The network namespace it runs in (`ip netns exec`), if any.
    netns: Option<String>,
    ready: String,
    log: PathBuf,
    proc: Option<Proc>,
    paused: bool,
    incarnation: u32,
}

impl Daemon {
    fn new(label: &str, args: Vec<String>, ready: &str, logs: &Path) -> Daemon {
        Daemon {
            label: label.to_string(),
            args,
            netns: None,
            ready: ready.to_string(),
            log: logs.join(format!("{label}.log")),
            proc: None,
            paused: false,
            incarnation: 0,
        }
    }

    /// Starts it and waits for its ready line (retrying a start that exits early).
    fn start(&mut self, bin: &Path, within: Duration) -> Result<(), NemesisError> {
        let mut last = None;
        for _ in 0..MAX_SPAWN_ATTEMPTS {
            match self.spawn_once(bin, within) {
                Ok(()) => return Ok(()),
                Err(e @ NemesisError::Harness(HarnessError::Timeout { .. })) => return Err(e),
                Err(e) => {
                    self.kill9();
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        Err(last.expect("at least one attempt"))
    }

    fn spawn_once(&mut self, bin: &Path, within: Duration) -> Result<(), NemesisError> {
        assert!(self.proc.is_none(), "{} is already running", self.label);
        self.incarnation += 1;
        let open_log = || {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .map_err(|e| NemesisError::io(format!("open {}", self.log.display()), e))
        };
        let mut log = open_log()?;
        let _ = writeln!(
            log,
            "===== nemesis: starting {} incarnation {} =====",
            self.label, self.incarnation
        );
        // `ip netns exec` execs the binary in place (same pid), so kill -9
        // and SIGSTOP reach the node itself.
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.args(&self.args)
            .env("KEYWAY_LOG", LOG_FILTER)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(open_log()?));
        let mut proc = Proc::spawn(&self.label, &mut cmd)?;
        let stdout = proc.child_mut().stdout.take().expect("stdout is piped");
        // Drain stdout for the process's whole life (a full pipe would
        // block its prints), copying each line into the log.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = writeln!(log, "stdout: {line}");
                let _ = tx.send(line);
            }
        });
        self.proc = Some(proc);
        self.paused = false;
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(&self.ready) => return Ok(()),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(HarnessError::Timeout {
                        what: format!("{} to print {:?}", self.label, self.ready),
                        after: within,
                        log_tail: tail(&self.log, 30),
                    }
                    .into());
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(NemesisError::Invalid(format!(
                        "{} exited before printing {:?}; log tail:\n{}",
                        self.label,
                        self.ready,
                        tail(&self.log, 30)
                    )));
                }
            }
        }
    }

    /// SIGKILL (and reap); a no-op if it is not running.
    fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
        self.paused = false;
    }

    fn pause(&mut self) -> Result<(), NemesisError> {
        let p = self.running()?;
        p.pause()?;
        self.paused = true;
        Ok(())
    }

    fn resume(&mut self) -> Result<(), NemesisError> {
        let p = self.running()?;
        p.resume()?;
        self.paused = false;
        Ok(())
    }

    fn running(&self) -> Result<&Proc, NemesisError> {
        self.proc
            .as_ref()
            .ok_or_else(|| NemesisError::Invalid(format!("{} is not running", self.label)))
    }

    /// If it was believed running but exited by itself: how it ended.
    fn exited_by_itself(&mut self) -> Option<String> {
        let status = self.proc.as_mut()?.try_wait()?;
        self.proc = None;
        Some(format!(
            "{} (incarnation {}) exited by itself: {status}",
            self.label, self.incarnation
        ))
    }
}

/// The whole cluster.
pub struct Cluster {
    spec: ClusterSpec,
    meta_url: String,
    /// The cluster secret every process of the cluster is started with
    /// (a random one per cluster, in its directory), and its text.
    secret_file: PathBuf,
    secret: String,
    meta: Option<Daemon>,
    etcd: Option<EtcdCluster>,
    /// Etcd members killed and not restarted yet.
    etcd_down: Vec<usize>,
    nodes: Vec<Daemon>,
    node_addrs: Vec<String>,
    node_admins: Vec<String>,
    /// Nodes whose fsyncs were made to fail and that were not restarted yet.
    disk_failed: Vec<bool>,
    /// Nodes cut off and not healed yet.
    partitioned: Vec<bool>,
    /// Nodes cut from the store or from their peers (blackhole routes) and not healed yet.
    cut: Vec<bool>,
    /// Times each slot's node was replaced by a new empty one.
    replacements: Vec<u16>,
    managers: Vec<Daemon>,
    /// Processes found exited by themselves (a crash), for the report.
    crashes: Vec<String>,
    /// Last, so it is removed after every process was killed (on drop).
    network: Option<Network>,
}

impl Cluster {
    /// Starts the metadata store, the nodes and the managers, each waited
    /// for (ready line). The map is bootstrapped once every node registered.
    pub fn start(spec: ClusterSpec) -> Result<Cluster, NemesisError> {
        if spec.nodes == 0 || spec.managers == 0 {
            return Err(NemesisError::Invalid(
                "a cluster needs at least one node and one manager".into(),
            ));
        }
        let logs = spec.dir.join("logs");
        std::fs::create_dir_all(&logs)
            .map_err(|e| NemesisError::io(format!("create {}", logs.display()), e))?;
        let ports = keyway_testkit::free_ports(1 + 2 * spec.nodes + spec.managers);
        let (secret_file, secret) = write_secret(&spec.dir)?;
        let secret_path = secret_file.display().to_string();
        let network = match (spec.network, spec.meta) {
            (false, _) => None,
            (true, MetaKind::Embedded) => Some(Network::create(spec.nodes)?),
            (true, MetaKind::Etcd) => {
                return Err(NemesisError::Invalid(
                    "network namespaces need the embedded metadata store (etcd listens on 127.0.0.1)"
                        .into(),
                ));
            }
        };
        // Its own address on the bridge, so a node can be cut from it alone.
        let meta_host = network
            .as_ref()
            .map_or("127.0.0.1".to_string(), |n| n.store_ip().to_string());
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let path = |name: &str| spec.dir.join(name).display().to_string();
        let n = spec.nodes.to_string();
        let ppn = spec.partitions_per_node.to_string();
        let (meta, etcd, meta_url) = match spec.meta {
            MetaKind::Embedded => {
                let addr = format!("{meta_host}:{}", ports[0]);
                let mut args = s(&[
                    "meta",
                    "--listen",
                    &addr,
                    "--data",
                    &path("meta"),
                    "--bootstrap-nodes",
                    &n,
                    "--partitions-per-node",
                    &ppn,
                    "--cluster-secret-file",
                    &secret_path,
                ]);
                args.extend(spec.replication().bootstrap());
                let mut meta = Daemon::new("meta", args, "keyway meta listening", &logs);
                meta.start(&spec.bin, spec.start_timeout)?;
                (Some(meta), None, format!("keyway://{addr}"))
            }
            MetaKind::Etcd => {
                let etcd = EtcdCluster::start(3)?;
                let url = etcd.url("/keyway/nemesis");
                (None, Some(etcd), url)
            }
        };
        let mut cluster = Cluster {
            meta_url,
            secret_file,
            secret,
            meta,
            etcd,
            etcd_down: Vec::new(),
            nodes: Vec::new(),
            node_addrs: Vec::new(),
            node_admins: Vec::new(),
            disk_failed: vec![false; spec.nodes],
            partitioned: vec![false; spec.nodes],
            cut: vec![false; spec.nodes],
            replacements: vec![0; spec.nodes],
            managers: Vec::new(),
            crashes: Vec::new(),
            spec: spec.clone(),
            network,
        };
        for i in 0..spec.nodes {
            let (resp, admin) = match &cluster.network {
                Some(net) => (
                    format!("{}:{NETNS_RESP_PORT}", net.node_ip(i)),
                    format!("{}:{NETNS_ADMIN_PORT}", net.node_ip(i)),
                ),
                None => (
                    format!("127.0.0.1:{}", ports[1 + 2 * i]),
                    format!("127.0.0.1:{}", ports[2 + 2 * i]),
                ),
            };
            let mut args = s(&[
                "server",
                "--meta",
                &cluster.meta_url,
                "--listen",
                &resp,
                "--admin-listen",
                &admin,
                "--data",
                &path(&format!("node{i}")),
                "--durability",
                "group",
                "--lease-ttl-ms",
                &spec.node_lease_ttl_ms.to_string(),
                "--lease-margin-ms",
                &spec.node_lease_margin_ms.to_string(),
                "--cluster-secret-file",
                &secret_path,
                // The workload and managers reach namespaced nodes from the
                // bridge address, not loopback, and the harness sets no
                // password: protected mode would refuse them.
                "--protected-mode",
                "no",
                // Change records off half a second after their last reader
                // (10 s by default): faults meet the log going off and on.
                "--log-keep-idle-ms",
                "500",
            ]);
            if spec.meta == MetaKind::Etcd {
                args.extend(s(&["--bootstrap-nodes", &n, "--partitions-per-node", &ppn]));
                args.extend(spec.replication().bootstrap());
            }
            args.extend(spec.replication().node());
            if spec.fault_injection {
                args.push("--fault-injection".into());
            }
            let mut node = Daemon::new(&format!("node{i}"), args, "serving redis://", &logs);
            node.netns = cluster.network.as_ref().map(|n| n.netns(i));
            node.start(&spec.bin, spec.start_timeout)?;
            cluster.nodes.push(node);
            cluster.node_addrs.push(resp);
            cluster.node_admins.push(admin);
        }
        for i in 0..spec.managers {
            let name = format!("mgr{i}");
            let admin = format!("127.0.0.1:{}", ports[1 + 2 * spec.nodes + i]);
            let mut mgr = Daemon::new(
                &name,
                s(&[
                    "manager",
                    "--meta",
                    &cluster.meta_url,
                    "--name",
                    &name,
                    "--admin-listen",
                    &admin,
                    "--lease-ttl-ms",
                    &spec.manager_lease_ttl_ms.to_string(),
                    "--no-rebalance",
                    "--no-auto-split",
                    "--no-auto-merge",
                    "--migration-stuck-timeout-ms",
                    "10000",
                    "--migration-fence-timeout-ms",
                    "3000",
                    "--migration-cleanup-grace-ms",
                    "1000",
                    "--cluster-secret-file",
                    &secret_path,
                ])
                .into_iter()
                .chain(spec.replication().manager())
                .chain(
                    spec.down_grace_ms
                        .into_iter()
                        .flat_map(|ms| ["--rebalance-down-grace-ms".to_string(), ms.to_string()]),
                )
                .collect(),
                &format!("manager {name} "),
                &logs,
            );
            mgr.start(&spec.bin, spec.start_timeout)?;
            cluster.managers.push(mgr);
        }
        Ok(cluster)
    }

    /// The cluster secret's file: what `keyway ctl --cluster-secret-file` takes.
    pub fn secret_file(&self) -> &Path {
        &self.secret_file
    }

    /// `keyway://HOST:PORT` or `etcd://...`: what `keyway ctl --meta` takes.
    pub fn meta_url(&self) -> &str {
        &self.meta_url
    }

    /// Every node's RESP address, in node order.
    pub fn node_addrs(&self) -> &[String] {
        &self.node_addrs
    }

    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    pub fn managers(&self) -> usize {
        self.managers.len()
    }

    /// Which manager is called `name` (`mgrI`).
    pub fn manager_index(&self, name: &str) -> Option<usize> {
        self.managers.iter().position(|m| m.label == name)
    }

    /// The etcd members, or 0 on the embedded store.
    pub fn etcd_members(&self) -> usize {
        self.etcd.as_ref().map_or(0, |e| e.len())
    }

    pub fn kill_node(&mut self, i: usize) -> Result<(), NemesisError> {
        self.nodes[i].kill9();
        self.disk_failed[i] = false;
        Ok(())
    }

    /// Node `i`'s data directory.
    fn node_dir(&self, i: usize) -> PathBuf {
        self.spec.dir.join(format!("node{i}"))
    }

    /// The id node `i` keeps in its data directory (`node.id`), if it
    /// registered already.
    pub fn node_id(&self, i: usize) -> Option<keyway_map::NodeId> {
        let text = std::fs::read_to_string(self.node_dir(i).join("node.id")).ok()?;
        keyway_map::NodeId::parse(&text)
    }

    /// kill -9 of node `i` and deletion of its data directory: its next
    /// [`Cluster::restart_node`] starts an empty node, which registers under
    /// a new id (same addresses, same network namespace).
    pub fn wipe_node(&mut self, i: usize) -> Result<(), NemesisError> {
        self.kill_node(i)?;
        let dir = self.node_dir(i);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(NemesisError::io(format!("remove {}", dir.display()), e)),
        }
    }

    /// Starts a new empty node in slot `i` after [`Cluster::wipe_node`]:
    /// new RESP and admin addresses (loopback: fresh ports; in a network
    /// namespace: the slot's namespace and IP, ports moved by
    /// [`NETNS_REPLACEMENT_PORT_STEP`]), so nothing addressed to the lost
    /// node (a peer's stream, a migration push, a client's cached route)
    /// reaches the new one, which registers under a new id.
    pub fn replace_node(&mut self, i: usize) -> Result<(), NemesisError> {
        self.kill_node(i)?;
        if self.node_dir(i).exists() {
            return Err(NemesisError::Invalid(format!(
                "node{i} is replaced only after its data directory was deleted"
            )));
        }
        self.replacements[i] += 1;
        let (resp, admin) = match &self.network {
            Some(net) => {
                let step = NETNS_REPLACEMENT_PORT_STEP * self.replacements[i];
                (
                    format!("{}:{}", net.node_ip(i), NETNS_RESP_PORT + step),
                    format!("{}:{}", net.node_ip(i), NETNS_ADMIN_PORT + step),
                )
            }
            None => {
                let ports = keyway_testkit::free_ports(2);
                (
                    format!("127.0.0.1:{}", ports[0]),
                    format!("127.0.0.1:{}", ports[1]),
                )
            }
        };
        let args = &mut self.nodes[i].args;
        for (flag, value) in [("--listen", &resp), ("--admin-listen", &admin)] {
            let at = args
                .iter()
                .position(|a| a == flag)
                .expect("every node is started with --listen and --admin-listen");
            args[at + 1] = value.clone();
        }
        self.node_addrs[i] = resp;
        self.node_admins[i] = admin;
        self.nodes[i].start(&self.spec.bin, self.spec.start_timeout)
    }

    /// kill -9 and start again: also the heal of [`Cluster::fail_disk`]
    /// (the new process's storage is healthy: nothing on disk was damaged).
    pub fn restart_node(&mut self, i: usize) -> Result<(), NemesisError> {
        self.kill_node(i)?;
        self.nodes[i].start(&self.spec.bin, self.spec.start_timeout)
    }

    /// Makes every later fsync of node `i` fail (`POST /fault/fsync-fail`
    /// on its admin port; needs [`ClusterSpec::fault_injection`]): the
    /// node then serves nothing until [`Cluster::restart_node`].
    pub fn fail_disk(&mut self, i: usize) -> Result<(), NemesisError> {
        if !self.spec.fault_injection {
            return Err(NemesisError::Invalid(
                "the disk fault needs nodes started with --fault-injection".into(),
            ));
        }
        let addr = self.node_admins[i].clone();
        let (status, body) =
            http_post(&addr, "/fault/fsync-fail", &self.secret, ADMIN_HTTP_TIMEOUT)
                .map_err(|e| NemesisError::io(format!("POST http://{addr}/fault/fsync-fail"), e))?;
        if status != 200 || !body.contains(r#""sync_fault":"always""#) {
            return Err(NemesisError::Invalid(format!(
                "POST http://{addr}/fault/fsync-fail answered {status}: {body}"
            )));
        }
        self.disk_failed[i] = true;
        Ok(())
    }

    /// Cuts node `i` off from the store, its peers, the managers and the
    /// clients (needs [`ClusterSpec::network`]).
    pub fn partition_node(&mut self, i: usize) -> Result<(), NemesisError> {
        let net = self.network.as_ref().ok_or_else(|| {
            NemesisError::Invalid("the partition fault needs network namespaces".into())
        })?;
        net.partition(i)?;
        self.partitioned[i] = true;
        Ok(())
    }

    /// Ends [`Cluster::partition_node`].
    pub fn heal_partition(&mut self, i: usize) -> Result<(), NemesisError> {
        if let Some(net) = &self.network {
            net.heal(i)?;
        }
        self.partitioned[i] = false;
        Ok(())
    }

    /// Cuts node `i` from the metadata store only, or (`peers`) from the
    /// other nodes only (needs [`ClusterSpec::network`]; see `netns.rs`).
    pub fn cut_node(&mut self, i: usize, peers: bool) -> Result<(), NemesisError> {
        let net = self.network.as_ref().ok_or_else(|| {
            NemesisError::Invalid("the partition faults need network namespaces".into())
        })?;
        self.cut[i] = true;
        if peers {
            net.cut_peers(i)
        } else {
            net.cut_store(i)
        }
    }

    /// Ends [`Cluster::cut_node`].
    pub fn heal_cut(&mut self, i: usize) -> Result<(), NemesisError> {
        if let Some(net) = &self.network {
            net.heal_cuts(i)?;
        }
        self.cut[i] = false;
        Ok(())
    }

    /// Which node listens on RESP address `addr`.
    pub fn node_index(&self, addr: &str) -> Option<usize> {
        self.node_addrs.iter().position(|a| a == addr)
    }

    pub fn pause_node(&mut self, i: usize) -> Result<(), NemesisError> {
        self.nodes[i].pause()
    }

    pub fn resume_node(&mut self, i: usize) -> Result<(), NemesisError> {
        self.nodes[i].resume()
    }

    pub fn kill_manager(&mut self, i: usize) -> Result<(), NemesisError> {
        self.managers[i].kill9();
        Ok(())
    }

    pub fn restart_manager(&mut self, i: usize) -> Result<(), NemesisError> {
        self.managers[i].kill9();
        self.managers[i].start(&self.spec.bin, self.spec.start_timeout)
    }

    /// Kills the `keyway meta` process, or etcd member `member`.
    pub fn kill_meta(&mut self, member: usize) -> Result<(), NemesisError> {
        match (&mut self.meta, &mut self.etcd) {
            (Some(meta), _) => meta.kill9(),
            (None, Some(etcd)) => {
                let member = member % etcd.len();
                etcd.kill_member(member);
                self.etcd_down.push(member);
            }
            (None, None) => unreachable!("a cluster has a metadata store"),
        }
        Ok(())
    }

    /// Restarts what [`Cluster::kill_meta`] killed.
    pub fn restart_meta(&mut self) -> Result<(), NemesisError> {
        if let Some(meta) = &mut self.meta {
            meta.kill9();
            return meta.start(&self.spec.bin, self.spec.start_timeout);
        }
        let etcd = self.etcd.as_mut().expect("a cluster has a metadata store");
        for member in std::mem::take(&mut self.etcd_down) {
            etcd.restart_member(member)?;
        }
        etcd.wait_healthy()?;
        Ok(())
    }

    /// Notes every process that exited by itself since the last look
    /// (they are restarted by [`Cluster::heal_all`]).
    pub fn note_crashes(&mut self) {
        let found: Vec<String> = self
            .meta
            .iter_mut()
            .chain(self.nodes.iter_mut())
            .chain(self.managers.iter_mut())
            .filter_map(Daemon::exited_by_itself)
            .collect();
        self.crashes.extend(found);
    }

    /// Processes that exited by themselves during the run.
    pub fn crashes(&self) -> &[String] {
        &self.crashes
    }

    /// Ends every fault: thaws what is frozen, reconnects what is cut off,
    /// restarts a node whose disk failed, starts what is down (the store
    /// first, then the nodes, then the managers). Returns what it did.
    pub fn heal_all(&mut self) -> Result<Vec<String>, NemesisError> {
        self.note_crashes();
        let mut healed = Vec::new();
        let needs_meta =
            self.meta.as_ref().is_some_and(|m| m.proc.is_none()) || !self.etcd_down.is_empty();
        if needs_meta {
            self.restart_meta()?;
            healed.push("restarted the metadata store".to_string());
        }
        for i in 0..self.nodes.len() {
            if self.partitioned[i] {
                self.heal_partition(i)?;
                healed.push(format!("healed node{i}'s partition"));
            }
            if self.cut[i] {
                self.heal_cut(i)?;
                healed.push(format!("healed node{i}'s cut"));
            }
            if self.disk_failed[i] {
                self.restart_node(i)?;
                healed.push(format!("restarted node{i} (failed disk)"));
            }
        }
        let bin = self.spec.bin.clone();
        let within = self.spec.start_timeout;
        for d in self.nodes.iter_mut().chain(self.managers.iter_mut()) {
            if d.proc.is_none() {
                d.start(&bin, within)?;
                healed.push(format!("restarted {}", d.label));
            } else if d.paused {
                d.resume()?;
                healed.push(format!("resumed {}", d.label));
            }
        }
        Ok(healed)
    }

    /// Copies the etcd members' logs (kept in the etcd cluster's own
    /// temporary directory, removed with it) into the run's `logs/`.
    pub fn copy_store_logs(&self) {
        let Some(etcd) = &self.etcd else {
            return;
        };
        let logs = self.spec.dir.join("logs");
        for i in 0..etcd.len() {
            let _ = std::fs::copy(etcd.log_path(i), logs.join(format!("etcd{i}.log")));
        }
    }

    /// Kills every process now (also done on drop; the network namespaces,
    /// if any, are removed when the cluster is dropped, after this).
    pub fn stop(&mut self) {
        for d in self
            .managers
            .iter_mut()
            .chain(self.nodes.iter_mut())
            .chain(self.meta.iter_mut())
        {
            d.kill9();
        }
        if let Some(etcd) = &mut self.etcd {
            etcd.stop_all();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
        // `network` is dropped after this body: no process is left in it.
    }
}

/// A plain HTTP/1.1 POST with an empty body: (status code, body).
fn http_post(
    addr: &str,
    path: &str,
    secret: &str,
    within: Duration,
) -> std::io::Result<(u16, String)> {
    use std::io::Read;
    let sock: std::net::SocketAddr = addr
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{e}")))?;
    let mut stream = std::net::TcpStream::connect_timeout(&sock, within)?;
    stream.set_read_timeout(Some(within))?;
    stream.set_write_timeout(Some(within))?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {secret}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

/// A random cluster secret (64 hex digits) in `dir/cluster-secret`, mode
/// 0600: (its path, its text).
fn write_secret(dir: &Path) -> Result<(PathBuf, String), NemesisError> {
    use std::fmt::Write as _;
    let path = dir.join("cluster-secret");
    let secret = rand::random::<[u8; 32]>()
        .iter()
        .fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        });
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
        .open(&path)
        .and_then(|mut f| writeln!(f, "{secret}"))
        .map_err(|e| NemesisError::io(format!("write {}", path.display()), e))?;
    Ok((path, secret))
}

/// The last `lines` lines of a log file.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
