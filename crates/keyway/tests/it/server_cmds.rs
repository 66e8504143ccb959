//! The server commands on a real cluster.
//!
//! - `FLUSHALL` sent to every primary (as a Redis Cluster client sends it)
//!   empties every node's storage of the Redis keyspace, strings and
//!   collections with their sub-entries, on the replicas too: its deletes
//!   are logged writes through the data path, so the replication streams
//!   carry them (in-process, two nodes, replication factor 2: each node is
//!   the primary of some partitions and the replica of the others).
//! - `INFO keyspace`, `MEMORY USAGE`, `SLOWLOG`, `CONFIG SET/GET`,
//!   `CLIENT LIST/KILL/REPLY`, `TIME`, `ROLE` answer with true figures.
//! - `SHUTDOWN` stops `keyway dev` cleanly (exit status 0, no reply, the
//!   data found again on restart).

use crate::common;

use bytes::Bytes;
use common::replica::raw_command;
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{DEFAULT_KEYSPACE, Keyspace, Routing, key_hash_slot};
use keyway_resp::Frame;
use keyway_storage::KeyRange;
use keyway_testkit::eventually;
use std::time::Duration;
use tokio::net::TcpStream;

fn text(f: &Frame) -> String {
    match f {
        Frame::Bulk(b) | Frame::Verbatim { text: b, .. } => String::from_utf8_lossy(b).into_owned(),
        other => panic!("not text: {other:?}"),
    }
}

fn field(info: &str, name: &str) -> Option<String> {
    info.split("\r\n")
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(str::to_string))
}

/// `(user keys, stored bytes)` of the Redis keyspace in one node's engine.
fn stored(c: &LocalCluster, i: usize) -> (u64, u64) {
    let ks = DEFAULT_KEYSPACE.0;
    let range = KeyRange {
        start: Bytes::copy_from_slice(&ks.to_be_bytes()),
        end: Some(Bytes::copy_from_slice(&(ks + 1).to_be_bytes())),
    };
    c.node(i)
        .unwrap()
        .shared()
        .engine
        .range_stats(&range)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_on_every_primary_empties_every_copy() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(2, dir.path().to_path_buf());
    spec.replication = keyway_meta::Replication {
        factor: 2,
        min_in_sync: 1,
    };
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    c.wait_serving(Duration::from_secs(30)).await.unwrap();
    let map = c.map().await.unwrap();
    let index_of = |id| {
        (0..c.len())
            .find(|i| c.node(*i).unwrap().id() == id)
            .unwrap()
    };
    let mut conns = Vec::new();
    for i in 0..c.len() {
        conns.push(
            TcpStream::connect(c.node(i).unwrap().resp_addr())
                .await
                .unwrap(),
        );
    }
    // Strings on every partition, and hashes and sets (sub-entries).
    let mut keys = Vec::new();
    for n in 0..400 {
        let key = format!("key:{n}");
        let owner = map
            .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(key.as_bytes()))
            .unwrap()
            .owner;
        let conn = &mut conns[index_of(owner)];
        let reply = match n % 4 {
            0 => raw_command(conn, &["HSET", &key, "a", "1", "b", "2"]).await,
            1 => raw_command(conn, &["SADD", &key, "x", "y", "z"]).await,
            _ => raw_command(conn, &["SET", &key, "v", "EX", "1000"]).await,
        };
        assert!(!matches!(reply, Frame::Error(_)), "{key}: {reply:?}");
        keys.push(key);
    }
    // Every key is on both nodes (its primary and its replica).
    let ks = Keyspace {
        id: DEFAULT_KEYSPACE,
        name: "default".into(),
        routing: Routing::Hash,
        replication_factor: 2,
        min_in_sync: 1,
    };
    eventually("every key on both nodes", Duration::from_secs(30), || {
        let all = (0..c.len()).all(|i| {
            let engine = &c.node(i).unwrap().shared().engine;
            keys.iter()
                .all(|k| engine.get(&ks.storage_key(k.as_bytes())).unwrap().is_some())
        });
        async move { all.then_some(()) }
    })
    .await;
    assert_eq!(stored(&c, 0).0, 400);
    assert_eq!(stored(&c, 1).0, 400);

    // INFO keyspace counts the keys (not the sub-entries), the expires and
    // their mean TTL, on the node's own partitions.
    let owned0 = keys
        .iter()
        .filter(|k| {
            map.locate_slot(DEFAULT_KEYSPACE, key_hash_slot(k.as_bytes()))
                .unwrap()
                .owner
                == c.node(0).unwrap().id()
        })
        .count();
    let info = text(&raw_command(&mut conns[0], &["INFO", "keyspace"]).await);
    let line = field(&info, "db0").unwrap_or_else(|| panic!("no db0 line in {info}"));
    let parts: std::collections::BTreeMap<&str, u64> = line
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k, v.parse().unwrap()))
        .collect();
    assert_eq!(parts["keys"], owned0 as u64, "{line}");
    let expiring0 = keys
        .iter()
        .enumerate()
        .filter(|(n, k)| {
            n % 4 >= 2
                && map
                    .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(k.as_bytes()))
                    .unwrap()
                    .owner
                    == c.node(0).unwrap().id()
        })
        .count();
    assert_eq!(parts["expires"], expiring0 as u64, "{line}");
    assert!(
        parts["avg_ttl"] > 990_000 && parts["avg_ttl"] <= 1_000_000,
        "{line}"
    );

    // FLUSHALL to every primary.
    for conn in conns.iter_mut() {
        assert_eq!(raw_command(conn, &["FLUSHALL"]).await, Frame::ok());
    }
    for conn in conns.iter_mut() {
        assert_eq!(
            raw_command(conn, &["DBSIZE"]).await,
            Frame::Integer(0),
            "a primary still serves keys"
        );
    }
    // The replicas followed: no entry at all (keys or sub-entries) is left
    // in either engine.
    eventually(
        "both engines empty of the Redis keyspace",
        Duration::from_secs(30),
        || {
            let empty = (0..c.len()).all(|i| stored(&c, i) == (0, 0));
            async move { empty.then_some(()) }
        },
    )
    .await;
    let status = &c.node(0).unwrap().shared().flush_metrics;
    assert_eq!(status.flushes.get(), 1);
    assert!(status.deleted.get() > 0);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_commands_answer_with_true_figures() {
    let dir = tempfile::tempdir().unwrap();
    let spec = ClusterSpec::ephemeral(1, dir.path().to_path_buf());
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    c.wait_serving(Duration::from_secs(30)).await.unwrap();
    let node = c.node(0).unwrap();
    let mut a = TcpStream::connect(node.resp_addr()).await.unwrap();
    let mut b = TcpStream::connect(node.resp_addr()).await.unwrap();

    // MEMORY USAGE: what the key occupies as stored; a hash grows with its fields.
    assert_eq!(raw_command(&mut a, &["SET", "s", "abc"]).await, Frame::ok());
    let Frame::Integer(small) = raw_command(&mut a, &["MEMORY", "USAGE", "s"]).await else {
        panic!("MEMORY USAGE of a string")
    };
    assert_eq!(
        small,
        (6 + 1) + (1 + 1 + 8) + 3,
        "storage key, encoding, data"
    );
    assert_eq!(
        raw_command(&mut a, &["MEMORY", "USAGE", "nosuch"]).await,
        Frame::Null
    );
    for n in 0..100 {
        raw_command(&mut a, &["HSET", "h", &format!("field{n}"), "value"]).await;
    }
    let Frame::Integer(all) = raw_command(&mut a, &["MEMORY", "USAGE", "h", "SAMPLES", "0"]).await
    else {
        panic!()
    };
    assert!(all > 100 * (5 + 7), "{all}");
    let Frame::Integer(sampled) = raw_command(&mut a, &["MEMORY", "USAGE", "h"]).await else {
        panic!()
    };
    assert!(
        (sampled - all).abs() * 10 < all,
        "sampled {sampled} vs {all}"
    );

    // SLOWLOG: with a zero threshold every data command is logged.
    assert_eq!(
        raw_command(&mut a, &["CONFIG", "SET", "slowlog-log-slower-than", "0"]).await,
        Frame::ok()
    );
    raw_command(&mut a, &["SLOWLOG", "RESET"]).await;
    raw_command(&mut a, &["SET", "slow", "1"]).await;
    let Frame::Array(entries) = raw_command(&mut a, &["SLOWLOG", "GET", "1"]).await else {
        panic!()
    };
    let Frame::Array(entry) = &entries[0] else {
        panic!()
    };
    assert_eq!(
        entry[3],
        Frame::Array(vec![
            Frame::Bulk("SET".into()),
            Frame::Bulk("slow".into()),
            Frame::Bulk("1".into())
        ])
    );
    assert_eq!(
        raw_command(&mut a, &["CONFIG", "GET", "slowlog-log-slower-than"]).await,
        Frame::Array(vec![
            Frame::Bulk("slowlog-log-slower-than".into()),
            Frame::Bulk("0".into())
        ])
    );

    // CLIENT LIST shows both connections; CLIENT KILL closes the other one.
    let Frame::Integer(b_id) = raw_command(&mut b, &["CLIENT", "ID"]).await else {
        panic!()
    };
    raw_command(&mut b, &["CLIENT", "SETNAME", "victim"]).await;
    // `cmd=` is each connection's last command, lower-cased, whatever
    // repeated before it (a connection updates it only on a change).
    let b_line = |list: String| {
        list.lines()
            .find(|l| l.starts_with(&format!("id={b_id} ")))
            .unwrap_or_else(|| panic!("no id={b_id} in {list}"))
            .to_string()
    };
    for cmd in [&["PING"][..], &["PING"], &["Echo", "x"], &["ECHO", "y"]] {
        raw_command(&mut b, cmd).await;
        let want = format!(" cmd={} ", cmd[0].to_ascii_lowercase());
        let line = b_line(text(&raw_command(&mut a, &["CLIENT", "LIST"]).await));
        assert!(line.contains(&want), "after {cmd:?}: {line}");
    }
    raw_command(&mut b, &["PING"]).await;
    let line = b_line(text(&raw_command(&mut a, &["CLIENT", "LIST"]).await));
    assert!(line.contains(" cmd=ping "), "back to ping: {line}");
    let list = text(&raw_command(&mut a, &["CLIENT", "LIST"]).await);
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(
        list.contains(&format!("id={b_id} ")) && list.contains("name=victim"),
        "{list}"
    );
    assert_eq!(
        raw_command(&mut a, &["CLIENT", "KILL", "ID", &b_id.to_string()]).await,
        Frame::Integer(1)
    );
    {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), b.read(&mut buf))
            .await
            .expect("the killed connection closes")
            .unwrap_or(0);
        assert_eq!(n, 0, "the killed connection closed");
    }

    // CLIENT REPLY SKIP: the next reply is not sent; OFF until ON.
    {
        use tokio::io::AsyncWriteExt;
        let pipeline = b"*3\r\n$6\r\nCLIENT\r\n$5\r\nREPLY\r\n$4\r\nSKIP\r\n*2\r\n$4\r\nECHO\r\n$6\r\nhidden\r\n*2\r\n$4\r\nECHO\r\n$5\r\nshown\r\n";
        a.write_all(pipeline).await.unwrap();
    }
    let mut parser = keyway_resp::ResponseParser::new(keyway_resp::Limits::default());
    let mut buf = bytes::BytesMut::new();
    let first = loop {
        use tokio::io::AsyncReadExt;
        if let Some(f) = parser.parse(&mut buf).unwrap() {
            break f;
        }
        a.read_buf(&mut buf).await.unwrap();
    };
    assert_eq!(first, Frame::Bulk("shown".into()));

    // TIME is the node's clock; ROLE says master.
    let Frame::Array(t) = raw_command(&mut a, &["TIME"]).await else {
        panic!()
    };
    let secs: u64 = text(&t[0]).parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(secs.abs_diff(now) <= 2);
    let Frame::Array(role) = raw_command(&mut a, &["ROLE"]).await else {
        panic!()
    };
    assert_eq!(role[0], Frame::Bulk("master".into()));
    c.shutdown().await;
}

#[test]
fn shutdown_stops_the_node_cleanly_and_keeps_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut cluster = common::DevCluster::start(1, &data, &[]);
    let base = cluster.base();
    let port = cluster.ports()[0];
    let mut conn = common::Resp::connect(port);
    assert_eq!(conn.cmd(&["SET", "kept", "yes"]), Frame::ok());
    // Redis answers SHUTDOWN by closing the connection, without a reply.
    assert!(
        conn.try_cmd(&["SHUTDOWN", "NOSAVE"]).is_err(),
        "SHUTDOWN replied"
    );
    let mut child = cluster.child.take().unwrap();
    let status = keyway_testkit::wait_until("keyway dev exits", Duration::from_secs(30), || {
        child.try_wait().unwrap()
    })
    .expect("keyway dev stopped after SHUTDOWN");
    assert!(status.success(), "exit status {status}");
    let cluster = common::DevCluster::start_on(1, &data, base, &[]);
    let mut conn = common::Resp::connect(cluster.ports()[0]);
    assert_eq!(conn.cmd(&["GET", "kept"]), Frame::Bulk("yes".into()));
}

/// The sample of `name` (no labels) in a node's `/metrics`.
fn gauge(admin_port: u16, name: &str) -> Option<f64> {
    let text = common::http_get(admin_port, "/metrics")?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn the_storage_memory_budget_is_a_setting_reported_on_metrics_info_and_status() {
    const CACHE_BYTES: u64 = 8 * 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let cache = CACHE_BYTES.to_string();
    let cluster = common::DevCluster::start(
        2,
        &dir.path().join("data"),
        &["--storage-cache-bytes", &cache],
    );
    for (i, port) in cluster.ports().into_iter().enumerate() {
        let admin = cluster.admin_port + i as u16;
        let mut conn = common::Resp::connect(port);
        for k in 0..200 {
            // Keys this node owns or not: a -MOVED is fine, the writes that
            // land fill this node's memtables.
            let _ = conn.try_cmd(&["SET", &format!("mem:{k}"), &"x".repeat(100)]);
        }
        // The setting is the capacity everywhere it is reported (and
        // `keyway dev` does not divide a size that was chosen).
        assert_eq!(
            gauge(admin, "keyway_storage_cache_capacity_bytes"),
            Some(CACHE_BYTES as f64),
            "node {i}"
        );
        let held = gauge(admin, "keyway_storage_cache_bytes").expect("cache gauge");
        assert!(held <= CACHE_BYTES as f64, "node {i}: {held}");
        assert!(
            gauge(admin, "keyway_storage_write_buffer_bytes").expect("memtable gauge") > 0.0,
            "node {i}: writes landed in no memtable"
        );
        let info = text(&conn.cmd(&["INFO", "memory"]));
        assert_eq!(
            field(&info, "keyway_storage_cache_capacity_bytes"),
            Some(cache.clone()),
            "{info}"
        );
        assert!(
            field(&info, "keyway_storage_cache_bytes").is_some(),
            "{info}"
        );
        assert!(
            field(&info, "keyway_storage_write_buffer_bytes").is_some(),
            "{info}"
        );
        assert_eq!(field(&info, "mem_allocator").as_deref(), Some("mimalloc"));
        let status: serde_json::Value =
            serde_json::from_str(&common::http_get(admin, "/status").unwrap()).unwrap();
        assert_eq!(
            status["storage_memory"]["cache_capacity_bytes"], CACHE_BYTES,
            "{status}"
        );
    }
    // Below the least cache accepted: refused at start, the setting named.
    let out = std::process::Command::new(common::keyway_bin())
        .args(["dev", "--storage-cache-bytes", "1000", "--data"])
        .arg(dir.path().join("bad"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("storage_cache_bytes must be at least"),
        "{err}"
    );
}
