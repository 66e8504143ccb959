//! Moving a replica under writes (issue 12, item 7), on a 3-node cluster
//! with replication factor 2 and `--min-in-sync 1`:
//!
//! - `a_replica_move_under_writes_loses_nothing_and_never_refuses_a_write`:
//!   while a client SETs keys of partition P at its primary A, `keyway ctl
//!   move P --replica B --to C` moves P's replica from B to C (the node
//!   with no copy). Every write is acknowledged (never `NOREPLICAS`, never
//!   an error: a replica move never pauses writes), the move reports
//!   `done`, and P ends with C its only replica, in sync, A still primary.
//!   Then A is killed: C is promoted and holds every acknowledged write.

use crate::common;
use crate::repl_fixture;

use common::Resp;
use keyway_map::{NodeId, PartitionMap, PartitionRecord, key_hash_slot};
use keyway_resp::Frame;
use keyway_testkit::wait_until;
use repl_fixture::{ReplCluster, ReplSpec};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

const SYNC_TIMEOUT: Duration = Duration::from_secs(45);
/// Writes acknowledged before the move starts, and after it ended.
const WRITES_AROUND_MOVE: usize = 200;

/// The keys whose slot lies in partition `p`, in a fixed order.
fn keys_in(p: &PartitionRecord) -> impl Iterator<Item = String> + use<> {
    let (a, b) = p.slot_span();
    let id = p.id;
    (0u32..)
        .map(move |i| format!("mv:{id}:{i}"))
        .filter(move |k| (a..=b).contains(&key_hash_slot(k.as_bytes())))
}

fn addr_of(cluster: &ReplCluster, map: &PartitionMap, id: NodeId) -> (u16, String) {
    let port = cluster.ports[cluster.index_of(map, id)];
    (port, format!("127.0.0.1:{port}"))
}

#[test]
fn a_replica_move_under_writes_loses_nothing_and_never_refuses_a_write() {
    let mut cluster = ReplCluster::start(ReplSpec::default());
    let map = wait_until("every partition in sync", SYNC_TIMEOUT, || {
        cluster.all_in_sync()
    })
    .unwrap();
    let p = ReplCluster::partitions(&map)[0].clone();
    let (a, b) = (p.owner, p.replicas[0]);
    let c = *map.nodes.keys().find(|n| !p.has_copy(**n)).unwrap();
    let (a_port, _) = addr_of(&cluster, &map, a);
    let (_, b_addr) = addr_of(&cluster, &map, b);
    let (c_port, c_addr) = addr_of(&cluster, &map, c);
    let keys = keys_in(&p);

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (stop, acked) = (stop.clone(), acked.clone());
        std::thread::spawn(move || -> Result<usize, String> {
            let mut conn = Resp::connect(a_port);
            for (i, key) in keys.enumerate() {
                if stop.load(Ordering::SeqCst) {
                    return Ok(i);
                }
                match conn.cmd(&["SET", &key, &i.to_string()]) {
                    Frame::Simple(s) if s == "OK" => acked.store(i + 1, Ordering::SeqCst),
                    other => return Err(format!("SET {key} (write {i}): {other:?}")),
                }
            }
            unreachable!("the key iterator is endless")
        })
    };
    let written = |n: usize| {
        let acked = acked.clone();
        wait_until("the writer to make progress", SYNC_TIMEOUT, move || {
            (acked.load(Ordering::SeqCst) >= n).then_some(())
        })
    };
    written(WRITES_AROUND_MOVE).unwrap();
    let (ok, out, err) = cluster.ctl(&[
        "--json",
        "move",
        &p.id.to_string(),
        "--replica",
        &b_addr,
        "--to",
        &c_addr,
    ]);
    assert!(ok, "ctl move --replica failed: {out}\n{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rows[0]["outcome"], "done", "{out}\n{err}");
    assert!(err.contains("requested"), "progress printed: {err}");
    let at_move_end = acked.load(Ordering::SeqCst);
    written(at_move_end + WRITES_AROUND_MOVE).unwrap();
    stop.store(true, Ordering::SeqCst);
    let total = writer
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("a write was refused during the replica move: {e}"));
    eprintln!("{total} writes acknowledged, {at_move_end} by the end of the move");

    let row = cluster.map().unwrap().partitions[&p.id].clone();
    assert_eq!(row.owner, a, "a replica move keeps the primary: {row:?}");
    assert_eq!(row.replicas, [c], "{row:?}");
    assert_eq!(row.in_sync, [c], "{row:?}");

    // C holds every acknowledged write: kill A, C is promoted, read it all.
    let a_index = cluster.index_of(&map, a);
    cluster.kill(a_index);
    wait_until("C to be promoted", SYNC_TIMEOUT, || {
        let m = cluster.map()?;
        (m.partitions[&p.id].owner == c).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", cluster.map()));
    let mut conn = Resp::connect(c_port);
    for (i, key) in keys_in(&p).take(total).enumerate() {
        let got = conn.cmd(&["GET", &key]);
        assert_eq!(
            got,
            Frame::Bulk(i.to_string().into_bytes().into()),
            "acknowledged write {i} ({key}) after the move and the failover"
        );
    }
}
