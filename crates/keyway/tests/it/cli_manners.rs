//! `keyway`'s command-line manners: a user error prints one line and exits
//! with status 2, any other failure exits 1 with a short chain of causes,
//! and neither prints a backtrace with `RUST_BACKTRACE=1` (only
//! `--backtrace` asks for one); every `ctl` listing's `--json` parses.

use crate::common;

use common::{DevCluster, free_port_block, keyway_bin, run};
use std::process::{Command, Output};

/// Runs `keyway ARGS` with RUST_BACKTRACE=1, as many developers' shells set it.
fn keyway(args: &[&str]) -> Output {
    Command::new(keyway_bin())
        .args(args)
        .env("KEYWAY_LOG", "warn")
        .env("RUST_BACKTRACE", "1")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("run keyway")
}

fn meta_flag(port: u16) -> String {
    format!("--meta=keyway://127.0.0.1:{port}")
}

/// Asserts a user error: status 2, stderr exactly one line `error: ...`;
/// returns that line.
fn user_error(args: &[&str]) -> String {
    let out = keyway(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{args:?} printed more than one line: {stderr}"
    );
    assert!(lines[0].starts_with("error: "), "{args:?}: {stderr}");
    lines[0].to_string()
}

#[test]
fn user_errors_print_one_line_and_exit_2_whatever_rust_backtrace_says() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(2, dir.path(), &[]);
    let meta = meta_flag(cluster.meta_port);
    let target = format!("127.0.0.1:{}", cluster.ports()[1]);

    // Split partition 1 (ids start at 1): it leaves the map, its two halves
    // take new ids.
    let halves: Vec<serde_json::Value> = serde_json::from_str(&run(Command::new(keyway_bin())
        .args(["ctl", &meta, "split", "1", "--json"])
        .env("KEYWAY_LOG", "warn")))
    .unwrap();
    assert_eq!(halves.len(), 2, "{halves:?}");
    assert!(
        halves.iter().all(|h| h["id"].as_u64() > Some(1)),
        "{halves:?}"
    );

    let line = user_error(&["ctl", &meta, "move", "1", "--to", &target]);
    assert!(
        line.starts_with(
            "error: partition 1 is not in the map (it was split, merged or dropped before map version "
        ),
        "{line}"
    );
    let line = user_error(&["ctl", &meta, "move", "999", "--to", &target]);
    assert!(
        line.contains("partition 999 is not in the map (no partition has had that id"),
        "{line}"
    );
    let line = user_error(&["ctl", &meta, "move", "2", "--to", "127.0.0.1:1"]);
    assert!(line.contains("no node '127.0.0.1:1' in the map"), "{line}");
    let line = user_error(&["ctl", &meta, "move", "banana", "--to", &target]);
    assert!(
        line.contains("neither a partition id nor a slot range"),
        "{line}"
    );
    // Refusals from the manager library's typed errors are user errors too.
    let line = user_error(&["ctl", &meta, "abort", "42"]);
    assert_eq!(line, "error: migration 42 not found");
    let line = user_error(&[
        "ctl",
        &meta,
        "keyspace",
        "set",
        "nosuch",
        "--replication-factor",
        "1",
    ]);
    assert!(line.contains("no keyspace named 'nosuch'"), "{line}");
    let line = user_error(&["ctl", &meta, "failover", "2", "--timeout-ms", "0"]);
    assert!(line.contains("--timeout-ms must be"), "{line}");
    let line = user_error(&["ctl", &meta, "split", "1"]);
    assert!(
        line.contains("partition 1 is not in the map (it was split"),
        "{line}"
    );
    let line = user_error(&["ctl", &meta, "merge", "0", "2"]);
    assert!(
        line.contains("partition 0 is not in the map (no partition has had"),
        "{line}"
    );
    // Not only `ctl`: another subcommand's bad flag, and a bad config file
    // (toml's own report of it spans several lines).
    let line = user_error(&["sim", "--keys", "0"]);
    assert_eq!(line, "error: --keys must be greater than 0");
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "max_clients = 10\nno_such_setting = 1\n").unwrap();
    let config = config.to_str().unwrap();
    let data = dir.path().join("never-created");
    let line = user_error(&["dev", "--data", data.to_str().unwrap(), "--config", config]);
    assert!(
        line.starts_with(&format!(
            "error: invalid config {config}: line 2, column 1: unknown field `no_such_setting`"
        )),
        "{line}"
    );
    assert!(!data.exists());
    // Clap's usage errors too.
    let line = user_error(&["ctl", &meta, "nodes", "--jsn"]);
    assert_eq!(
        line,
        "error: unexpected argument '--jsn' found (tip: a similar argument exists: '--json'); try '--help'"
    );
    let line = user_error(&["ctl", "nodes"]);
    assert!(
        line.contains("required arguments were not provided: --meta <META>"),
        "{line}"
    );
    // Help is not an error.
    let help = keyway(&["ctl", "--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("Usage: keyway ctl"));

    // Asked for, the backtrace is there.
    let out = keyway(&["--backtrace", "ctl", &meta, "abort", "42"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: migration 42 not found\nbacktrace:\n"),
        "{stderr}"
    );
    assert!(stderr.lines().count() > 2, "{stderr}");
}

#[test]
fn an_internal_failure_exits_1_with_its_causes_and_no_backtrace() {
    // Nothing listens on this port: the metadata store is unreachable.
    let port = free_port_block(1);
    let out = keyway(&["ctl", &meta_flag(port), "nodes"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(
        stderr
            .lines()
            .skip(1)
            .all(|l| l.starts_with("  caused by: ")),
        "{stderr}"
    );
    assert!(stderr.lines().count() <= 6, "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
}

#[test]
fn every_ctl_listing_has_json_that_parses() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(2, dir.path(), &["--replication-factor", "2"]);
    let meta = meta_flag(cluster.meta_port);
    let manager = format!("127.0.0.1:{}", cluster.admin_port + cluster.nodes as u16);
    let listings: Vec<Vec<&str>> = vec![
        vec!["nodes"],
        vec!["map"],
        vec!["leases"],
        vec!["manager"],
        vec!["migrations"],
        vec!["changelog"],
        vec!["hotkeys"],
        vec!["keyspace", "list"],
        vec!["decisions", "--manager-admin", &manager],
        vec!["recovery"],
        vec!["rebalance", "--plan"],
    ];
    for listing in listings {
        let out = run(Command::new(keyway_bin())
            .args(["ctl", &meta])
            .args(&listing)
            .arg("--json")
            .env("KEYWAY_LOG", "warn"));
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(&out);
        let value = parsed.unwrap_or_else(|e| panic!("ctl {listing:?} --json: {e}: {out}"));
        assert!(value.is_array() || value.is_object(), "{listing:?}: {out}");
    }
}

/// A partition of the map: (id, owner, first slot).
type PartitionRow = (u64, u64, u16);

/// `ctl map --json`: the partitions, and each node's (id, RESP address).
fn map_of(meta: &str) -> (Vec<PartitionRow>, Vec<(u64, String)>) {
    let map: serde_json::Value = serde_json::from_str(&run(Command::new(keyway_bin())
        .args(["ctl", meta, "map", "--json"])
        .env("KEYWAY_LOG", "warn")))
    .unwrap();
    let parts = map["partitions"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| {
            let start = p["start"].as_str().unwrap();
            let slot = start
                .get(..4)
                .map_or(0, |s| u16::from_str_radix(s, 16).unwrap());
            (
                p["id"].as_u64().unwrap(),
                p["owner"].as_u64().unwrap(),
                slot,
            )
        })
        .collect();
    let nodes = map["nodes"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| {
            let addr = n["resp_addr"].as_str().unwrap().to_string();
            (n["id"].as_u64().unwrap(), addr)
        })
        .collect();
    (parts, nodes)
}

/// ~1.5 MB of values in `slot` through node `port` (a move of its
/// partition at 200 kB/s copies for several seconds).
fn fill_slot(port: u16, slot: u16) {
    let mut conn = common::Resp::connect(port);
    let tag = common::key_in_slot(slot, "");
    let value = "d".repeat(1_024);
    for batch in 0..15 {
        let mut buf = Vec::new();
        for i in 0..100 {
            let key = format!("{tag}k{batch}-{i}");
            buf.extend_from_slice(
                format!(
                    "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n",
                    key.len(),
                    value.len()
                )
                .as_bytes(),
            );
        }
        conn.send_raw(&buf).unwrap();
        for _ in 0..100 {
            let reply = conn.read_reply().unwrap();
            assert!(format!("{reply:?}").contains("OK"), "SET: {reply:?}");
        }
    }
}

fn owned_by(meta: &str, node: u64) -> usize {
    map_of(meta).0.iter().filter(|p| p.1 == node).count()
}

#[test]
fn drain_follows_until_the_node_owns_nothing_and_detach_returns_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(
        3,
        dir.path(),
        &[
            "--partitions-per-node",
            "2",
            "--migration-max-bytes-per-sec",
            "200000",
            "--migration-cleanup-grace-ms",
            "500",
        ],
    );
    let meta = meta_flag(cluster.meta_port);
    let (parts, nodes) = map_of(&meta);
    let port_of = |node: u64| -> u16 {
        let addr = &nodes.iter().find(|n| n.0 == node).unwrap().1;
        addr.rsplit(':').next().unwrap().parse().unwrap()
    };
    let (first, second) = (nodes[0].0, nodes[1].0);
    // A partition of the first node holds data: its move takes seconds.
    let &(_, _, slot) = parts.iter().find(|p| p.1 == first).unwrap();
    fill_slot(port_of(first), slot);
    let owned_before = owned_by(&meta, first);
    assert!(owned_before > 0);

    // --detach: back as soon as the node is marked, its moves still to come.
    let out = keyway(&["ctl", &meta, "drain", &first.to_string(), "--detach"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("is draining"), "{stdout}");
    assert!(
        owned_by(&meta, first) > 0,
        "drain --detach returned only after the node's partitions had moved"
    );
    // ... and the drain completes without anyone following it.
    keyway_testkit::wait_until(
        "the detached drain to move every partition away",
        std::time::Duration::from_secs(120),
        || (owned_by(&meta, first) == 0).then_some(()),
    )
    .unwrap();

    // Without --detach: it returns once the node owns nothing.
    let out = keyway(&["ctl", &meta, "drain", &second.to_string(), "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["draining"], true, "{info}");
    assert_eq!(
        owned_by(&meta, second),
        0,
        "drain returned before the moves ended"
    );

    // A bad dashboard setting is a user error naming it.
    let line = user_error(&["manager", &meta, "--ui-skew-history-samples", "0"]);
    assert!(
        line.contains("ui_skew_history_samples must be 1..="),
        "{line}"
    );
}

/// The partition record `id` of `ctl map --json`.
fn partition_json(meta: &str, id: u64) -> serde_json::Value {
    let map: serde_json::Value = serde_json::from_str(&run(Command::new(keyway_bin())
        .args(["ctl", meta, "map", "--json"])
        .env("KEYWAY_LOG", "warn")))
    .unwrap();
    map["partitions"][id.to_string()].clone()
}

#[test]
fn move_back_detach_returns_once_requested_and_the_switch_back_still_happens() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(
        3,
        dir.path(),
        &["--replication-factor", "2", "--partitions-per-node", "1"],
    );
    let meta = meta_flag(cluster.meta_port);
    let (parts, nodes) = map_of(&meta);
    let id = parts[0].0;
    let p = partition_json(&meta, id);
    let old = p["owner"].as_u64().unwrap();
    let holders: Vec<u64> = std::iter::once(old)
        .chain(
            p["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_u64().unwrap()),
        )
        .collect();
    let target = nodes.iter().find(|n| !holders.contains(&n.0)).unwrap();
    // A primary move to a node without a copy, kept revertible for a minute.
    let out = keyway(&[
        "ctl",
        &meta,
        "move",
        &id.to_string(),
        "--to",
        &target.1,
        "--fail-back-window-ms",
        "60000",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    keyway_testkit::wait_until(
        "the old primary in sync under the new one",
        std::time::Duration::from_secs(60),
        || {
            let p = partition_json(&meta, id);
            (p["owner"].as_u64() == Some(target.0)
                && p["in_sync"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|n| n.as_u64() == Some(old)))
            .then_some(())
        },
    )
    .unwrap();

    // --detach: the answer is "requested", not the outcome it would wait for.
    let out = keyway(&[
        "ctl",
        &meta,
        "--json",
        "move",
        "--back",
        &id.to_string(),
        "--detach",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["outcome"], "requested", "{rows}");
    // ... and the switch back happens without anyone following it.
    keyway_testkit::wait_until(
        "the detached move back to switch the primary back",
        std::time::Duration::from_secs(60),
        || (partition_json(&meta, id)["owner"].as_u64() == Some(old)).then_some(()),
    )
    .unwrap();
}
