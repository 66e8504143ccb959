//! The replica's side of `Replicate`: check, apply, fsync, grant read leases.
//!
//! Process overview (one call from primary S):
//! 1. Calls of one sender are serialised, and applied only in increasing
//!    `(incarnation, call)` order: a call that arrives after a newer one
//!    was applied (a retried batch stuck in a paused process, a stream
//!    batch racing a catch-up's clean) is refused as stale and changes
//!    nothing. A pipelined stream call (`after_call` ≠ 0) continues the
//!    stream call it names: it waits (at most [`PREDECESSOR_WAIT`]) until
//!    that call was applied here, and is refused once that call (or one
//!    before it) was refused, so this node's copy never has a gap. A call
//!    applied after its predecessor is a prefix extension; the sender's
//!    chain restarts (`after_call` 0, from what this node acknowledged)
//!    after any failure, and a restarted chain's calls are newer than
//!    every call of the old one, which is then stale.
//! 2. **Check** ([`check`], pure) under the routing read guard, with each
//!    engine sub-batch in the same critical section (invariant 2): for each
//!    listed partition, this node's map must show S as owner and this node
//!    among the replicas at the epoch S names, or an older epoch (a newer
//!    one exists only in the map, and only its owner sends it); a map at a
//!    newer epoch than S names means S was deposed: refused. Every record's
//!    key must lie in a listed partition.
//! 3. **Apply**: the optional clean (`delete_range_chunk`, which also drops
//!    version markers), the records (`apply_foreign`), then, once out of
//!    the ordered section (so the sender's next call applies meanwhile),
//!    fsync through this node's last seq when the call asks it or this
//!    node's durability waits for fsyncs (otherwise the records are in the
//!    OS's hands: `periodic`/`none` flush each batch). One fsync answers
//!    every call applied before it (`DurableSeq::sync_through`). A token's
//!    time is taken before the fsync, so earlier than the answer leaves.
//! 4. **Read leases** (invariant 11): for each listed partition S vouches
//!    for, `grant_replica_read(p, epoch, anchor + read_lease)`, where the
//!    anchor is when *an earlier answer of this node* to S's stream left
//!    here (S echoes the token of the newest answer it has; with calls in
//!    flight that is not the answer right before; the last
//!    [`REMEMBERED_TOKENS`] are known here). S received that answer before
//!    sending this call, so S's own bound (that answer's arrival + the
//!    lease) is never earlier than the lease granted here, however late
//!    this call arrives.

use super::metrics::ReplicationMetrics;
use crate::executor::{DurableSeq, LatencyGauge};
use crate::migrate::{Refusal, RefusalReason};
use crate::peer::pb;
use crate::routing::Routing;
use bytes::Bytes;
use keyway_map::{Epoch, NodeId, PartitionId, PartitionMap};
use keyway_storage::{ChangeRecord, Engine, KeyRange};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Records per engine call (each under its own routing guard).
const APPLY_SUB_BATCH: usize = 128;
/// Entries deleted per engine call of a clean.
const DROP_SUB_CHUNK: usize = 1_000;
/// Longest read lease a sender may ask for.
const MAX_READ_LEASE_MS: u64 = 60_000;
/// How long a pipelined stream call waits for the call it continues.
pub const PREDECESSOR_WAIT: Duration = Duration::from_secs(1);
/// Answers per sender whose token a later call may echo (more than any
/// stream's window, `replica_stream_window_calls`).
pub const REMEMBERED_TOKENS: usize = 128;

/// What a replica remembers of one sender's stream.
#[derive(Default)]
struct SenderState {
    incarnation: u64,
    last_call: u64,
    /// The last stream call applied here.
    last_stream_call: u64,
    /// The newest stream call refused here: a call continuing it, or one
    /// before it, must not be applied (its predecessor's records are
    /// missing here).
    stream_refused: u64,
    /// The tokens of the newest answers to stream calls, and when each
    /// left (oldest first, at most [`REMEMBERED_TOKENS`]).
    tokens: std::collections::VecDeque<(u64, Instant)>,
}

/// A sender's state and the condition its pipelined calls wait on.
#[derive(Default)]
struct Sender {
    state: Mutex<SenderState>,
    moved: std::sync::Condvar,
}

/// Where one call stands in its sender's order (see the module docs).
#[derive(Debug, PartialEq, Eq)]
enum Order {
    Apply,
    /// The stream call it continues was not applied yet.
    Wait,
    Refuse(String),
}

impl SenderState {
    /// Pure: the order check of one call (after the incarnation reset).
    fn order(&self, incarnation: u64, call: u64, stream: bool, after_call: u64) -> Order {
        if incarnation < self.incarnation
            || (incarnation == self.incarnation && call <= self.last_call)
        {
            return Order::Refuse(format!(
                "arrived after {}/{}",
                self.incarnation, self.last_call
            ));
        }
        if !stream || after_call == 0 {
            return Order::Apply;
        }
        if after_call >= call {
            return Order::Refuse(format!("continues call {after_call}, not an earlier one"));
        }
        if incarnation > self.incarnation {
            // The first call of its chain was not applied here yet.
            return Order::Wait;
        }
        if self.last_stream_call >= after_call {
            // Applied (a later stream call applied instead would be newer
            // than this one, which the first check refused).
            return Order::Apply;
        }
        if self.stream_refused >= after_call {
            return Order::Refuse(format!("continues call {after_call}, which was refused"));
        }
        Order::Wait
    }
}

/// The replica side (see the module docs).
pub struct ReplicaSide {
    me: NodeId,
    engine: Arc<dyn Engine>,
    routing: Arc<Routing>,
    latency: Arc<LatencyGauge>,
    metrics: Arc<ReplicationMetrics>,
    /// Published after each fsync here (this node's own streams ship up to it).
    durable: Arc<DurableSeq>,
    senders: Mutex<HashMap<NodeId, Arc<Sender>>>,
    /// Testing hook: while true every call waits before it is looked at
    /// (as a `SIGSTOP`ped process would).
    paused: watch::Sender<bool>,
    next_token: std::sync::atomic::AtomicU64,
    /// Per partition, this node's last seq after a call listing it was
    /// applied (read under the routing guard the call was checked under).
    applied: Arc<Mutex<HashMap<PartitionId, keyway_storage::Seq>>>,
    /// Armed by every call (heartbeats too): a replica may be promoted,
    /// and its streams then read its log from the era floor on, so its
    /// records stay kept while it replicates (`log_gc`).
    holds: Arc<crate::log_gc::LogHolds>,
}

/// Why a call was not applied.
#[derive(Debug)]
pub enum ReplicaError {
    Refused(Refusal),
    Invalid(String),
    Storage(keyway_storage::StorageError),
}

impl ReplicaSide {
    pub fn new(
        me: NodeId,
        engine: Arc<dyn Engine>,
        routing: Arc<Routing>,
        latency: Arc<LatencyGauge>,
        metrics: Arc<ReplicationMetrics>,
        durable: Arc<DurableSeq>,
        holds: Arc<crate::log_gc::LogHolds>,
    ) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        ReplicaSide {
            me,
            engine,
            routing,
            latency,
            metrics,
            durable,
            holds,
            senders: Mutex::new(HashMap::new()),
            paused: watch::channel(false).0,
            next_token: std::sync::atomic::AtomicU64::new(seed | 1),
            applied: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// This node's last seq after the last call listing `partition` was
    /// applied here, read under the routing guard that call was checked
    /// under (so under a map in which this node did not own the partition
    /// at a newer epoch): every record that call brought is at or below
    /// it, and every write this node admits as the partition's owner at a
    /// newer epoch is above it. A switchover's era floor (`rules.rs`).
    pub fn applied_seq(&self, partition: PartitionId) -> Option<keyway_storage::Seq> {
        self.applied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&partition)
            .copied()
    }

    /// Testing hook: stall (`true`) or resume every `Replicate` call here.
    pub fn set_paused(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    fn sender(&self, node: NodeId) -> Arc<Sender> {
        self.senders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(node)
            .or_default()
            .clone()
    }

    /// Serves one call (see the module docs).
    pub async fn serve(
        self: Arc<Self>,
        req: pb::ReplicateRequest,
    ) -> Result<pb::ReplicateResponse, ReplicaError> {
        let arrived = Instant::now();
        let answer = self.clone().serve_call(req).await;
        self.metrics.replica_serve_seconds.since(arrived);
        answer
    }

    async fn serve_call(
        self: Arc<Self>,
        req: pb::ReplicateRequest,
    ) -> Result<pb::ReplicateResponse, ReplicaError> {
        let mut paused = self.paused.subscribe();
        while *paused.borrow_and_update() {
            if paused.changed().await.is_err() {
                break;
            }
        }
        let sender = NodeId(req.sender);
        let listed = listed_from_pb(&req.partitions)?;
        let records = req
            .records
            .iter()
            .enumerate()
            .map(|(i, b)| {
                ChangeRecord::decode(b)
                    .map_err(|e| ReplicaError::Invalid(format!("record {i}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let drop = match req.drop_limit {
            0 => None,
            n => {
                let pid = PartitionId(req.drop_partition);
                let (_, epoch, range, _) = listed
                    .iter()
                    .find(|l| l.0 == pid)
                    .ok_or_else(|| ReplicaError::Invalid("drop_partition is not listed".into()))?;
                Some((pid, *epoch, range.clone(), n as usize))
            }
        };
        // From here on on a blocking thread (the engine blocks), which runs
        // to the end even if the caller gives up (its deadline passed): the
        // ordered section is never cut short, so a later call cannot run
        // while this one's records are still being applied. One hand-off
        // for the order, the check and the apply.
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.in_order(req, sender, listed, records, drop))
            .await
            .map_err(|e| ReplicaError::Invalid(format!("replicate task failed: {e}")))?
    }

    /// The ordered part of [`Self::serve`]: under the sender's lock.
    fn in_order(
        &self,
        req: pb::ReplicateRequest,
        sender: NodeId,
        listed: Vec<ListedPartition>,
        records: Vec<ChangeRecord>,
        drop: Option<(PartitionId, Epoch, KeyRange, usize)>,
    ) -> Result<pb::ReplicateResponse, ReplicaError> {
        self.holds.arm();
        let slot = self.sender(sender);
        let mut state = slot.state.lock().unwrap_or_else(|e| e.into_inner());
        let waited = Instant::now();
        let mut counted_wait = false;
        loop {
            match state.order(req.incarnation, req.call, req.stream, req.after_call) {
                Order::Apply => break,
                Order::Wait if waited.elapsed() < PREDECESSOR_WAIT => {
                    if !counted_wait {
                        counted_wait = true;
                        self.metrics.replica_continuation_waits.inc();
                    }
                    let left = PREDECESSOR_WAIT.saturating_sub(waited.elapsed());
                    state = slot
                        .moved
                        .wait_timeout(state, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                order => {
                    let why = match order {
                        Order::Refuse(why) => why,
                        _ => format!(
                            "call {} it continues did not arrive within {PREDECESSOR_WAIT:?}",
                            req.after_call
                        ),
                    };
                    if req.stream && req.incarnation == state.incarnation {
                        state.stream_refused = state.stream_refused.max(req.call);
                        slot.moved.notify_all();
                    }
                    return Err(self.refuse(Refusal {
                        reason: RefusalReason::Stale,
                        detail: format!(
                            "call {}/{} of node {sender} {why}",
                            req.incarnation, req.call
                        ),
                    }));
                }
            }
        }
        if req.incarnation > state.incarnation {
            *state = SenderState {
                incarnation: req.incarnation,
                ..SenderState::default()
            };
        }
        let answer = self.apply_call(&mut state, &req, sender, listed, records, drop);
        if answer.is_err() && req.stream {
            // Its records may be missing here: no call may continue it.
            state.stream_refused = state.stream_refused.max(req.call);
        }
        slot.moved.notify_all();
        std::mem::drop(state);
        // The fsync outside the sender's lock: the next call applies
        // meanwhile, and one fsync covers the calls applied before it
        // (`DurableSeq::sync_through`, a group commit across calls).
        let (answer, sync) = answer?;
        if sync {
            self.durable
                .sync_through(&*self.engine, answer.last_seq)
                .map_err(ReplicaError::Storage)?;
        }
        Ok(answer)
    }

    /// Applies a call [`Self::in_order`] let through, under its sender's
    /// lock; the answer, and whether it must be fsynced first.
    fn apply_call(
        &self,
        state: &mut SenderState,
        req: &pb::ReplicateRequest,
        sender: NodeId,
        listed: Vec<ListedPartition>,
        records: Vec<ChangeRecord>,
        drop: Option<(PartitionId, Epoch, KeyRange, usize)>,
    ) -> Result<(pb::ReplicateResponse, bool), ReplicaError> {
        // The sender's mode asks it, or this node's own does (a replica
        // under `group` never holds an acknowledged record only in a
        // user-space buffer).
        let sync = req.sync || self.durable.acks_wait_for_fsync();
        let n_records = records.len();
        let bytes_written = crate::copies::payload_bytes(&records);
        let applied = apply(
            &*self.engine,
            &self.routing,
            self.me,
            sender,
            &listed,
            drop,
            &records,
            &self.applied,
        )
        .map_err(ReplicaError::Storage)?;
        let (last_seq, deleted) = applied.map_err(|r| self.refuse(r))?;
        state.last_call = req.call;
        if req.stream {
            state.last_stream_call = req.call;
            if req.after_call != 0 {
                self.metrics.replica_continued_calls.inc();
            }
        }
        self.metrics
            .replica_applied_records
            .inc_by(n_records as u64);
        let mut token = 0;
        if req.stream {
            let lease = Duration::from_millis(req.read_lease_ms.min(MAX_READ_LEASE_MS));
            if req.prev_token != 0
                && let Some((_, anchor)) = state.tokens.iter().find(|(t, _)| *t == req.prev_token)
            {
                let anchor = *anchor;
                for (pid, epoch, _, vouch) in &listed {
                    if *vouch {
                        self.routing
                            .grant_replica_read(*pid, *epoch, anchor + lease);
                    }
                }
            }
            token = self
                .next_token
                .fetch_add(2, std::sync::atomic::Ordering::Relaxed);
            if state.tokens.len() == REMEMBERED_TOKENS {
                state.tokens.pop_front();
            }
            state.tokens.push_back((token, Instant::now()));
        }
        let answer = pb::ReplicateResponse {
            token,
            last_seq,
            deleted: deleted as u64,
            recent_latency_us: self.latency.recent_max_micros(),
            bytes_written,
        };
        Ok((answer, sync))
    }

    fn refuse(&self, r: Refusal) -> ReplicaError {
        self.metrics.replica_refusals.inc();
        tracing::debug!(reason = r.reason.label(), %r, "replicate call refused");
        ReplicaError::Refused(r)
    }
}

type ListedPartition = (PartitionId, Epoch, KeyRange, bool);

fn listed_from_pb(ps: &[pb::ReplicatedPartition]) -> Result<Vec<ListedPartition>, ReplicaError> {
    ps.iter()
        .map(|p| {
            let r = p
                .range
                .clone()
                .ok_or_else(|| ReplicaError::Invalid("a listed partition has no range".into()))?;
            Ok((
                PartitionId(p.id),
                Epoch(p.epoch),
                KeyRange::new(r.start, r.end),
                p.vouch,
            ))
        })
        .collect()
}

/// Check and effect, each engine call under its own routing read guard.
#[allow(clippy::too_many_arguments)]
fn apply(
    engine: &dyn Engine,
    routing: &Routing,
    me: NodeId,
    sender: NodeId,
    listed: &[ListedPartition],
    drop: Option<(PartitionId, Epoch, KeyRange, usize)>,
    records: &[ChangeRecord],
    applied_at: &Mutex<HashMap<PartitionId, keyway_storage::Seq>>,
) -> Result<Result<(u64, usize), Refusal>, keyway_storage::StorageError> {
    let mut deleted = 0;
    if let Some((pid, epoch, range, limit)) = drop {
        routing.revoke_replica_read(pid);
        while deleted < limit {
            let view = routing.read();
            if let Err(r) = check(view.map(), me, sender, listed, std::iter::empty()) {
                return Ok(Err(r));
            }
            // A clean needs the map at the sender's epoch: the range must be
            // exactly the partition's here.
            let here = view.map().partitions.get(&pid);
            if here.is_none_or(|p| {
                p.epoch != epoch || crate::migrate::receive::storage_range(p) != range
            }) {
                return Ok(Err(Refusal {
                    reason: RefusalReason::MapBehind,
                    detail: format!("partition {pid} is not at epoch {epoch} here yet"),
                }));
            }
            let want = (limit - deleted).min(DROP_SUB_CHUNK);
            let n = engine.delete_range_chunk(&range, want)?;
            drop_guard(view);
            deleted += n;
            if n < want {
                break;
            }
        }
    }
    let parts: Vec<&[ChangeRecord]> = match records.is_empty() {
        true => vec![&[]],
        // Sub-batches end where the sender's batches end: each is applied
        // atomically, so no read here sees half of a batch.
        false => keyway_storage::whole_batches(records, APPLY_SUB_BATCH),
    };
    for part in parts {
        let view = routing.read();
        if let Err(r) = check(
            view.map(),
            me,
            sender,
            listed,
            part.iter().map(|r| &r.mutation.key()[..]),
        ) {
            return Ok(Err(r));
        }
        let seq = match part.is_empty() {
            true => engine.last_seq(),
            false => {
                let _no_reads = routing.replica_apply_exclusive();
                engine.apply_foreign(part)?
            }
        };
        {
            let mut at = applied_at.lock().unwrap_or_else(|e| e.into_inner());
            for (pid, ..) in listed {
                let e = at.entry(*pid).or_insert(seq);
                *e = (*e).max(seq);
            }
        }
        drop_guard(view);
    }
    Ok(Ok((engine.last_seq(), deleted)))
}

/// Ends a check's critical section (the effect is in the engine).
fn drop_guard(view: crate::routing::RoutingGuard<'_>) {
    drop(view);
}

/// May `sender` ship records with `keys` for the `listed` partitions to
/// this node (`me`), by `map`? Pure; see the module docs.
pub fn check<'k>(
    map: &PartitionMap,
    me: NodeId,
    sender: NodeId,
    listed: &[ListedPartition],
    mut keys: impl Iterator<Item = &'k [u8]>,
) -> Result<(), Refusal> {
    let refuse = |reason, detail: String| Err(Refusal { reason, detail });
    let mut ranges: Vec<KeyRange> = Vec::with_capacity(listed.len());
    for (pid, epoch, range, _) in listed {
        let Some(p) = map.partitions.get(pid) else {
            return refuse(
                RefusalReason::MapBehind,
                format!("partition {pid} unknown here (map version {})", map.version),
            );
        };
        if p.epoch > *epoch {
            return refuse(
                RefusalReason::Stale,
                format!(
                    "partition {pid} is at epoch {} here, the sender names {epoch}",
                    p.epoch
                ),
            );
        }
        if p.epoch == *epoch {
            if p.owner != sender {
                return refuse(
                    RefusalReason::Stale,
                    format!("node {sender} does not own partition {pid} at epoch {epoch} here"),
                );
            }
            if !p.replicas.contains(&me) {
                return refuse(
                    RefusalReason::NotReceiving,
                    format!("this node is not a replica of partition {pid} at epoch {epoch}"),
                );
            }
            ranges.push(crate::migrate::receive::storage_range(p));
        } else {
            // The sender names a newer epoch: it owns the partition there.
            ranges.push(range.clone());
        }
    }
    match keys.find(|k| !ranges.iter().any(|r| r.contains(k))) {
        Some(k) => refuse(
            RefusalReason::OutOfRange,
            format!(
                "key {:?} is in no partition the call lists",
                Bytes::copy_from_slice(k)
            ),
        ),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{MapVersion, NodeInfo};

    fn map() -> PartitionMap {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect();
        PartitionMap::bootstrap_replicated(&nodes, 1, 2).unwrap()
    }

    fn listed(map: &PartitionMap, pid: PartitionId, epoch: Epoch) -> Vec<ListedPartition> {
        let p = &map.partitions[&pid];
        vec![(pid, epoch, crate::migrate::receive::storage_range(p), true)]
    }

    fn state(incarnation: u64, last_call: u64, last_stream_call: u64, refused: u64) -> SenderState {
        SenderState {
            incarnation,
            last_call,
            last_stream_call,
            stream_refused: refused,
            ..SenderState::default()
        }
    }

    #[test]
    fn a_pipelined_call_is_applied_only_right_after_the_call_it_continues() {
        let refused = |o: Order| matches!(o, Order::Refuse(_));
        // Calls 5 (applied), then 6 continuing 5: applied.
        let s = state(1, 5, 5, 0);
        assert_eq!(s.order(1, 6, true, 5), Order::Apply);
        // 7 continuing 6 before 6 arrived: waits.
        assert_eq!(s.order(1, 7, true, 6), Order::Wait);
        // 6 was refused: 7 (continuing it) is refused, and so is 8
        // continuing 7 (refused in turn).
        let s = state(1, 5, 5, 6);
        assert!(refused(s.order(1, 7, true, 6)));
        let s = state(1, 5, 5, 7);
        assert!(refused(s.order(1, 8, true, 7)));
        // A catch-up call (not stream) between: 8 continuing 6 is applied
        // after 6 and the catch-up 7.
        let s = state(1, 7, 6, 0);
        assert_eq!(s.order(1, 8, true, 6), Order::Apply);
        // A catch-up applied before 6 arrived: 6 is stale, hence 8 too.
        let s = state(1, 7, 5, 0);
        assert!(refused(s.order(1, 6, true, 5)));
        let s = state(1, 7, 5, 6);
        assert!(refused(s.order(1, 8, true, 6)));
        // A restarted chain (after_call 0) is applied, and the old chain's
        // later calls are stale against it.
        let s = state(1, 5, 5, 0);
        assert_eq!(s.order(1, 9, true, 0), Order::Apply);
        let s = state(1, 9, 9, 0);
        assert!(refused(s.order(1, 7, true, 6)));
        // A new incarnation: its first call applies; a call continuing
        // one of it that did not arrive yet waits.
        assert_eq!(s.order(2, 1, true, 0), Order::Apply);
        assert_eq!(s.order(2, 2, true, 1), Order::Wait);
        // An older incarnation, or a call continuing itself or a later one.
        assert!(refused(s.order(0, 50, true, 0)));
        assert!(refused(s.order(1, 10, true, 10)));
        assert!(refused(s.order(1, 10, true, 11)));
        // Catch-up calls ignore after_call.
        assert_eq!(s.order(1, 10, false, 0), Order::Apply);
    }

    #[test]
    fn only_the_owner_at_the_epoch_ships_to_a_listed_replica() {
        let mut m = map();
        let p = m
            .partitions
            .values()
            .find(|p| p.owner == NodeId(1))
            .unwrap()
            .clone();
        let replica = p.replicas[0];
        let other = (1..=3)
            .map(NodeId)
            .find(|n| *n != replica && *n != p.owner)
            .unwrap();
        let key = [&p.storage_bounds().0[..], b"k"].concat();
        let keys = || std::iter::once(&key[..]);
        let l = listed(&m, p.id, p.epoch);
        assert!(check(&m, replica, p.owner, &l, keys()).is_ok());
        // Not the owner.
        let r = check(&m, replica, other, &l, keys()).unwrap_err();
        assert_eq!(r.reason, RefusalReason::Stale);
        // Not a replica.
        let r = check(&m, other, p.owner, &l, keys()).unwrap_err();
        assert_eq!(r.reason, RefusalReason::NotReceiving);
        // A key outside the listed partitions.
        let outside = b"\xff\xff\xff\xffz".to_vec();
        let r = check(&m, replica, p.owner, &l, std::iter::once(&outside[..])).unwrap_err();
        assert_eq!(r.reason, RefusalReason::OutOfRange);
        // A newer epoch than this map's is trusted; an older one is refused.
        let newer = listed(&m, p.id, Epoch(p.epoch.0 + 1));
        assert!(check(&m, replica, other, &newer, keys()).is_ok());
        let row = m.partitions.get_mut(&p.id).unwrap();
        row.epoch = Epoch(p.epoch.0 + 2);
        m.version = MapVersion(m.version.0 + 1);
        let r = check(&m, replica, p.owner, &l, keys()).unwrap_err();
        assert_eq!(r.reason, RefusalReason::Stale);
        // Unknown partition: the map is behind.
        let unknown = vec![(
            PartitionId(999),
            Epoch(1),
            KeyRange::new(Bytes::new(), None),
            false,
        )];
        assert_eq!(
            check(&m, replica, p.owner, &unknown, std::iter::empty())
                .unwrap_err()
                .reason,
            RefusalReason::MapBehind
        );
    }
}
