//! The final checks, once the load has stopped: every acknowledged write
//! reads back as it left the key, no request bounced between nodes
//! unresolved, the map (ours and `ctl map`'s) is sane, every owner holds a
//! lease, every migration ended, and no process logged a panic.

use super::client::Router;
use super::load::{LoadStats, Want, load_value};
use super::procs::Cluster;
use super::{PRELOAD_VALUE_LEN, REDIRECT_PATIENCE};
use bytes::Bytes;
use keyway_map::{DEFAULT_KEYSPACE, NodeId, NodeState, PartitionMap, key_hash_slot};
use keyway_meta::MetaStore;
use keyway_resp::Frame;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// Reads back every key the load wrote (as its last acknowledged write left
/// it) and every preloaded key; reports the load, the verification and the
/// redirect chains, and asserts nothing was lost, no request bounced
/// unresolved and no DEL found an acknowledged key missing.
pub fn assert_acknowledged_writes(
    map: &PartitionMap,
    load: &LoadStats,
    preloaded: &[String],
    hot_span: (u16, u16),
) {
    let LoadStats {
        want,
        acked_sets: sets,
        acked_overwrites: overwrites,
        acked_dels: dels,
        unknown,
        errors,
        anomalies,
        redirect_chains,
    } = load;
    let in_hot = |key: &str| {
        let s = key_hash_slot(key.as_bytes());
        s >= hot_span.0 && s <= hot_span.1
    };
    let mut expect: Vec<(String, Option<Vec<u8>>)> = want
        .iter()
        .map(|(n, w)| {
            let value = match w {
                Want::Value(v) => Some(load_value(*n, *v).into_bytes()),
                Want::Absent => None,
            };
            (format!("load:{n}"), value)
        })
        .collect();
    let hot_keys = expect.iter().filter(|(k, _)| in_hot(k)).count();
    let deleted = expect.iter().filter(|(_, v)| v.is_none()).count();
    expect.extend(
        preloaded
            .iter()
            .map(|k| (k.clone(), Some(vec![b'p'; PRELOAD_VALUE_LEN]))),
    );
    let t = Instant::now();
    let (bad, verify_chains) = verify(map, &expect);
    eprintln!(
        "load: acknowledged {sets} new keys, {overwrites} overwrites, {dels} deletes; {unknown} outcomes unknown (errors {errors:?})"
    );
    eprintln!(
        "verify: {} keys checked ({} of the load, {hot_keys} of them in the moving partition, {deleted} deleted; {} preloaded) in {:?}: {} lost or wrong",
        expect.len(),
        want.len(),
        preloaded.len(),
        t.elapsed(),
        bad.len()
    );
    let unresolved = redirect_chains
        .iter()
        .filter(|c| {
            c.rsplit(" -> ")
                .next()
                .is_some_and(|last| last.contains("MOVED"))
        })
        .count();
    eprintln!(
        "redirect chains of two hops or more: {} during the load ({unresolved} unresolved after {REDIRECT_PATIENCE:?}), {} during the verification",
        redirect_chains.len(),
        verify_chains.len()
    );
    let mut chains: Vec<&String> = redirect_chains.iter().chain(&verify_chains).collect();
    chains.sort_by_key(|c| !c.contains("UNRESOLVED"));
    for c in chains.iter().take(20) {
        eprintln!("  {c}");
    }
    assert_eq!(
        unresolved, 0,
        "requests bounced between nodes for more than {REDIRECT_PATIENCE:?} (see the chains above)"
    );
    assert!(
        anomalies.is_empty(),
        "{} DELs found acknowledged keys missing, e.g. {:?}",
        anomalies.len(),
        &anomalies[..anomalies.len().min(10)]
    );
    assert!(
        bad.is_empty(),
        "{} acknowledged writes lost or wrong, e.g. {:?}",
        bad.len(),
        &bad[..bad.len().min(10)]
    );
    assert!(hot_keys > 1000, "too few writes hit the moving partition");
}

/// `ctl map --json` agrees with `map` (every partition owned by a node of
/// ours that is up), every owner holds a live lease, `ctl migrations` shows
/// every move ended, and no process logged a panic.
pub fn assert_cluster_settled(
    cluster: &Cluster,
    rt: &tokio::runtime::Runtime,
    meta: &Arc<dyn MetaStore>,
    map: &PartitionMap,
    ours: &[NodeId],
) {
    // `ctl map --json` agrees: every partition owned by a node of ours that is up.
    let json: serde_json::Value = serde_json::from_str(&cluster.ctl(&["--json", "map"])).unwrap();
    let nodes = json["nodes"].as_object().expect("nodes object");
    let parts = json["partitions"].as_object().expect("partitions object");
    assert_eq!(parts.len(), map.partitions.len());
    for (id, p) in parts {
        let owner = &p["owner"];
        let node = nodes
            .values()
            .find(|n| &n["id"] == owner)
            .unwrap_or_else(|| panic!("ctl map: partition {id} owned by unknown node {owner}"));
        assert!(
            ours.iter().any(|o| serde_json::json!(o) == *owner),
            "ctl map: partition {id} owned by {owner}, not one of our nodes"
        );
        assert_eq!(node["state"], "up", "ctl map: partition {id} owner {node}");
    }
    // And every owner holds a live lease.
    let leased: Vec<NodeId> = rt
        .block_on(meta.leases())
        .expect("leases")
        .into_iter()
        .map(|l| l.node)
        .collect();
    for p in map.partitions.values() {
        assert!(
            leased.contains(&p.owner),
            "partition {} owner {} holds no lease (leases: {leased:?})",
            p.id,
            p.owner
        );
    }
    let migrations: serde_json::Value =
        serde_json::from_str(&cluster.ctl(&["--json", "migrations"])).unwrap();
    for m in migrations.as_array().unwrap() {
        let state = m["state"].as_str().unwrap();
        assert!(state == "DONE" || state == "ABORTED", "ctl migrations: {m}");
    }

    // No process panicked (a panic in a task need not kill the process).
    for d in cluster.daemons() {
        let log = std::fs::read_to_string(&d.log).unwrap_or_default();
        assert!(
            !log.contains("panicked"),
            "{} logged a panic (see {})",
            d.label,
            d.log.display()
        );
    }
}

/// GETs every key (pipelined per owner, following `-MOVED` one by one);
/// returns the keys whose value is missing or wrong (or present though
/// deleted), with what was read.
fn verify(
    map: &PartitionMap,
    expect: &[(String, Option<Vec<u8>>)],
) -> (Vec<(String, Frame)>, Vec<String>) {
    let mut router = Router::new(map);
    let mut by_port: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (i, (k, _)) in expect.iter().enumerate() {
        let port = router.routes[key_hash_slot(k.as_bytes()) as usize];
        by_port.entry(port).or_default().push(i);
    }
    let mut bad = Vec::new();
    for (port, idx) in by_port {
        for batch in idx.chunks(1000) {
            let reqs: Vec<Vec<Vec<u8>>> = batch
                .iter()
                .map(|i| vec![b"GET".to_vec(), expect[*i].0.as_bytes().to_vec()])
                .collect();
            let replies = router
                .conn(port)
                .and_then(|c| c.pipeline(&reqs))
                .unwrap_or_else(|e| panic!("verify at {port}: {e}"));
            for (i, reply) in batch.iter().zip(replies) {
                let (key, want) = &expect[*i];
                let reply = match reply {
                    Frame::Error(e) if e.starts_with("MOVED ") => router
                        .request(key, &[b"GET", key.as_bytes()])
                        .unwrap_or_else(|e| panic!("verify GET {key}: {e}")),
                    other => other,
                };
                let wanted = match want {
                    Some(v) => Frame::Bulk(Bytes::copy_from_slice(v)),
                    None => Frame::Null,
                };
                if reply != wanted {
                    bad.push((key.clone(), reply));
                }
            }
        }
    }
    (bad, router.redirect_chains)
}

/// Every partition is owned by one of our (live) nodes, and every slot is covered.
pub fn assert_map_sane(map: &PartitionMap, ours: &[NodeId]) {
    for p in map.partitions.values() {
        assert!(
            ours.contains(&p.owner),
            "partition {} owned by {} which is not a live node",
            p.id,
            p.owner
        );
        assert_eq!(
            map.nodes[&p.owner].state,
            NodeState::Up,
            "partition {} owner {} is not up",
            p.id,
            p.owner
        );
    }
    for slot in 0..keyway_map::SLOT_COUNT {
        assert!(
            map.locate_slot(DEFAULT_KEYSPACE, slot).is_some(),
            "slot {slot} has no partition"
        );
    }
}
