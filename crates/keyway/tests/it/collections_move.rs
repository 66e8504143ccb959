//! Collections through a move and back: content, TTLs, versions and garbage.
//!
//! One partition (hash tag `{cm}`) holds a hash with a TTL, a set, a list
//! whose head was popped, a sorted set, a hash, a list and a sorted set
//! deleted just before the move (their sub-entries garbage), a hash deleted
//! and created again (a new version over the old one's garbage), and a hash
//! that expires once it has moved. The partition moves to the other node
//! and back. At each owner: every live key holds exactly its content, the
//! TTL survived, the deleted and expired keys are gone, `DBSIZE` counts keys
//! not entries; and across both nodes exactly the dead sub-entries were
//! reclaimed (the `collection_garbage_reclaimed_entries` counters add up to
//! the dead fields, none twice, none missed), whichever node's walk got to
//! them: the source's before its copy or during the stream, the target's
//! after the flip.

use crate::common;

use common::workload::ctl_json;
use common::{DevCluster, Resp, http_get, keyway_bin};
use keyway_resp::Frame;
use keyway_testkit::wait_until;
use std::process::Command;
use std::time::Duration;

const DEAD_FIELDS: usize = 2_000;
const REBORN_OLD_FIELDS: usize = 1_000;
const SOON_FIELDS: usize = 300;
const LIVE_FIELDS: usize = 500;
const SET_MEMBERS: usize = 700;
const LIST_ELEMENTS: usize = 600;
/// Popped from the list's head before the move (its head index moves on).
const LIST_POPPED: usize = 100;
const ZSET_MEMBERS: usize = 400;
/// A deleted list's elements, and a deleted sorted set's members (two
/// sub-entries each: the member and its score index entry).
const LIST_DEAD: usize = 200;
const ZSET_DEAD: usize = 300;
const TTL_MS: i64 = 600_000;
/// Long enough to be still alive when the first move has copied it.
const SOON_TTL_MS: &str = "1500";

fn int(f: Frame) -> i64 {
    match f {
        Frame::Integer(n) => n,
        other => panic!("not an integer: {other:?}"),
    }
}

fn fill(c: &mut Resp, cmd: &str, key: &str, n: usize, tag: &str) {
    let items: Vec<usize> = (0..n).collect();
    for chunk in items.chunks(500) {
        let mut args = vec![cmd.to_string(), key.to_string()];
        for i in chunk {
            if cmd == "ZADD" {
                args.push(i.to_string());
            }
            args.push(format!("{tag}{i}"));
            if cmd == "HSET" {
                args.push(format!("{tag}value{i}"));
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let want = if cmd == "RPUSH" {
            chunk[chunk.len() - 1] + 1
        } else {
            chunk.len()
        };
        assert_eq!(int(c.cmd(&args)), want as i64, "{cmd} {key}");
    }
}

/// Sum of a counter over every node's `/metrics`.
fn counter_sum(cluster: &DevCluster, name: &str) -> u64 {
    let want = format!("keyway_{name}_total ");
    (0..cluster.nodes as u16)
        .map(|i| {
            let text = http_get(cluster.admin_port + i, "/metrics").expect("/metrics");
            text.lines()
                .find_map(|l| l.strip_prefix(&want))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .map_or(0, |v| v as u64)
        })
        .sum()
}

fn sorted_pairs(f: Frame) -> Vec<(String, String)> {
    let Frame::Array(items) = f else {
        panic!("not an array: {f:?}")
    };
    let s = |f: &Frame| match f {
        Frame::Bulk(b) => String::from_utf8(b.to_vec()).unwrap(),
        other => panic!("not a bulk: {other:?}"),
    };
    let mut out: Vec<(String, String)> = items.chunks(2).map(|p| (s(&p[0]), s(&p[1]))).collect();
    out.sort();
    out
}

fn check_content(c: &mut Resp, moved: &str) {
    assert_eq!(
        int(c.cmd(&["HLEN", "{cm}live"])),
        LIVE_FIELDS as i64,
        "{moved}"
    );
    assert_eq!(
        c.cmd(&["HGET", "{cm}live", "l123"]),
        Frame::bulk("lvalue123"),
        "{moved}"
    );
    let pttl = int(c.cmd(&["PTTL", "{cm}live"]));
    assert!(
        pttl > 0 && pttl <= TTL_MS,
        "{moved}: the hash's TTL is {pttl}"
    );
    assert_eq!(
        int(c.cmd(&["SCARD", "{cm}set"])),
        SET_MEMBERS as i64,
        "{moved}"
    );
    assert_eq!(int(c.cmd(&["SISMEMBER", "{cm}set", "s699"])), 1, "{moved}");
    assert_eq!(int(c.cmd(&["PTTL", "{cm}set"])), -1, "{moved}");
    assert_eq!(int(c.cmd(&["EXISTS", "{cm}dead"])), 0, "{moved}");
    assert_eq!(int(c.cmd(&["HLEN", "{cm}dead"])), 0, "{moved}");
    assert_eq!(
        sorted_pairs(c.cmd(&["HGETALL", "{cm}reborn"])),
        vec![
            ("new".to_string(), "1".to_string()),
            ("newer".to_string(), "2".to_string())
        ],
        "{moved}: the re-created hash shows an old version's fields"
    );
    assert_eq!(
        c.cmd(&["TYPE", "{cm}set"]),
        Frame::Simple("set".into()),
        "{moved}"
    );
    let left = (LIST_ELEMENTS - LIST_POPPED) as i64;
    assert_eq!(int(c.cmd(&["LLEN", "{cm}list"])), left, "{moved}");
    assert_eq!(
        c.cmd(&["LINDEX", "{cm}list", "0"]),
        Frame::bulk("e100"),
        "{moved}"
    );
    assert_eq!(
        c.cmd(&["LINDEX", "{cm}list", "-1"]),
        Frame::bulk("e599"),
        "{moved}"
    );
    assert_eq!(
        c.cmd(&["LRANGE", "{cm}list", "250", "251"]),
        Frame::Array(vec![Frame::bulk("e350"), Frame::bulk("e351")]),
        "{moved}"
    );
    assert_eq!(
        int(c.cmd(&["ZCARD", "{cm}zset"])),
        ZSET_MEMBERS as i64,
        "{moved}"
    );
    assert_eq!(int(c.cmd(&["ZRANK", "{cm}zset", "z200"])), 200, "{moved}");
    assert_eq!(
        c.cmd(&["ZSCORE", "{cm}zset", "z399"]),
        Frame::bulk("399"),
        "{moved}"
    );
    assert_eq!(
        c.cmd(&["ZRANGEBYSCORE", "{cm}zset", "(10", "12"]),
        Frame::Array(vec![Frame::bulk("z11"), Frame::bulk("z12")]),
        "{moved}"
    );
    assert_eq!(
        int(c.cmd(&["EXISTS", "{cm}ldead", "{cm}zdead"])),
        0,
        "{moved}"
    );
}

fn move_to(meta: &str, partition: u64, to: &str) {
    let out = Command::new(keyway_bin())
        .args(["ctl", "--meta", meta, "move", &partition.to_string()])
        .args(["--to", to, "--wait", "--timeout-secs", "120"])
        .env("KEYWAY_LOG", "warn")
        .output()
        .expect("run keyway ctl move");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(" DONE"),
        "move of {partition} to {to} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn collections_keep_content_ttl_and_versions_through_a_move_and_back_and_their_garbage_is_reclaimed_once()
 {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(
        2,
        &dir.path().join("data"),
        &[
            "--no-rebalance",
            "--no-auto-split",
            "--no-auto-merge",
            "--migration-cleanup-grace-ms",
            "200",
            "--active-expire-interval-ms",
            "30",
        ],
    );
    let meta = format!("keyway://127.0.0.1:{}", cluster.base());
    let mut any = Resp::connect(cluster.ports()[0]);
    let slot = int(any.cmd(&["CLUSTER", "KEYSLOT", "{cm}"]));
    let map = ctl_json(&meta, &["map"]);
    let hex = |v: &serde_json::Value| v.as_str().map(|s| i64::from_str_radix(s, 16).unwrap());
    let row = map["partitions"]
        .as_object()
        .unwrap()
        .values()
        .find(|p| hex(&p["start"]).unwrap() <= slot && hex(&p["end"]).is_none_or(|e| slot < e))
        .unwrap()
        .clone();
    let partition = row["id"].as_u64().unwrap();
    let owner = row["owner"].as_u64().unwrap().to_string();
    let addrs: Vec<(String, String)> = map["nodes"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(id, n)| (id.clone(), n["resp_addr"].as_str().unwrap().to_string()))
        .collect();
    let source = addrs.iter().find(|(id, _)| *id == owner).unwrap().1.clone();
    let target = addrs.iter().find(|(id, _)| *id != owner).unwrap().1.clone();

    let reclaimed_before = counter_sum(&cluster, "collection_garbage_reclaimed_entries");
    let mut c = Resp::connect(port_of(&source));
    fill(&mut c, "HSET", "{cm}live", LIVE_FIELDS, "l");
    assert_eq!(int(c.cmd(&["PEXPIRE", "{cm}live", &TTL_MS.to_string()])), 1);
    fill(&mut c, "SADD", "{cm}set", SET_MEMBERS, "s");
    fill(&mut c, "HSET", "{cm}reborn", REBORN_OLD_FIELDS, "r");
    fill(&mut c, "HSET", "{cm}soon", SOON_FIELDS, "x");
    assert_eq!(int(c.cmd(&["PEXPIRE", "{cm}soon", SOON_TTL_MS])), 1);
    fill(&mut c, "RPUSH", "{cm}list", LIST_ELEMENTS, "e");
    let popped = c.cmd(&["LPOP", "{cm}list", &LIST_POPPED.to_string()]);
    assert!(
        matches!(&popped, Frame::Array(v) if v.len() == LIST_POPPED),
        "{popped:?}"
    );
    fill(&mut c, "ZADD", "{cm}zset", ZSET_MEMBERS, "z");
    fill(&mut c, "RPUSH", "{cm}ldead", LIST_DEAD, "x");
    fill(&mut c, "ZADD", "{cm}zdead", ZSET_DEAD, "y");
    fill(&mut c, "HSET", "{cm}dead", DEAD_FIELDS, "d");
    // Garbage right before the move: the source's walk may or may not have
    // reclaimed it when the copy reads it.
    assert_eq!(
        int(c.cmd(&["DEL", "{cm}dead", "{cm}ldead", "{cm}zdead"])),
        3
    );
    assert_eq!(int(c.cmd(&["DEL", "{cm}reborn"])), 1);
    assert_eq!(
        int(c.cmd(&["HSET", "{cm}reborn", "new", "1", "newer", "2"])),
        2
    );

    move_to(&meta, partition, &target);
    let mut t = Resp::connect(port_of(&target));
    match c.cmd(&["HLEN", "{cm}live"]) {
        Frame::Error(e) if e.starts_with("MOVED ") => {}
        other => panic!("the old owner still answers for the moved hash: {other:?}"),
    }
    check_content(&mut t, "after the move");

    // The hash with the short TTL expires at its new owner.
    wait_until(
        "the short-lived hash expires",
        Duration::from_secs(30),
        || (int(t.cmd(&["EXISTS", "{cm}soon"])) == 0).then_some(()),
    )
    .unwrap();
    assert_eq!(
        int(t.cmd(&["DBSIZE"])),
        5,
        "live, set, reborn, list, zset: keys, not entries"
    );

    move_to(&meta, partition, &source);
    let mut c = Resp::connect(port_of(&source));
    check_content(&mut c, "after the move back");
    assert_eq!(int(c.cmd(&["DBSIZE"])), 5);

    // Every dead sub-entry reclaimed exactly once, by whichever owner.
    let dead = (DEAD_FIELDS + REBORN_OLD_FIELDS + SOON_FIELDS + LIST_DEAD + 2 * ZSET_DEAD) as u64;
    let reclaimed = wait_until(
        "every dead sub-entry reclaimed",
        Duration::from_secs(60),
        || {
            let n =
                counter_sum(&cluster, "collection_garbage_reclaimed_entries") - reclaimed_before;
            (n >= dead).then_some(n)
        },
    )
    .unwrap();
    assert_eq!(reclaimed, dead, "sub-entries reclaimed more than once");
}
