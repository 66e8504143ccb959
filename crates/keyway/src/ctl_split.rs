//! `keyway ctl split | merge | decisions`: splits and merges by hand, and
//! what the leader manager decided (and decided not to do) on its own.
//!
//! `split` and `merge` are one metadata compare-and-set each, made here
//! against the store: no data moves and the owner keeps serving (a client
//! naming the old partition at its old epoch is redirected to the new one).
//! `decisions` reads the leader manager's admin port (`/decisions`): the
//! store does not know where that is, so `--manager-admin` says (default
//! `keyway dev`'s manager port).

use crate::ctl::print_json;
use anyhow::Context;
use bytes::Bytes;
use keyway_manager::{SplitAt, merge_partitions, split_partition};
use keyway_map::{PartitionId, PartitionMap, PartitionRecord, Routing, from_hex};
use keyway_meta::MetaStore;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(clap::Subcommand)]
pub enum SplitCommand {
    /// Split a partition in two (metadata only; the owner keeps both halves).
    /// Without --at/--at-slot: a hash partition at its median slot.
    Split(SplitArgs),
    /// Merge two neighbouring partitions of one node into one (metadata only).
    Merge(MergeArgs),
    /// The leader manager's recent decisions: splits, merges, moves, and
    /// why it left things alone (e.g. `single_key`).
    Decisions(DecisionsArgs),
}

#[derive(clap::Args)]
pub struct SplitArgs {
    /// The partition id (`keyway ctl map` lists them).
    partition: u64,
    /// Where the right half starts: a key of a range keyspace, or in a hash
    /// keyspace the key's slot (hash tags honoured). `0x`-prefixed: hex.
    #[arg(long, conflicts_with = "at_slot")]
    at: Option<String>,
    /// Hash keyspaces: the slot where the right half starts.
    #[arg(long)]
    at_slot: Option<u16>,
}

#[derive(clap::Args)]
pub struct MergeArgs {
    /// One partition id.
    left: u64,
    /// Its neighbour (either order; both must be on the same node).
    right: u64,
}

#[derive(clap::Args)]
pub struct DecisionsArgs {
    /// The leader manager's admin address (`keyway manager --admin-listen`).
    #[arg(long, default_value = "127.0.0.1:8000")]
    manager_admin: String,
    /// Only this duty's decisions (split, merge, rebalance, ...).
    #[arg(long)]
    duty: Option<String>,
    /// Show at most this many, newest last.
    #[arg(long, default_value_t = 50)]
    limit: usize,
}

pub async fn run(meta: &dyn MetaStore, cmd: SplitCommand, json: bool) -> anyhow::Result<()> {
    match cmd {
        SplitCommand::Split(args) => split_cmd(meta, args, json).await,
        SplitCommand::Merge(args) => merge_cmd(meta, args, json).await,
        SplitCommand::Decisions(args) => decisions_cmd(args, json).await,
    }
}

/// `0x`-prefixed hex, or the text's bytes.
fn parse_key(text: &str) -> anyhow::Result<Bytes> {
    match text.strip_prefix("0x") {
        Some(hex) => from_hex(hex).ok_or_else(|| {
            crate::cli_error::UserError(format!("bad hex key {text:?} (0x and hex digits)")).into()
        }),
        None => Ok(Bytes::copy_from_slice(text.as_bytes())),
    }
}

async fn split_cmd(meta: &dyn MetaStore, args: SplitArgs, json: bool) -> anyhow::Result<()> {
    let at = match (&args.at, args.at_slot) {
        (Some(key), _) => SplitAt::Key(parse_key(key)?),
        (None, Some(slot)) => SplitAt::Slot(slot),
        (None, None) => SplitAt::Auto,
    };
    let before = meta.get_map().await?;
    crate::cli_error::require_partition(&before, PartitionId(args.partition))?;
    let (left, right) = split_partition(meta, PartitionId(args.partition), at).await?;
    let map = meta.get_map().await?;
    print_records(&map, &[left, right], json)
}

async fn merge_cmd(meta: &dyn MetaStore, args: MergeArgs, json: bool) -> anyhow::Result<()> {
    let before = meta.get_map().await?;
    for id in [args.left, args.right] {
        crate::cli_error::require_partition(&before, PartitionId(id))?;
    }
    let merged = merge_partitions(meta, PartitionId(args.left), PartitionId(args.right)).await?;
    let map = meta.get_map().await?;
    print_records(&map, &[merged], json)
}

fn print_records(
    map: &PartitionMap,
    records: &[PartitionRecord],
    json: bool,
) -> anyhow::Result<()> {
    if json {
        return print_json(&records);
    }
    println!(
        "{:>6}  {:>8}  {:<28}  {:<40}  {:>6}",
        "ID", "KEYSPACE", "RANGE", "OWNER", "EPOCH"
    );
    for p in records {
        let ks = map.keyspaces.get(&p.keyspace);
        println!(
            "{:>6}  {:>8}  {:<28}  {:<40}  {:>6}",
            p.id,
            ks.map_or_else(|| p.keyspace.to_string(), |k| k.name.clone()),
            range_text(ks.map(|k| k.routing), p),
            p.owner,
            p.epoch
        );
    }
    Ok(())
}

fn range_text(routing: Option<Routing>, p: &PartitionRecord) -> String {
    if routing == Some(Routing::Hash) {
        let (first, last) = p.slot_span();
        return format!("slots {first}-{last}");
    }
    let text = |b: &[u8]| keyway_manager::stats::key_text(b);
    let end = p.end.as_deref().map_or("end".to_string(), text);
    format!("[{}, {end})", text(&p.start))
}

/// One decision as `/decisions` serves it.
#[derive(serde::Deserialize, serde::Serialize)]
struct DecisionRow {
    at_unix_ms: u64,
    duty: String,
    action: String,
    reason: String,
    partition: Option<u64>,
    acted: bool,
    detail: String,
}

async fn decisions_cmd(args: DecisionsArgs, json: bool) -> anyhow::Result<()> {
    let body = http_get(&args.manager_admin, "/decisions")
        .await
        .with_context(|| {
            format!(
                "asking the manager at {} (--manager-admin)",
                args.manager_admin
            )
        })?;
    let mut rows: Vec<DecisionRow> =
        serde_json::from_str(&body).context("the manager's /decisions is not a decision list")?;
    if let Some(duty) = &args.duty {
        rows.retain(|r| &r.duty == duty);
    }
    let skip = rows.len().saturating_sub(args.limit);
    let rows = &rows[skip..];
    if json {
        return print_json(&rows);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    println!(
        "{:>8}  {:<9}  {:<9}  {:<14}  {:>9}  {:<5}  DETAIL",
        "AGO", "DUTY", "ACTION", "REASON", "PARTITION", "ACTED"
    );
    for r in rows {
        let ago = format!("{:.1}s", now.saturating_sub(r.at_unix_ms) as f64 / 1000.0);
        let partition = r.partition.map_or("-".to_string(), |p| p.to_string());
        println!(
            "{:>8}  {:<9}  {:<9}  {:<14}  {:>9}  {:<5}  {}",
            ago, r.duty, r.action, r.reason, partition, r.acted, r.detail
        );
    }
    Ok(())
}

/// A plain HTTP/1.0 GET (the reply ends with the connection): the body of a
/// 200 answer.
pub(crate) async fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let limit = Duration::from_secs(10);
    let mut conn = tokio::time::timeout(limit, tokio::net::TcpStream::connect(addr))
        .await
        .context("connect timed out")??;
    // The process's cluster secret (`--cluster-secret-file`), if any.
    let auth = keyway_auth::authorization(keyway_auth::process_secret().as_ref())
        .map_or(String::new(), |v| format!("Authorization: {v}\r\n"));
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n{auth}\r\n");
    conn.write_all(request.as_bytes()).await?;
    let mut reply = Vec::new();
    tokio::time::timeout(limit, conn.read_to_end(&mut reply))
        .await
        .context("reply timed out")??;
    let reply = String::from_utf8(reply).context("the reply is not UTF-8")?;
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .context("malformed HTTP reply")?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) == Some("401") {
        user_bail!(
            "{}",
            keyway_auth::refused_message("admin port", addr, body.trim())
        );
    }
    anyhow::ensure!(
        status.split_whitespace().nth(1) == Some("200"),
        "{path}: {status}"
    );
    Ok(body.to_string())
}
