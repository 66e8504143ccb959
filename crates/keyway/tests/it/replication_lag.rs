//! A replica that stops answering (SIGSTOP), on a 3-node cluster with
//! replication factor 2 (`keyway meta --replication-factor 2`).
//!
//! - `a_stopped_replica_leaves_the_in_sync_set_and_rejoins_after_sigcont`:
//!   the stopped node leaves the in-sync set of every partition it
//!   replicates within `replica_lag_timeout_ms` (plus slack for the map
//!   to reach `keyway ctl`), while writes to the partitions it does not
//!   own go on succeeding; right after SIGCONT, a `READONLY` read on it
//!   never shows a value older than the last acknowledged write (it
//!   answers `-MOVED` until back in sync: its read lease lapsed); it
//!   then catches up and rejoins the in-sync set everywhere, and serves
//!   `READONLY` reads of the writes it missed.
//! - `min_in_sync_2_refuses_writes_with_noreplicas_and_serves_reads`: with
//!   `--min-in-sync 2` and one of the two copies stopped, writes to the
//!   partitions it replicates get `-NOREPLICAS Not enough good replicas to
//!   write.`, reads of them still answer the last acknowledged value, and
//!   after SIGCONT writes are accepted again.
//!
//! The node lease TTL is long here (20 s), so no pause lasts long enough
//! for a failover (each write waits up to the lag timeout, one partition
//! after the other): these tests are about the in-sync set alone.

use crate::common;
use crate::repl_fixture;

use common::Resp;
use keyway_map::{NodeId, PartitionMap, PartitionRecord, key_hash_slot};
use keyway_resp::Frame;
use keyway_testkit::wait_until;
use repl_fixture::{ReplCluster, ReplSpec};
use std::time::{Duration, Instant};

/// Slack beyond `replica_lag_timeout_ms` for the shrink to commit and the
/// map to be read back by `keyway ctl` (one process start per poll).
const MAP_SLACK: Duration = Duration::from_millis(2_500);
/// Longest a resumed replica may take to catch up and rejoin everywhere.
const REJOIN_TIMEOUT: Duration = Duration::from_secs(45);
const NOREPLICAS: &str = "NOREPLICAS Not enough good replicas to write.";

fn spec(min_in_sync: u8) -> ReplSpec {
    ReplSpec {
        min_in_sync,
        lease_ttl_ms: 20_000,
        lease_margin_ms: 4_000,
        replica_lag_timeout_ms: 1_500,
        replica_read_lease_ms: 750,
        ..ReplSpec::default()
    }
}

/// A key whose slot lies in partition `p`.
fn key_in(p: &PartitionRecord) -> String {
    let (a, b) = p.slot_span();
    (0u32..)
        .map(|i| format!("lag:{}:{i}", p.id))
        .find(|k| (a..=b).contains(&key_hash_slot(k.as_bytes())))
        .unwrap()
}

fn bulk(f: &Frame) -> Option<String> {
    match f {
        Frame::Bulk(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// The RESP port of node `id`.
fn port_of(cluster: &ReplCluster, map: &PartitionMap, id: NodeId) -> u16 {
    cluster.ports[cluster.index_of(map, id)]
}

/// The partitions `victim` replicates (and does not own), with a key each.
fn replicated_by(map: &PartitionMap, victim: NodeId) -> Vec<(PartitionRecord, String)> {
    ReplCluster::partitions(map)
        .into_iter()
        .filter(|p| p.owner != victim && p.replicas.contains(&victim))
        .map(|p| {
            let k = key_in(&p);
            (p, k)
        })
        .collect()
}

fn set_ok(port: u16, key: &str, value: &str) {
    let reply = Resp::connect(port).cmd(&["SET", key, value]);
    assert_eq!(reply, Frame::Simple("OK".into()), "SET {key} on :{port}");
}

#[test]
fn a_stopped_replica_leaves_the_in_sync_set_and_rejoins_after_sigcont() {
    let spec = spec(1);
    let lag = Duration::from_millis(spec.replica_lag_timeout_ms);
    let cluster = ReplCluster::start(spec);
    let map = wait_until("every partition in sync", REJOIN_TIMEOUT, || {
        cluster.all_in_sync()
    })
    .unwrap();
    let victim_index = 2;
    let victim = cluster.node_id(&map, victim_index);
    let victim_port = cluster.ports[victim_index];
    let watched = replicated_by(&map, victim);
    assert!(!watched.is_empty(), "node{victim_index} replicates nothing");
    for (p, key) in &watched {
        set_ok(port_of(&cluster, &map, p.owner), key, "before");
    }
    // The replica serves READONLY reads while in sync.
    wait_until("a READONLY read on the in-sync replica", lag, || {
        let mut c = Resp::connect(victim_port);
        assert_eq!(c.cmd(&["READONLY"]), Frame::Simple("OK".into()));
        let got = c.cmd(&["GET", &watched[0].1]);
        (bulk(&got).as_deref() == Some("before")).then_some(())
    })
    .unwrap();

    cluster.pause(victim_index);
    let stopped = Instant::now();
    // Writes to the partitions the stopped node replicates go on: each waits
    // at most about the lag timeout, then its primary drops the replica.
    // One writer per partition, all at once, so each shrink is due at about
    // the lag timeout after the stop.
    let writers: Vec<_> = watched
        .iter()
        .map(|(p, key)| {
            let (id, port, key) = (p.id, port_of(&cluster, &map, p.owner), key.clone());
            std::thread::spawn(move || {
                let t = Instant::now();
                set_ok(port, &key, "during");
                (id, t.elapsed())
            })
        })
        .collect();
    for w in writers {
        let (id, waited) = w.join().unwrap();
        assert!(
            waited <= lag + MAP_SLACK,
            "a write to partition {id} waited {waited:?} for the stopped replica (lag timeout {lag:?})"
        );
    }
    let left = (lag + MAP_SLACK).saturating_sub(stopped.elapsed());
    let dropped = wait_until(
        "the stopped replica to leave every in-sync set",
        left,
        || {
            let m = cluster.map()?;
            ReplCluster::partitions(&m)
                .iter()
                .all(|p| !p.in_sync.contains(&victim))
                .then_some(m)
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e} (lag timeout {lag:?} + {MAP_SLACK:?} after SIGSTOP): {:?}",
            cluster.map()
        )
    });
    eprintln!(
        "node{victim_index} left the in-sync sets {:?} after SIGSTOP (lag timeout {lag:?})",
        stopped.elapsed()
    );
    for (p, _) in &watched {
        let now = &dropped.partitions[&p.id];
        assert!(
            now.replicas.contains(&victim),
            "partition {}: the stopped node is still a replica (not in sync): {now:?}",
            p.id
        );
        assert!(now.epoch > p.epoch, "the shrink is a CAS at a new epoch");
    }
    // Writes go on after the shrink too, without waiting.
    for (p, key) in &watched {
        set_ok(port_of(&cluster, &map, p.owner), key, "after");
    }

    cluster.resume(victim_index);
    // Never the stale value: its read lease lapsed while it was stopped.
    let mut ro = Resp::connect(victim_port);
    assert_eq!(ro.cmd(&["READONLY"]), Frame::Simple("OK".into()));
    for (p, key) in &watched {
        match ro.cmd(&["GET", key]) {
            Frame::Error(e) if e.starts_with("MOVED ") => {}
            other => assert_eq!(
                bulk(&other).as_deref(),
                Some("after"),
                "partition {}: READONLY read on the resumed replica",
                p.id
            ),
        }
    }
    let rejoined = Instant::now();
    wait_until(
        "the resumed replica to rejoin every in-sync set",
        REJOIN_TIMEOUT,
        || cluster.all_in_sync(),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}", cluster.map()));
    eprintln!(
        "node{victim_index} back in every in-sync set {:?} after SIGCONT",
        rejoined.elapsed()
    );
    // It caught up: it serves what it missed.
    for (p, key) in &watched {
        wait_until("a READONLY read of the missed write", lag, || {
            let got = ro.cmd(&["GET", key]);
            (bulk(&got).as_deref() == Some("after")).then_some(())
        })
        .unwrap_or_else(|e| panic!("partition {}: {e}", p.id));
    }
}

#[test]
fn min_in_sync_2_refuses_writes_with_noreplicas_and_serves_reads() {
    let spec = spec(2);
    let lag = Duration::from_millis(spec.replica_lag_timeout_ms);
    let cluster = ReplCluster::start(spec);
    let map = wait_until("every partition in sync", REJOIN_TIMEOUT, || {
        cluster.all_in_sync()
    })
    .unwrap();
    let victim_index = 1;
    let victim = cluster.node_id(&map, victim_index);
    let watched = replicated_by(&map, victim);
    assert!(!watched.is_empty());
    for (p, key) in &watched {
        let port = port_of(&cluster, &map, p.owner);
        // Right after bootstrap a primary may still be re-syncing a replica
        // (the node that registered last treats its in-sync sets as from
        // before a restart): NOREPLICAS until it rejoined.
        wait_until(
            "the first write acknowledged",
            REJOIN_TIMEOUT,
            || match Resp::connect(port).cmd(&["SET", key, "acked"]) {
                Frame::Simple(ok) if ok == "OK" => Some(()),
                Frame::Error(e) if e == NOREPLICAS => None,
                other => panic!("SET {key}: {other:?}"),
            },
        )
        .unwrap_or_else(|e| panic!("partition {}: {e}", p.id));
    }
    wait_until("every partition in sync again", REJOIN_TIMEOUT, || {
        cluster.all_in_sync()
    })
    .unwrap();

    cluster.pause(victim_index);
    // Once the primary dropped the stopped copy, fewer than 2 copies are
    // in sync: writes are refused before they run, reads are served.
    for (p, key) in &watched {
        let port = port_of(&cluster, &map, p.owner);
        let refused = wait_until("-NOREPLICAS", lag + MAP_SLACK, || {
            match Resp::connect(port).cmd(&["SET", key, "probe"]) {
                Frame::Error(e) => Some(e),
                // Acknowledged while the stopped copy was still in sync
                // (waited out the lag timeout): not yet refused.
                Frame::Simple(ok) if ok == "OK" => None,
                other => panic!("SET {key}: {other:?}"),
            }
        })
        .unwrap_or_else(|e| panic!("partition {}: {e}", p.id));
        assert_eq!(refused, NOREPLICAS, "partition {}", p.id);
        let got = Resp::connect(port).cmd(&["GET", key]);
        let value = bulk(&got);
        assert!(
            matches!(value.as_deref(), Some("acked") | Some("probe")),
            "partition {}: a read while writes are refused: {got:?}",
            p.id
        );
        // A refused write did not run: the value is the last acknowledged one.
        let again = Resp::connect(port).cmd(&["SET", key, "refused-2"]);
        assert_eq!(again, Frame::Error(NOREPLICAS.into()));
        assert_ne!(
            bulk(&Resp::connect(port).cmd(&["GET", key])).as_deref(),
            Some("refused-2"),
            "a write refused with NOREPLICAS took effect"
        );
    }

    cluster.resume(victim_index);
    wait_until(
        "the resumed copy to rejoin every in-sync set",
        REJOIN_TIMEOUT,
        || cluster.all_in_sync(),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}", cluster.map()));
    for (p, key) in &watched {
        set_ok(port_of(&cluster, &map, p.owner), key, "accepted-again");
    }
}
