//! Blocking list commands on real nodes (`keyway_node::blocking`):
//! - a `BLPOP` blocked client is woken by an `RPUSH` from another client;
//!   blocked clients are served first blocked, first served; `BLMOVE` and
//!   `BLMPOP` wake the same way; a timeout answers nil after the timeout;
//!   blocked clients are served before the pusher's next command (a chain of
//!   BRPOPLPUSHes too); a client that disconnects while blocked leaves no
//!   waiter behind; a
//!   request pipelined after a blocking command waits for it;
//! - a client blocked on a key whose slot moves away gets `-MOVED` to the
//!   new owner, and the migration of that slot completes while it waits
//!   (a waiter holds nothing on the executor).
//!
//! Blocked clients are observed through `/status` (`blocking.blocked_clients`),
//! never by sleeping. `KEYWAY_TEST_LOG=info` turns the cluster's logs on.

use crate::common;

use common::workload::ctl_json;
use common::{DevCluster, Resp, http_get};
use keyway_resp::Frame;
use keyway_testkit::wait_until;
use std::process::Command;
use std::time::{Duration, Instant};

fn blocked_clients(admin_port: u16) -> u64 {
    let status = http_get(admin_port, "/status").expect("/status");
    let status: serde_json::Value = serde_json::from_str(&status).expect("status json");
    status["blocking"]["blocked_clients"]
        .as_u64()
        .unwrap_or_else(|| panic!("no blocking.blocked_clients in {status}"))
}

fn wait_blocked(admin_port: u16, n: u64) {
    wait_until(
        &format!("{n} blocked clients"),
        Duration::from_secs(10),
        || (blocked_clients(admin_port) == n).then_some(()),
    )
    .unwrap();
}

fn encode(cmds: &[&[&str]]) -> Vec<u8> {
    let mut out = bytes::BytesMut::new();
    for c in cmds {
        let frame = Frame::Array(
            c.iter()
                .map(|a| Frame::Bulk(bytes::Bytes::copy_from_slice(a.as_bytes())))
                .collect(),
        );
        keyway_resp::encode(&frame, keyway_resp::Protocol::Resp2, &mut out);
    }
    out.to_vec()
}

/// Sends `args` without waiting for the reply.
fn send(c: &mut Resp, args: &[&str]) {
    c.send_raw(&encode(&[args])).expect("send");
}

fn pair(k: &'static str, v: &'static str) -> Frame {
    Frame::Array(vec![Frame::bulk(k), Frame::bulk(v)])
}

fn log_level() -> String {
    std::env::var("KEYWAY_TEST_LOG").unwrap_or_else(|_| "warn".into())
}

#[test]
fn blocked_clients_are_woken_by_pushes_in_order_and_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_level();
    let cluster = DevCluster::start(1, &dir.path().join("data"), &["--log", &log]);
    let (port, admin) = (cluster.ports()[0], cluster.admin_port);
    let mut pusher = Resp::connect(port);

    // Woken by a push from another client.
    let mut a = Resp::connect(port);
    send(&mut a, &["BLPOP", "{b}none", "{b}k", "0"]);
    wait_blocked(admin, 1);
    // What Redis's own tests wait on (`wait_for_blocked_client`).
    let info = match pusher.cmd(&["INFO"]) {
        Frame::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
        other => panic!("INFO: {other:?}"),
    };
    assert!(info.contains("\r\nblocked_clients:1\r\n"), "{info}");
    assert_eq!(pusher.cmd(&["RPUSH", "{b}k", "x"]), Frame::Integer(1));
    assert_eq!(a.read_reply().unwrap(), pair("{b}k", "x"));
    wait_blocked(admin, 0);
    assert_eq!(pusher.cmd(&["EXISTS", "{b}k"]), Frame::Integer(0));

    // First blocked, first served: one element each, in blocking order.
    let mut c = Resp::connect(port);
    send(&mut a, &["BRPOP", "{b}k", "0"]);
    wait_blocked(admin, 1);
    send(&mut c, &["BLPOP", "{b}k", "0"]);
    wait_blocked(admin, 2);
    assert_eq!(pusher.cmd(&["RPUSH", "{b}k", "1"]), Frame::Integer(1));
    assert_eq!(a.read_reply().unwrap(), pair("{b}k", "1"));
    wait_blocked(admin, 1);
    assert_eq!(pusher.cmd(&["RPUSH", "{b}k", "2", "3"]), Frame::Integer(2));
    assert_eq!(c.read_reply().unwrap(), pair("{b}k", "2"));
    assert_eq!(
        pusher.cmd(&["LRANGE", "{b}k", "0", "-1"]),
        Frame::Array(vec![Frame::bulk("3")])
    );
    pusher.cmd(&["DEL", "{b}k"]);

    // BLMOVE and BLMPOP wake the same way.
    send(
        &mut a,
        &["BLMOVE", "{b}src", "{b}dst", "LEFT", "RIGHT", "0"],
    );
    send(
        &mut c,
        &["BLMPOP", "0", "2", "{b}x", "{b}y", "RIGHT", "COUNT", "2"],
    );
    wait_blocked(admin, 2);
    pusher.cmd(&["LPUSH", "{b}src", "m"]);
    assert_eq!(a.read_reply().unwrap(), Frame::bulk("m"));
    assert_eq!(
        pusher.cmd(&["LRANGE", "{b}dst", "0", "-1"]),
        Frame::Array(vec![Frame::bulk("m")])
    );
    pusher.cmd(&["RPUSH", "{b}y", "1", "2", "3"]);
    assert_eq!(
        c.read_reply().unwrap(),
        Frame::Array(vec![
            Frame::bulk("{b}y"),
            Frame::Array(vec![Frame::bulk("3"), Frame::bulk("2")])
        ])
    );

    // Blocked clients are served before the pusher's next command, a chain
    // of them included (list.tcl's "Circular BRPOPLPUSH"): the push runs
    // their attempts on its executor thread right after itself.
    for round in 0..20 {
        send(&mut a, &["BRPOPLPUSH", "{b}l1", "{b}l2", "0"]);
        wait_blocked(admin, 1);
        send(&mut c, &["BRPOPLPUSH", "{b}l2", "{b}l1", "0"]);
        wait_blocked(admin, 2);
        assert_eq!(pusher.cmd(&["RPUSH", "{b}l1", "foo"]), Frame::Integer(1));
        assert_eq!(
            pusher.cmd(&["LRANGE", "{b}l1", "0", "-1"]),
            Frame::Array(vec![Frame::bulk("foo")]),
            "round {round}"
        );
        assert_eq!(
            pusher.cmd(&["LLEN", "{b}l2"]),
            Frame::Integer(0),
            "round {round}"
        );
        assert_eq!(a.read_reply().unwrap(), Frame::bulk("foo"));
        assert_eq!(c.read_reply().unwrap(), Frame::bulk("foo"));
        wait_blocked(admin, 0);
        pusher.cmd(&["DEL", "{b}l1"]);
    }

    // A timeout answers nil (the null array) once it passed, not before.
    let began = Instant::now();
    assert_eq!(a.cmd(&["BLPOP", "{b}none", "0.3"]), Frame::NullArray);
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "a 0.3 s timeout took {took:?}"
    );
    assert_eq!(
        a.cmd(&["BRPOPLPUSH", "{b}none", "{b}d", "0.05"]),
        Frame::NullArray
    );
    assert_eq!(
        a.cmd(&["BLPOP", "{b}none", "-1"]),
        Frame::Error("ERR timeout is negative".into())
    );
    wait_blocked(admin, 0);

    // A request pipelined after a blocking command waits for it (and a
    // push from the same pipeline's later requests does not jump ahead).
    a.send_raw(&encode(&[&["BLPOP", "{b}p", "0"], &["PING"]]))
        .unwrap();
    wait_blocked(admin, 1);
    pusher.cmd(&["RPUSH", "{b}p", "v"]);
    assert_eq!(a.read_reply().unwrap(), pair("{b}p", "v"));
    assert_eq!(a.read_reply().unwrap(), Frame::Simple("PONG".into()));

    // Inside MULTI a blocking command does not block.
    assert_eq!(a.cmd(&["MULTI"]), Frame::ok());
    assert_eq!(
        a.cmd(&["BLPOP", "{b}none", "0"]),
        Frame::Simple("QUEUED".into())
    );
    assert_eq!(a.cmd(&["EXEC"]), Frame::Array(vec![Frame::NullArray]));

    // A client that disconnects while blocked leaves no waiter behind.
    send(&mut c, &["BLPOP", "{b}gone", "0"]);
    wait_blocked(admin, 1);
    drop(c);
    wait_blocked(admin, 0);
    pusher.cmd(&["RPUSH", "{b}gone", "kept"]);
    assert_eq!(pusher.cmd(&["LLEN", "{b}gone"]), Frame::Integer(1));

    // CLIENT UNBLOCK: nil (TIMEOUT, the default) or the UNBLOCKED error.
    let Frame::Integer(a_id) = a.cmd(&["CLIENT", "ID"]) else {
        panic!("client id")
    };
    let a_id = a_id.to_string();
    assert_eq!(pusher.cmd(&["CLIENT", "UNBLOCK", &a_id]), Frame::Integer(0));
    send(&mut a, &["BLPOP", "{b}u", "0"]);
    wait_blocked(admin, 1);
    assert_eq!(pusher.cmd(&["CLIENT", "UNBLOCK", &a_id]), Frame::Integer(1));
    assert_eq!(a.read_reply().unwrap(), Frame::NullArray);
    send(&mut a, &["BLMOVE", "{b}u", "{b}v", "LEFT", "LEFT", "0"]);
    wait_blocked(admin, 1);
    assert_eq!(
        pusher.cmd(&["CLIENT", "UNBLOCK", &a_id, "ERROR"]),
        Frame::Integer(1)
    );
    assert_eq!(
        a.read_reply().unwrap(),
        Frame::Error("UNBLOCKED client unblocked via CLIENT UNBLOCK".into())
    );
    wait_blocked(admin, 0);

    // CROSSSLOT as Redis Cluster.
    assert_eq!(
        a.cmd(&["BLPOP", "a", "b", "0"]),
        Frame::Error("CROSSSLOT Keys in request don't hash to the same slot".into())
    );
}

/// The partition id that holds `slot` in `meta`'s map.
fn partition_of(meta: &str, slot: u16) -> u64 {
    let map = ctl_json(meta, &["map"]);
    // Bounds are hex routing keys (`be16(slot)`); an empty start is the
    // beginning, a missing or empty end the end.
    let bound = |v: &serde_json::Value, open: u32| match v.as_str() {
        Some(h) if !h.is_empty() => u32::from_str_radix(h, 16).expect("hex bound"),
        _ => open,
    };
    map["partitions"]
        .as_object()
        .unwrap()
        .values()
        .find(|p| {
            let (start, end) = (bound(&p["start"], 0), bound(&p["end"], 1 << 16));
            start <= u32::from(slot) && u32::from(slot) < end
        })
        .map(|p| p["id"].as_u64().unwrap())
        .expect("a partition of the slot")
}

#[test]
fn a_blocked_client_gets_moved_when_its_slot_moves_and_does_not_hold_up_the_move() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_level();
    let cluster = DevCluster::start(
        2,
        &dir.path().join("data"),
        &[
            "--migration-cleanup-grace-ms",
            "200",
            "--no-rebalance",
            "--log",
            &log,
        ],
    );
    let meta = format!("keyway://127.0.0.1:{}", cluster.base());
    let ports = cluster.ports();
    let Frame::Integer(slot) = Resp::connect(ports[0]).cmd(&["CLUSTER", "KEYSLOT", "{m}k"]) else {
        panic!("keyslot")
    };
    let slot = slot as u16;
    // The node that owns the slot: the one that answers, not MOVED.
    let owner_index = (0..ports.len())
        .find(|&i| {
            !matches!(Resp::connect(ports[i]).cmd(&["LLEN", "{m}k"]),
                Frame::Error(e) if e.starts_with("MOVED"))
        })
        .expect("an owner of {m}");
    let other_index = 1 - owner_index;
    let (owner_port, owner_admin) = (ports[owner_index], cluster.admin_port + owner_index as u16);
    let target = format!("127.0.0.1:{}", ports[other_index]);

    let mut blocked = Resp::connect(owner_port);
    blocked
        .stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    send(&mut blocked, &["BLPOP", "{m}k", "0"]);
    wait_blocked(owner_admin, 1);

    let partition = partition_of(&meta, slot);
    let began = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["ctl", "--meta", &meta, "move", &partition.to_string()])
        .args(["--to", &target, "--wait", "--timeout-secs", "60"])
        .env("KEYWAY_LOG", "warn")
        .output()
        .expect("run keyway ctl move");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(" DONE"),
        "the move of partition {partition} with a client blocked on it failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "moved partition {partition} in {:?} with a client blocked on it",
        began.elapsed()
    );

    // The waiter learns of the move and is redirected to the new owner.
    match blocked.read_reply().expect("a reply to the blocked BLPOP") {
        Frame::Error(e) => assert_eq!(
            e,
            format!("MOVED {slot} {target}"),
            "the blocked client's redirect"
        ),
        other => panic!("the blocked client got {other:?}, not MOVED"),
    }
    wait_blocked(owner_admin, 0);

    // On the new owner it blocks and is woken as usual.
    let mut again = Resp::connect(ports[other_index]);
    send(&mut again, &["BLPOP", "{m}k", "0"]);
    wait_blocked(cluster.admin_port + other_index as u16, 1);
    assert_eq!(
        Resp::connect(ports[other_index]).cmd(&["RPUSH", "{m}k", "after"]),
        Frame::Integer(1)
    );
    assert_eq!(again.read_reply().unwrap(), pair("{m}k", "after"));
}

/// Many blocked consumers and concurrent producers: every pushed element is
/// popped exactly once and no consumer is left waiting while elements
/// remain (no lost wake-up between an empty attempt and its registration).
#[test]
fn concurrent_consumers_pop_every_pushed_element_exactly_once() {
    const CONSUMERS: usize = 6;
    const PRODUCERS: usize = 2;
    const PER_PRODUCER: usize = 400;
    let dir = tempfile::tempdir().unwrap();
    let log = log_level();
    let cluster = DevCluster::start(1, &dir.path().join("data"), &["--log", &log]);
    let port = cluster.ports()[0];
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Resp::connect(port);
                let mut got = Vec::new();
                loop {
                    // Two keys, so wake-ups come from either.
                    match c.cmd(&["BLPOP", "{q}a", "{q}b", "10"]) {
                        Frame::Array(kv) => match &kv[1] {
                            Frame::Bulk(v) if &v[..] == b"stop" => return got,
                            Frame::Bulk(v) => got.push(String::from_utf8_lossy(v).into_owned()),
                            other => panic!("BLPOP value {other:?}"),
                        },
                        other => panic!("a consumer waited 10 s with elements pending: {other:?}"),
                    }
                }
            })
        })
        .collect();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            std::thread::spawn(move || {
                let mut c = Resp::connect(port);
                for i in 0..PER_PRODUCER {
                    let key = if i % 3 == 0 { "{q}b" } else { "{q}a" };
                    let v = format!("{p}:{i}");
                    assert!(matches!(c.cmd(&["RPUSH", key, &v]), Frame::Integer(_)));
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    let mut c = Resp::connect(port);
    for _ in 0..CONSUMERS {
        c.cmd(&["RPUSH", "{q}b", "stop"]);
    }
    let mut all: Vec<String> = consumers
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    all.sort();
    let mut want: Vec<String> = (0..PRODUCERS)
        .flat_map(|p| (0..PER_PRODUCER).map(move |i| format!("{p}:{i}")))
        .collect();
    want.sort();
    assert_eq!(
        all.len(),
        want.len(),
        "popped {} of {}",
        all.len(),
        want.len()
    );
    assert_eq!(all, want, "every element popped exactly once");
    assert_eq!(c.cmd(&["EXISTS", "{q}a", "{q}b"]), Frame::Integer(0));
    wait_blocked(cluster.admin_port, 0);
}
