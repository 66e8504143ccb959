//! redis-py's RedisCluster writes and reads back 10,000 random keys; after
//! the cluster is stopped (Ctrl-C) and started again on the same data
//! directory, every acknowledged key is still there.

use crate::common;

use common::{DevCluster, run};
use std::process::Command;

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

#[test]
fn redis_py_cluster_10k_keys_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let acked = dir.path().join("acked.txt");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/cluster_rw.py");
    let mut cluster = DevCluster::start(3, &data, &[]);
    let base = cluster.base();
    run(Command::new(python())
        .args([script, "write", &cluster.ports()[0].to_string()])
        .arg(&acked)
        .arg("10000"));
    cluster.stop();

    let cluster = DevCluster::start_on(3, &data, base, &[]);
    let out = run(Command::new(python())
        .args([script, "verify", &cluster.ports()[1].to_string()])
        .arg(&acked));
    assert!(out.contains("verified 10000"), "{out}");
}
