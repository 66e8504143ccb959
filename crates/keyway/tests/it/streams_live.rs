//! Streams on real nodes:
//! - a stream with consumer groups, pending entries, consumers, deleted
//!   entries and a TTL moves live to the other node and back (in chunks, like
//!   any collection) and keeps everything: `XINFO STREAM FULL` (every entry,
//!   group, pending entry and consumer with its times) is the same at each
//!   owner, and the groups go on delivering after the move;
//! - `XREAD BLOCK` (with `$`) and `XREADGROUP BLOCK` (with `>`) are woken
//!   by an `XADD` from another client, and time out with nil; a blocked
//!   `XREADGROUP` ends with an error when its group or stream goes.
//!
//! Blocked clients are observed through `/status`, never by sleeping.

use crate::common;

use common::workload::ctl_json;
use common::{DevCluster, Resp, http_get, keyway_bin};
use keyway_resp::Frame;
use keyway_testkit::wait_until;
use std::process::Command;
use std::time::{Duration, Instant};

const ENTRIES: usize = 1_500;

fn int(f: Frame) -> i64 {
    match f {
        Frame::Integer(n) => n,
        other => panic!("not an integer: {other:?}"),
    }
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

fn entry(id: &str, f: &str, v: &str) -> Frame {
    Frame::Array(vec![
        Frame::bulk(id.to_owned()),
        Frame::Array(vec![Frame::bulk(f.to_owned()), Frame::bulk(v.to_owned())]),
    ])
}

#[test]
fn a_stream_with_groups_moves_live_and_back_and_keeps_its_content() {
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
        ],
    );
    let meta = format!("keyway://127.0.0.1:{}", cluster.base());
    let mut any = Resp::connect(cluster.ports()[0]);
    let slot = int(any.cmd(&["CLUSTER", "KEYSLOT", "{st}"]));
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

    let mut c = Resp::connect(port_of(&source));
    let key = "{st}events";
    for i in 1..=ENTRIES {
        let id = format!("{i}-1");
        assert_eq!(
            c.cmd(&["XADD", key, &id, "n", &i.to_string()]),
            Frame::bulk(id.clone())
        );
    }
    assert_eq!(
        c.cmd(&["XGROUP", "CREATE", key, "workers", "0"]),
        Frame::ok()
    );
    assert_eq!(c.cmd(&["XGROUP", "CREATE", key, "audit", "$"]), Frame::ok());
    let read = c.cmd(&[
        "XREADGROUP",
        "GROUP",
        "workers",
        "alice",
        "COUNT",
        "300",
        "STREAMS",
        key,
        ">",
    ]);
    assert!(matches!(&read, Frame::Array(s) if s.len() == 1), "{read:?}");
    c.cmd(&[
        "XREADGROUP",
        "GROUP",
        "workers",
        "bob",
        "COUNT",
        "200",
        "STREAMS",
        key,
        ">",
    ]);
    assert_eq!(
        int(c.cmd(&["XACK", key, "workers", "1-1", "2-1", "301-1"])),
        3
    );
    assert_eq!(
        int(c.cmd(&["XGROUP", "CREATECONSUMER", key, "audit", "carol"])),
        1
    );
    assert_eq!(int(c.cmd(&["XDEL", key, "10-1", "1500-1"])), 2);
    assert_eq!(int(c.cmd(&["PEXPIRE", key, "600000"])), 1);
    // A deleted stream's sub-entries are garbage the move may carry or not.
    c.cmd(&["XADD", "{st}gone", "1-1", "a", "b"]);
    c.cmd(&["XGROUP", "CREATE", "{st}gone", "g", "0"]);
    assert_eq!(int(c.cmd(&["DEL", "{st}gone"])), 1);

    let full = c.cmd(&["XINFO", "STREAM", key, "FULL", "COUNT", "0"]);
    let pending = c.cmd(&["XPENDING", key, "workers"]);
    assert_eq!(
        pending,
        Frame::Array(vec![
            Frame::Integer(497),
            Frame::bulk("3-1"),
            Frame::bulk("500-1"),
            Frame::Array(vec![
                Frame::Array(vec![Frame::bulk("alice"), Frame::bulk("298")]),
                Frame::Array(vec![Frame::bulk("bob"), Frame::bulk("199")]),
            ]),
        ])
    );

    move_to(&meta, partition, &target);
    let mut t = Resp::connect(port_of(&target));
    match c.cmd(&["XLEN", key]) {
        Frame::Error(e) if e.starts_with("MOVED ") => {}
        other => panic!("the old owner still answers for the moved stream: {other:?}"),
    }
    assert_eq!(int(t.cmd(&["XLEN", key])), (ENTRIES - 2) as i64);
    assert_eq!(
        t.cmd(&["XINFO", "STREAM", key, "FULL", "COUNT", "0"]),
        full,
        "XINFO STREAM FULL after the move"
    );
    assert_eq!(t.cmd(&["XPENDING", key, "workers"]), pending);
    let pttl = int(t.cmd(&["PTTL", key]));
    assert!(
        pttl > 0 && pttl <= 600_000,
        "the TTL after the move: {pttl}"
    );
    assert_eq!(int(t.cmd(&["EXISTS", "{st}gone"])), 0);
    assert_eq!(t.cmd(&["TYPE", key]), Frame::Simple("stream".into()));

    // The groups go on where they were.
    assert_eq!(
        t.cmd(&[
            "XREADGROUP",
            "GROUP",
            "workers",
            "alice",
            "COUNT",
            "1",
            "STREAMS",
            key,
            ">",
        ]),
        Frame::Array(vec![Frame::Array(vec![
            Frame::bulk(key),
            Frame::Array(vec![entry("501-1", "n", "501")]),
        ])])
    );
    let added = t.cmd(&["XADD", key, "*", "n", "new"]);
    assert_eq!(last_generated_id(t.cmd(&["XINFO", "STREAM", key])), added);
    let full = t.cmd(&["XINFO", "STREAM", key, "FULL", "COUNT", "0"]);

    move_to(&meta, partition, &source);
    let mut c = Resp::connect(port_of(&source));
    assert_eq!(
        c.cmd(&["XINFO", "STREAM", key, "FULL", "COUNT", "0"]),
        full,
        "XINFO STREAM FULL after the move back"
    );
    assert_eq!(int(c.cmd(&["DBSIZE"])), 1);
}

/// The value after `last-generated-id` in an `XINFO STREAM` reply.
fn last_generated_id(info: Frame) -> Frame {
    let Frame::Array(items) = info else {
        panic!("not an array: {info:?}")
    };
    let at = items
        .iter()
        .position(|f| *f == Frame::bulk("last-generated-id"))
        .expect("last-generated-id");
    items[at + 1].clone()
}

fn blocked_clients(admin_port: u16) -> u64 {
    let status = http_get(admin_port, "/status").expect("/status");
    let status: serde_json::Value = serde_json::from_str(&status).expect("status json");
    status["blocking"]["blocked_clients"].as_u64().unwrap()
}

fn wait_blocked(admin_port: u16, n: u64) {
    wait_until(
        &format!("{n} blocked clients"),
        Duration::from_secs(10),
        || (blocked_clients(admin_port) == n).then_some(()),
    )
    .unwrap();
}

fn send(c: &mut Resp, args: &[&str]) {
    let mut out = bytes::BytesMut::new();
    let frame = Frame::Array(
        args.iter()
            .map(|a| Frame::Bulk(bytes::Bytes::copy_from_slice(a.as_bytes())))
            .collect(),
    );
    keyway_resp::encode(&frame, keyway_resp::Protocol::Resp2, &mut out);
    c.send_raw(&out).expect("send");
}

#[test]
fn blocked_stream_readers_are_woken_by_xadd_and_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(1, &dir.path().join("data"), &[]);
    let (port, admin) = (cluster.ports()[0], cluster.admin_port);
    let mut writer = Resp::connect(port);
    writer.cmd(&["XADD", "{b}s", "1-1", "old", "x"]);
    writer.cmd(&["XGROUP", "CREATE", "{b}s", "g", "$"]);

    // XREAD BLOCK with `$`: only what arrives after it blocked; two readers
    // of one stream are both served by one XADD.
    let mut a = Resp::connect(port);
    let mut b = Resp::connect(port);
    send(&mut a, &["XREAD", "BLOCK", "0", "STREAMS", "{b}s", "$"]);
    send(
        &mut b,
        &[
            "XREAD", "BLOCK", "0", "STREAMS", "{b}none", "{b}s", "$", "$",
        ],
    );
    wait_blocked(admin, 2);
    // An XADD to another stream wakes nobody for good.
    writer.cmd(&["XADD", "{b}other", "1-1", "f", "v"]);
    writer.cmd(&["XADD", "{b}s", "2-1", "new", "y"]);
    let want = Frame::Array(vec![Frame::Array(vec![
        Frame::bulk("{b}s"),
        Frame::Array(vec![entry("2-1", "new", "y")]),
    ])]);
    assert_eq!(a.read_reply().unwrap(), want);
    assert_eq!(b.read_reply().unwrap(), want);
    wait_blocked(admin, 0);

    // XREADGROUP BLOCK with `>`: one of two consumers gets the entry, the
    // other the next one.
    assert_eq!(
        writer.cmd(&["XGROUP", "SETID", "{b}s", "g", "$"]),
        Frame::ok()
    );
    send(
        &mut a,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "alice",
            "BLOCK",
            "0",
            "STREAMS",
            "{b}s",
            ">",
        ],
    );
    wait_blocked(admin, 1);
    send(
        &mut b,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "bob",
            "BLOCK",
            "0",
            "STREAMS",
            "{b}s",
            ">",
        ],
    );
    wait_blocked(admin, 2);
    writer.cmd(&["XADD", "{b}s", "3-1", "n", "3"]);
    let first = a.read_reply().unwrap();
    assert_eq!(
        first,
        Frame::Array(vec![Frame::Array(vec![
            Frame::bulk("{b}s"),
            Frame::Array(vec![entry("3-1", "n", "3")]),
        ])])
    );
    wait_blocked(admin, 1);
    writer.cmd(&["XADD", "{b}s", "4-1", "n", "4"]);
    assert_eq!(
        b.read_reply().unwrap(),
        Frame::Array(vec![Frame::Array(vec![
            Frame::bulk("{b}s"),
            Frame::Array(vec![entry("4-1", "n", "4")]),
        ])])
    );
    match writer.cmd(&["XPENDING", "{b}s", "g"]) {
        Frame::Array(v) => assert_eq!(v[0], Frame::Integer(2)),
        other => panic!("XPENDING: {other:?}"),
    }

    // A blocked XREADGROUP ends when its group is destroyed, its stream
    // deleted or replaced by another type.
    let ends: [(&[&str], &str); 3] = [
        (
            &["XGROUP", "DESTROY", "{b}s", "g"],
            "NOGROUP the consumer group this client was blocked on no longer exists",
        ),
        (
            &["DEL", "{b}s"],
            "UNBLOCKED the stream key no longer exists",
        ),
        (
            &["SET", "{b}s", "v"],
            "UNBLOCKED the stream key no longer exists",
        ),
    ];
    for (end, error) in ends {
        writer.cmd(&["DEL", "{b}s"]);
        writer.cmd(&["XGROUP", "CREATE", "{b}s", "g", "$", "MKSTREAM"]);
        send(
            &mut a,
            &[
                "XREADGROUP",
                "GROUP",
                "g",
                "alice",
                "BLOCK",
                "0",
                "STREAMS",
                "{b}s",
                ">",
            ],
        );
        wait_blocked(admin, 1);
        writer.cmd(end);
        assert_eq!(
            a.read_reply().unwrap(),
            Frame::Error(error.into()),
            "{end:?}"
        );
        wait_blocked(admin, 0);
    }

    writer.cmd(&["DEL", "{b}s"]);

    // A timeout answers the null array after about the timeout.
    let began = Instant::now();
    assert_eq!(
        a.cmd(&["XREAD", "BLOCK", "200", "STREAMS", "{b}s", "$"]),
        Frame::NullArray
    );
    assert!(
        began.elapsed() >= Duration::from_millis(190),
        "{:?}",
        began.elapsed()
    );
    wait_blocked(admin, 0);
}
