//! A connection's pipeline keeps its order when its requests run inline on
//! the connection's own shard thread (`executor.rs`, 8), on a real node
//! with each durability:
//! - a read after a write of the same key in one pipeline sees it (the
//!   write ran inline, its reply waits for the group's fsync, and the read's
//!   with it);
//! - a request queued rather than run inline (a script, which runs aside)
//!   keeps every later request of the pipeline behind it: a GET sent in
//!   the same write as an EVAL that sets its key sees the script's value;
//! - 2,000 pipelined INCRs count exactly;
//! - `/metrics` shows the requests ran inline (else this tests the queue).
//!
//! Two shard threads, and two connections placed on them in turn: one
//! runs the key's requests inline, the other queues them on the key's
//! thread; both see the same order.

use crate::common;

use common::{DevCluster, Resp};
use keyway_resp::{Frame, Protocol};

fn pipeline(c: &mut Resp, commands: &[Vec<String>]) -> Vec<Frame> {
    let mut out = bytes::BytesMut::new();
    for args in commands {
        let frame = Frame::Array(args.iter().map(|a| Frame::bulk(a.clone())).collect());
        keyway_resp::encode(&frame, Protocol::Resp2, &mut out);
    }
    c.send_raw(&out).unwrap();
    (0..commands.len())
        .map(|_| c.read_reply().unwrap())
        .collect()
}

fn cmd(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

fn metric(admin_port: u16, name: &str) -> u64 {
    let text = common::http_get(admin_port, "/metrics").expect("node /metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not on /metrics"))
}

fn check_order(durability: &str) {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(
        1,
        &dir.path().join("data"),
        &[
            "--no-rebalance",
            "--executor-threads",
            "2",
            "--durability",
            durability,
        ],
    );
    let inline_before = metric(cluster.admin_port, "keyway_inline_runs_total");
    let mut clients: Vec<_> = (0..2).map(|_| Resp::connect(cluster.ports()[0])).collect();
    for (n, c) in clients.iter_mut().enumerate() {
        check_connection(
            c,
            &format!("{durability}, connection {n}"),
            &format!("{{p}}{n}"),
        );
    }
    let inline = metric(cluster.admin_port, "keyway_inline_runs_total") - inline_before;
    assert!(
        inline >= 2_000,
        "{durability}: only {inline} requests ran inline: the test exercised the queue"
    );
}

/// The checks on one connection; `tag` makes its keys its own (all in the
/// slot of `{p}`: on one thread, which only one of the connections is on).
fn check_connection(c: &mut Resp, durability: &str, tag: &str) {
    let key = |name: &str| format!("{tag}{name}");

    // Write then read, many times over, in one pipeline.
    let mut commands = Vec::new();
    for i in 0..200 {
        commands.push(cmd(&["SET", &key("k"), &format!("v{i}")]));
        commands.push(cmd(&["GET", &key("k")]));
    }
    let replies = pipeline(c, &commands);
    for (i, pair) in replies.chunks(2).enumerate() {
        assert_eq!(pair[0], Frame::ok(), "{durability}: SET {i}");
        assert_eq!(
            pair[1],
            Frame::bulk(format!("v{i}")),
            "{durability}: GET {i}"
        );
    }

    // A script (queued, runs aside) then reads of its key: behind it.
    let script = "redis.call('set', KEYS[1], ARGV[1]); return 1";
    for round in 0..20 {
        let value = format!("s{round}");
        let replies = pipeline(
            c,
            &[
                cmd(&["EVAL", script, "1", &key("s"), &value]),
                cmd(&["GET", &key("s")]),
                cmd(&["APPEND", &key("s"), "+"]),
                cmd(&["GET", &key("s")]),
            ],
        );
        assert_eq!(replies[0], Frame::Integer(1), "{durability}: EVAL {round}");
        assert_eq!(
            replies[1],
            Frame::bulk(value.clone()),
            "{durability}: GET after EVAL {round}"
        );
        assert_eq!(
            replies[3],
            Frame::bulk(format!("{value}+")),
            "{durability}: GET after APPEND {round}"
        );
    }

    // Exact counts.
    let incrs: Vec<_> = (0..2_000).map(|_| cmd(&["INCR", &key("n")])).collect();
    let replies = pipeline(c, &incrs);
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(*r, Frame::Integer(i as i64 + 1), "{durability}: INCR {i}");
    }
    assert_eq!(c.cmd(&["GET", &key("n")]), Frame::bulk("2000"));
}

#[test]
fn a_pipeline_keeps_its_order_when_its_requests_run_inline_group() {
    check_order("group");
}

#[test]
fn a_pipeline_keeps_its_order_when_its_requests_run_inline_periodic_and_always() {
    check_order("periodic");
    check_order("always");
}
