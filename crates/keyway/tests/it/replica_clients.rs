//! Real cluster clients read from replicas of a replicated cluster (3 nodes,
//! replication factor 2): redis-py's `RedisCluster(read_from_replicas=True)`
//! and ioredis's `Cluster` with `scaleReads: 'slave'`, unmodified. Each
//! writes unique values and reads every one back right after its
//! acknowledgement; a read that misses the acknowledged value is a stale
//! read, and there must be none. Every node must have served replica reads
//! (its `keyway_replica_reads{outcome="served"}` counter).
//!
//! Every Keyway node here is the primary of one range and a replica of
//! another; `CLUSTER SLOTS` lists its replica role at its replica endpoint
//! (on by default), so both clients see 3 primaries and 3 replicas, as of a
//! Redis cluster of 3 masters and 3 replicas: ioredis sends `READONLY` to
//! the replicas and reads there, and redis-py's commands to all primaries
//! (`scan_iter`) reach every node, which the redis-py test checks too.
//!
//! The replicas serve because the primaries' streams grant them read
//! leases; the tests wait until every partition has an in-sync replica.

use crate::common;

use common::{DevCluster, Resp, http_get, key_in_slot, run};
use keyway_resp::Frame;
use std::process::Command;
use std::time::Duration;

const KEYS: &str = "300";
const ROUNDS: &str = "3";

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// `READONLY` reads of partitions node `i` of `cluster` does not own so
/// far, by outcome (`served` as a replica, `moved` to the primary).
fn replica_reads(cluster: &DevCluster, i: usize, outcome: &str) -> u64 {
    let admin = cluster.admin_port + i as u16;
    let metrics = http_get(admin, "/metrics").expect("the node's /metrics answers");
    let prefix = format!(r#"keyway_replica_reads_total{{outcome="{outcome}"}} "#);
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|n| n.trim().parse().expect("a counter value"))
        .unwrap_or(0)
}

/// `READONLY` reads node `i` of `cluster` served as a replica so far.
fn served(cluster: &DevCluster, i: usize) -> u64 {
    replica_reads(cluster, i, "served")
}

/// Whether every slot range `CLUSTER SLOTS` (asked at `port`) lists has a
/// replica and every listed replica serves a `READONLY` read of its range:
/// then each primary has vouched for its replicas (a fresh cluster's map
/// lists them in sync before their primaries' streams confirm them, and a
/// primary that did not stream to a replica yet takes it out of the set
/// until it has caught up, so a listing alone may still change under the
/// clients).
fn replicas_serve(port: u16) -> bool {
    let serves = |range: &Frame| -> bool {
        let Frame::Array(r) = range else { return false };
        let (Some(Frame::Integer(first)), true) = (r.first(), r.len() >= 4) else {
            return false;
        };
        let key = key_in_slot(*first as u16, ":probe");
        r[3..].iter().all(|node| {
            let Frame::Array(node) = node else {
                return false;
            };
            let Some(Frame::Integer(port)) = node.get(1) else {
                return false;
            };
            let Ok(mut replica) = Resp::try_connect(*port as u16, Duration::from_secs(5)) else {
                return false;
            };
            matches!(replica.try_cmd(&["READONLY"]), Ok(Frame::Simple(_)))
                && matches!(replica.try_cmd(&["GET", &key]), Ok(Frame::Null))
        })
    };
    match Resp::connect(port).cmd(&["CLUSTER", "SLOTS"]) {
        Frame::Array(ranges) => !ranges.is_empty() && ranges.iter().all(serves),
        _ => false,
    }
}

fn wait_for_replicas(port: u16) {
    keyway_testkit::wait_until(
        "every slot range lists a replica that serves its reads",
        Duration::from_secs(30),
        || replicas_serve(port).then_some(()),
    )
    .expect("replicas serving");
}

/// Runs `client` against a fresh replicated cluster and checks its output
/// and every node's replica read counter.
/// Then `then(port)`: more checks on the same cluster.
fn reads_from_replicas(client: impl FnOnce(u16) -> Command, then: impl FnOnce(u16)) {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--replication-factor", "2"];
    let mut cluster = DevCluster::start(3, &dir.path().join("data"), &flags);
    let port = cluster.ports()[0];
    wait_for_replicas(port);
    let before: Vec<u64> = (0..3).map(|i| served(&cluster, i)).collect();
    let out = run(&mut client(port));
    let after: Vec<u64> = (0..3).map(|i| served(&cluster, i)).collect();
    let per_node: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let moved: Vec<u64> = (0..3)
        .map(|i| replica_reads(&cluster, i, "moved"))
        .collect();
    eprintln!("{out}replica reads served per node: {per_node:?}, moved to the primary: {moved:?}");
    assert!(out.contains(" stale 0"), "{out}");
    assert!(
        per_node.iter().all(|n| *n > 0),
        "every node serves replica reads: {per_node:?}"
    );
    then(port);
    cluster.stop();
}

#[test]
fn redis_py_reads_from_replicas_with_no_stale_read() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/replica_reads.py");
    let scan = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/scan_all.py");
    reads_from_replicas(
        |port| {
            let mut cmd = Command::new(python());
            cmd.args([script, &port.to_string(), KEYS, ROUNDS]);
            cmd
        },
        |port| {
            // redis-py sees the 3 main addresses as primaries, the 3 replica
            // endpoints as replicas, and scans every key written.
            let out = run(Command::new(python()).args([scan, &port.to_string()]));
            let field = |name: &str| {
                out.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                    .unwrap_or_else(|| panic!("no {name} in {out}"))
                    .to_string()
            };
            assert_eq!(field("primaries").split(',').count(), 3, "{out}");
            assert_eq!(field("replicas").split(',').count(), 3, "{out}");
            assert_eq!(field("scanned"), KEYS, "{out}");
        },
    );
}

#[test]
fn ioredis_reads_from_replicas_with_no_stale_read() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/js/replica_reads.js");
    reads_from_replicas(
        |port| {
            let mut cmd = Command::new("node");
            cmd.args([script, &port.to_string(), KEYS, ROUNDS]);
            cmd
        },
        |_| {},
    );
}
