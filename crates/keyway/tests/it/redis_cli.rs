//! The README's promise, with the real `redis-cli`: `keyway dev` comes up, a
//! key set through one node is read through another, a node that does not
//! own a slot answers MOVED to the right owner, CLUSTER SLOTS/SHARDS agree
//! everywhere and cover every slot once, and redis-benchmark runs clean.

use crate::common;

use common::{DevCluster, Resp, redis_cli};
use keyway_resp::Frame;
use std::process::Command;

#[test]
fn redis_cli_set_on_one_node_get_on_another_and_moved_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(3, dir.path(), &[]);
    let ports = cluster.ports();
    assert_eq!(redis_cli(ports[0], &["-c", "set", "k", "v"]), "OK");
    assert_eq!(redis_cli(ports[2], &["-c", "get", "k"]), "v");

    // Slot of "k" is 7629; exactly one node owns it, every other answers MOVED to it.
    let owner_port = ports
        .iter()
        .copied()
        .find(|p| redis_cli(*p, &["get", "k"]) == "v")
        .expect("some node owns slot 7629");
    for p in ports.iter().copied().filter(|p| *p != owner_port) {
        let out = redis_cli(p, &["get", "k"]);
        // redis-cli prints "(error) " only on a terminal.
        assert_eq!(out, format!("MOVED 7629 127.0.0.1:{owner_port}"));
    }
}

fn slot_coverage(slots: &Frame) -> Vec<u32> {
    let mut counts = vec![0u32; 16384];
    let Frame::Array(ranges) = slots else {
        panic!("CLUSTER SLOTS not an array: {slots:?}")
    };
    for r in ranges {
        let Frame::Array(parts) = r else {
            panic!("range not an array")
        };
        let (Frame::Integer(a), Frame::Integer(b)) = (&parts[0], &parts[1]) else {
            panic!("bad range {parts:?}")
        };
        for s in *a..=*b {
            counts[s as usize] += 1;
        }
    }
    counts
}

fn shard_coverage(shards: &Frame) -> Vec<u32> {
    let mut counts = vec![0u32; 16384];
    let Frame::Array(shards) = shards else {
        panic!("CLUSTER SHARDS not an array")
    };
    for shard in shards {
        // RESP2: a flat array of key, value pairs.
        let Frame::Array(kv) = shard else {
            panic!("shard not an array")
        };
        let slots = kv
            .chunks(2)
            .find(|p| p[0] == Frame::Bulk("slots".into()))
            .map(|p| &p[1])
            .expect("slots field");
        let Frame::Array(bounds) = slots else {
            panic!("slots not an array")
        };
        for pair in bounds.chunks(2) {
            let (Frame::Integer(a), Frame::Integer(b)) = (&pair[0], &pair[1]) else {
                panic!("bad slots")
            };
            for s in *a..=*b {
                counts[s as usize] += 1;
            }
        }
    }
    counts
}

#[test]
fn cluster_slots_and_shards_agree_on_every_node_and_cover_each_slot_once() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(3, dir.path(), &[]);
    let mut first_slots = None;
    let mut first_shards = None;
    for port in cluster.ports() {
        let mut c = Resp::connect(port);
        let slots = c.cmd(&["CLUSTER", "SLOTS"]);
        let shards = c.cmd(&["CLUSTER", "SHARDS"]);
        assert!(
            slot_coverage(&slots).iter().all(|&n| n == 1),
            "CLUSTER SLOTS on {port} does not cover each slot once"
        );
        assert!(
            shard_coverage(&shards).iter().all(|&n| n == 1),
            "CLUSTER SHARDS on {port} does not cover each slot once"
        );
        match (&first_slots, &first_shards) {
            (None, None) => {
                first_slots = Some(slots);
                first_shards = Some(shards);
            }
            (Some(s), Some(h)) => {
                assert_eq!(s, &slots, "CLUSTER SLOTS differs on {port}");
                assert_eq!(h, &shards, "CLUSTER SHARDS differs on {port}");
            }
            _ => unreachable!(),
        }
        let nodes = c.cmd(&["CLUSTER", "NODES"]);
        let Frame::Bulk(text) = nodes else {
            panic!("CLUSTER NODES not a bulk")
        };
        let text = String::from_utf8(text.to_vec()).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert_eq!(text.lines().filter(|l| l.contains("myself")).count(), 1);
    }
}

#[test]
fn redis_benchmark_cluster_mode_runs_without_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(3, dir.path(), &[]);
    let out = Command::new("redis-benchmark")
        .args([
            "--cluster",
            "-p",
            &cluster.ports()[0].to_string(),
            "-t",
            "set,get",
            "-n",
            "20000",
            "-q",
        ])
        .output()
        .expect("run redis-benchmark");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "redis-benchmark failed: {stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("SET:") && stdout.contains("GET:"),
        "no SET/GET figures: {stdout}\n{stderr}"
    );
    let lower = format!("{stdout}{stderr}").to_lowercase();
    assert!(
        !lower.contains("error"),
        "redis-benchmark reported errors: {stdout}\n{stderr}"
    );
}
