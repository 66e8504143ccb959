//! Collections on a real node: they survive a restart, their sub-entries
//! never show as keys (DBSIZE, SCAN, KEYS-like walks), and deleting a big
//! one is O(1) at the command with its sub-entries reclaimed in the
//! background by the owner (the `keyway_collection_garbage_reclaimed_entries`
//! counter), after which the partition's engine holds nothing of it.

use crate::common;

use common::{DevCluster, Resp, free_port_block, http_get};
use keyway_resp::Frame;
use keyway_testkit::wait_until;
use std::time::Duration;

const FIELDS: usize = 3_000;

fn int(f: Frame) -> i64 {
    match f {
        Frame::Integer(n) => n,
        other => panic!("not an integer: {other:?}"),
    }
}

/// A counter's value in node 0's `/metrics`.
fn counter(cluster: &DevCluster, name: &str) -> u64 {
    let text = http_get(cluster.admin_port, "/metrics").expect("/metrics");
    let want = format!("keyway_{name}_total ");
    text.lines()
        .find_map(|l| l.strip_prefix(&want))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

#[test]
fn collections_survive_restart_hide_their_entries_and_are_reclaimed_after_delete() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_port_block(6);
    let extra = ["--active-expire-interval-ms", "30"];
    let mut cluster = DevCluster::start_on(1, &data, base, &extra);
    let port = cluster.ports()[0];
    let mut c = Resp::connect(port);
    for chunk in (0..FIELDS).collect::<Vec<_>>().chunks(500) {
        let mut args = vec!["HSET".to_string(), "big".to_string()];
        for i in chunk {
            args.push(format!("field:{i}"));
            args.push(i.to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        c.cmd(&args);
    }
    assert_eq!(int(c.cmd(&["SADD", "s", "a", "b", "c"])), 3);
    assert_eq!(c.cmd(&["SET", "str", "v"]), Frame::ok());
    assert_eq!(int(c.cmd(&["HLEN", "big"])), FIELDS as i64);
    // Three keys, however many entries they have.
    assert_eq!(int(c.cmd(&["DBSIZE"])), 3);
    let Frame::Array(scan) = c.cmd(&["SCAN", "0", "COUNT", "100000"]) else {
        panic!("scan")
    };
    let Frame::Array(keys) = &scan[1] else {
        panic!("scan keys")
    };
    assert_eq!(keys.len(), 3, "{keys:?}");
    let Frame::Array(hashes) = c.cmd(&["SCAN", "0", "COUNT", "100000", "TYPE", "hash"]) else {
        panic!("scan type")
    };
    assert_eq!(hashes[1], Frame::Array(vec![Frame::bulk("big")]));

    // A clean restart keeps everything.
    drop(c);
    cluster.stop();
    let cluster = DevCluster::start_on(1, &data, base, &extra);
    let mut c = Resp::connect(port);
    assert_eq!(int(c.cmd(&["HLEN", "big"])), FIELDS as i64);
    assert_eq!(c.cmd(&["HGET", "big", "field:1234"]), Frame::bulk("1234"));
    assert_eq!(int(c.cmd(&["SCARD", "s"])), 3);

    // DEL is one meta delete; the walk reclaims every sub-entry.
    let before = counter(&cluster, "collection_garbage_reclaimed_entries");
    assert_eq!(int(c.cmd(&["DEL", "big"])), 1);
    assert_eq!(int(c.cmd(&["HLEN", "big"])), 0);
    assert_eq!(int(c.cmd(&["HSET", "big", "new", "1"])), 1);
    let reclaimed = wait_until(
        "the old hash's sub-entries reclaimed",
        Duration::from_secs(60),
        || {
            let n = counter(&cluster, "collection_garbage_reclaimed_entries") - before;
            (n >= FIELDS as u64).then_some(n)
        },
    )
    .unwrap();
    assert_eq!(
        reclaimed, FIELDS as u64,
        "exactly the dead fields are reclaimed"
    );
    // The live hash (a new version of the same key) is untouched.
    assert_eq!(
        c.cmd(&["HGETALL", "big"]),
        Frame::Array(vec![Frame::bulk("new"), Frame::bulk("1")])
    );
    assert_eq!(int(c.cmd(&["DBSIZE"])), 3);
}
