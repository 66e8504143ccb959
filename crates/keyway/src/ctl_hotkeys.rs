//! `keyway ctl hotkeys`: the busiest sampled keys of every partition, asked
//! of the nodes directly (the `PartitionStats` RPC, through the manager's
//! [`RpcStats`]), so it works with or without a manager running.

use keyway_manager::stats::key_text;
use keyway_manager::{ClusterLoad, RpcStats, StatsSource};
use keyway_map::{NodeId, PartitionId};
use keyway_meta::MetaStore;
use serde::Serialize;
use std::time::Duration;

#[derive(clap::Args)]
pub struct HotkeysArgs {
    /// Only this partition.
    #[arg(long)]
    partition: Option<u64>,
    /// Keys shown per partition (the node samples at most its `hot_keys_k`).
    #[arg(long, default_value_t = 5)]
    top: usize,
    /// Deadline of each node's answer, milliseconds.
    #[arg(long, default_value_t = 5_000)]
    timeout_ms: u64,
}

/// One row: a key of a partition.
#[derive(Debug, Serialize)]
pub struct HotKeyRow {
    pub partition: PartitionId,
    pub node: NodeId,
    pub key: String,
    /// Estimated requests per second to the key.
    pub per_sec: f64,
    /// Its share (0..=1) of the partition's sampled requests.
    pub share: f64,
    /// The partition's requests per second.
    pub partition_per_sec: f64,
}

/// The rows of `load`: per partition (busiest partition first) its `top`
/// busiest keys.
pub fn rows(load: &ClusterLoad, partition: Option<u64>, top: usize) -> Vec<HotKeyRow> {
    let mut parts: Vec<_> = load
        .partitions
        .values()
        .filter(|p| partition.is_none_or(|id| p.partition.0 == id))
        .collect();
    parts.sort_by(|a, b| {
        b.requests_per_sec()
            .total_cmp(&a.requests_per_sec())
            .then(a.partition.cmp(&b.partition))
    });
    let mut out = Vec::new();
    for p in parts {
        let rate = p.requests_per_sec();
        for h in p.hot_keys.iter().take(top) {
            out.push(HotKeyRow {
                partition: p.partition,
                node: p.node,
                key: key_text(&h.key),
                per_sec: h.per_sec,
                share: if rate > 0.0 {
                    (h.per_sec / rate).min(1.0)
                } else {
                    0.0
                },
                partition_per_sec: rate,
            });
        }
    }
    out
}

pub async fn hotkeys_cmd(
    meta: &dyn MetaStore,
    args: HotkeysArgs,
    json: bool,
) -> anyhow::Result<()> {
    let map = meta.get_map().await?;
    if let Some(id) = args.partition {
        crate::cli_error::require_partition(&map, PartitionId(id))?;
    }
    let load = RpcStats::new()
        .collect(&map, Duration::from_millis(args.timeout_ms.max(1)))
        .await;
    for node in &load.unreachable {
        eprintln!("node {node} did not answer; its partitions are missing");
    }
    let rows = rows(&load, args.partition, args.top);
    if json {
        return crate::ctl::print_json(&rows);
    }
    println!(
        "{:>9}  {:<40}  {:<32}  {:>10}  {:>6}",
        "PARTITION", "NODE", "KEY", "RATE/S", "SHARE"
    );
    for r in rows {
        let mut key = r.key.clone();
        if key.chars().count() > 32 {
            key = key.chars().take(31).collect::<String>() + "…";
        }
        println!(
            "{:>9}  {:<40}  {:<32}  {:>10.1}  {:>5.1}%",
            r.partition,
            r.node,
            key,
            r.per_sec,
            r.share * 100.0
        );
    }
    Ok(())
}
