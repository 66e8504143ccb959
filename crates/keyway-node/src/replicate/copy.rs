//! Catch-up of one partition at a replica that is not in sync.
//!
//! Process overview (primary P, replica R, partition p):
//! 1. **Clean**: drop p's range at R (`Replicate` with `drop_limit`,
//!    authorised by R's replica check, not by a migration) until empty, so
//!    nothing an earlier copy or an older primary left survives (version
//!    markers included: another primary's seqs are not comparable with ours).
//! 2. **Ship from now** ([`super::rules::Rules::copy_shipping`]): P's stream
//!    carries p's records to R from its next batch on.
//! 3. **Copy**: page through p's range in chunks, each read from a fresh
//!    engine snapshot *after* step 2 (so its seq is ≥ the end of every
//!    batch the stream filtered without p), applied at R as foreign `Put`s
//!    versioned with the chunk's seq (migration's `read_chunk` and throttle);
//!    versions make chunks and stream records commute. One fsync at the end.
//! 4. **Join** ([`super::rules::Rules::copy_done`]): s0 = the last seq now,
//!    read under the rules' lock; every later reply waits for R; once R's
//!    stream acked ≥ s0 the rules CAS R into the in-sync set.
//!
//! The copy's cost (bytes shipped, bytes the replica reported written,
//! duration) is accounted as a `replica` copy in `crate::copies`, from the
//! clean to the closing fsync.
//!
//! Every call shares the stream's call numbering, so R never applies an
//! older call after a newer one (a stale stream batch cannot land after the
//! clean). A call refused or failing is retried with back-off for at most
//! the lag timeout; then the copy fails and the rules retry it later.

use super::Replication;
use super::stream::{Listed, Stream, listed_to_pb};
use crate::copies::{CopyGuard, CopyKind};
use crate::migrate::push::{chunk_bytes, rate_wait, read_chunk};
use crate::peer::{PeerError, pb};
use bytes::Bytes;
use keyway_map::{NodeId, PartitionId};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Entries per clean call.
const CLEAN_CHUNK_ENTRIES: u32 = 10_000;

/// Runs the catch-up and reports the outcome to the rules.
pub async fn run(
    repl: Arc<Replication>,
    stream: Arc<Stream>,
    partition: PartitionId,
    replica: NodeId,
) {
    let row = repl.routing.map().partitions.get(&partition).cloned();
    let cost = match &row {
        Some(row) => repl.copies.start(CopyKind::Replica, row, replica, 0),
        None => repl
            .copies
            .start_with(CopyKind::Replica, partition, replica, 0, None),
    };
    match copy(&repl, &stream, partition, replica, &cost).await {
        Ok(()) => {
            let r = cost.done();
            tracing::info!(%partition, %replica, bytes_sent = r.bytes_sent,
                bytes_written = r.bytes_written, duration_ms = r.duration_ms,
                "replica copied; joining");
        }
        Err(e) => {
            cost.failed(e.clone());
            tracing::warn!(%partition, %replica, %e, "replica catch-up failed; retrying later");
            repl.lock()
                .rules
                .copy_failed(partition, replica, Instant::now());
        }
    }
}

/// The partition as the rules have it now, if `replica` is still copying it.
fn entry(repl: &Replication, partition: PartitionId, replica: NodeId) -> Option<Listed> {
    let inner = repl.lock();
    let p = inner.rules.parts().get(&partition)?;
    match p.replicas.get(&replica)? {
        super::rules::ReplicaState::Copying { .. } => {
            Some((partition, p.epoch, p.range.clone(), false))
        }
        _ => None,
    }
}

async fn copy(
    repl: &Arc<Replication>,
    stream: &Arc<Stream>,
    partition: PartitionId,
    replica: NodeId,
    cost: &CopyGuard,
) -> Result<(), String> {
    let gone = || format!("partition {partition} is no longer copied to {replica}");
    // 1. Clean.
    loop {
        let listed = entry(repl, partition, replica).ok_or_else(gone)?;
        let resp = call(
            repl,
            stream,
            &listed,
            Vec::new(),
            false,
            CLEAN_CHUNK_ENTRIES,
        )
        .await?;
        if resp.deleted == 0 {
            break;
        }
    }
    // 2. Ship from now.
    if !repl.lock().rules.copy_shipping(partition, replica) {
        return Err(gone());
    }
    // 3. Copy.
    let throttle = repl.cfg.throttle;
    let max_bytes = chunk_bytes(&throttle);
    let started = Instant::now();
    let mut copied = 0u64;
    let mut after: Option<Bytes> = None;
    loop {
        let listed = entry(repl, partition, replica).ok_or_else(gone)?;
        let engine = repl.engine.clone();
        let range = listed.2.clone();
        let cursor = after.clone();
        let chunk = super::blocking(move || read_chunk(&*engine, &range, cursor, max_bytes))
            .await
            .map_err(|e| format!("reading the copy: {e}"))?;
        if !chunk.records.is_empty() {
            let records: Vec<Bytes> = chunk
                .records
                .iter()
                .map(|r| Bytes::from(r.encode()))
                .collect();
            repl.metrics.stream_records.inc_by(records.len() as u64);
            repl.metrics.stream_bytes.inc_by(chunk.bytes);
            let resp = call(repl, stream, &listed, records, false, 0).await?;
            cost.shipped(chunk.bytes, resp.bytes_written);
        }
        copied += chunk.bytes;
        match chunk.next {
            Some(next) => after = Some(next),
            None => break,
        }
        if let Some(wait) = rate_wait(&throttle, copied, started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    let listed = entry(repl, partition, replica).ok_or_else(gone)?;
    call(repl, stream, &listed, Vec::new(), true, 0).await?;
    // 4. Join, at the last seq read under the rules' lock.
    let engine = repl.engine.clone();
    repl.with_rules(|r| r.copy_done(partition, replica, engine.last_seq()));
    Ok(())
}

/// One catch-up call, retried (each try a new call number) for at most the
/// lag timeout while the replica is unavailable or refuses it as stale
/// ordering or map-behind.
async fn call(
    repl: &Replication,
    stream: &Stream,
    listed: &Listed,
    records: Vec<Bytes>,
    sync: bool,
    drop_limit: u32,
) -> Result<pb::ReplicateResponse, String> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(10);
    loop {
        let (incarnation, call) = stream.next_call();
        let req = pb::ReplicateRequest {
            sender: repl.me.0,
            incarnation,
            call,
            prev_token: 0,
            partitions: listed_to_pb(std::slice::from_ref(listed)),
            records: records.clone(),
            sync,
            read_lease_ms: 0,
            drop_partition: if drop_limit > 0 { listed.0.0 } else { 0 },
            drop_limit,
            stream: false,
            after_call: 0,
        };
        match stream.client.replicate(req).await {
            Ok(resp) => return Ok(resp),
            Err(e @ (PeerError::Unavailable(_) | PeerError::Refused { .. }))
                if started.elapsed() < repl.cfg.lag_timeout =>
            {
                tracing::debug!(replica = %stream.replica, %e, "catch-up call failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            Err(e) => return Err(format!("replica {}: {e}", stream.replica)),
        }
    }
}
