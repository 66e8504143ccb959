//! Sorted sets on a real node (`keyway dev`, fjall): a client blocked in
//! BZPOPMIN is woken by a ZADD on its key, BZMPOP times out with nil, and a
//! sorted set of 20,000 members answers reads from both ends (the engine's
//! reverse scans), ranks, ranges and a chunked ZSCAN correctly.

use crate::common;

use std::collections::HashSet;

use common::{DevCluster, Resp, free_port_block, http_get};
use keyway_resp::Frame;
use keyway_testkit::wait_until;
use std::time::{Duration, Instant};

const MEMBERS: usize = 20_000;

fn bulk(s: &str) -> Frame {
    Frame::Bulk(bytes::Bytes::copy_from_slice(s.as_bytes()))
}

fn int(f: Frame) -> i64 {
    match f {
        Frame::Integer(n) => n,
        other => panic!("not an integer: {other:?}"),
    }
}

/// A gauge's value in the node's `/metrics`.
fn gauge(cluster: &DevCluster, name: &str) -> i64 {
    let text = http_get(cluster.admin_port, "/metrics").expect("/metrics");
    let want = format!("keyway_{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&want))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as i64)
}

#[test]
fn blocking_pops_wake_and_big_sorted_sets_read_from_both_ends() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_port_block(6);
    let cluster = DevCluster::start_on(1, &dir.path().join("data"), base, &[]);
    let port = cluster.ports()[0];
    let mut c = Resp::connect(port);

    // A client blocked in BZPOPMIN is served by a later ZADD.
    let waiter = std::thread::spawn(move || {
        let mut b = Resp::connect(port);
        b.cmd(&["BZPOPMIN", "{q}none", "{q}k", "10"])
    });
    wait_until(
        "the BZPOPMIN client blocks",
        Duration::from_secs(10),
        || (gauge(&cluster, "blocked_clients") >= 1).then_some(()),
    )
    .expect("blocked");
    assert_eq!(int(c.cmd(&["ZADD", "{q}k", "5", "m", "7", "n"])), 2);
    assert_eq!(
        waiter.join().unwrap(),
        Frame::Array(vec![bulk("{q}k"), bulk("m"), bulk("5")])
    );
    assert_eq!(
        c.cmd(&["ZRANGE", "{q}k", "0", "-1"]),
        Frame::Array(vec![bulk("n")])
    );
    // BZMPOP on nothing times out with nil.
    let start = Instant::now();
    assert_eq!(
        c.cmd(&["BZMPOP", "0.2", "1", "{q}empty", "MAX"]),
        Frame::NullArray
    );
    assert!(start.elapsed() >= Duration::from_millis(200));
    // Served at once when there is something.
    assert_eq!(
        c.cmd(&["BZMPOP", "1", "2", "{q}empty", "{q}k", "MAX"]),
        Frame::Array(vec![
            bulk("{q}k"),
            Frame::Array(vec![Frame::Array(vec![bulk("n"), bulk("7")])])
        ])
    );

    // A big sorted set: scores i, members m<i>.
    for chunk in (0..MEMBERS).collect::<Vec<_>>().chunks(1000) {
        let mut args = vec!["ZADD".to_string(), "big".to_string()];
        for i in chunk {
            args.push(i.to_string());
            args.push(format!("m{i:05}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(int(c.cmd(&args)), chunk.len() as i64);
    }
    assert_eq!(int(c.cmd(&["ZCARD", "big"])), MEMBERS as i64);
    let top = format!("m{:05}", MEMBERS - 1);
    assert_eq!(
        c.cmd(&["ZREVRANGE", "big", "0", "1", "WITHSCORES"]),
        Frame::Array(vec![
            bulk(&top),
            bulk(&(MEMBERS - 1).to_string()),
            bulk(&format!("m{:05}", MEMBERS - 2)),
            bulk(&(MEMBERS - 2).to_string()),
        ])
    );
    assert_eq!(int(c.cmd(&["ZREVRANK", "big", &top])), 0);
    assert_eq!(int(c.cmd(&["ZRANK", "big", "m12345"])), 12345);
    assert_eq!(
        c.cmd(&[
            "ZRANGE", "big", "+inf", "(19997", "BYSCORE", "REV", "LIMIT", "0", "5"
        ]),
        Frame::Array(vec![bulk(&top), bulk(&format!("m{:05}", MEMBERS - 2))])
    );
    assert_eq!(int(c.cmd(&["ZCOUNT", "big", "100", "(200"])), 100);
    assert_eq!(
        c.cmd(&["ZPOPMAX", "big"]),
        Frame::Array(vec![bulk(&top), bulk(&(MEMBERS - 1).to_string())])
    );
    // ZSCAN: every member exactly once, in many calls.
    let mut cursor = "0".to_string();
    let mut seen = HashSet::new();
    let mut calls = 0;
    loop {
        let Frame::Array(r) = c.cmd(&["ZSCAN", "big", &cursor, "COUNT", "500"]) else {
            panic!("zscan")
        };
        let (Frame::Bulk(next), Frame::Array(items)) = (&r[0], &r[1]) else {
            panic!("zscan reply {r:?}")
        };
        for pair in items.chunks(2) {
            let Frame::Bulk(m) = &pair[0] else { panic!() };
            assert!(seen.insert(m.clone()), "{m:?} returned twice");
        }
        calls += 1;
        cursor = String::from_utf8(next.to_vec()).unwrap();
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(seen.len(), MEMBERS - 1);
    assert!(calls >= (MEMBERS - 1) / 500, "{calls} calls");
    drop(cluster);
}
