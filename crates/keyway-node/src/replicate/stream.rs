//! [`Stream`]: the primary's one stream to one replica node.
//!
//! Process overview:
//! 1. Read this node's change log after the end of the newest call in
//!    flight (none: after the acked seq), never past the durable seq (a
//!    bounded batch).
//! 2. Only then take the rules' list of partitions shipped to the replica
//!    (so a partition marked shipped after the read is covered by its
//!    catch-up's snapshot, read after the marking at a seq ≥ the batch's
//!    end), and keep the records whose key lies in one of them.
//! 3. Send them as one call (with the partitions, their epochs,
//!    the read-lease vouches and the last answer's token), fsynced at the
//!    replica when acknowledgements here wait for an fsync (`always`,
//!    `group`; with `periodic`/`none` handed to the replica's OS, as they
//!    are here); an empty call every `replica_heartbeat_ms` renews the leases.
//!    Up to `replica_stream_window_calls` calls are in flight: each names
//!    the one it continues (`after_call`), and the replica applies it only
//!    after that one (`replica.rs`), so its copy stays a prefix of the log.
//!    A write waits for its replicas, so with one call at a time a write
//!    waits for the round trip of the call before its own. The calls ride
//!    one long-lived `ReplicateStream` (`keyway_peer::replicate_stream`,
//!    a message each way per call instead of a new HTTP/2 stream), opened
//!    again after any failure; a call unanswered after the lag timeout is
//!    a failure. Catch-ups send unary `Replicate` calls, numbered with the
//!    stream's, and the replica orders both alike.
//! 4. Answers are taken in call order. On each, the acked seq moves to the
//!    batch's end (the log hold follows), and the rules hear of it
//!    (`stream_batch_acked`); the token it carries is echoed by the next
//!    call sent. A failed call fails the calls after it (they continue
//!    it): all are given up and the stream reads again from the acked seq.
//!
//! A partition whose old primary a switchover kept in sync (an *era*, see
//! `rules.rs`) is shipped only above the era's floor, only by a batch that
//! starts within what the replica holds (`covered`: the read starts there
//! when it is below the acked seq, so the replica's copy stays a prefix),
//! and with every record's seq stamped with the era's epoch. With calls in
//! flight, "what the replica holds" is the era's `covered` as their
//! acknowledgements will move it ([`project_eras`]); a rewind below what
//! is in flight waits until those calls are answered.
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
use keyway_peer::replicate_stream::ReplicateStream;
use keyway_storage::{ChangeRecord, KeyRange, Seq, StorageError};
use std::collections::VecDeque;
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
        // Records on before the start is read (`log_gc`: a node whose log
        // nobody read stops writing them).
        repl.holds.arm();
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
        let held = repl
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
            );
        match held {
            Ok(guard) => {
                *stream.hold.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
                repl.lock().rules.stream_restarted(replica, start);
            }
            Err(e) => {
                // Records after the durable seq are gone (switched on just
                // now, after writes not yet durable): the replica cannot be
                // caught up from the log. Lost from the start, as when its
                // records are truncated: the rules take its partitions out
                // of sync and the stream starts over, with records kept.
                tracing::warn!(%replica, %e, "replication stream starts lost");
                // Not "restarted" at `start`: the replica does not hold
                // the records up to it, so nothing may count as acked there.
                stream.lost.store(true, Ordering::Release);
            }
        }
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
        let window = repl.cfg.stream_window_calls.max(1);
        let mut token = 0u64;
        let mut flight = Flight::new(&repl);
        let mut last_call = Instant::now() - heartbeat;
        let mut pause = Duration::from_millis(5);
        let mut reported_lost = false;
        while !self.stopped() {
            if self.is_lost() {
                flight.clear();
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
            let durable = repl.durable.get(&*repl.engine);
            // 1. Send while the window has room and there is news (or a
            //    heartbeat is due and nothing is in flight).
            let room = flight.calls.len() < window;
            if room {
                let batch = match self.next_batch(&repl, &flight.calls, durable).await {
                    Next::Batch(b) => Some(b),
                    Next::Idle => None,
                    Next::Again => continue,
                };
                if let Some(b) = batch {
                    let news = !b.records.is_empty() || b.span.examined > b.span.from;
                    if news || (flight.calls.is_empty() && last_call.elapsed() >= heartbeat) {
                        last_call = Instant::now();
                        flight.send(&self, &repl, b, token);
                        continue;
                    }
                }
            }
            // 2. Wait for the oldest answer, news, or a timer.
            let wait = match flight.calls.is_empty() {
                true => heartbeat.saturating_sub(last_call.elapsed()),
                false => heartbeat,
            };
            // Records past the durable seq that no storage thread will
            // fsync soon (foreign records applied here, say): fsync them.
            // Never under `periodic`/`none`: there the durable seq is the
            // engine's last, and a foreign record applied since `durable`
            // was read is not waiting for an fsync (an fsync here made a
            // periodic replica keep writes a crash must lose: the
            // `replica_crash` periodic test caught it in CI).
            let undurable = repl.durable.acks_wait_for_fsync() && repl.engine.last_seq() > durable;
            let wait = if undurable {
                wait.min(DURABLE_WAIT)
            } else {
                wait
            };
            let has_flight = !flight.calls.is_empty();
            let answer = tokio::select! {
                a = flight.oldest(), if has_flight => Some(a),
                _ = &mut durable_changed, if room => None,
                _ = self.wake.notified() => None,
                _ = tokio::time::sleep(wait) => {
                    if undurable {
                        let (durable, engine) = (repl.durable.clone(), repl.engine.clone());
                        let sync = move || durable.sync_through(&*engine, engine.last_seq());
                        if let Err(e) = super::blocking(sync).await {
                            tracing::warn!(%e, "replication stream: fsync failed");
                        }
                    }
                    None
                }
            };
            let Some(answer) = answer else { continue };
            // 3. Answers are taken in call order.
            let call = flight.pop();
            match answer {
                Ok(resp) => {
                    let reply_at = Instant::now();
                    if call.count > 0 {
                        repl.metrics.stream_call_seconds.since(call.sent_at);
                    }
                    pause = Duration::from_millis(5);
                    token = resp.token;
                    if self.stopped() || self.is_lost() {
                        continue;
                    }
                    let span = &call.span;
                    self.acked.fetch_max(span.examined, Ordering::AcqRel);
                    if let Some(h) = &*self.hold.lock().unwrap_or_else(|e| e.into_inner()) {
                        h.advance(span.examined + 1);
                    }
                    if call.count > 0 {
                        repl.metrics.stream_calls.inc();
                    }
                    repl.metrics.stream_records.inc_by(call.count as u64);
                    repl.metrics.stream_bytes.inc_by(call.bytes as u64);
                    let replica = self.replica;
                    repl.with_rules(|r| {
                        r.stream_batch_acked(
                            replica,
                            span.from,
                            span.examined,
                            &span.era_ids,
                            reply_at,
                        )
                    });
                }
                Err(e) => {
                    // The calls after a failed one continue it: the
                    // replica refuses them (or they fail too). Start
                    // again from what it acknowledged.
                    token = 0;
                    flight.clear();
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
        flight.clear();
        tracing::info!(replica = %self.replica, "replication stream stopped");
    }

    /// The next call's batch: from the end of the newest call in flight,
    /// or (none in flight) from the acked seq or the rules' rewind.
    async fn next_batch(
        &self,
        repl: &Replication,
        flight: &VecDeque<InFlight>,
        durable: Seq,
    ) -> Next {
        let rewind = repl.lock().rules.rewind_to(self.replica);
        let from = match flight.back() {
            // A rewind re-reads below what is in flight: wait for it first.
            Some(_) if rewind.is_some() => return Next::Idle,
            Some(newest) => newest.span.examined,
            None => rewind.map_or(self.acked(), |r| r.min(self.acked())),
        };
        let read = if from < durable {
            // From the engine's in-memory tail when it has the records (a
            // stream that keeps up), else read from the log on a blocking
            // thread.
            let read = match repl.engine.recent_changes(from, BATCH_RECORDS) {
                Some(answer) => answer,
                None => {
                    let engine = repl.engine.clone();
                    super::blocking(move || engine.changes_since(from, BATCH_RECORDS)).await
                }
            };
            match read {
                Ok(records) => Some(records),
                Err(StorageError::LogTruncated { .. }) => {
                    self.lost.store(true, Ordering::Release);
                    return Next::Again;
                }
                Err(e) => {
                    tracing::warn!(replica = %self.replica, %e, "reading the change log failed");
                    tokio::time::sleep(MAX_RETRY_PAUSE).await;
                    return Next::Again;
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
        let eras = project_eras(eras, flight.iter().map(|c| &c.span));
        let (records, examined) = match read {
            Some(all) => match filter(all, durable, &listed, &eras, from) {
                Some(kept) => kept,
                None => {
                    tracing::warn!(replica = %self.replica, "a switched-over partition's seq cannot be stamped any more");
                    self.lost.store(true, Ordering::Release);
                    return Next::Again;
                }
            },
            None => (Vec::new(), from),
        };
        Next::Batch(Batch {
            span: Span {
                from,
                examined,
                era_ids: eras.iter().map(|(p, e)| (*p, e.epoch)).collect(),
            },
            records,
            listed,
        })
    }
}

/// What [`Stream::next_batch`] found.
enum Next {
    Batch(Batch),
    /// Nothing may be read now (a rewind waits for the calls in flight).
    Idle,
    /// Start the loop over (the stream was lost, or a read failed).
    Again,
}

/// One call's content: the records of its span, and the partitions listed.
struct Batch {
    span: Span,
    records: Vec<Bytes>,
    listed: Vec<Listed>,
}

/// What one call covers: the log after `from` up to `examined`, and the
/// eras it was built with.
#[derive(Clone, Debug)]
struct Span {
    from: Seq,
    examined: Seq,
    era_ids: Vec<(PartitionId, Epoch)>,
}

/// One call sent and not answered yet.
struct InFlight {
    call: u64,
    span: Span,
    count: usize,
    bytes: usize,
    sent_at: Instant,
}

/// A stream's calls in flight, oldest first, counted in
/// `keyway_replication_stream_calls_in_flight`, and the `ReplicateStream`
/// that carries them (opened with the first call after a failure: a
/// failure gives up every call in flight and the stream with them).
struct Flight {
    calls: VecDeque<InFlight>,
    gauge: prometheus_client::metrics::gauge::Gauge,
    conn: Option<ReplicateStream>,
    /// How long a call may stay unanswered (`replica_lag_timeout_ms`, as a
    /// unary call's deadline).
    call_timeout: Duration,
}

impl Flight {
    fn new(repl: &Replication) -> Self {
        Flight {
            calls: VecDeque::new(),
            gauge: repl.metrics.stream_calls_in_flight.clone(),
            conn: None,
            call_timeout: repl.cfg.lag_timeout,
        }
    }

    /// Sends `b` as the stream's next call (continuing the newest in flight).
    fn send(&mut self, stream: &Stream, repl: &Replication, b: Batch, token: u64) {
        let count = b.records.len();
        let bytes: usize = b.records.iter().map(|r| r.len()).sum();
        let (incarnation, call) = stream.next_call();
        let after_call = self.calls.back().map_or(0, |c| c.call);
        debug_assert!(
            self.calls
                .back()
                .is_none_or(|c| c.span.examined == b.span.from),
            "a pipelined call must begin where the one it continues ends"
        );
        let req = pb::ReplicateRequest {
            sender: repl.me.0,
            incarnation,
            call,
            prev_token: token,
            partitions: listed_to_pb(&b.listed),
            // As durable at the replica as an acknowledgement here
            // promises (see `ReplicateRequest.sync`).
            sync: count > 0 && repl.durable.acks_wait_for_fsync(),
            records: b.records,
            read_lease_ms: repl.cfg.read_lease.as_millis() as u64,
            drop_partition: 0,
            drop_limit: 0,
            stream: true,
            after_call,
        };
        self.conn
            .get_or_insert_with(|| {
                repl.metrics.stream_opens.inc();
                stream.client.replicate_stream()
            })
            .send(req);
        self.gauge.inc();
        self.calls.push_back(InFlight {
            call,
            span: b.span,
            count,
            bytes,
            sent_at: Instant::now(),
        });
    }

    /// The oldest call's answer (cancel-safe: the call stays in flight), or
    /// a failure once it waited [`Flight::call_timeout`].
    async fn oldest(&mut self) -> Result<pb::ReplicateResponse, PeerError> {
        debug_assert!(
            self.calls.is_empty() || self.conn.is_some(),
            "calls in flight ride a stream"
        );
        let (Some(c), Some(conn)) = (self.calls.front(), self.conn.as_mut()) else {
            return std::future::pending().await;
        };
        let deadline = c.sent_at + self.call_timeout;
        tokio::select! {
            answer = conn.answer() => answer,
            _ = tokio::time::sleep_until(deadline.into()) => Err(PeerError::Unavailable(format!(
                "replicate call {} unanswered after {:?}",
                c.call, self.call_timeout
            ))),
        }
    }

    fn pop(&mut self) -> InFlight {
        self.gauge.dec();
        self.calls
            .pop_front()
            .expect("an answer came from a call in flight")
    }

    fn clear(&mut self) {
        self.gauge.dec_by(self.calls.len() as i64);
        self.calls.clear();
        self.conn = None;
    }
}

/// The rules' eras (`covered` as of the acknowledged calls) moved on by
/// the calls in flight as their acknowledgements will move them
/// (`Rules::stream_batch_acked`: a call that listed the era and began
/// within `covered` extends it to its end), so the next call ships an era
/// partition only where it continues the replica's prefix.
fn project_eras<'a>(
    eras: Vec<(PartitionId, Era)>,
    flight: impl Iterator<Item = &'a Span> + Clone,
) -> Vec<(PartitionId, Era)> {
    eras.into_iter()
        .map(|(pid, mut era)| {
            for c in flight.clone() {
                if c.from <= era.covered && c.era_ids.contains(&(pid, era.epoch)) {
                    era.covered = era.covered.max(c.examined);
                }
            }
            (pid, era)
        })
        .collect()
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
    fn calls_in_flight_move_an_era_as_their_acknowledgements_will() {
        let era = |covered| Era {
            epoch: Epoch(6),
            floor: 11,
            covered,
        };
        let p = PartitionId(2);
        let span = |from, examined, listed: bool| Span {
            from,
            examined,
            era_ids: match listed {
                true => vec![(p, Epoch(6))],
                false => vec![],
            },
        };
        let covered = |eras: Vec<(PartitionId, Era)>| eras[0].1.covered;
        // Two calls continuing each other from covered: the next call
        // continues the replica's prefix at the second's end.
        let flight = [span(20, 30, true), span(30, 40, true)];
        assert_eq!(covered(project_eras(vec![(p, era(20))], flight.iter())), 40);
        // A call built before the era existed (it did not list it) moves
        // nothing, nor does one after it: the stream rewinds later.
        let flight = [span(20, 30, false), span(30, 40, true)];
        assert_eq!(covered(project_eras(vec![(p, era(20))], flight.iter())), 20);
        // A call of another era epoch moves nothing either.
        let other = Span {
            era_ids: vec![(p, Epoch(5))],
            ..span(20, 30, true)
        };
        assert_eq!(
            covered(project_eras(vec![(p, era(20))], [other].iter())),
            20
        );
        // Nothing in flight: the rules' covered.
        assert_eq!(covered(project_eras(vec![(p, era(20))], [].iter())), 20);
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
