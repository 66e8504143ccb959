//! `keyway ctl` reads nodes, the map, leases, the manager seat and the
//! migrations from the metadata store, as a table and as JSON, and refuses
//! bad move requests with the reason.

use crate::common;

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

    // `keyway dev` runs a manager in-process.
    let seat = ctl(port, &["manager"]);
    assert!(seat.contains("manager seat held by local-"), "{seat}");

    let none: Vec<serde_json::Value> =
        serde_json::from_str(&ctl(port, &["migrations", "--json"])).unwrap();
    assert!(none.is_empty());
    // Bad move requests are refused with the reason, and nothing is recorded.
    let target = format!("127.0.0.1:{}", cluster.ports()[1]);
    for (what, why) in [
        ("999", "partition 999 is not in the map"),
        ("0-100", "cuts partition 1 (slots 0-1364)"),
        ("banana", "neither a partition id nor a slot range"),
    ] {
        let err = ctl_fails(port, &["move", what, "--to", &target]);
        assert!(err.contains(why), "{what}: {err}");
    }
    let err = ctl_fails(port, &["move", "1", "--to", "127.0.0.1:1"]);
    assert!(err.contains("no node '127.0.0.1:1'"), "{err}");
    let err = ctl_fails(port, &["abort", "42"]);
    assert!(err.contains("migration 42 not found"), "{err}");
    let none: Vec<serde_json::Value> =
        serde_json::from_str(&ctl(port, &["migrations", "--json"])).unwrap();
    assert!(none.is_empty());
}

/// Runs a `ctl` command that must fail; returns its stderr.
fn ctl_fails(meta_port: u16, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["ctl", "--meta", &format!("keyway://127.0.0.1:{meta_port}")])
        .args(args)
        .env("KEYWAY_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn ctl_shows_replicas_and_checks_replication_and_failover_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(3, dir.path(), &["--replication-factor", "2"]);
    let port = cluster.meta_port;
    // Right after bootstrap each primary takes its replicas out of sync
    // (their positions in its log are unknown), copies them and takes them
    // back in: wait for that, then every node shows all its replicas in sync.
    let nodes: Vec<serde_json::Value> = keyway_testkit::wait_until(
        "every replica back in sync after bootstrap",
        std::time::Duration::from_secs(30),
        || {
            let nodes: Vec<serde_json::Value> =
                serde_json::from_str(&ctl(port, &["nodes", "--json"])).unwrap();
            nodes
                .iter()
                .all(|n| n["in_sync_replicas"] == 4)
                .then_some(nodes)
        },
    )
    .unwrap();
    for n in &nodes {
        assert_eq!(n["partitions"], 4, "{n}");
        assert_eq!(
            n["replicas"], 4,
            "bootstrap spreads replicas like primaries: {n}"
        );
        assert_eq!(n["in_sync_replicas"], 4, "{n}");
    }
    let table = ctl(port, &["nodes"]);
    assert!(
        table.contains("PRIMARIES") && table.contains("IN_SYNC"),
        "{table}"
    );
    let map = ctl(port, &["map"]);
    assert!(map.contains("REPLICAS") && map.contains("2/2"), "{map}");
    assert!(map.contains("READS"), "the reads_from column: {map}");
    let map_json: serde_json::Value = serde_json::from_str(&ctl(port, &["map", "--json"])).unwrap();
    for p in map_json["partitions"].as_object().unwrap().values() {
        assert_eq!(p["replicas"].as_array().unwrap().len(), 1, "{p}");
        assert_ne!(p["replicas"][0], p["owner"], "{p}");
    }
    for (args, why) in [
        (
            &["keyspace", "set", "default", "--replication-factor", "6"][..],
            "replication factor must be 1..=5",
        ),
        (
            &["keyspace", "set", "default", "--min-in-sync", "3"],
            "min_in_sync must be 1..=2",
        ),
        (&["keyspace", "set", "default"], "nothing to set"),
        (
            &["keyspace", "set", "nope", "--replication-factor", "2"],
            "no keyspace named 'nope'",
        ),
        (
            &[
                "keyspace",
                "create",
                "h",
                "--routing",
                "hash",
                "--replication-factor",
                "2",
                "--min-in-sync",
                "3",
            ],
            "--replication-factor / --min-in-sync",
        ),
        (&["failover", "999"], "partition 999 is not in the map"),
        (&["failover", "1", "--timeout-ms", "0"], "--timeout-ms"),
    ] {
        let err = ctl_fails(port, args);
        assert!(err.contains(why), "{args:?}: {err}");
    }
    let set = ctl(port, &["keyspace", "set", "default", "--min-in-sync", "2"]);
    assert!(set.contains("replication factor 2, min in sync 2"), "{set}");
    let created: serde_json::Value = serde_json::from_str(&ctl(
        port,
        &[
            "keyspace",
            "create",
            "r",
            "--routing",
            "range",
            "--replication-factor",
            "3",
            "--json",
        ],
    ))
    .unwrap();
    assert_eq!(created["replication_factor"], 3, "{created}");

    // A planned switchover reaches partition 1's primary over its Peer
    // port: its in-sync replica is primary at epoch + 1 afterwards.
    let before: serde_json::Value = serde_json::from_str(&ctl(port, &["map", "--json"])).unwrap();
    let row = &before["partitions"]["1"];
    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["ctl", "--meta", &format!("keyway://127.0.0.1:{port}")])
        .args(["failover", "1", "--json"])
        .env("KEYWAY_LOG", "warn")
        .output()
        .unwrap();
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let after: serde_json::Value = serde_json::from_str(&ctl(port, &["map", "--json"])).unwrap();
    let now = &after["partitions"]["1"];
    assert_eq!(
        rows[0]["ok"],
        true,
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.status.success());
    assert_eq!(now["owner"], row["replicas"][0], "{now}");
    assert_eq!(now["epoch"].as_u64(), row["epoch"].as_u64().map(|e| e + 1));
    // The history shows how: partition 1's row at the new epoch, new primary.
    let since = before["version"].as_u64().unwrap().to_string();
    let history: Vec<serde_json::Value> =
        serde_json::from_str(&ctl(port, &["map", "--since", &since, "--json"])).unwrap();
    assert!(
        history
            .iter()
            .flat_map(|v| v["changes"].as_array().unwrap())
            .any(|c| c["kind"] == "upsert_partition"
                && c["id"] == 1
                && c["owner"] == now["owner"]
                && c["epoch"] == now["epoch"]),
        "{history:?}"
    );
    let text = ctl(port, &["map", "--since", &since]);
    let line = format!(
        "partition 1 slots 0-1364 primary {:x} ",
        now["owner"].as_u64().unwrap()
    );
    assert!(text.contains(&line), "{line} in {text}");
    let err = ctl_fails(port, &["map", "--since", "999999"]);
    assert!(
        err.contains("version 999999 is newer than the map's"),
        "{err}"
    );

    // `--detach`: the command returns with the background run's pid and
    // log; that run makes the switchover and writes its report there.
    let row = after["partitions"]["2"].clone();
    let log = dir.path().join("failover-2.log");
    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["ctl", "--meta", &format!("keyway://127.0.0.1:{port}")])
        .args(["failover", "2", "--detach", "--log-file"])
        .arg(&log)
        .env("KEYWAY_LOG", "warn")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("runs in the background (pid ") && said.contains("failover-2.log"),
        "{said}"
    );
    let report = keyway_testkit::wait_until(
        "the detached failover's report",
        std::time::Duration::from_secs(60),
        || {
            std::fs::read_to_string(&log)
                .ok()
                .filter(|t| t.contains("partition 2:"))
        },
    )
    .unwrap();
    assert!(report.contains("partition 2: primary node"), "{report}");
    let now: serde_json::Value = serde_json::from_str(&ctl(port, &["map", "--json"])).unwrap();
    let now = &now["partitions"]["2"];
    assert_eq!(now["owner"], row["replicas"][0], "{now}");
    assert_eq!(now["epoch"].as_u64(), row["epoch"].as_u64().map(|e| e + 1));
}
