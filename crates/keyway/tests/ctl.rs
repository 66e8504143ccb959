//! `keyway ctl` reads nodes, the map, leases and the manager seat from the
//! metadata store, as a table and as JSON.

mod common;

use common::{DevCluster, run};
use std::process::Command;

fn ctl(meta_port: u16, args: &[&str]) -> String {
    run(Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["ctl", "--meta", &format!("keyway://127.0.0.1:{meta_port}")])
        .args(args)
        .env("KEYWAY_LOG", "warn"))
}

#[test]
fn ctl_shows_nodes_map_leases_and_the_manager_seat() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(3, dir.path(), &[]);
    let port = cluster.meta_port;

    let nodes = ctl(port, &["nodes"]);
    assert_eq!(nodes.lines().count(), 4, "{nodes}");
    for p in cluster.ports() {
        assert!(nodes.contains(&format!("127.0.0.1:{p}")), "{nodes}");
    }

    let json: Vec<serde_json::Value> =
        serde_json::from_str(&ctl(port, &["nodes", "--json"])).unwrap();
    assert_eq!(json.len(), 3);
    assert!(
        json.iter()
            .all(|n| n["partitions"] == 4
                && n["lease_remaining_ms"].as_u64().is_some_and(|ms| ms > 0))
    );

    let map = ctl(port, &["map"]);
    assert!(map.contains("12 partitions, 3 nodes"), "{map}");
    assert!(map.contains("slots 0-1364"), "{map}");
    let map_json: serde_json::Value = serde_json::from_str(&ctl(port, &["map", "--json"])).unwrap();
    assert_eq!(map_json["partitions"].as_object().unwrap().len(), 12);

    let leases: Vec<serde_json::Value> =
        serde_json::from_str(&ctl(port, &["leases", "--json"])).unwrap();
    assert_eq!(leases.len(), 3);

    assert!(ctl(port, &["manager"]).contains("manager seat empty"));
}
