//! Re-replication after a node is gone for good (issue 13, item 1), with
//! real processes: 4 nodes at replication factor 2 (`--min-in-sync 1`),
//! writes acknowledged at every partition's primary, then `kill -9` of one
//! node and deletion of its data directory. After `--rebalance-down-grace-ms`
//! (and not before) every partition is back to 2 in-sync copies on the 3
//! survivors, the dead node holds nothing, every acknowledged write reads
//! back, and `keyway ctl decommission --force` removes the node.

use crate::common;
use crate::repl_fixture;

use common::Resp;
use keyway_map::{PartitionMap, key_hash_slot};
use keyway_resp::Frame;
use keyway_testkit::wait_until;
use repl_fixture::{ReplCluster, ReplSpec};
use std::time::{Duration, Instant};

const SYNC_TIMEOUT: Duration = Duration::from_secs(60);
const GRACE_MS: u64 = 4_000;
const KEYS: usize = 400;

/// The port of the primary of `key`'s partition.
fn primary_port(cluster: &ReplCluster, map: &PartitionMap, key: &str) -> u16 {
    let slot = key_hash_slot(key.as_bytes());
    let p = ReplCluster::partitions(map)
        .into_iter()
        .find(|p| {
            let (a, b) = p.slot_span();
            (a..=b).contains(&slot)
        })
        .unwrap();
    cluster.ports[cluster.index_of(map, p.owner)]
}

#[test]
fn a_node_lost_for_good_is_re_replicated_on_the_survivors_after_the_grace() {
    let spec = ReplSpec {
        nodes: 4,
        partitions_per_node: 2,
        manager_flags: vec!["--rebalance-down-grace-ms".into(), GRACE_MS.to_string()],
        ..ReplSpec::default()
    };
    let mut cluster = ReplCluster::start(spec);
    let map = wait_until("every partition in sync", SYNC_TIMEOUT, || {
        cluster.all_in_sync()
    })
    .unwrap();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("rr:{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let mut conn = Resp::connect(primary_port(&cluster, &map, key));
        match conn.cmd(&["SET", key, &i.to_string()]) {
            Frame::Simple(s) if s == "OK" => {}
            other => panic!("SET {key}: {other:?}"),
        }
    }
    let dead = cluster.node_id(&map, 3);
    let hit = ReplCluster::partitions(&map)
        .iter()
        .filter(|p| p.has_copy(dead))
        .count();
    assert!(hit > 0);
    let t0 = Instant::now();
    cluster.kill(3);
    std::fs::remove_dir_all(cluster.dir().join("node3")).unwrap();

    // Within the grace: failover only, never a replacement.
    let within = wait_until("node 3's primaries to fail over", SYNC_TIMEOUT, || {
        let m = cluster.map()?;
        (m.owned_by(dead).count() == 0).then_some(m)
    })
    .unwrap();
    if t0.elapsed() < Duration::from_millis(GRACE_MS) {
        for p in ReplCluster::partitions(&within) {
            assert_eq!(1 + p.replicas.len(), 2, "a move on suspicion: {p:?}");
        }
    }
    let (ok, out, err) = cluster.ctl(&["--json", "recovery"]);
    assert!(ok, "{out}\n{err}");
    let view: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        view["leaseless_nodes"][0]["node"],
        dead.to_string(),
        "{out}"
    );

    let after = wait_until("RF 2 on the survivors", SYNC_TIMEOUT, || {
        let m = cluster.map()?;
        let parts = ReplCluster::partitions(&m);
        parts
            .iter()
            .all(|p| !p.has_copy(dead) && p.in_sync_copies() == 2)
            .then_some(m)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", cluster.map()));
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(GRACE_MS),
        "before the grace: {took:?}"
    );
    eprintln!(
        "kill -9 to {hit} partitions back at 2 in-sync copies: {} ms (grace {GRACE_MS} ms)",
        took.as_millis()
    );
    for (i, key) in keys.iter().enumerate() {
        let mut conn = Resp::connect(primary_port(&cluster, &after, key));
        let got = conn.cmd(&["GET", key]);
        assert_eq!(
            got,
            Frame::Bulk(i.to_string().into_bytes().into()),
            "acknowledged write {key} lost"
        );
    }
    let (ok, out, err) = cluster.ctl(&["decommission", "--force", &dead.to_string()]);
    assert!(ok, "decommission --force: {out}\n{err}");
    let m = cluster.map().unwrap();
    assert!(!m.nodes.contains_key(&dead));
}

/// The stray sweep's figures on a node's `/metrics`.
fn swept_entries(admin_port: u16) -> u64 {
    let text = common::http_get(admin_port, "/metrics").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("keyway_stray_sweep_dropped_entries_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

#[test]
fn a_node_back_after_it_was_replaced_serves_none_of_its_old_data_and_drops_it() {
    const SWEEP_GRACE_MS: u64 = 2_000;
    let spec = ReplSpec {
        nodes: 4,
        partitions_per_node: 2,
        manager_flags: vec!["--rebalance-down-grace-ms".into(), GRACE_MS.to_string()],
        node_flags: vec![
            "--stray-sweep-interval-ms".into(),
            "300".into(),
            "--stray-sweep-grace-ms".into(),
            SWEEP_GRACE_MS.to_string(),
        ],
        ..ReplSpec::default()
    };
    let mut cluster = ReplCluster::start(spec);
    let map = wait_until("every partition in sync", SYNC_TIMEOUT, || {
        cluster.all_in_sync()
    })
    .unwrap();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("rb:{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let mut conn = Resp::connect(primary_port(&cluster, &map, key));
        assert_eq!(
            conn.cmd(&["SET", key, &i.to_string()]),
            Frame::Simple("OK".into())
        );
    }
    let victim = 3;
    let dead = cluster.node_id(&map, victim);
    let held: Vec<&String> = keys
        .iter()
        .filter(|k| {
            let slot = key_hash_slot(k.as_bytes());
            ReplCluster::partitions(&map).iter().any(|p| {
                let (a, b) = p.slot_span();
                (a..=b).contains(&slot) && p.has_copy(dead)
            })
        })
        .collect();
    assert!(!held.is_empty());
    cluster.kill(victim);
    let after = wait_until("RF 2 without node 3", SYNC_TIMEOUT, || {
        let m = cluster.map()?;
        ReplCluster::partitions(&m)
            .iter()
            .all(|p| !p.has_copy(dead) && p.in_sync_copies() == 2)
            .then_some(m)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", cluster.map()));
    // Back with its old data directory: it holds no copy in the map.
    cluster.restart(victim);
    let port = cluster.ports[victim];
    let admin = cluster.admin_ports[victim];
    let mut plain = Resp::connect(port);
    // Until its lease is back it answers CLUSTERDOWN; then MOVED, never a value.
    wait_until(
        "node 3 to hold its lease again",
        SYNC_TIMEOUT,
        || match plain.cmd(&["GET", held[0]]) {
            Frame::Error(e) if e.starts_with("CLUSTERDOWN") => None,
            _ => Some(()),
        },
    )
    .unwrap();
    let mut readonly = Resp::connect(port);
    assert_eq!(readonly.cmd(&["READONLY"]), Frame::Simple("OK".into()));
    for key in &held {
        for conn in [&mut plain, &mut readonly] {
            match conn.cmd(&["GET", key]) {
                Frame::Error(e) if e.starts_with("MOVED ") => {}
                other => panic!("node{victim} served {key} it holds no copy of: {other:?}"),
            }
        }
    }
    // After the sweep's grace, all of it is dropped.
    let swept = wait_until(
        "the stray sweep to drop node 3's old data",
        SYNC_TIMEOUT,
        || (swept_entries(admin) >= held.len() as u64).then_some(()),
    );
    swept.unwrap_or_else(|e| panic!("{e}: swept {}", swept_entries(admin)));
    for (i, key) in keys.iter().enumerate() {
        let mut conn = Resp::connect(primary_port(&cluster, &after, key));
        assert_eq!(
            conn.cmd(&["GET", key]),
            Frame::Bulk(i.to_string().into_bytes().into()),
            "{key} lost"
        );
    }
}
