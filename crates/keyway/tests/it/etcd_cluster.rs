//! Keyway on a real etcd: `keyway dev --meta etcd://...` passes the same
//! redis-cli and redis-py checks as with the embedded store, and with a
//! 3-member etcd, losing one member changes nothing visible while losing two
//! stops the nodes within lease TTL plus margin; restoring them brings the
//! service back with no acknowledged write lost.

use crate::common;

use common::{DevCluster, Resp, redis_cli, run};
use keyway_resp::Frame;
use keyway_testkit::EtcdCluster;
use std::process::Command;
use std::time::{Duration, Instant};

const LEASE_TTL_MS: u64 = 2000;
const LEASE_MARGIN_MS: u64 = 500;

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

#[test]
fn keyway_dev_on_etcd_passes_the_redis_cli_and_redis_py_checks() {
    let etcd = EtcdCluster::start(1).expect("etcd starts (run scripts/setup.sh to install it)");
    let url = etcd.url("/keyway/devtest");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let acked = dir.path().join("acked.txt");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/cluster_rw.py");

    let mut cluster = DevCluster::start(3, &data, &["--meta", &url]);
    assert!(
        cluster.stdout.iter().any(|l| l.contains(&url)),
        "dev should print the etcd URL: {:?}",
        cluster.stdout
    );
    let ports = cluster.ports();
    assert_eq!(redis_cli(ports[0], &["-c", "set", "k", "v"]), "OK");
    assert_eq!(redis_cli(ports[2], &["-c", "get", "k"]), "v");
    let moved = ports
        .iter()
        .map(|p| redis_cli(*p, &["get", "k"]))
        .filter(|o| o.starts_with("MOVED 7629 "))
        .count();
    assert_eq!(moved, 2);
    run(Command::new(python())
        .args([script, "write", &ports[0].to_string()])
        .arg(&acked)
        .arg("10000"));
    let base = cluster.base();
    cluster.stop();

    let cluster = DevCluster::start_on(3, &data, base, &["--meta", &url]);
    let out = run(Command::new(python())
        .args([script, "verify", &cluster.ports()[1].to_string()])
        .arg(&acked));
    assert!(out.contains("verified 10000"), "{out}");
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !cond() {
        assert!(
            started.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

#[test]
fn three_member_etcd_one_loss_is_invisible_two_stop_service_restore_resumes() {
    let mut etcd = EtcdCluster::start(3).expect("etcd starts (run scripts/setup.sh to install it)");
    let url = etcd.url("/keyway/quorum");
    let dir = tempfile::tempdir().unwrap();
    let ttl = LEASE_TTL_MS.to_string();
    let margin = LEASE_MARGIN_MS.to_string();
    let cluster = DevCluster::start(
        1,
        &dir.path().join("data"),
        &[
            "--meta",
            &url,
            "--lease-ttl-ms",
            &ttl,
            "--lease-margin-ms",
            &margin,
        ],
    );
    let mut c = Resp::connect(cluster.ports()[0]);
    let mut acked = Vec::new();
    let mut write = |c: &mut Resp, i: usize| -> Result<(), Frame> {
        let key = format!("{{q}}{i}");
        match c.cmd(&["SET", &key, "v"]) {
            Frame::Simple(s) if s == "OK" => {
                acked.push(key);
                Ok(())
            }
            other => Err(other),
        }
    };
    let mut i = 0;
    while i < 100 {
        write(&mut c, i).unwrap();
        i += 1;
    }

    // One member down: for several lease periods every write still succeeds.
    etcd.kill_member(0);
    let until = Instant::now() + Duration::from_millis(3 * LEASE_TTL_MS);
    while Instant::now() < until {
        if let Err(reply) = write(&mut c, i) {
            panic!("a write failed with one etcd member down: {reply:?}");
        }
        i += 1;
    }

    // Two down: no quorum, no renewals; the node stops within TTL + margin (plus slack for the RPC timeout).
    etcd.kill_member(1);
    let stopped_after = wait_until(
        "the node to stop serving",
        Duration::from_millis(LEASE_TTL_MS + LEASE_MARGIN_MS + 3000),
        || matches!(c.cmd(&["GET", "{q}0"]), Frame::Error(e) if e.starts_with("CLUSTERDOWN")),
    );
    assert!(stopped_after <= Duration::from_millis(LEASE_TTL_MS + LEASE_MARGIN_MS + 3000));

    etcd.restart_member(0).unwrap();
    etcd.restart_member(1).unwrap();
    wait_until("service to resume", Duration::from_secs(60), || {
        c.cmd(&["GET", "{q}0"]) == Frame::Bulk("v".into())
    });
    // Right after quorum returns etcd may still be settling, so a renewal can
    // miss and the node briefly refuse again: retry refusals, never accept a miss.
    for key in &acked {
        wait_until(
            &format!("{key} to be readable"),
            Duration::from_secs(30),
            || match c.cmd(&["GET", key]) {
                Frame::Bulk(v) => {
                    assert_eq!(&v[..], b"v");
                    true
                }
                Frame::Error(e) if e.starts_with("CLUSTERDOWN") => false,
                other => panic!("acknowledged {key} lost: {other:?}"),
            },
        );
    }
}
