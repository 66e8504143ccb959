//! The rebalancer's operator side on an in-process cluster: `keyway ctl
//! rebalance --plan` shows a newly joined empty node's fair share moving to
//! it (and moves nothing), and `keyway ctl drain` empties a node through
//! migrations the leader manager starts, after which `keyway ctl
//! decommission` removes it; every key stays readable throughout.

use keyway_client::{Client, ClientConfig};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_manager::rebalance::Objective;
use keyway_map::NodeId;
use keyway_node::Node;
use serde_json::Value;
use std::future::Future;
use std::io::{Read, Write};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);
const KEYS: usize = 6_000;
const VALUE: [u8; 512] = [7; 512];

/// Polls `probe` until it returns `Some`, failing after DEADLINE.
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, probe: impl FnMut() -> F) -> T {
    keyway_testkit::eventually(what, DEADLINE, probe).await
}

/// `keyway ctl --meta URL args...`: (success, stdout, stderr).
async fn ctl(meta: &str, args: &[&str]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_keyway"));
    cmd.args(["ctl", "--meta", meta]).args(args);
    cmd.env("KEYWAY_LOG", "warn");
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run keyway ctl"))
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn ctl_json(meta: &str, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (ok, out, err) = ctl(meta, &all).await;
    assert!(ok, "keyway ctl {args:?} failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn spec(dir: &std::path::Path) -> ClusterSpec {
    let mut spec = ClusterSpec::ephemeral(3, dir.to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.node.stats_scan_interval_ms = 200;
    spec
}

async fn write_keys(c: &LocalCluster) -> Client {
    let seeds: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    let seeds: Vec<&str> = seeds.iter().map(|s| s.as_str()).collect();
    let client = Client::connect(&seeds, ClientConfig::default())
        .await
        .unwrap();
    for i in 0..KEYS {
        client
            .set(format!("key:{i}").as_bytes(), &VALUE)
            .await
            .unwrap();
    }
    client
}

async fn assert_keys(client: &Client) {
    for i in 0..KEYS {
        let v = client.get(format!("key:{i}").as_bytes()).await.unwrap();
        assert_eq!(v.as_deref(), Some(&VALUE[..]), "key:{i}");
    }
}

/// A node id in JSON: a number, or the 40-hex-digit text.
fn node_id(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_str().and_then(NodeId::parse).map(|n| n.0))
        .unwrap_or_else(|| panic!("not a node id: {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_shows_a_joined_nodes_share_moving_to_it_and_moves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path());
    spec.manager = None;
    let c = LocalCluster::start(spec.clone()).await.unwrap();
    let meta = c.meta_url();
    let client = write_keys(&c).await;

    // A fourth node joins the running cluster, empty.
    let mut config = spec.node.clone();
    config.data_dir = dir.path().join("node-4");
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.admin_listen = "127.0.0.1:0".parse().unwrap();
    let joined = Node::start(config, c.meta().clone()).await.unwrap();
    let new = joined.id();

    // Once every node has sized its partitions (after the writes), the plan
    // is complete.
    let payload = (KEYS * VALUE.len()) as u64;
    let plan = eventually("a complete plan", || async {
        // A test-sized cluster: balance bytes however few there are.
        let plan = ctl_json(
            &meta,
            &["rebalance", "--plan", "--rebalance-min-total-bytes", "0"],
        )
        .await;
        let complete = plan["stop"]["reason"] != "load_incomplete"
            && plan["total_bytes"].as_u64() >= Some(payload);
        complete.then_some(plan)
    })
    .await;
    let moves = plan["moves"].as_array().unwrap();
    assert_eq!(moves.len(), 3, "{plan:#}");
    let total = plan["total_bytes"].as_u64().unwrap();
    let moved = plan["moved_bytes"].as_u64().unwrap();
    let ratio = moved as f64 / (total as f64 / 4.0);
    assert!(
        (0.9..=1.1).contains(&ratio),
        "moved {ratio:.3}x the quarter: {plan:#}"
    );
    for m in moves {
        assert_eq!(node_id(&m["to"]), new.0, "a move elsewhere: {m}");
        assert_eq!(m["reason"], "balance");
    }
    // One migration per node at a time: only one can start now.
    let now = moves.iter().filter(|m| m["now"] == true).count();
    assert_eq!(now, 1, "{plan:#}");
    assert_eq!(plan["stop"]["reason"], "balanced", "{plan:#}");
    assert!(plan["busiest_over_share_after"].as_f64().unwrap() <= 1.10);

    // The table names the new node and the moves.
    let (ok, table, err) = ctl(
        &meta,
        &["rebalance", "--plan", "--rebalance-min-total-bytes", "0"],
    )
    .await;
    assert!(ok, "{err}");
    assert!(table.contains("3 move(s)"), "{table}");
    assert!(table.contains(&new.to_string()), "{table}");
    assert!(table.contains("later"), "{table}");
    // Other objectives: 12 partitions over 4 nodes is 3 moves too.
    let by_count = ctl_json(
        &meta,
        &["rebalance", "--plan", "--rebalance-objective", "partitions"],
    )
    .await;
    assert_eq!(by_count["moves"].as_array().unwrap().len(), 3);
    assert_eq!(by_count["objective"], Objective::Partitions.name());
    // Without --plan it refuses (the manager rebalances on its own).
    assert!(!ctl(&meta, &["rebalance"]).await.0);

    // Nothing moved.
    let migrations = ctl_json(&meta, &["migrations"]).await;
    assert!(migrations.as_array().unwrap().is_empty(), "{migrations}");
    assert_eq!(c.map().await.unwrap().owned_by(new).count(), 0);
    assert_keys(&client).await;
    joined.shutdown().await;
    c.shutdown().await;
}

/// GET `path` on `addr`'s admin port: the body.
fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_empties_a_node_through_migrations_then_decommission_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path());
    let m = spec.manager.as_mut().unwrap();
    m.config.monitor.stats_interval_ms = 300;
    m.config.monitor.stats_timeout_ms = 300;
    m.config.rebalance.interval_ms = 100;
    // Count partitions: 12 over 3 nodes is balanced, whatever the data.
    m.config.rebalance.objective = Objective::Partitions;
    m.config.driver.migration.cleanup_grace_ms = 100;
    let c = LocalCluster::start(spec).await.unwrap();
    let meta = c.meta_url();
    let client = write_keys(&c).await;
    let admin = c.manager().unwrap().admin_addr();
    let drained = c.node(2).unwrap().id();
    let others: Vec<NodeId> = (0..2).map(|i| c.node(i).unwrap().id()).collect();

    // A node that owns partitions cannot be decommissioned.
    let (ok, _, err) = ctl(&meta, &["decommission", &drained.to_string()]).await;
    assert!(!ok && err.contains("drain it first"), "{err}");

    let (ok, out, err) = ctl(&meta, &["drain", &drained.to_string()]).await;
    assert!(ok, "{err}");
    assert!(out.contains("draining"), "{out}");
    let nodes = ctl_json(&meta, &["nodes"]).await;
    let row = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == drained.to_string())
        .unwrap()
        .clone();
    assert_eq!(row["draining"], true, "{row}");

    // The rebalancer moves its partitions, through migrations, to the others.
    eventually(
        "the drained node to own nothing and every move to end",
        || async {
            let map = c.map().await.unwrap();
            let migrations = ctl_json(&meta, &["migrations"]).await;
            let done = migrations
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["state"] == "DONE");
            (map.owned_by(drained).count() == 0 && done).then_some(())
        },
    )
    .await;
    let migrations = ctl_json(&meta, &["migrations"]).await;
    let migrations = migrations.as_array().unwrap();
    assert_eq!(
        migrations.len(),
        4,
        "exactly its partitions moved: {migrations:?}"
    );
    for m in migrations {
        assert_eq!(node_id(&m["source"]), drained.0, "{m}");
        assert!(others.iter().any(|o| o.0 == node_id(&m["target"])), "{m}");
    }
    let map = c.map().await.unwrap();
    for o in &others {
        assert_eq!(map.owned_by(*o).count(), 6, "spread evenly");
    }
    let metrics = http_get(admin, "/metrics");
    assert!(
        metrics.contains(r#"keyway_manager_rebalance_moves_started_total{reason="drain"} 4"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("keyway_manager_rebalance_nodes_draining 1"),
        "{metrics}"
    );
    let decisions = http_get(admin, "/decisions");
    assert!(decisions.contains(r#""reason":"drain""#), "{decisions}");
    assert_keys(&client).await;

    // Empty and draining: decommission removes it from the map.
    let (ok, out, err) = ctl(&meta, &["decommission", &drained.to_string()]).await;
    assert!(ok, "{err}");
    assert!(out.contains("removed"), "{out}");
    assert!(!c.map().await.unwrap().nodes.contains_key(&drained));
    assert_keys(&client).await;
    c.shutdown().await;
}
