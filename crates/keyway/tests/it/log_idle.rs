//! Change records switched off while nobody reads a node's log (`log_gc`,
//! `log_keep_idle_ms`: 300 ms under `ClusterSpec::ephemeral`): a move and
//! a `WATCH` begun while the records are off still find every record they
//! need, and the records go off again once their holds are gone.

use crate::common::Resp;
use keyway_client::{Client, ClientConfig};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_manager::request_move;
use keyway_map::{DEFAULT_KEYSPACE, key_hash_slot};
use keyway_resp::Frame;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

/// Whether any node's engine keeps change records now.
fn any_kept(c: &LocalCluster) -> bool {
    (0..c.len()).any(|i| c.node(i).is_some_and(|n| n.shared().engine.log_kept()))
}

async fn until_records_off(c: &LocalCluster, what: &str) {
    let deadline = Instant::now() + WAIT;
    while any_kept(c) {
        assert!(Instant::now() < deadline, "records still kept {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_move_and_a_watch_begun_while_records_are_off_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(2, dir.path().to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    // The move's snapshot lease keeps records after it this long (60 s by
    // default), past the push's own hold.
    spec.node.log_snapshot_hold_ms = 2_000;
    spec.manager = Some(crate::common::manager_without_policies(true));
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    c.wait_serving(WAIT).await.unwrap();
    let seeds: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    let seeds: Vec<&str> = seeds.iter().map(|s| s.as_str()).collect();
    let client = Arc::new(
        Client::connect(&seeds, ClientConfig::default())
            .await
            .unwrap(),
    );

    let map = c.map().await.unwrap();
    let p = map
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(b"k0"))
        .unwrap()
        .clone();
    let keys: Vec<String> = (0..100_000)
        .map(|i| format!("k{i}"))
        .filter(|k| {
            let (first, last) = p.slot_span();
            (first..=last).contains(&key_hash_slot(k.as_bytes()))
        })
        .take(200)
        .collect();
    for k in &keys {
        client.set(k.as_bytes(), b"before").await.unwrap();
    }
    until_records_off(&c, "with no reader").await;
    let owner = (0..c.len())
        .find(|i| c.node(*i).unwrap().id() == p.owner)
        .unwrap();
    let engine = c.node(owner).unwrap().shared().engine.clone();
    assert_eq!(engine.log_start(), engine.last_seq() + 1, "truncated whole");

    // Writes go on through the move; each key's last acknowledged value
    // must be at the new owner.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (client, keys, stop) = (client.clone(), keys.clone(), stop.clone());
        tokio::spawn(async move {
            let mut last: BTreeMap<String, String> = BTreeMap::new();
            let mut round = 0u64;
            while !stop.load(Ordering::Acquire) {
                for k in &keys {
                    let v = format!("w{round}");
                    if client.set(k.as_bytes(), v.as_bytes()).await.is_ok() {
                        last.insert(k.clone(), v);
                    }
                }
                round += 1;
            }
            last
        })
    };
    let target = *map.nodes.keys().find(|n| **n != p.owner).unwrap();
    let rec = request_move(&**c.meta(), p.id, target).await.unwrap();
    let driver = c.manager().expect("a manager").driver();
    let deadline = Instant::now() + WAIT;
    loop {
        let state = driver
            .migrations()
            .await
            .unwrap()
            .into_iter()
            .find(|m| m.id == rec.id)
            .map(|m| m.state);
        match state.as_deref() {
            Some("DONE") => break,
            Some("ABORTED") => panic!("the move aborted"),
            _ => {}
        }
        assert!(Instant::now() < deadline, "the move did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Release);
    let last = writer.await.unwrap();
    assert_eq!(c.map().await.unwrap().partitions[&p.id].owner, target);
    for k in &keys {
        let want = last.get(k).map_or("before", |v| v.as_str());
        let got = client.get(k.as_bytes()).await.unwrap();
        assert_eq!(got.as_deref(), Some(want.as_bytes()), "key {k}");
    }

    // A WATCH of an absent key, begun while records are off: created and
    // deleted meanwhile, the EXEC is refused as Redis refuses it.
    until_records_off(&c, "after the move").await;
    let port: u16 = c.resp_addrs()[(0..c.len())
        .find(|i| c.node(*i).unwrap().id() == target)
        .unwrap()]
    .as_deref()
    .unwrap()
    .rsplit_once(':')
    .unwrap()
    .1
    .parse()
    .unwrap();
    let holds = c
        .node(
            (0..c.len())
                .find(|i| c.node(*i).unwrap().id() == target)
                .unwrap(),
        )
        .unwrap()
        .shared()
        .migrations
        .holds()
        .clone();
    let exec = tokio::task::spawn_blocking(move || {
        let key = "{k0}absent";
        let (mut a, mut b) = (Resp::connect(port), Resp::connect(port));
        assert_eq!(a.cmd(&["WATCH", key]), Frame::ok());
        // Kept for the WATCH however long it lasts, not only for the idle
        // time its arming gives.
        assert!(
            holds.list().iter().any(|h| h.name == "watch"),
            "the WATCH of an absent key leases the log: {:?}",
            holds.list()
        );
        assert_eq!(b.cmd(&["SET", key, "1"]), Frame::ok());
        assert_eq!(b.cmd(&["DEL", key]), Frame::Integer(1));
        assert_eq!(a.cmd(&["MULTI"]), Frame::ok());
        a.cmd(&["SET", key, "2"]);
        a.cmd(&["EXEC"])
    })
    .await
    .unwrap();
    assert!(
        matches!(exec, Frame::NullArray | Frame::Null),
        "EXEC ran although the watched key was created meanwhile: {exec:?}"
    );
    c.shutdown().await;
}
