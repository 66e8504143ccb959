//! One step of an ordered scan over a partition this node owns: the check
//! and the read together, under the routing read guard (invariant 2), so no
//! entry is read with authority that a cutover or a split already took away.
//!
//! Blocking (the engine is called): run it on a storage thread
//! ([`scan_owned_released`], what `KW.SCAN` and `RangeScan` do), never on
//! an async worker. Holding the read side while
//! reading delays a map install or a fence by at most one step, which is
//! bounded by `limit` live entries and [`MAX_EXAMINED_PER_STEP`] entries read.

use crate::executor::{Task, TaskOutput};
use crate::routing::{Rejection, Routing};
use bytes::Bytes;
use keyway_map::{Epoch, KeyspaceId, PartitionId, PartitionRecord, keyspace_prefix};
use keyway_resp::Frame;
use keyway_storage::{Engine, KeyRange, StorageError};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Queues a node-wide read on a storage thread and hands back the receiver
/// of its released reply (`Executor::submit_node_wide`, boxed so the peer
/// service can hold it).
pub type SubmitRead = Arc<
    dyn Fn(Task) -> Pin<Box<dyn Future<Output = Result<oneshot::Receiver<Frame>, Frame>> + Send>>
        + Send
        + Sync,
>;

/// Most entries (live or expired) one step reads before it answers, so a
/// run of expired keys cannot hold the routing read side for long; the
/// step then answers fewer than `limit` entries and a resume key.
pub const MAX_EXAMINED_PER_STEP: usize = 20_000;
/// Entries asked of the engine per scan call.
const ENGINE_BATCH: usize = 256;

/// What one step read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedPage {
    /// The partition the step was admitted for (as this node's map has it).
    pub partition: PartitionRecord,
    /// `(local routing key, value)` of live string entries, strictly increasing.
    pub entries: Vec<(Bytes, Bytes)>,
    /// Inclusive resume key (greater than every returned key); `None` = nothing
    /// further before `min(to, partition end)`.
    pub next: Option<Bytes>,
}

/// Why a step read nothing.
#[derive(Debug)]
pub enum StepError {
    /// The ownership check refused it.
    Refused(Rejection),
    /// The engine failed.
    Storage(StorageError),
}

impl From<StorageError> for StepError {
    fn from(e: StorageError) -> Self {
        StepError::Storage(e)
    }
}

/// The smallest key greater than `key`.
pub fn successor(key: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(key.len() + 1);
    out.extend_from_slice(key);
    out.push(0);
    Bytes::from(out)
}

/// The lower of two exclusive upper bounds (`None` = unbounded).
pub fn min_end<'a>(a: Option<&'a [u8]>, b: Option<&'a [u8]>) -> Option<&'a [u8]> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Reads up to `limit` live entries of `[from, to)` of the partition of
/// keyspace `ks` holding `from`, if this node owns it (at exactly
/// `expected`, when given) and serves it now. `limit` must be positive.
pub fn scan_owned(
    routing: &Routing,
    engine: &dyn Engine,
    ks: KeyspaceId,
    from: &[u8],
    to: Option<&[u8]>,
    limit: usize,
    expected: Option<(PartitionId, Epoch)>,
) -> Result<OwnedPage, StepError> {
    assert!(limit > 0, "scan_owned needs a positive limit");
    let now_ms = routing.unix_ms();
    let guard = routing.read();
    let partition = guard
        .admit_key(ks, from, expected)
        .map_err(StepError::Refused)?;
    let mut page = OwnedPage {
        partition: partition.clone(),
        entries: Vec::new(),
        next: None,
    };
    let end = min_end(to, partition.end.as_deref());
    if end.is_some_and(|e| e <= from) {
        return Ok(page);
    }
    let prefix = keyspace_prefix(ks);
    let storage = |local: &[u8]| Bytes::from([&prefix[..], local].concat());
    let range = KeyRange::new(
        storage(from),
        match end {
            Some(e) => Some(storage(e)),
            None => {
                ks.0.checked_add(1)
                    .map(|n| Bytes::copy_from_slice(&n.to_be_bytes()))
            }
        },
    );
    let mut after: Option<Bytes> = None;
    let mut examined = 0usize;
    loop {
        let want = (limit - page.entries.len()).clamp(1, ENGINE_BATCH);
        let chunk = engine.scan(&range, after.as_deref(), want)?;
        let exhausted = chunk.next.is_none() || chunk.entries.is_empty();
        let count = chunk.entries.len();
        for (i, (key, value)) in chunk.entries.into_iter().enumerate() {
            examined += 1;
            let local = key.slice(prefix.len()..);
            if !value.is_expired_at(now_ms) {
                page.entries.push((local.clone(), value.data));
            }
            let last_of_range = exhausted && i + 1 == count;
            if !last_of_range && (page.entries.len() >= limit || examined >= MAX_EXAMINED_PER_STEP)
            {
                page.next = Some(successor(&local));
                return Ok(page);
            }
            after = Some(key);
        }
        if exhausted {
            return Ok(page);
        }
    }
}

/// [`scan_owned`] as a node-wide read on a storage thread queued by
/// `submit`, like every other read: the page is handed back only once the
/// step's reply was released, after group commit (it may have read other
/// threads' writes, so it asks for an fsync when it read anything). `Err`
/// carries the executor's own error (shutting down, held too long).
pub async fn scan_owned_released<F, Fut>(
    submit: F,
    routing: Arc<Routing>,
    ks: KeyspaceId,
    from: Bytes,
    to: Option<Bytes>,
    limit: usize,
    expected: Option<(PartitionId, Epoch)>,
) -> Result<Result<OwnedPage, StepError>, Frame>
where
    F: FnOnce(Task) -> Fut,
    Fut: Future<Output = Result<oneshot::Receiver<Frame>, Frame>>,
{
    let out = Arc::new(Mutex::new(None));
    let task: Task = {
        let out = out.clone();
        Box::new(move |engine| {
            let step = scan_owned(&routing, engine, ks, &from, to.as_deref(), limit, expected);
            let read = step.is_ok();
            *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(step);
            TaskOutput::reply(Frame::ok(), read)
        })
    };
    match submit(task).await?.await {
        Ok(Frame::Error(e)) => Err(Frame::Error(e)),
        Ok(_) => out
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| Frame::Error("ERR scan step produced nothing".into())),
        Err(_) => Err(Frame::Error("ERR server is shutting down".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use keyway_map::{
        Keyspace, MapVersion, NodeId, NodeInfo, NodeState, PartitionMap, PartitionState,
        Routing as KeyRouting,
    };
    use keyway_storage::{MemEngine, Mutation, ValueKind};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const KS: KeyspaceId = KeyspaceId(1);

    fn part(id: u64, start: &str, end: Option<&str>, owner: u64) -> PartitionRecord {
        PartitionRecord {
            id: PartitionId(id),
            keyspace: KS,
            start: Bytes::copy_from_slice(start.as_bytes()),
            end: end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
            owner: NodeId(owner),
            replicas: vec![],
            in_sync: Vec::new(),
            reads_from: None,
            epoch: Epoch(2),
            state: PartitionState::Active,
        }
    }

    /// Node 1 owns `[, m)` of range keyspace 1, node 2 owns `[m, )`.
    fn routing() -> Routing {
        let mut map = PartitionMap::bootstrap(
            &[1, 2].map(|i| NodeInfo {
                id: NodeId(i),
                resp_addr: format!("127.0.0.1:{}", 7000 + i),
                admin_addr: format!("127.0.0.1:{}", 8000 + i),
                state: NodeState::Up,
                weight: keyway_map::DEFAULT_NODE_WEIGHT,
                draining: false,
                zone: None,
                replica_addr: None,
            }),
            1,
        )
        .unwrap();
        let ks = Keyspace {
            id: KS,
            name: "r".into(),
            routing: KeyRouting::Range,
            replication_factor: 1,
            min_in_sync: 1,
        };
        map.apply(
            MapVersion(2),
            &[
                keyway_map::MapChange::UpsertKeyspace(ks),
                keyway_map::MapChange::UpsertPartition(part(10, "", Some("m"), 1)),
                keyway_map::MapChange::UpsertPartition(part(11, "m", None, 2)),
            ],
        )
        .unwrap();
        let r = Routing::new(NodeId(1), Arc::new(SystemClock));
        r.install(map).unwrap();
        r.set_lease_deadline(Instant::now() + Duration::from_secs(60));
        r
    }

    fn engine(keys: &[(&str, Option<u64>)]) -> MemEngine {
        let e = MemEngine::new();
        let muts: Vec<Mutation> = keys
            .iter()
            .map(|(k, exp)| Mutation::Put {
                key: Bytes::from([&keyspace_prefix(KS)[..], k.as_bytes()].concat()),
                kind: ValueKind::String,
                expire_at_ms: *exp,
                data: Bytes::from(format!("v-{k}")),
            })
            .collect();
        e.apply(&muts).unwrap();
        e
    }

    fn keys(page: &OwnedPage) -> Vec<String> {
        page.entries
            .iter()
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .collect()
    }

    #[test]
    fn pages_stay_inside_the_partition_and_skip_expired_keys() {
        let r = routing();
        let e = engine(&[
            ("a", None),
            ("b", Some(1)),
            ("c", None),
            ("d", None),
            ("m", None),
        ]);
        let p = scan_owned(&r, &e, KS, b"", None, 2, None).unwrap();
        assert_eq!(keys(&p), ["a", "c"]);
        assert_eq!(p.entries[0].1, Bytes::from_static(b"v-a"));
        assert_eq!(p.next.as_deref(), Some(&b"c\0"[..]));
        assert_eq!(p.partition.id, PartitionId(10));
        let p = scan_owned(&r, &e, KS, b"c\0", None, 10, None).unwrap();
        assert_eq!(keys(&p), ["d"], "stops at the partition's end");
        assert_eq!(p.next, None);
        let p = scan_owned(&r, &e, KS, b"a", Some(b"c"), 10, None).unwrap();
        assert_eq!(keys(&p), ["a"], "b expired, c excluded");
        let p = scan_owned(&r, &e, KS, b"c", Some(b"c"), 10, None).unwrap();
        assert!(p.entries.is_empty() && p.next.is_none());
    }

    #[test]
    fn a_full_page_at_the_range_end_has_no_resume_key() {
        let r = routing();
        let e = engine(&[("a", None), ("c", None)]);
        let p = scan_owned(&r, &e, KS, b"", None, 2, None).unwrap();
        assert_eq!(keys(&p), ["a", "c"]);
        assert_eq!(p.next, None);
    }

    #[test]
    fn foreign_or_stale_partitions_are_refused_with_the_record() {
        let r = routing();
        let e = engine(&[]);
        match scan_owned(&r, &e, KS, b"x", None, 10, None) {
            Err(StepError::Refused(Rejection::StaleEpoch { partition, .. })) => {
                assert_eq!(
                    (partition.id, partition.owner),
                    (PartitionId(11), NodeId(2))
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let stale = Some((PartitionId(10), Epoch(1)));
        assert!(matches!(
            scan_owned(&r, &e, KS, b"a", None, 10, stale),
            Err(StepError::Refused(Rejection::StaleEpoch { .. }))
        ));
        r.set_fenced(PartitionId(10), true);
        assert!(matches!(
            scan_owned(&r, &e, KS, b"a", None, 10, None),
            Err(StepError::Refused(Rejection::Fenced { .. }))
        ));
        r.revoke_lease();
        assert!(matches!(
            scan_owned(&r, &e, KS, b"a", None, 10, None),
            Err(StepError::Refused(Rejection::LeaseLapsed))
        ));
    }
}
