//! The source's migration roles, driven by hand over the `Peer` RPCs (the
//! manager's driver is tested elsewhere): the push copies and keeps the target
//! caught up, dual writes are at the target when acknowledged, a fenced
//! partition holds requests — they get `-MOVED` once the flip is installed,
//! or run once the fence lifts — and never see an error.

use crate::common;

use common::Resp;
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{
    DEFAULT_KEYSPACE, Epoch, MapChange, NodeId, OwnershipCondition, PartitionRecord, key_hash_slot,
};
use keyway_meta::MapTxn;
use keyway_peer::{MigrationRef, PeerClient, PeerError, PushSpec, RefusalReason, Throttle};
use keyway_resp::Frame;
use keyway_storage::{ChangeRecord, KeyRange, Mutation};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

/// Polls `probe` until it holds or `within` passes; true if it held.
async fn wait_until<F, Fut>(within: Duration, mut probe: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if probe().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

struct Setup {
    cluster: LocalCluster,
    partition: PartitionRecord,
    source: PeerClient,
    target: PeerClient,
    target_id: NodeId,
    source_port: u16,
    range: KeyRange,
    /// Keys of `partition`.
    keys: Vec<String>,
}

async fn setup(dir: &std::path::Path) -> Setup {
    let mut spec = ClusterSpec::ephemeral(2, dir.to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    // These tests play the manager's part themselves.
    spec.manager = None;
    let cluster = LocalCluster::start(spec).await.expect("cluster starts");
    cluster.wait_serving(WAIT).await.unwrap();
    let map = cluster.map().await.unwrap();
    let partition = map
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(b"k0"))
        .unwrap()
        .clone();
    let keys: Vec<String> = (0..20_000)
        .map(|i| format!("k{i}"))
        .filter(|k| partition.contains_slot_of(k))
        .take(300)
        .collect();
    let admin = |id: NodeId| map.nodes[&id].admin_addr.clone();
    let target_id = *map.nodes.keys().find(|n| **n != partition.owner).unwrap();
    let source_port: u16 = map.nodes[&partition.owner]
        .resp_addr
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    let (start, end) = partition.storage_bounds();
    Setup {
        source: PeerClient::connect(&admin(partition.owner)).unwrap(),
        target: PeerClient::connect(&admin(target_id)).unwrap(),
        target_id,
        source_port,
        range: KeyRange::new(start, end),
        keys,
        partition,
        cluster,
    }
}

impl Setup {
    /// Migration `id` of the setup's partition at its epoch e.
    fn migration(&self, id: u64) -> MigrationRef {
        MigrationRef {
            id,
            partition: self.partition.id,
            epoch: self.partition.epoch,
        }
    }

    /// The storage key of user key `key` (default keyspace).
    fn storage_key(&self, key: &str) -> bytes::Bytes {
        let map = self.cluster_map_keyspace();
        map.storage_key(key.as_bytes())
    }

    fn cluster_map_keyspace(&self) -> keyway_map::Keyspace {
        let node = self.cluster.node(0).unwrap();
        node.shared().routing.map().keyspaces[&DEFAULT_KEYSPACE].clone()
    }

    fn port_of(&self, node: NodeId) -> u16 {
        let idx = (0..self.cluster.len())
            .find(|i| self.cluster.node(*i).map(|n| n.id()) == Some(node))
            .unwrap();
        let addr = self.cluster.node(idx).unwrap().resp_addr();
        addr.rsplit_once(':').unwrap().1.parse().unwrap()
    }

    /// Commits the flip (source, e) → (target, e+1) and waits until the
    /// target serves the partition at e+1.
    async fn flip(&self) {
        let p = &self.partition;
        self.cluster
            .meta()
            .commit(MapTxn {
                conditions: vec![OwnershipCondition {
                    partition: p.id,
                    expected: Some((p.owner, p.epoch)),
                }],
                changes: vec![MapChange::UpsertPartition(PartitionRecord {
                    owner: self.target_id,
                    epoch: Epoch(p.epoch.0 + 1),
                    ..p.clone()
                })],
            })
            .await
            .unwrap();
        let flipped = |v: Option<keyway_peer::PartitionView>| {
            v.is_some_and(|v| v.owner == self.target_id && v.epoch.0 == p.epoch.0 + 1)
        };
        assert!(
            wait_until(WAIT, || async {
                flipped(self.target.partition_view(p.id).await.unwrap())
            })
            .await,
            "the target installs the flip"
        );
    }
}

/// A `Put` of `value` at `key` with a source seq newer than anything here.
fn late_put(key: bytes::Bytes, value: &str) -> ChangeRecord {
    ChangeRecord {
        batch_continues: false,
        seq: u64::MAX / 4,
        mutation: Mutation::Put {
            key,
            kind: keyway_storage::ValueKind::String,
            expire_at_ms: None,
            data: bytes::Bytes::copy_from_slice(value.as_bytes()),
        },
    }
}

fn refused(res: Result<impl std::fmt::Debug, PeerError>, want: RefusalReason) {
    match res {
        Err(PeerError::Refused { reason, .. }) if reason == want => {}
        other => panic!("expected a {want:?} refusal, got {other:?}"),
    }
}

trait SlotOf {
    fn contains_slot_of(&self, key: &str) -> bool;
}

impl SlotOf for PartitionRecord {
    fn contains_slot_of(&self, key: &str) -> bool {
        let (first, last) = self.slot_span();
        (first..=last).contains(&key_hash_slot(key.as_bytes()))
    }
}

fn ok(frame: Frame) {
    assert_eq!(frame, Frame::Simple("OK".into()));
}

/// Starts a push and waits until the target holds the snapshot and is caught up.
async fn push_caught_up(s: &Setup, id: u64) {
    let after_seq = s.source.last_seq().await.unwrap();
    s.source
        .migrate_start(&PushSpec {
            id,
            partition: s.partition.id,
            epoch: s.partition.epoch,
            range: s.range.clone(),
            target: s.target.addr().to_string(),
            copy: true,
            after_seq,
            throttle: Throttle::default(),
        })
        .await
        .unwrap();
    assert!(
        wait_until(WAIT, || async {
            let st = s.source.migrate_status(id).await.unwrap();
            assert_eq!(st.error, None);
            st.copy_done && st.acked_seq >= st.head_seq
        })
        .await,
        "push catches up"
    );
}

async fn held_count(c: &LocalCluster, index: usize) -> String {
    let metrics = c.node(index).unwrap().shared().metrics.encode();
    metrics
        .lines()
        .find(|l| l.starts_with("keyway_held_requests_total"))
        .unwrap_or("")
        .to_string()
}

fn source_index(s: &Setup) -> usize {
    (0..s.cluster.len())
        .find(|i| s.cluster.node(*i).map(|n| n.id()) == Some(s.partition.owner))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dual_writes_are_at_the_target_when_acknowledged_and_a_held_write_gets_moved_after_the_flip()
 {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path()).await;
    let port = s.source_port;
    let keys = s.keys.clone();
    tokio::task::spawn_blocking(move || {
        let mut c = Resp::connect(port);
        for k in &keys {
            ok(c.cmd(&["SET", k, "copied"]));
        }
    })
    .await
    .unwrap();

    push_caught_up(&s, 7).await;
    let (src, _) = s.source.digest(&s.range).await.unwrap();
    let (tgt, _) = s.target.digest(&s.range).await.unwrap();
    assert_eq!(src, tgt, "the copy plus catch-up equals the source");
    assert_eq!(src.keys, 300);

    // Dual: after each acknowledged write (no write in flight), the target
    // already holds it: the digests agree at every step.
    s.source.migrate_dual(7, true).await.unwrap();
    for (i, k) in s.keys.iter().take(20).enumerate() {
        let port = s.source_port;
        let k2 = k.clone();
        tokio::task::spawn_blocking(move || ok(Resp::connect(port).cmd(&["SET", &k2, "dual"])))
            .await
            .unwrap();
        let (src, _) = s.source.digest(&s.range).await.unwrap();
        let (tgt, _) = s.target.digest(&s.range).await.unwrap();
        assert_eq!(
            src, tgt,
            "write {i} ({k}) was acknowledged before the target had it"
        );
    }

    // The driver moves the checkpoint to the present right before it
    // fences (the rolling checkpoint, `push.rs`), so the digests at the
    // fence agree and cover nothing written before it: the 20 dual writes
    // were digested on both sides just before.
    let (_, moved) = s.source.migrate_checkpoint(7).await.unwrap();
    assert!(moved, "the checkpoint moves to the present");
    s.source.migrate_fence(7, true).await.unwrap();
    let d = s.source.migrate_digest(7).await.unwrap();
    assert!(d.incremental);
    assert_eq!(d.source, d.target);
    assert_eq!(
        d.delta_keys, 0,
        "the fence's digest covers only what came after the refresh"
    );
    s.source.migrate_fence(7, false).await.unwrap();

    // A key the target lost (a record that did not come from the push)
    // and that the source writes again is caught by the next refresh, and
    // the chained checkpoint carries the difference to the fence.
    let chunk = s
        .target
        .snapshot_chunk(&s.range, None, 1_000, 1 << 20)
        .await
        .unwrap();
    let victim = chunk
        .entries
        .iter()
        .find(|e| e.key.ends_with(s.keys[1].as_bytes()))
        .unwrap();
    s.target
        .apply_foreign_for(
            &s.migration(7),
            &[ChangeRecord {
                batch_continues: false,
                seq: u64::MAX / 2,
                mutation: Mutation::Delete {
                    key: victim.key.clone(),
                },
            }],
            true,
        )
        .await
        .unwrap();
    let port = s.source_port;
    let k1 = s.keys[1].clone();
    tokio::task::spawn_blocking(move || ok(Resp::connect(port).cmd(&["SET", &k1, "again"])))
        .await
        .unwrap();

    // Fence: a write is held (no reply, no error) ...
    let (_, moved) = s.source.migrate_checkpoint(7).await.unwrap();
    assert!(moved);
    let before = held_count(&s.cluster, source_index(&s)).await;
    // The fence answers with the digests (the driver's path).
    let (_, with_fence) = s.source.migrate_fence_digests(7).await.unwrap();
    let with_fence = with_fence.expect("the fence brings the digests");
    let port = s.source_port;
    let key = s.keys[0].clone();
    let held = tokio::task::spawn_blocking(move || Resp::connect(port).cmd(&["SET", &key, "held"]));
    let idx = source_index(&s);
    assert!(
        wait_until(WAIT, || async {
            held_count(&s.cluster, idx).await != before
        })
        .await,
        "the write is parked"
    );
    assert!(!held.is_finished());
    let d = s.source.migrate_digest(7).await.unwrap();
    assert_ne!(
        d.source, d.target,
        "a key lost on the target goes unnoticed"
    );
    assert_eq!(
        (with_fence.source, with_fence.target),
        (d.source, d.target),
        "the fence's digests are the fenced range's"
    );

    // A client sent to the target early (before it has the flip) is held
    // there too, not redirected back to the source.
    let target_idx = (0..s.cluster.len())
        .find(|i| s.cluster.node(*i).map(|n| n.id()) == Some(s.target_id))
        .unwrap();
    let target_port: u16 = s
        .cluster
        .node(target_idx)
        .unwrap()
        .resp_addr()
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    let before_t = held_count(&s.cluster, target_idx).await;
    let key3 = s.keys[3].clone();
    let early = tokio::task::spawn_blocking(move || {
        Resp::connect(target_port).cmd(&["SET", &key3, "early"])
    });
    assert!(
        wait_until(WAIT, || async {
            held_count(&s.cluster, target_idx).await != before_t
        })
        .await,
        "the early request is held at the target"
    );
    assert!(!early.is_finished());

    // ... until the flip is installed: then it is redirected to the target.
    let p = &s.partition;
    s.cluster
        .meta()
        .commit(MapTxn {
            conditions: vec![OwnershipCondition {
                partition: p.id,
                expected: Some((p.owner, p.epoch)),
            }],
            changes: vec![MapChange::UpsertPartition(PartitionRecord {
                owner: s.target_id,
                epoch: Epoch(p.epoch.0 + 1),
                ..p.clone()
            })],
        })
        .await
        .unwrap();
    let reply = held.await.unwrap();
    let Frame::Error(e) = &reply else {
        panic!("expected a redirect, got {reply:?}")
    };
    assert!(e.starts_with("MOVED "), "{e}");
    let target_port: u16 = e.rsplit_once(':').unwrap().1.parse().unwrap();
    let key = s.keys[0].clone();
    let value = tokio::task::spawn_blocking(move || {
        let mut c = Resp::connect(target_port);
        let v = c.cmd(&["GET", &key]);
        ok(c.cmd(&["SET", &key, "after"]));
        v
    })
    .await
    .unwrap();
    assert_eq!(
        value,
        Frame::Bulk("dual".into()),
        "the target serves the dual-written value"
    );
    assert_eq!(
        early.await.unwrap(),
        Frame::Simple("OK".into()),
        "the early request ran at the target"
    );
    s.source.migrate_stop(7).await.unwrap();
    s.cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lifted_fence_runs_the_held_requests_and_a_stopped_push_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path()).await;
    push_caught_up(&s, 9).await;
    let idx = source_index(&s);
    let before = held_count(&s.cluster, idx).await;
    s.source.migrate_fence(9, true).await.unwrap();
    let port = s.source_port;
    let key = s.keys[1].clone();
    let held = tokio::task::spawn_blocking(move || {
        let mut c = Resp::connect(port);
        // A pipeline of two writes on one slot: both held, run in order.
        c.send_raw(
            format!(
                "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n$1\r\n1\r\n*2\r\n$4\r\nINCR\r\n${}\r\n{key}\r\n",
                key.len(),
                key.len()
            )
            .as_bytes(),
        )
        .unwrap();
        (c.read_reply().unwrap(), c.read_reply().unwrap())
    });
    assert!(
        wait_until(WAIT, || async {
            held_count(&s.cluster, idx).await != before
        })
        .await
    );
    assert!(!held.is_finished());
    s.source.migrate_fence(9, false).await.unwrap();
    assert_eq!(
        held.await.unwrap(),
        (Frame::Simple("OK".into()), Frame::Integer(2))
    );
    s.source.migrate_stop(9).await.unwrap();
    assert!(matches!(
        s.source.migrate_status(9).await,
        Err(keyway_peer::PeerError::NotFound(_))
    ));
    s.cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fence_does_not_outlive_its_migration_when_no_manager_is_left_to_lift_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path()).await;
    let meta = s.cluster.meta().clone();
    let rec = keyway_manager::request_move(&*meta, s.partition.id, s.target_id)
        .await
        .unwrap();
    let id = rec.id.0;
    push_caught_up(&s, id).await;
    let idx = source_index(&s);
    let before = held_count(&s.cluster, idx).await;
    s.source.migrate_fence(id, true).await.unwrap();
    let port = s.source_port;
    let key = s.keys[2].clone();
    let held = tokio::task::spawn_blocking(move || Resp::connect(port).cmd(&["SET", &key, "v"]));
    assert!(
        wait_until(WAIT, || async {
            held_count(&s.cluster, idx).await != before
        })
        .await
    );
    assert!(!held.is_finished());
    // An operator aborts while no manager runs: the source notices the
    // ABORTED record by itself, stops the push and lifts the fence.
    keyway_manager::request_abort(&*meta, rec.id).await.unwrap();
    assert_eq!(held.await.unwrap(), Frame::Simple("OK".into()));
    assert!(
        wait_until(WAIT, || async {
            matches!(
                s.source.migrate_status(id).await,
                Err(keyway_peer::PeerError::NotFound(_))
            )
        })
        .await
    );
    s.cluster.shutdown().await;
}

/// Invariant 2 for peer writes: a foreign record is accepted only for a
/// migration the target registered, and a node refuses to drop a range it
/// owns; neither refused call changes anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unregistered_foreign_records_and_a_drop_of_an_owned_range_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path()).await;
    let port = s.source_port;
    let keys = s.keys.clone();
    tokio::task::spawn_blocking(move || {
        let mut c = Resp::connect(port);
        for k in &keys {
            ok(c.cmd(&["SET", k, "v"]));
        }
    })
    .await
    .unwrap();
    let (before, _) = s.source.digest(&s.range).await.unwrap();
    assert_eq!(before.keys, 300);

    // No push ever registered migration 99 at the target.
    let put = late_put(s.storage_key(&s.keys[0]), "stray");
    let unregistered = s
        .target
        .apply_foreign_for(&s.migration(99), std::slice::from_ref(&put), true)
        .await;
    // A call naming no migration is malformed for a node.
    let unnamed = s.target.apply_foreign(std::slice::from_ref(&put)).await;
    let (at_target, _) = s.target.digest(&s.range).await.unwrap();
    assert_eq!(at_target.keys, 0, "a refused ApplyForeign wrote nothing");
    refused(unregistered, RefusalReason::NotReceiving);
    assert!(matches!(unnamed, Err(PeerError::InvalidArgument(_))));

    // The source owns the partition: a (stale manager's) drop is refused.
    let owned = s
        .source
        .drop_range_chunk_for(&s.migration(99), &s.range, 1_000)
        .await;
    let (after, _) = s.source.digest(&s.range).await.unwrap();
    assert_eq!(after, before, "a refused drop deleted nothing");
    refused(owned, RefusalReason::Owned);
    assert!(matches!(
        s.source.drop_range_chunk(&s.range, 1_000).await,
        Err(PeerError::InvalidArgument(_))
    ));
    let metrics = s
        .cluster
        .node(source_index(&s))
        .unwrap()
        .shared()
        .metrics
        .encode();
    assert!(
        metrics.contains("keyway_peer_refusals_total{kind=\"owned\"} 1"),
        "{metrics}"
    );
    s.cluster.shutdown().await;
}

/// A delayed `ApplyForeign` of the migration, retried after the flip, must
/// neither overwrite a newer acknowledged write at the new owner nor
/// resurrect a key deleted there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_apply_foreign_after_the_flip_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path()).await;
    let port = s.source_port;
    let keys = s.keys.clone();
    tokio::task::spawn_blocking(move || {
        let mut c = Resp::connect(port);
        for k in &keys {
            ok(c.cmd(&["SET", k, "copied"]));
        }
    })
    .await
    .unwrap();
    push_caught_up(&s, 11).await;
    // Before the flip the registered migration's records are accepted.
    let early = late_put(s.storage_key(&s.keys[5]), "copied");
    s.target
        .apply_foreign_for(&s.migration(11), &[early], true)
        .await
        .unwrap();
    s.source.migrate_fence(11, true).await.unwrap();
    s.flip().await;

    // The new owner takes a write and a delete.
    let target_port = s.port_of(s.target_id);
    let (k_set, k_del) = (s.keys[0].clone(), s.keys[1].clone());
    let (k1, k2) = (k_set.clone(), k_del.clone());
    tokio::task::spawn_blocking(move || {
        let mut c = Resp::connect(target_port);
        ok(c.cmd(&["SET", &k1, "newer"]));
        assert_eq!(c.cmd(&["DEL", &k2]), Frame::Integer(1));
    })
    .await
    .unwrap();

    // The late records of the old epoch arrive.
    let late = [
        late_put(s.storage_key(&k_set), "stale"),
        late_put(s.storage_key(&k_del), "resurrected"),
    ];
    let applied = s
        .target
        .apply_foreign_for(&s.migration(11), &late, true)
        .await;
    let (v_set, v_del) = tokio::task::spawn_blocking(move || {
        let mut c = Resp::connect(target_port);
        (c.cmd(&["GET", &k_set]), c.cmd(&["EXISTS", &k_del]))
    })
    .await
    .unwrap();
    assert_eq!(
        v_set,
        Frame::Bulk("newer".into()),
        "the acknowledged write stands"
    );
    assert_eq!(v_del, Frame::Integer(0), "the deleted key stays deleted");
    refused(applied, RefusalReason::Owned);
    // Registering again (a push retrying) is refused too.
    refused(
        s.target.migrate_receive(&s.migration(11), true).await,
        RefusalReason::Owned,
    );
    s.source.migrate_stop(11).await.unwrap();
    s.cluster.shutdown().await;
}

/// A target that lost its (volatile) registration, as after a restart, is
/// registered again by the push through the same checks, and the stream
/// goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_push_registers_again_at_a_target_that_lost_the_migration() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path()).await;
    push_caught_up(&s, 13).await;
    s.target
        .migrate_receive(&s.migration(13), false)
        .await
        .unwrap();
    let port = s.source_port;
    let key = s.keys[4].clone();
    tokio::task::spawn_blocking(move || ok(Resp::connect(port).cmd(&["SET", &key, "later"])))
        .await
        .unwrap();
    assert!(
        wait_until(WAIT, || async {
            let st = s.source.migrate_status(13).await.unwrap();
            assert_eq!(st.error, None, "the push failed");
            st.acked_seq >= st.head_seq
        })
        .await,
        "the push catches up again"
    );
    let (src, _) = s.source.digest(&s.range).await.unwrap();
    let (tgt, _) = s.target.digest(&s.range).await.unwrap();
    assert_eq!((src, src.keys), (tgt, 1));
    s.source.migrate_stop(13).await.unwrap();
    s.cluster.shutdown().await;
}
