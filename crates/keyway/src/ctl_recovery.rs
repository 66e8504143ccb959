//! `keyway ctl recovery`: re-replication at a glance, from the map and the
//! leases: the under-replicated partitions, the nodes without a lease and
//! what they still hold, and the copies in flight (replicas not yet in
//! sync on nodes holding a lease). The copies' progress comes from the
//! nodes themselves (their `PartitionStats` RPC lists the copies each sends,
//! see keyway-node `copies.rs`): bytes sent and written, bytes remaining
//! against the sender's size estimate, the rate and the time left
//! (keyway-manager `copies.rs`, the same figures the manager shows). With
//! `--manager HOST:PORT` (the leading manager's admin address) it adds the
//! manager's own view (`/status` → `replication.recovery`): the nodes dead
//! past the grace, how long each Down node still waits for it, the
//! throttled partitions. `--watch` redraws progress bars (one per running
//! copy) every `--interval-ms` until the cluster is recovered
//! ([`Report::recovered`]: nothing under-replicated, no replica catching
//! up, no copy running, and no node without a lease still holding a copy);
//! with `--json` it prints one report per line instead.

use crate::ctl::print_json;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use keyway_manager::RpcStats;
use keyway_manager::copies::{CopyProgress, CopyTotals, CopyTracker, RateBasis, totals};
use keyway_manager::replication::membership::wanted_copies;
use keyway_map::{NodeId, NodeState, PartitionMap};
use keyway_meta::MetaStore;
use keyway_peer::copies::CopyReport;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

/// Shortest `--interval-ms` accepted.
const MIN_INTERVAL_MS: u64 = 100;

#[derive(clap::Args, Debug)]
pub struct RecoveryArgs {
    /// The leading manager's admin address, for the grace wait and the
    /// throttled partitions (only the manager knows them).
    #[arg(long)]
    manager: Option<String>,
    /// Follow the recovery with progress bars (`--json`: one report per
    /// line) until no partition is under-replicated.
    #[arg(long)]
    watch: bool,
    /// With `--watch`: how often the nodes are asked, ms (the rate is over
    /// this interval; at least 100).
    #[arg(long, default_value_t = 1_000)]
    interval_ms: u64,
    /// Deadline of each node's answer, ms.
    #[arg(long, default_value_t = 2_000)]
    rpc_timeout_ms: u64,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub(crate) struct UnderReplicated {
    partition: u64,
    in_sync_copies: usize,
    wanted: usize,
    owner: String,
    /// Replicas on nodes without a lease.
    on_leaseless_nodes: Vec<String>,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Leaseless {
    node: String,
    state: keyway_map::NodeState,
    primaries: usize,
    replicas: usize,
}

#[derive(Debug, PartialEq, Serialize)]
pub(crate) struct CopyInFlight {
    partition: u64,
    target: String,
    /// The primary's catch-up of it, if the primary reported one.
    progress: Option<CopyProgress>,
}

#[derive(Debug, PartialEq, Serialize)]
pub(crate) struct Report {
    under_replicated: Vec<UnderReplicated>,
    leaseless_nodes: Vec<Leaseless>,
    copies_in_flight: Vec<CopyInFlight>,
    /// Every running copy the nodes report (replica catch-ups and
    /// migration copies), with bytes remaining, rate and ETA.
    copies_running: Vec<CopyProgress>,
    /// The copies the nodes finished lately (each keeps its last 64).
    copies_finished: Vec<CopyProgress>,
    copy_totals: CopyTotals,
    /// Nodes that did not answer for their copies.
    unreachable_nodes: Vec<String>,
    /// The manager's `replication.recovery` view, with `--manager`.
    manager: Option<serde_json::Value>,
}

impl Report {
    /// Nothing left to recover: no partition under-replicated, no replica
    /// out of sync on a node with a lease, no copy running, every node with
    /// a lease answered, and no node without a lease holding a copy (a
    /// node just killed keeps its lease a while; the map still counts an in-sync
    /// replica on a dead node until its primary or the manager removes it,
    /// so the under-replicated count alone ends too early).
    pub(crate) fn recovered(&self) -> bool {
        self.under_replicated.is_empty()
            && self.copies_in_flight.is_empty()
            && self.copies_running.is_empty()
            && self.unreachable_nodes.is_empty()
            && self
                .leaseless_nodes
                .iter()
                .all(|n| n.primaries == 0 && n.replicas == 0)
    }
}

/// The map-and-leases part of the report, with the copies `copies` lists
/// (pure).
pub(crate) fn report(
    map: &PartitionMap,
    leased: &BTreeSet<NodeId>,
    copies: &[CopyProgress],
) -> Report {
    let mut under = Vec::new();
    let mut in_flight = Vec::new();
    for p in map.partitions.values() {
        let wanted = wanted_copies(map, p);
        if p.in_sync_copies() < wanted {
            under.push(UnderReplicated {
                partition: p.id.0,
                in_sync_copies: p.in_sync_copies(),
                wanted,
                owner: p.owner.to_string(),
                on_leaseless_nodes: p
                    .replicas
                    .iter()
                    .filter(|r| !leased.contains(r))
                    .map(|r| r.to_string())
                    .collect(),
            });
        }
        for r in p
            .replicas
            .iter()
            .filter(|r| leased.contains(r) && !p.in_sync.contains(r))
        {
            let progress = copies
                .iter()
                .filter(|c| c.partition == p.id && c.to == *r && c.from == p.owner)
                .max_by_key(|c| (c.running(), c.started_at_ms))
                .cloned();
            in_flight.push(CopyInFlight {
                partition: p.id.0,
                target: r.to_string(),
                progress,
            });
        }
    }
    // Fewest in-sync copies first, as the manager plans them.
    under.sort_by_key(|u| (u.in_sync_copies, u.partition));
    let leaseless = map
        .nodes
        .values()
        .filter(|n| !leased.contains(&n.id))
        .map(|n| Leaseless {
            node: n.id.to_string(),
            state: n.state,
            primaries: map.owned_by(n.id).count(),
            replicas: map
                .partitions
                .values()
                .filter(|p| p.replicas.contains(&n.id))
                .count(),
        })
        .collect();
    let (running, finished): (Vec<CopyProgress>, Vec<CopyProgress>) =
        copies.iter().cloned().partition(|c| c.running());
    Report {
        under_replicated: under,
        leaseless_nodes: leaseless,
        copies_in_flight: in_flight,
        copy_totals: totals(&running),
        copies_running: running,
        copies_finished: finished,
        unreachable_nodes: Vec::new(),
        manager: None,
    }
}

/// One round of every leased node's copies (by sending node) and the nodes
/// that did not answer.
async fn gather_copies(
    stats: &RpcStats,
    map: &PartitionMap,
    leased: &BTreeSet<NodeId>,
    timeout: Duration,
) -> (BTreeMap<NodeId, Vec<CopyReport>>, Vec<String>) {
    let mut copies = BTreeMap::new();
    let mut unreachable = Vec::new();
    let asked = map
        .nodes
        .values()
        .filter(|n| n.state == NodeState::Up && leased.contains(&n.id));
    // One at a time, each bounded by the timeout (a CLI's few nodes).
    for n in asked {
        match stats.node_report(&n.admin_addr, timeout).await {
            Ok(r) => {
                copies.insert(n.id, r.copies);
            }
            Err(_) => unreachable.push(n.id.to_string()),
        }
    }
    (copies, unreachable)
}

/// Reads the store, the nodes and (with `--manager`) the manager; the
/// tracker keeps the previous round's samples (the rate's interval).
async fn round(
    meta: &dyn MetaStore,
    args: &RecoveryArgs,
    stats: &RpcStats,
    tracker: &CopyTracker,
) -> anyhow::Result<Report> {
    let map = meta.get_map().await?;
    let leased: BTreeSet<NodeId> = meta.leases().await?.iter().map(|l| l.node).collect();
    let timeout = Duration::from_millis(args.rpc_timeout_ms.max(1));
    let (copies, unreachable) = gather_copies(stats, &map, &leased, timeout).await;
    tracker.observe(&copies);
    let mut r = report(&map, &leased, &tracker.list());
    r.unreachable_nodes = unreachable;
    if let Some(addr) = &args.manager {
        let body = crate::ctl_split::http_get(addr, "/status").await?;
        let status: serde_json::Value = serde_json::from_str(&body)?;
        r.manager = status.pointer("/replication/recovery").cloned();
        anyhow::ensure!(
            r.manager.is_some(),
            "{addr}/status has no replication.recovery (not a keyway manager of this version?)"
        );
    }
    Ok(r)
}

pub async fn recovery_cmd(
    meta: &dyn MetaStore,
    args: RecoveryArgs,
    json: bool,
) -> anyhow::Result<()> {
    user_ensure!(
        args.interval_ms >= MIN_INTERVAL_MS,
        "--interval-ms must be at least {MIN_INTERVAL_MS}, got {}",
        args.interval_ms
    );
    let stats = RpcStats::new();
    let tracker = CopyTracker::default();
    if !args.watch {
        let r = round(meta, &args, &stats, &tracker).await?;
        return match json {
            true => print_json(&r),
            false => {
                print_text(&r);
                Ok(())
            }
        };
    }
    let mut bars = Bars::new()?;
    loop {
        let r = round(meta, &args, &stats, &tracker).await?;
        let done = r.recovered();
        if json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            bars.draw(&r);
        }
        if done {
            if !json {
                bars.clear();
                print_text(&r);
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(args.interval_ms)).await;
    }
}

fn bytes(n: u64) -> String {
    indicatif::HumanBytes(n).to_string()
}

fn rate_text(c: &CopyProgress) -> String {
    let basis = match c.rate_basis {
        RateBasis::LastInterval => "",
        RateBasis::SinceStart => " (avg)",
        RateBasis::WholeCopy => " (whole copy)",
    };
    match c.rate_bytes_per_sec {
        Some(r) => format!("{}/s{basis}", bytes(r as u64)),
        None => "-".into(),
    }
}

fn eta_text(ms: Option<u64>) -> String {
    match ms {
        Some(ms) => format!("{:.1}s", ms as f64 / 1000.0),
        None => "?".into(),
    }
}

fn print_text(r: &Report) {
    println!("under-replicated partitions: {}", r.under_replicated.len());
    for u in &r.under_replicated {
        println!(
            "  partition {:>5}  {}/{} in sync  primary {}  replicas without lease {:?}",
            u.partition, u.in_sync_copies, u.wanted, u.owner, u.on_leaseless_nodes
        );
    }
    println!("nodes without a lease: {}", r.leaseless_nodes.len());
    for n in &r.leaseless_nodes {
        println!(
            "  {}  {:?}  primary of {}  replica of {}",
            n.node, n.state, n.primaries, n.replicas
        );
    }
    println!(
        "copies in flight (replicas not yet in sync): {}",
        r.copies_in_flight.len()
    );
    for c in &r.copies_in_flight {
        let progress = match &c.progress {
            Some(p) => format!(
                "  {} sent / {} written of ~{}, {}, eta {}",
                bytes(p.bytes_sent),
                bytes(p.bytes_written),
                p.bytes_total_estimate.map_or("?".into(), bytes),
                rate_text(p),
                eta_text(p.eta_ms)
            ),
            None => "  (no copy reported yet)".into(),
        };
        println!("  partition {:>5} -> {}{progress}", c.partition, c.target);
    }
    let t = &r.copy_totals;
    println!(
        "copies running: {}  sent {}  written {}  remaining {}  rate {}/s  eta {}",
        t.running,
        bytes(t.bytes_sent),
        bytes(t.bytes_written),
        bytes(t.bytes_remaining),
        bytes(t.rate_bytes_per_sec as u64),
        eta_text(t.eta_ms)
    );
    for c in &r.copies_running {
        println!("  {}", copy_line(c));
    }
    if !r.copies_finished.is_empty() {
        println!("copies finished lately: {}", r.copies_finished.len());
        for c in r.copies_finished.iter().rev().take(10) {
            println!("  {}", copy_line(c));
        }
    }
    if !r.unreachable_nodes.is_empty() {
        println!("nodes that did not answer: {:?}", r.unreachable_nodes);
    }
    if let Some(m) = &r.manager {
        println!("manager: dead past the grace {}", m["dead_nodes"]);
        if let Some(waits) = m["waiting_for_grace"].as_array() {
            for w in waits {
                println!(
                    "  node {} waits {} ms more for the grace ({} partitions with a copy)",
                    w["node"], w["left_ms"], w["partitions"]
                );
            }
        }
        println!(
            "  throttled {}  recovered replicas {}",
            m["throttled_partitions"], m["recovered_replicas"]
        );
    }
}

fn copy_line(c: &CopyProgress) -> String {
    format!(
        "{} partition {} node {} -> {}: {} sent, {} written, {} ms, {}, {}{}",
        c.kind.label(),
        c.partition,
        c.from.0,
        c.to.0,
        bytes(c.bytes_sent),
        bytes(c.bytes_written),
        c.duration_ms,
        rate_text(c),
        c.outcome.label(),
        c.error
            .as_ref()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default()
    )
}

/// `--watch`'s bars: a header line and one bar per running copy.
struct Bars {
    multi: MultiProgress,
    header: ProgressBar,
    copies: HashMap<(u64, u64, u64, u64), ProgressBar>,
    style: ProgressStyle,
}

impl Bars {
    fn new() -> anyhow::Result<Bars> {
        let multi = MultiProgress::new();
        let header = multi.add(ProgressBar::new_spinner());
        Ok(Bars {
            multi,
            header,
            copies: HashMap::new(),
            style: ProgressStyle::with_template("{prefix} [{bar:30}] {bytes}/{total_bytes} {msg}")?
                .progress_chars("=> "),
        })
    }

    fn draw(&mut self, r: &Report) {
        let t = &r.copy_totals;
        self.header.set_message(format!(
            "under-replicated {}  copies running {}  remaining {}  rate {}/s  eta {}",
            r.under_replicated.len(),
            t.running,
            bytes(t.bytes_remaining),
            bytes(t.rate_bytes_per_sec as u64),
            eta_text(t.eta_ms)
        ));
        self.header.tick();
        let mut seen = BTreeSet::new();
        for c in &r.copies_running {
            let key = (c.partition.0, c.from.0, c.to.0, c.started_at_ms);
            seen.insert(key);
            let bar = self.copies.entry(key).or_insert_with(|| {
                let bar = self.multi.add(ProgressBar::new(0));
                bar.set_style(self.style.clone());
                bar.set_prefix(format!(
                    "{} p{} {}->{}",
                    c.kind.label(),
                    c.partition,
                    c.from.0,
                    c.to.0
                ));
                bar
            });
            bar.set_length(c.bytes_total_estimate.unwrap_or(0).max(c.bytes_sent).max(1));
            bar.set_position(c.bytes_sent);
            bar.set_message(format!("{} eta {}", rate_text(c), eta_text(c.eta_ms)));
        }
        self.copies.retain(|k, bar| {
            let keep = seen.contains(k);
            if !keep {
                bar.finish_and_clear();
            }
            keep
        });
    }

    fn clear(&mut self) {
        for bar in self.copies.values() {
            bar.finish_and_clear();
        }
        self.header.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::NodeInfo;

    #[test]
    fn the_report_lists_what_a_leaseless_node_leaves_behind() {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect();
        let mut map = PartitionMap::bootstrap_replicated(&nodes, 1, 2).unwrap();
        // Node 3 lost its lease; one replacement is in flight on node 1.
        let hit = map
            .partitions
            .values()
            .find(|p| p.owner != NodeId(3) && p.replicas.contains(&NodeId(3)))
            .unwrap()
            .id;
        let row = map.partitions.get_mut(&hit).unwrap();
        row.in_sync.clear();
        let leased: BTreeSet<NodeId> = [NodeId(1), NodeId(2)].into();
        let r = report(&map, &leased, &[]);
        assert_eq!(r.leaseless_nodes.len(), 1);
        assert_eq!(r.leaseless_nodes[0].node, NodeId(3).to_string());
        assert_eq!(r.leaseless_nodes[0].replicas, 1);
        let u: Vec<u64> = r.under_replicated.iter().map(|u| u.partition).collect();
        assert_eq!(u, [hit.0]);
        assert_eq!(
            r.under_replicated[0].on_leaseless_nodes,
            [NodeId(3).to_string()]
        );
        assert!(r.copies_in_flight.is_empty());
        assert!(!r.recovered(), "node 3 still holds copies");
        let all: BTreeSet<NodeId> = [NodeId(1), NodeId(2), NodeId(3)].into();
        let mut healed = PartitionMap::bootstrap_replicated(&nodes, 1, 2).unwrap();
        assert!(report(&healed, &all, &[]).recovered());
        // A replica catching up is not recovered yet, and shows its copy.
        let row = healed.partitions.get_mut(&hit).unwrap();
        let target = row.replicas[0];
        row.in_sync.clear();
        let copy = keyway_manager::copies::progress(
            row.owner,
            &keyway_peer::copies::CopyReport {
                partition: hit,
                peer: target,
                kind: keyway_peer::copies::CopyKind::Replica,
                migration: 0,
                bytes_sent: 100,
                bytes_written: 100,
                bytes_total_estimate: Some(400),
                started_at_ms: 1,
                finished_at_ms: None,
                duration_ms: 1_000,
                outcome: keyway_peer::copies::CopyOutcome::Running,
                error: None,
            },
            None,
        );
        let r = report(&healed, &all, std::slice::from_ref(&copy));
        assert!(!r.recovered());
        assert_eq!(r.copies_in_flight.len(), 1);
        assert_eq!(r.copies_in_flight[0].progress.as_ref(), Some(&copy));
        assert_eq!(r.copies_running, std::slice::from_ref(&copy));
        assert_eq!(r.copy_totals.bytes_remaining, 300);
        assert_eq!(r.copy_totals.eta_ms, Some(3_000));
    }
}
