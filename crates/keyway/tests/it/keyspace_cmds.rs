//! The keyspace commands on real nodes: KEYS and RANDOMKEY are node-wide
//! (each node answers for the keys it owns, never for a collection's
//! sub-entries), the multi-key ones (RENAME, COPY, SORT ... STORE) stay in
//! one slot, OBJECT HELP needs no key, and a DUMP payload RESTOREs on
//! another node over the wire.

use crate::common;

use common::{DevCluster, Resp};
use keyway_resp::Frame;
use std::collections::BTreeSet;

fn names(f: Frame) -> BTreeSet<String> {
    match f {
        Frame::Array(items) => items
            .into_iter()
            .map(|i| match i {
                Frame::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
                other => panic!("not a key: {other:?}"),
            })
            .collect(),
        other => panic!("not an array: {other:?}"),
    }
}

/// Sends `args` to whichever node serves it (follows one `-MOVED`).
fn routed(conns: &mut [Resp], ports: &[u16], args: &[&str]) -> Frame {
    let reply = conns[0].cmd(args);
    if let Frame::Error(e) = &reply
        && let Some(addr) = e.strip_prefix("MOVED ").and_then(|r| r.split(' ').nth(1))
    {
        let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
        let i = ports
            .iter()
            .position(|p| *p == port)
            .expect("a node of this cluster");
        return conns[i].cmd(args);
    }
    reply
}

#[test]
fn keys_randomkey_and_multi_key_commands_on_two_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(2, &dir.path().join("data"), &[]);
    let ports = cluster.ports();
    let mut conns: Vec<Resp> = ports.iter().map(|p| Resp::connect(*p)).collect();

    // Keys spread over both nodes, collections among them.
    let mut all = BTreeSet::new();
    for i in 0..40 {
        let (s, h, z) = (format!("str:{i}"), format!("hash:{i}"), format!("set:{i}"));
        assert_eq!(routed(&mut conns, &ports, &["SET", &s, "v"]), Frame::ok());
        routed(&mut conns, &ports, &["HSET", &h, "f1", "1", "f2", "2"]);
        routed(&mut conns, &ports, &["SADD", &z, "a", "b", "c"]);
        all.extend([s, h, z]);
    }
    // KEYS: each node its own, together every key, no sub-entry anywhere.
    let mut union = BTreeSet::new();
    for c in conns.iter_mut() {
        let mine = names(c.cmd(&["KEYS", "*"]));
        assert!(!mine.is_empty(), "both nodes own keys");
        assert!(union.is_disjoint(&mine), "a key on two nodes");
        union.extend(mine);
    }
    assert_eq!(union, all);
    let hashes: BTreeSet<String> = conns
        .iter_mut()
        .flat_map(|c| names(c.cmd(&["KEYS", "hash:*"])))
        .collect();
    assert_eq!(hashes.len(), 40);
    assert!(hashes.iter().all(|k| k.starts_with("hash:")));
    // RANDOMKEY: a key this node owns.
    for (i, c) in conns.iter_mut().enumerate() {
        let mine = names(c.cmd(&["KEYS", "*"]));
        for _ in 0..20 {
            let Frame::Bulk(k) = c.cmd(&["RANDOMKEY"]) else {
                panic!("RANDOMKEY on node {i}")
            };
            assert!(mine.contains(&*String::from_utf8_lossy(&k)));
        }
        assert_eq!(
            c.cmd(&["KEYS"]),
            Frame::error("ERR wrong number of arguments for 'keys' command")
        );
    }

    // One slot per command, CROSSSLOT otherwise.
    let c = &mut conns[0];
    assert_eq!(
        c.cmd(&["RENAME", "str:1", "str:2"]),
        Frame::error("CROSSSLOT Keys in request don't hash to the same slot")
    );
    // OBJECT HELP has no key: any node answers it.
    for c in conns.iter_mut() {
        let Frame::Array(help) = c.cmd(&["OBJECT", "HELP"]) else {
            panic!("OBJECT HELP")
        };
        assert_eq!(help.len(), 15);
    }
    let r = |conns: &mut Vec<Resp>, a: &[&str]| routed(conns, &ports, a);
    r(&mut conns, &["HSET", "{t}h", "f", "v", "g", "w"]);
    assert_eq!(r(&mut conns, &["RENAME", "{t}h", "{t}h2"]), Frame::ok());
    assert_eq!(
        r(&mut conns, &["TYPE", "{t}h2"]),
        Frame::Simple("hash".into())
    );
    assert_eq!(
        r(&mut conns, &["COPY", "{t}h2", "{t}h3"]),
        Frame::Integer(1)
    );
    assert_eq!(r(&mut conns, &["HGET", "{t}h3", "g"]), Frame::bulk("w"));
    r(&mut conns, &["SADD", "{t}s", "3", "1", "2"]);
    assert_eq!(
        r(&mut conns, &["SORT", "{t}s", "DESC", "STORE", "{t}sorted"]),
        Frame::Integer(3)
    );
    assert_eq!(
        r(&mut conns, &["TYPE", "{t}sorted"]),
        Frame::Simple("list".into())
    );
    assert_eq!(
        r(&mut conns, &["SORT", "{t}s", "LIMIT", "0", "2"]),
        Frame::Array(vec![Frame::bulk("1"), Frame::bulk("2")])
    );
    // DUMP on one node, RESTORE of the payload under a key of the other.
    let Frame::Bulk(payload) = r(&mut conns, &["DUMP", "{t}h3"]) else {
        panic!("DUMP")
    };
    let mut moved_to = None;
    for i in 0..1000 {
        let k = format!("restored:{i}");
        let owner = conns
            .iter_mut()
            .position(|c| c.cmd(&["EXISTS", &k]) == Frame::Integer(0));
        if owner == Some(1) {
            moved_to = Some(k);
            break;
        }
    }
    let target = moved_to.expect("a key of node 2");
    let payload = String::from_utf8(payload.to_vec());
    // The payload is binary: send it as raw bytes through a RESP array.
    let reply = match payload {
        Ok(text) => conns[1].cmd(&["RESTORE", &target, "0", &text]),
        Err(e) => {
            let bytes = e.into_bytes();
            let mut wire = format!(
                "*4\r\n$7\r\nRESTORE\r\n${}\r\n{target}\r\n$1\r\n0\r\n${}\r\n",
                target.len(),
                bytes.len()
            )
            .into_bytes();
            wire.extend_from_slice(&bytes);
            wire.extend_from_slice(b"\r\n");
            conns[1].send_raw(&wire).unwrap();
            conns[1].read_reply().unwrap()
        }
    };
    assert_eq!(reply, Frame::ok());
    assert_eq!(conns[1].cmd(&["HGET", &target, "f"]), Frame::bulk("v"));
    assert_eq!(conns[1].cmd(&["HLEN", &target]), Frame::Integer(2));

    // The walks are counted (`/metrics`, `/status`).
    let status = common::http_get(cluster.admin_port, "/status").expect("/status");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let walks = &status["key_walks"];
    assert!(walks["keys_commands"].as_u64().unwrap() >= 3, "{walks}");
    assert!(
        walks["randomkey_commands"].as_u64().unwrap() >= 20,
        "{walks}"
    );
    assert!(walks["entries_examined"].as_u64().unwrap() > 0, "{walks}");
    let metrics = common::http_get(cluster.admin_port, "/metrics").expect("/metrics");
    assert!(metrics.contains("keyway_keys_commands_total "), "{metrics}");
    assert!(metrics.contains("keyway_key_walk_entries_total "));
    drop(cluster);
}
