//! Lua scripts on a real node (`keyway dev`) and through `keyway proxy`:
//! - EVAL/EVALSHA write and read the script's keys atomically, EVALSHA
//!   after SCRIPT FLUSH is `-NOSCRIPT`, undeclared keys of another slot
//!   are refused;
//! - a script running past `lua-time-limit` makes the node answer `-BUSY`
//!   (inside MULTI the refusal flags the transaction: `-EXECABORT`), SCRIPT
//!   KILL stops it (its client gets the kill error) and the node serves
//!   again; a script that wrote is `-UNKILLABLE`;
//! - the proxy forwards keyed and keyless scripts.
//!
//! Busy is observed by polling a command until it is refused, never by
//! sleeping.

use crate::common;

use common::{DevCluster, Proc, Resp, free_port_block};
use keyway_resp::Frame;
use keyway_testkit::wait_until;
use std::time::Duration;

fn send(c: &mut Resp, args: &[&str]) {
    let frame = Frame::Array(args.iter().map(|a| Frame::bulk(a.to_string())).collect());
    let mut out = bytes::BytesMut::new();
    keyway_resp::encode(&frame, keyway_resp::Protocol::Resp2, &mut out);
    c.send_raw(&out).unwrap();
}

fn err_starts(frame: &Frame, prefix: &str) -> bool {
    matches!(frame, Frame::Error(e) if e.starts_with(prefix))
}

/// Polls PING on `probe` until the node answers -BUSY.
fn wait_busy(probe: &mut Resp) {
    wait_until("the node answers -BUSY", Duration::from_secs(10), || {
        err_starts(&probe.cmd(&["PING"]), "BUSY").then_some(())
    })
    .unwrap();
}

#[test]
fn scripts_run_atomically_busy_scripts_are_killed_and_the_proxy_forwards_them() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(1, &dir.path().join("data"), &["--no-rebalance"]);
    let port = cluster.ports()[0];
    let mut c = Resp::connect(port);

    // Writes and reads of the declared keys, one reply.
    let script = "redis.call('set', KEYS[1], ARGV[1]); redis.call('incr', KEYS[2]); return {redis.call('get', KEYS[1]), redis.call('get', KEYS[2])}";
    assert_eq!(
        c.cmd(&["EVAL", script, "2", "{k}a", "{k}n", "v"]),
        Frame::Array(vec![Frame::bulk("v"), Frame::bulk("1")])
    );
    let Frame::Bulk(sha) = c.cmd(&["SCRIPT", "LOAD", script]) else {
        panic!("SCRIPT LOAD")
    };
    let sha = String::from_utf8(sha.to_vec()).unwrap();
    assert_eq!(
        c.cmd(&["EVALSHA", &sha, "2", "{k}a", "{k}n", "w"]),
        Frame::Array(vec![Frame::bulk("w"), Frame::bulk("2")])
    );
    assert_eq!(c.cmd(&["SCRIPT", "FLUSH"]), Frame::ok());
    assert!(err_starts(&c.cmd(&["EVALSHA", &sha, "0"]), "NOSCRIPT"));
    assert!(err_starts(
        &c.cmd(&["EVAL", "return redis.call('get', 'other')", "1", "{k}a"]),
        "ERR Script attempted to access keys that do not hash to the same slot"
    ));
    assert!(err_starts(
        &c.cmd(&["EVAL", "return 1", "2", "a", "b"]),
        "CROSSSLOT"
    ));
    assert!(err_starts(
        &c.cmd(&[
            "EVAL_RO",
            "return redis.call('set', KEYS[1], 1)",
            "1",
            "{k}a"
        ]),
        "ERR Write commands are not allowed from read-only scripts."
    ));
    assert!(err_starts(&c.cmd(&["SCRIPT", "KILL"]), "NOTBUSY"));

    // A busy script: -BUSY for others (a transaction is flagged), SCRIPT KILL.
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "lua-time-limit", "10"]),
        Frame::ok()
    );
    let mut runner = Resp::connect(port);
    let mut tx = Resp::connect(port);
    let mut probe = Resp::connect(port);
    assert_eq!(tx.cmd(&["MULTI"]), Frame::ok());
    send(&mut runner, &["EVAL", "while true do end", "0"]);
    wait_busy(&mut probe);
    assert!(err_starts(&tx.cmd(&["INCR", "{k}n"]), "BUSY"));
    assert!(err_starts(&probe.cmd(&["GET", "{k}a"]), "BUSY"));
    assert_eq!(probe.cmd(&["SCRIPT", "KILL"]), Frame::ok());
    let killed = runner.read_reply().unwrap();
    assert!(
        err_starts(&killed, "ERR Script killed by user with SCRIPT KILL..."),
        "{killed:?}"
    );
    assert_eq!(probe.cmd(&["GET", "{k}n"]), Frame::bulk("2"));
    assert!(err_starts(&tx.cmd(&["EXEC"]), "EXECABORT"));
    assert_eq!(
        probe.cmd(&["GET", "{k}n"]),
        Frame::bulk("2"),
        "the transaction did not run"
    );
    let status: serde_json::Value =
        serde_json::from_str(&common::http_get(cluster.admin_port, "/status").expect("/status"))
            .unwrap();
    assert_eq!(status["scripts"]["kills"], serde_json::json!(1), "{status}");
    assert!(
        status["scripts"]["busy_refusals"].as_u64().unwrap() >= 3,
        "{status}"
    );
    assert_eq!(
        status["scripts"]["running"],
        serde_json::json!(0),
        "{status}"
    );

    // Through the proxy: keyed and keyless scripts.
    let meta = format!("keyway://127.0.0.1:{}", cluster.base());
    let base = free_port_block(2);
    let _proxy = Proc::spawn(
        &[
            "proxy".to_string(),
            "--meta".into(),
            meta,
            "--listen".into(),
            format!("127.0.0.1:{base}"),
            "--admin-listen".into(),
            format!("127.0.0.1:{}", base + 1),
        ],
        "serving",
    );
    let mut p = Resp::connect(base);
    assert_eq!(
        p.cmd(&["EVAL", "return redis.call('incr', KEYS[1])", "1", "{k}n"]),
        Frame::Integer(3)
    );
    assert_eq!(
        p.cmd(&["EVAL", "return {1, 'two'}", "0"]),
        Frame::Array(vec![Frame::Integer(1), Frame::bulk("two")])
    );

    // A script that wrote cannot be killed (the node is dropped with it).
    send(
        &mut runner,
        &[
            "EVAL",
            "redis.call('set', KEYS[1], 'x') while true do end",
            "1",
            "{k}w",
        ],
    );
    wait_busy(&mut probe);
    assert!(err_starts(&probe.cmd(&["SCRIPT", "KILL"]), "UNKILLABLE"));
}
