//! Recovery from the permanent loss of a node under a redis-py workload
//! (issue 13's first "done when"): 4 nodes at replication factor 2, loaded
//! with `KEYWAY_RECOVERY_KEYS` keys (default 20,000; the measured run uses
//! 1,000,000) of 100 bytes through redis-py's cluster pipeline
//! (`tests/py/bulk.py`), a redis-py read-before-write workload running
//! (`tests/py/failover_rw.py`), then `kill -9` of one node and deletion of
//! its data directory. It fails if
//! - a partition is given a new copy before `--rebalance-down-grace-ms`
//!   (a move on suspicion),
//! - the partitions are not back at 2 in-sync copies on the 3 survivors
//!   within `RECOVERY_BOUND` (scaled with the data),
//! - a loaded key or an acknowledged workload write is lost,
//! - the workload saw an error other than redirects, timeouts, connection
//!   errors and cluster-down,
//! - `keyway ctl decommission --force` of the dead node fails.
//!
//! It prints the time from the kill to the failover, to the first
//! replacement copy and to full replication, and the copy rate: bytes the
//! survivors shipped to replicas (`keyway_replication_stream_bytes`, which
//! counts catch-up copies and the small workload's stream) over the time
//! from the first replacement to full replication.
//!
//! The measured run: `KEYWAY_RECOVERY_KEYS=1000000
//! KEYWAY_TEST_BIN=target/release/keyway cargo test -p keyway --test
//! recovery_redis_py -- --nocapture`.

use crate::common;
use crate::repl_fixture;

use keyway_map::NodeId;
use repl_fixture::{ReplCluster, ReplSpec, RwWorkload};
use std::process::Command;
use std::time::{Duration, Instant};

const GRACE_MS: u64 = 5_000;
const VALUE_BYTES: usize = 100;
const DEFAULT_KEYS: u64 = 20_000;
/// Time allowed past the grace for recovery: a floor plus a generous
/// per-key share (1 MB/s would be 100 s for 1M keys of 100 bytes).
const RECOVERY_FLOOR: Duration = Duration::from_secs(60);
const RECOVERY_PER_KEY: Duration = Duration::from_micros(300);
const SYNC_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the map is read while waiting for recovery.
const POLL: Duration = Duration::from_millis(200);
/// A workload with fewer acknowledged writes did not really run.
const MIN_ACKED: u64 = 200;

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

fn keys() -> u64 {
    std::env::var("KEYWAY_RECOVERY_KEYS")
        .ok()
        .map(|v| v.parse().expect("KEYWAY_RECOVERY_KEYS must be a number"))
        .unwrap_or(DEFAULT_KEYS)
}

fn bulk(mode: &str, ports: &str, n: u64) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/bulk.py");
    let out = Command::new(python())
        .args([
            script,
            mode,
            ports,
            &n.to_string(),
            &VALUE_BYTES.to_string(),
        ])
        .output()
        .expect("run python3 (redis-py)");
    assert!(
        out.status.success(),
        "bulk.py {mode}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The sum of a counter (all label sets) on a node's `/metrics`.
fn counter(admin_port: u16, name: &str) -> f64 {
    let text = common::http_get(admin_port, "/metrics").unwrap_or_default();
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

const SHIPPED: &str = "keyway_replication_stream_bytes_total";

#[test]
fn a_loaded_node_lost_for_good_is_re_replicated_under_redis_py() {
    let n = keys();
    let spec = ReplSpec {
        nodes: 4,
        partitions_per_node: 2,
        manager_flags: vec!["--rebalance-down-grace-ms".into(), GRACE_MS.to_string()],
        ..ReplSpec::default()
    };
    let mut cluster = ReplCluster::start(spec);
    keyway_testkit::wait_until("every partition in sync", SYNC_TIMEOUT, || {
        cluster.all_in_sync()
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", cluster.map()));
    let ports: Vec<String> = cluster.ports.iter().map(u16::to_string).collect();
    let ports = ports.join(",");
    let loaded = bulk("load", &ports, n);
    eprintln!("{loaded} (keys, seconds) of {VALUE_BYTES} bytes");
    let map = keyway_testkit::wait_until(
        "every partition in sync after the load",
        SYNC_TIMEOUT,
        || cluster.all_in_sync(),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}", cluster.map()));

    // The workload: one worker per partition's slot group.
    let groups = repl_fixture::slot_groups(&map);
    let mut py = RwWorkload::start(
        &cluster.ports,
        &groups,
        cluster.dir().join("recovery_rw.json"),
    );

    let victim = 3;
    let dead: NodeId = cluster.node_id(&map, victim);
    let survivors: Vec<u16> = (0..cluster.ports.len())
        .filter(|i| *i != victim)
        .map(|i| cluster.admin_ports[i])
        .collect();
    let shipped = |ports: &[u16]| ports.iter().map(|p| counter(*p, SHIPPED)).sum::<f64>();
    let shipped_before = shipped(&survivors);
    let hit_ids: Vec<_> = ReplCluster::partitions(&map)
        .iter()
        .filter(|p| p.has_copy(dead))
        .map(|p| p.id)
        .collect();
    let hit = hit_ids.len();
    assert!(hit > 0, "node{victim} holds no copy");

    let t0 = Instant::now();
    cluster.kill(victim);
    std::fs::remove_dir_all(cluster.dir().join(format!("node{victim}"))).unwrap();
    py.killed_now();

    let bound = Duration::from_millis(GRACE_MS)
        + RECOVERY_FLOOR
        + RECOVERY_PER_KEY * u32::try_from(n).unwrap();
    let mut failed_over = None;
    let mut first_copy = None;
    let recovered = loop {
        assert!(
            t0.elapsed() < bound,
            "not back at 2 in-sync copies within {bound:?}: {:?}",
            cluster.map()
        );
        let Some(m) = cluster.map() else {
            std::thread::sleep(POLL);
            continue;
        };
        let parts = ReplCluster::partitions(&m);
        if failed_over.is_none() && m.owned_by(dead).count() == 0 {
            failed_over = Some(t0.elapsed());
        }
        // A replacement copy: a partition the dead node held that lists
        // three copies, or has left the dead node behind.
        let replaced = parts
            .iter()
            .filter(|p| hit_ids.contains(&p.id))
            .any(|p| 1 + p.replicas.len() > 2 || !p.has_copy(dead));
        if replaced && first_copy.is_none() {
            let at = t0.elapsed();
            assert!(
                at >= Duration::from_millis(GRACE_MS),
                "a new copy {at:?} after the kill, before the grace: {parts:?}"
            );
            first_copy = Some(at);
        }
        if parts
            .iter()
            .all(|p| !p.has_copy(dead) && p.in_sync_copies() == 2)
        {
            break t0.elapsed();
        }
        std::thread::sleep(POLL);
    };
    let shipped_bytes = shipped(&survivors) - shipped_before;
    let first_copy = first_copy.expect("recovery without a replacement copy");
    let copy_s = (recovered - first_copy).as_secs_f64().max(1e-3);
    eprintln!(
        "kill -9 of node{victim} ({hit} of {} partitions had a copy there, {n} keys of {VALUE_BYTES} bytes): \
         failover {:?}, first replacement copy {first_copy:?}, every partition at 2 in-sync copies {recovered:?} \
         (grace {GRACE_MS} ms)",
        ReplCluster::partitions(&map).len(),
        failed_over.unwrap_or(recovered),
    );
    eprintln!(
        "copied {:.1} MB in {copy_s:.2} s: {:.1} MB/s",
        shipped_bytes / 1e6,
        shipped_bytes / 1e6 / copy_s
    );

    let report = py.stop();
    repl_fixture::assert_rw_report_clean(&report, MIN_ACKED);

    let verified: serde_json::Value = serde_json::from_str(&bulk("verify", &ports, n)).unwrap();
    eprintln!("loaded keys read back: {verified}");
    assert_eq!(
        verified["ok"].as_u64(),
        Some(n),
        "loaded keys lost: {verified}"
    );

    let (ok, out, err) = cluster.ctl(&["decommission", "--force", &dead.to_string()]);
    assert!(ok, "decommission --force: {out}\n{err}");
    assert!(!cluster.map().unwrap().nodes.contains_key(&dead));
}
