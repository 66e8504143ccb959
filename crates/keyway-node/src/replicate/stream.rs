//! [`Stream`]: the primary's one stream to one replica node.
//!
//! Process overview:
//! 1. Read this node's change log after the acked seq, never past the
//!    durable seq (a bounded batch).
//! 2. Only then take the rules' list of partitions shipped to the replica
//!    (so a partition marked shipped after the read is covered by its
//!    catch-up's snapshot, read after the marking at a seq ≥ the batch's
//!    end), and keep the records whose key lies in one of them.
//! 3. Send them in one `Replicate` call (with the partitions, their epochs,
//!    the read-lease vouches and the last answer's token), fsynced at the
//!    replica when acknowledgements here wait for an fsync (`always`,
//!    `group`; with `periodic`/`none` handed to the replica's OS, as they
//!    are here); an empty call every `replica_heartbeat_ms` renews the leases.
//! 4. On the answer, the acked seq moves to the batch's end (the log hold
//!    follows), and the rules hear of it (`stream_batch_acked`).
//!
//! A partition whose old primary a switchover kept in sync (an *era*, see
//! `rules.rs`) is shipped only above the era's floor, only by a batch that
//! starts within what the replica holds (`covered`: the read starts there
//! when it is below the acked seq, so the replica's copy stays a prefix),
//! and with every record's seq stamped with the era's epoch.
//!
//! Failures are retried with a back-off; the rules' lag timeout decides
//! what a replica that does not answer costs. A stream whose log hold was
//! given up for retention (or that finds its records truncated) is *lost*:
//! it stops acknowledging, the rules CAS its in-sync partitions out, and
//! the driver starts a new stream once nothing waits on it.

use super::Replication;
use super::rules::Era;
use crate::peer::{PeerClient, PeerError, PeerOptions, pb};
use bytes::Bytes;
use keyway_map::{Epoch, NodeId, PartitionId};
use keyway_storage::{ChangeRecord, KeyRange, Seq, StorageError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::Notify;

/// Change records examined per batch at most.
const BATCH_RECORDS: usize = 5_000;
/// Encoded bytes per call at most (a larger single record travels alone).
const BATCH_BYTES: usize = 4 * 1024 * 1024;
/// A single batch bigger than this (encoded) is shipped in parts: the one
/// case where a replica may briefly hold part of a batch (a RESTORE, COPY or
/// *STORE of a collection of hundreds of MiB), because one call must stay
/// under the peer RPC's message limit ([`crate::peer::MAX_MESSAGE_BYTES`]).
const MAX_WHOLE_BATCH_BYTES: usize = crate::peer::MAX_MESSAGE_BYTES / 4;
/// How long a stream waits for someone else's fsync to cover records past
/// the durable seq before it fsyncs them itself.
const DURABLE_WAIT: Duration = Duration::from_millis(10);
/// Longest pause between two retries of a failed call.
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// One partition as a call lists it.
pub(crate) type Listed = (PartitionId, Epoch, KeyRange, bool);

/// The stream to one replica node (see the module docs).
pub struct Stream {
    pub replica: NodeId,
    pub client: PeerClient,
    /// Identifies this stream at the replica (see `replica.rs`).
    incarnation: u64,
    calls: AtomicU64,
    acked: AtomicU64,
    stopped: AtomicBool,
    lost: AtomicBool,
    wake: Notify,
    hold: Mutex<Option<crate::log_gc::HoldGuard>>,
}

impl Stream {
    /// Starts the stream's task from the durable seq now.
    pub fn start(
        repl: &Arc<Replication>,
        replica: NodeId,
        addr: &str,
    ) -> Result<Arc<Stream>, String> {
        let client = PeerClient::connect_with(
            addr,
            PeerOptions {
                rpc_timeout: repl.cfg.lag_timeout,
                ..PeerOptions::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let start = repl.durable.get(&*repl.engine);
        let incarnation = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        let stream = Arc::new(Stream {
            replica,
            client,
            incarnation,
            calls: AtomicU64::new(0),
            acked: AtomicU64::new(start),
            stopped: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            wake: Notify::new(),
            hold: Mutex::new(None),
        });
        let weak = Arc::downgrade(&stream);
        let guard = repl
            .holds
            .hold(
                format!("replica {replica}"),
                start + 1,
                Box::new(move |why| {
                    if let Some(s) = weak.upgrade() {
                        tracing::warn!(replica = %s.replica, %why, "replication stream lost its log hold");
                        s.lost.store(true, Ordering::Release);
                        s.wake.notify_one();
                    }
                }),
            )
            .map_err(|e| e.to_string())?;
        *stream.hold.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
        repl.lock().rules.stream_restarted(replica, start);
        tokio::spawn(stream.clone().run(repl.clone()));
        tracing::info!(%replica, addr, from_seq = start, "replication stream started");
        Ok(stream)
    }

    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake.notify_one();
        self.hold.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    pub fn acked(&self) -> Seq {
        self.acked.load(Ordering::Acquire)
    }

    /// The identity of a new call of this stream (catch-ups share it, so the
    /// replica orders their calls with the stream's).
    pub fn next_call(&self) -> (u64, u64) {
        (
            self.incarnation,
            self.calls.fetch_add(1, Ordering::AcqRel) + 1,
        )
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    async fn run(self: Arc<Self>, repl: Arc<Replication>) {
        let heartbeat = repl.cfg.heartbeat;
        let mut token = 0u64;
        let mut last_call = Instant::now() - heartbeat;
        let mut pause = Duration::from_millis(5);
        let mut reported_lost = false;
        while !self.stopped() {
            if self.is_lost() {
                if !reported_lost {
                    reported_lost = true;
                    let replica = self.replica;
                    repl.with_rules(|r| r.stream_lost(replica, Instant::now()));
                }
                let _ = tokio::time::timeout(heartbeat, self.wake.notified()).await;
                continue;
            }
            let durable_changed = repl.durable.changed();
            tokio::pin!(durable_changed);
            durable_changed.as_mut().enable();
            let rewind = repl.lock().rules.rewind_to(self.replica);
            let acked = rewind.map_or(self.acked(), |r| r.min(self.acked()));
            let durable = repl.durable.get(&*repl.engine);
            let batch = if acked < durable {
                // From the engine's in-memory tail when it has the records
                // (a stream that keeps up), else read from the log on a
                // blocking thread.
                let recent = repl.engine.recent_changes(acked, BATCH_RECORDS);
                let read = match recent {
                    Some(answer) => answer,
                    None => {
                        let engine = repl.engine.clone();
                        super::blocking(move || engine.changes_since(acked, BATCH_RECORDS)).await
                    }
                };
                match read {
                    Ok(records) => Some(records),
                    Err(StorageError::LogTruncated { .. }) => {
                        self.lost.store(true, Ordering::Release);
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(replica = %self.replica, %e, "reading the change log failed");
                        tokio::time::sleep(MAX_RETRY_PAUSE).await;
                        continue;
                    }
                }
            } else {
                None
            };
            let (listed, eras) = {
                let inner = repl.lock();
                (
                    inner.rules.shipped_to(self.replica),
                    inner.rules.eras_to(self.replica),
                )
            };
            let (records, examined) = match batch {
                Some(all) => match filter(all, durable, &listed, &eras, acked) {
                    Some(kept) => kept,
                    None => {
                        tracing::warn!(replica = %self.replica, "a switched-over partition's seq cannot be stamped any more");
                        self.lost.store(true, Ordering::Release);
                        continue;
                    }
                },
                None => (Vec::new(), acked),
            };
            let era_ids: Vec<(PartitionId, Epoch)> =
                eras.iter().map(|(p, e)| (*p, e.epoch)).collect();
            if records.is_empty() && examined == acked && last_call.elapsed() < heartbeat {
                let wait = heartbeat.saturating_sub(last_call.elapsed());
                // Records past the durable seq that no storage thread will
                // fsync soon (foreign records applied here, say): fsync them.
                let undurable = repl.engine.last_seq() > durable;
                let wait = if undurable {
                    wait.min(DURABLE_WAIT)
                } else {
                    wait
                };
                let changed = tokio::select! {
                    _ = &mut durable_changed => true,
                    _ = self.wake.notified() => true,
                    _ = tokio::time::sleep(wait) => false,
                };
                if !changed && undurable {
                    let (durable, engine) = (repl.durable.clone(), repl.engine.clone());
                    if let Err(e) = super::blocking(move || durable.sync_now(&*engine)).await {
                        tracing::warn!(%e, "replication stream: fsync failed");
                    }
                }
                continue;
            }
            let bytes: usize = records.iter().map(|r| r.len()).sum();
            let count = records.len();
            let (incarnation, call) = self.next_call();
            let req = pb::ReplicateRequest {
                sender: repl.me.0,
                incarnation,
                call,
                prev_token: token,
                partitions: listed_to_pb(&listed),
                // As durable at the replica as an acknowledgement here
                // promises (see `ReplicateRequest.sync`).
                sync: !records.is_empty() && repl.durable.acks_wait_for_fsync(),
                records,
                read_lease_ms: repl.cfg.read_lease.as_millis() as u64,
                drop_partition: 0,
                drop_limit: 0,
                stream: true,
            };
            last_call = Instant::now();
            match self.client.replicate(req).await {
                Ok(resp) => {
                    let reply_at = Instant::now();
                    if count > 0 {
                        repl.metrics.stream_call_seconds.since(last_call);
                    }
                    pause = Duration::from_millis(5);
                    token = resp.token;
                    if self.stopped() || self.is_lost() {
                        continue;
                    }
                    self.acked.fetch_max(examined, Ordering::AcqRel);
                    if let Some(h) = &*self.hold.lock().unwrap_or_else(|e| e.into_inner()) {
                        h.advance(examined + 1);
                    }
                    if count > 0 {
                        repl.metrics.stream_calls.inc();
                    }
                    repl.metrics.stream_records.inc_by(count as u64);
                    repl.metrics.stream_bytes.inc_by(bytes as u64);
                    let replica = self.replica;
                    repl.with_rules(|r| {
                        r.stream_batch_acked(replica, acked, examined, &era_ids, reply_at)
                    });
                }
                Err(e) => {
                    token = 0;
                    match &e {
                        PeerError::Unavailable(_) => {
                            tracing::debug!(replica = %self.replica, %e, "replica unavailable; retrying")
                        }
                        _ => {
                            tracing::info!(replica = %self.replica, %e, "replicate call refused; retrying")
                        }
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_RETRY_PAUSE);
                }
            }
        }
        tracing::info!(replica = %self.replica, "replication stream stopped");
    }
}

/// The encoded records of `all` (read after `from`, up to `durable`) whose
/// key is in a listed partition, about [`BATCH_BYTES`] of them, and the
/// last seq examined. Only whole batches are shipped (the cut is always at
/// a batch end, past `BATCH_BYTES` if one batch is bigger), so a replica
/// applies, serves and may be promoted with whole batches only. A
/// partition with an era (see the module docs) ships only records above
/// its floor, only when `from` is within its `covered`, stamped; `None`: a
/// seq that cannot be stamped.
fn filter(
    all: Vec<ChangeRecord>,
    durable: Seq,
    listed: &[Listed],
    eras: &[(PartitionId, Era)],
    from: Seq,
) -> Option<(Vec<Bytes>, Seq)> {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    // How much of `out`, and up to which seq, ends at a batch end.
    let mut whole = (0usize, from);
    let mut whole_bytes = 0usize;
    for r in all {
        if r.seq > durable || (bytes >= BATCH_BYTES && whole.1 + 1 == r.seq) {
            break;
        }
        let ends = !r.batch_continues;
        let key = r.mutation.key();
        if let Some((pid, _, _, _)) = listed.iter().find(|(_, _, range, _)| range.contains(key)) {
            let enc = match eras.iter().find(|(p, _)| p == pid) {
                None => Some(Bytes::from(r.encode())),
                Some((_, era)) if r.seq <= era.floor || from > era.covered => None,
                Some((_, era)) => Some(Bytes::from(
                    ChangeRecord {
                        seq: era.stamp(r.seq)?,
                        mutation: r.mutation,
                        batch_continues: r.batch_continues,
                    }
                    .encode(),
                )),
            };
            if let Some(enc) = enc {
                bytes += enc.len();
                out.push(enc);
            }
        }
        if ends || bytes - whole_bytes > MAX_WHOLE_BATCH_BYTES {
            whole = (out.len(), r.seq);
            whole_bytes = bytes;
        }
    }
    // A batch cut off by `durable` (or by the end of what was read) waits
    // for the next call.
    debug_assert!(
        out.len() == whole.0,
        "the change log or the durable seq split a batch"
    );
    out.truncate(whole.0);
    Some((out, whole.1))
}

pub(crate) fn listed_to_pb(listed: &[Listed]) -> Vec<pb::ReplicatedPartition> {
    listed
        .iter()
        .map(|(id, epoch, range, vouch)| pb::ReplicatedPartition {
            id: id.0,
            epoch: epoch.0,
            range: Some(pb::KeyRange {
                start: range.start.clone(),
                end: range.end.clone(),
            }),
            vouch: *vouch,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::rules::{ERA_SEQ_BITS, ERA_SEQ_LIMIT};
    use super::*;

    fn del(seq: Seq, key: &'static [u8]) -> ChangeRecord {
        ChangeRecord {
            batch_continues: false,
            seq,
            mutation: keyway_storage::Mutation::Delete {
                key: Bytes::from_static(key),
            },
        }
    }

    fn seqs(out: &[Bytes]) -> Vec<Seq> {
        out.iter()
            .map(|b| ChangeRecord::decode(b).unwrap().seq)
            .collect()
    }

    #[test]
    fn an_era_partition_ships_stamped_above_its_floor_only_from_within_covered() {
        let a = (
            PartitionId(1),
            Epoch(3),
            KeyRange::prefix(Bytes::from_static(b"a/")),
            true,
        );
        let b = (
            PartitionId(2),
            Epoch(6),
            KeyRange::prefix(Bytes::from_static(b"b/")),
            true,
        );
        let listed = vec![a, b];
        let era = Era {
            epoch: Epoch(6),
            floor: 11,
            covered: 12,
        };
        let eras = vec![(PartitionId(2), era)];
        let all = || {
            vec![
                del(11, b"b/1"),
                del(12, b"a/1"),
                del(13, b"b/2"),
                del(14, b"c/1"),
                del(15, b"b/3"),
            ]
        };
        // From 10: b's 11 is at the floor (not shipped), 13 and 15 stamped; not past durable.
        let (out, examined) = filter(all(), 14, &listed, &eras, 10).unwrap();
        assert_eq!(seqs(&out), vec![12, (6 << ERA_SEQ_BITS) | 13]);
        assert_eq!(examined, 14);
        // A batch starting above covered ships none of b (no gap at the replica).
        let (out, examined) = filter(all(), 20, &listed, &eras, 13).unwrap();
        assert_eq!(seqs(&out), vec![12]);
        assert_eq!(examined, 15);
        // A seq that cannot be stamped: the stream is lost.
        let big = vec![del(ERA_SEQ_LIMIT, b"b/9")];
        assert!(filter(big, ERA_SEQ_LIMIT, &listed, &eras, 10).is_none());
    }

    #[test]
    fn a_call_ships_whole_batches_only_even_past_its_byte_budget() {
        let listed = vec![(
            PartitionId(1),
            Epoch(1),
            KeyRange::prefix(Bytes::from_static(b"a/")),
            true,
        )];
        let big = |seq: Seq, continues: bool| ChangeRecord {
            batch_continues: continues,
            seq,
            mutation: keyway_storage::Mutation::Put {
                key: Bytes::from_static(b"a/k"),
                kind: keyway_storage::ValueKind::String,
                expire_at_ms: None,
                data: Bytes::from(vec![b'x'; BATCH_BYTES / 2]),
            },
        };
        // Batches [1], [2, 3], [4]: the budget runs out inside [2, 3], which
        // still goes whole; 4 waits for the next call.
        let all = vec![big(1, false), big(2, true), big(3, false), big(4, false)];
        let (out, examined) = filter(all, 10, &listed, &[], 0).unwrap();
        assert_eq!(seqs(&out), vec![1, 2, 3]);
        assert_eq!(examined, 3);
        let flags: Vec<bool> = out
            .iter()
            .map(|b| ChangeRecord::decode(b).unwrap().batch_continues)
            .collect();
        assert_eq!(flags, vec![false, true, false], "the flag is shipped");
        // A batch whose records are partly in other partitions still ends
        // where its last record is examined.
        let mixed = vec![
            ChangeRecord {
                batch_continues: true,
                ..del(5, b"a/1")
            },
            del(6, b"z/1"),
            del(7, b"a/2"),
        ];
        let (out, examined) = filter(mixed, 10, &listed, &[], 4).unwrap();
        assert_eq!((seqs(&out), examined), (vec![5, 7], 7));
    }
}
