//! The same cluster as separate processes, as a user would run it on
//! several machines: `keyway meta` plus three `keyway server`s, or three
//! `keyway server`s on a real etcd (no `keyway meta` at all).

use crate::common;

use common::{Proc, free_port_block, redis_cli, run, spawn_servers};
use std::process::Command;
use std::time::{Duration, Instant};

/// Waits for the map, then runs the README's redis-cli checks and a redis-py round trip.
fn check_cluster(ports: &[u16], dir: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ports
        .iter()
        .all(|p| redis_cli(*p, &["cluster", "info"]).contains("cluster_state:ok"))
    {
        assert!(
            Instant::now() < deadline,
            "cluster never reached cluster_state:ok"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(redis_cli(ports[0], &["-c", "set", "k", "v"]), "OK");
    assert_eq!(redis_cli(ports[2], &["-c", "get", "k"]), "v");
    let moved = ports
        .iter()
        .map(|p| redis_cli(*p, &["get", "k"]))
        .filter(|o| o.starts_with("MOVED 7629 "))
        .count();
    assert_eq!(moved, 2, "the two non-owners redirect");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/cluster_rw.py");
    let acked = dir.join("acked.txt");
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run(Command::new(&py)
        .args([script, "write", &ports[0].to_string()])
        .arg(&acked)
        .arg("2000"));
    let out = run(Command::new(&py)
        .args([script, "verify", &ports[1].to_string()])
        .arg(&acked));
    assert!(out.contains("verified 2000"), "{out}");
}

#[test]
fn keyway_meta_and_three_keyway_servers_form_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_port_block(7);
    let meta_addr = format!("127.0.0.1:{base}");
    let meta_dir = dir.path().join("meta").display().to_string();
    let _meta = Proc::spawn(
        &[
            "meta",
            "--listen",
            &meta_addr,
            "--data",
            &meta_dir,
            "--bootstrap-nodes",
            "3",
        ]
        .map(String::from),
        "keyway meta listening",
    );
    let (ports, _servers) = spawn_servers(
        &format!("keyway://{meta_addr}"),
        3,
        base + 1,
        dir.path(),
        &[],
    );
    check_cluster(&ports, dir.path());
}

#[test]
fn three_keyway_servers_on_etcd_form_a_cluster() {
    let etcd = keyway_testkit::EtcdCluster::start(1)
        .expect("etcd starts (run scripts/setup.sh to install it)");
    let dir = tempfile::tempdir().unwrap();
    let base = free_port_block(7);
    let bootstrap = ["--bootstrap-nodes".to_string(), "3".into()];
    let (ports, _servers) = spawn_servers(
        &etcd.url("/keyway/multi"),
        3,
        base + 1,
        dir.path(),
        &bootstrap,
    );
    check_cluster(&ports, dir.path());
}
