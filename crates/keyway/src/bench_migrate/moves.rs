//! The test partitions and their moves: loading a partition with keys whose
//! slots fall into it (pipelined SETs straight to the owner), driving each
//! move through the manager and polling its migration record until it ends,
//! and reading every loaded key back afterwards.

use super::report::{Loaded, MoveResult, Verify};
use super::resp::Conn;
use super::{MigrateArgs, fmt_size, say};
use keyway_cluster::LocalCluster;
use keyway_manager::request_move;
use keyway_map::{NodeId, PartitionId, PartitionMap, key_hash_slot};
use keyway_meta::MetaStore;
use keyway_migration::{MigrationId, MigrationRecord, MigrationState};
use keyway_resp::Frame;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a move's migration record is polled.
const POLL: Duration = Duration::from_millis(5);
/// SETs per pipelined batch while loading.
const LOAD_BATCH: usize = 256;
/// Connections per partition while loading.
const LOAD_CONNS: usize = 4;
/// Slack after the target starts serving during which a client may still be
/// finding it (the redirect and the connection to the new owner).
const CUTOVER_TAIL_US: u64 = 200_000;

// ---------------------------------------------------------------------------
// Loading and verifying

/// FNV-1a, to derive each loaded key's value offset.
fn fnv(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn value_of<'a>(values: &'a [u8], key: &[u8], vsize: usize) -> &'a [u8] {
    let off = (fnv(key) % (values.len() - vsize) as u64) as usize;
    &values[off..off + vsize]
}

/// Loads `size` bytes of `vsize`-byte values into partition `pid`, over
/// [`LOAD_CONNS`] connections to its owner.
pub(super) async fn load_partition(
    map: &PartitionMap,
    pid: PartitionId,
    size: u64,
    values: &Arc<Vec<u8>>,
    vsize: usize,
) -> anyhow::Result<Loaded> {
    let p = &map.partitions[&pid];
    let (first, last) = p.slot_span();
    let addr = map.nodes[&p.owner].resp_addr.clone();
    let count = size.div_ceil(vsize as u64) as usize;
    let mut keys = Vec::with_capacity(count);
    let mut i = 0u64;
    while keys.len() < count {
        let k = format!("kwbench:p{}:{i}", pid.0).into_bytes();
        let slot = key_hash_slot(&k);
        if slot >= first && slot <= last {
            keys.push(k);
        }
        i += 1;
    }
    let started = Instant::now();
    let keys = Arc::new(keys);
    let mut tasks = Vec::new();
    for c in 0..LOAD_CONNS {
        let (keys, values, addr) = (keys.clone(), values.clone(), addr.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::connect(&addr).await?;
            let mine: Vec<&Vec<u8>> = keys.iter().skip(c).step_by(LOAD_CONNS).collect();
            for batch in mine.chunks(LOAD_BATCH) {
                for k in batch {
                    conn.push(&[b"SET".as_slice(), k, value_of(&values, k, vsize)]);
                }
                conn.flush().await?;
                for _ in batch {
                    match conn.read_reply().await? {
                        Frame::Simple(s) if s == "OK" => {}
                        other => anyhow::bail!("loading SET to {addr}: {other:?}"),
                    }
                }
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let keys = Arc::try_unwrap(keys).unwrap_or_else(|k| (*k).clone());
    Ok(Loaded {
        partition: pid.0,
        first_slot: first,
        last_slot: last,
        requested_bytes: size,
        keys: keys.len(),
        value_bytes: (keys.len() * vsize) as u64,
        load_secs: started.elapsed().as_secs_f64(),
        key_list: keys,
    })
}

/// Every loaded key, read back from its partition's owner in `map`.
pub(super) async fn verify(
    map: &PartitionMap,
    loaded: &[Loaded],
    values: &[u8],
    vsize: usize,
) -> anyhow::Result<Verify> {
    let mut verify = Verify::default();
    for l in loaded {
        let owner = &map.nodes[&map.partitions[&PartitionId(l.partition)].owner];
        let (missing, wrong) = verify_keys(&owner.resp_addr, &l.key_list, values, vsize).await?;
        verify.keys += l.keys;
        verify.missing += missing;
        verify.wrong += wrong;
    }
    Ok(verify)
}

/// Pipelined GETs of `keys` at `addr`: (missing, wrong value).
async fn verify_keys(
    addr: &str,
    keys: &[Vec<u8>],
    values: &[u8],
    vsize: usize,
) -> anyhow::Result<(usize, usize)> {
    let mut conn = Conn::connect(addr).await?;
    let (mut missing, mut wrong) = (0, 0);
    for batch in keys.chunks(LOAD_BATCH) {
        for k in batch {
            conn.push(&[b"GET".as_slice(), k]);
        }
        conn.flush().await?;
        for k in batch {
            match conn.read_reply().await? {
                Frame::Bulk(v) if v == value_of(values, k, vsize) => {}
                Frame::Bulk(_) => wrong += 1,
                Frame::Null | Frame::NullArray => missing += 1,
                other => anyhow::bail!(
                    "verifying GET {} at {addr}: {other:?}",
                    String::from_utf8_lossy(k)
                ),
            }
        }
    }
    Ok((missing, wrong))
}

// ---------------------------------------------------------------------------
// The moves

/// Moves each loaded partition `args.moves` times round the nodes of `map`
/// (owner → next node → ...), one move at a time, saying how each went.
/// Returns the moves and the problems seen; the first move that cannot be
/// run or followed to its end stops them all.
pub(super) async fn move_all(
    cluster: &LocalCluster,
    map: &PartitionMap,
    loaded: &[Loaded],
    args: &MigrateArgs,
    names: &HashMap<NodeId, String>,
    base_us: u64,
    base: Instant,
) -> anyhow::Result<(Vec<MoveResult>, Vec<String>)> {
    let json = args.json;
    let meta = cluster.meta().clone();
    let mut moves = Vec::new();
    let mut problems = Vec::new();
    let node_ids: Vec<NodeId> = map.nodes.keys().copied().collect();
    // Round-robin over the sizes (size A, size B, size A, ...), so anything
    // that drifts during the run (store size, machine load) affects every
    // size alike and cannot pass for an effect of the partition's size.
    'sizes: for m in 0..args.moves {
        for l in loaded {
            let now_map = meta.get_map().await?;
            let owner = now_map.partitions[&PartitionId(l.partition)].owner;
            let at = node_ids.iter().position(|n| *n == owner).unwrap_or(0);
            let target = node_ids[(at + 1) % node_ids.len()];
            let backoffs_before = copy_backoffs(cluster);
            let r = run_move(
                &*meta,
                PartitionId(l.partition),
                target,
                l.requested_bytes,
                names,
                Duration::from_secs(args.move_timeout_secs),
                base_us,
                base,
            )
            .await;
            let mut r = match r {
                Ok(r) => r,
                Err(e) => {
                    problems.push(format!("partition {}: move {}: {e:#}", l.partition, m + 1));
                    say(json, format!("move failed: {e:#}"));
                    break 'sizes;
                }
            };
            r.copy_backoffs = copy_backoffs(cluster) - backoffs_before;
            say(
                json,
                format!(
                    "  move {}/{} partition {} {} -> {}: {} in {} ms (flip after {}), {} copied in {} ({} backoffs), pause {} ms",
                    m + 1,
                    args.moves,
                    r.partition,
                    r.from,
                    r.to,
                    r.state,
                    r.to_done_ms,
                    r.to_flip_ms
                        .map(|v| format!("{v} ms"))
                        .unwrap_or_else(|| "-".into()),
                    fmt_size(r.total_bytes),
                    r.copy_ms
                        .map(|v| format!("{v} ms"))
                        .unwrap_or_else(|| "?".into()),
                    r.copy_backoffs,
                    r.pause_ms
                        .map(|v| v.to_string())
                        .unwrap_or_else(|| "-".into()),
                ),
            );
            if r.state != "DONE" {
                problems.push(format!(
                    "migration {} of partition {} ended {} ({})",
                    r.migration,
                    r.partition,
                    r.state,
                    r.abort_reason.clone().unwrap_or_default()
                ));
            }
            moves.push(r);
        }
    }
    Ok((moves, problems))
}

/// Copy backoffs so far, summed over the running nodes.
fn copy_backoffs(cluster: &LocalCluster) -> u64 {
    (0..cluster.len())
        .filter_map(|i| cluster.node(i))
        .map(|n| n.shared().metrics.migration_backoffs.get())
        .sum()
}

/// Requests one move and polls its record until it ends (or `timeout`).
#[allow(clippy::too_many_arguments)]
async fn run_move(
    meta: &dyn MetaStore,
    pid: PartitionId,
    target: NodeId,
    size: u64,
    names: &HashMap<NodeId, String>,
    timeout: Duration,
    base_us: u64,
    base: Instant,
) -> anyhow::Result<MoveResult> {
    let requested_us = base.elapsed().as_micros() as u64;
    let deadline = Instant::now() + timeout;
    let rec = request_move(meta, pid, target).await?;
    let id = rec.id;
    let mut copy_start: Option<u64> = None;
    let mut copy_end: Option<u64> = None;
    let mut cutover_start: Option<u64> = None;
    let rec = loop {
        let rec = load_record(meta, id).await?;
        match rec.state {
            MigrationState::Copying => {
                copy_start.get_or_insert(rec.state_entered_at_ms);
            }
            MigrationState::Aborted | MigrationState::Pending => {}
            later => {
                // The first state seen after COPYING: when it was entered is
                // when the copy ended (exact if it is CATCHUP, else an upper bound).
                if copy_start.is_some() && copy_end.is_none() {
                    copy_end = Some(rec.state_entered_at_ms);
                }
                if later == MigrationState::Cutover {
                    cutover_start.get_or_insert(rec.state_entered_at_ms);
                }
            }
        }
        if rec.state.is_terminal() {
            break rec;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "migration {id} still in {} after {timeout:?}",
            rec.state
        );
        tokio::time::sleep(POLL).await;
    };
    let done_us = base.elapsed().as_micros() as u64;
    let copy_ms = match (copy_start, copy_end) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    let serving_ms = match (rec.fence_started_ms, rec.pause_ms) {
        (Some(f), Some(p)) => Some(f + p),
        _ => None,
    };
    // Manager timestamps are wall-clock ms; samples are µs since `base`.
    let rel = |ms: u64| (ms * 1000).saturating_sub(base_us);
    let cutover_us = match (cutover_start.or(rec.fence_started_ms), serving_ms) {
        (Some(a), Some(b)) => Some((rel(a), rel(b) + CUTOVER_TAIL_US)),
        _ => None,
    };
    Ok(MoveResult {
        migration: id.0,
        partition: pid.0,
        size_bytes: size,
        from: names
            .get(&rec.source())
            .cloned()
            .unwrap_or_else(|| rec.source().to_string()),
        to: names
            .get(&target)
            .cloned()
            .unwrap_or_else(|| target.to_string()),
        state: rec.state.name(),
        abort_reason: rec.abort_reason.as_ref().map(|a| format!("{a:?}")),
        total_bytes: rec.total_bytes,
        copy_ms,
        copy_bytes_per_sec: copy_ms
            .filter(|&ms| ms > 0)
            .map(|ms| rec.total_bytes as f64 * 1000.0 / ms as f64),
        pause_ms: rec.pause_ms,
        cutover_steps: rec.cutover_steps,
        client_stall_ms: None,
        client_writes_in_cutover: 0,
        client_worst_move_ms: None,
        to_flip_ms: serving_ms.map(|s| s.saturating_sub(rec.started_at_ms)),
        to_done_ms: rec.state_entered_at_ms.saturating_sub(rec.started_at_ms),
        copy_backoffs: 0,
        cutover_us,
        copy_us: match (copy_start, copy_end) {
            (Some(a), Some(b)) => Some((rel(a), rel(b))),
            _ => None,
        },
        move_us: (requested_us, done_us),
    })
}

async fn load_record(meta: &dyn MetaStore, id: MigrationId) -> anyhow::Result<MigrationRecord> {
    let stored = meta
        .get_migration(id.0)
        .await?
        .ok_or_else(|| anyhow::anyhow!("migration {id} not found"))?;
    Ok(MigrationRecord::decode(&stored.record)?)
}
