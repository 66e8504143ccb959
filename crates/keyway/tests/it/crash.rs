//! Acknowledged means durable: writes acknowledged under `group` and
//! `always` durability survive a kill -9 of the whole `keyway dev` process.
//! So do writes acknowledged under `periodic` and `none`: a process crash
//! keeps the page cache, and those modes hand each batch to the OS before
//! replying (without that, the tail still in fjall's user-space journal
//! buffer was lost). A kill -9 cannot see a missing fsync: that is
//! `unsynced_crash.rs`.
//! Invalid configuration is refused at start with a message naming it.

use crate::common;

use common::{DevCluster, Resp};
use keyway_resp::Frame;
use std::process::Command;

fn write_then_kill_then_verify(durability: &str) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // No periodic fsync may run before the kill: it would flush everything.
    let args = ["--durability", durability, "--periodic-sync-ms", "3600000"];
    let mut cluster = DevCluster::start(1, &data, &args);
    let base = cluster.base();
    let port = cluster.ports()[0];
    // Several connections writing at once, so group commits hold many writes.
    let writers: Vec<_> = (0..4)
        .map(|w| {
            std::thread::spawn(move || {
                let mut c = Resp::connect(port);
                let mut acked = Vec::new();
                for i in 0..500 {
                    let key = format!("crash:{w}:{i}");
                    if c.cmd(&["SET", &key, &format!("v{i}")]) == Frame::Simple("OK".into()) {
                        acked.push(key);
                    }
                }
                acked
            })
        })
        .collect();
    let acked: Vec<String> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    assert_eq!(acked.len(), 2000);
    let mut child = cluster.child.take().unwrap();
    child.kill().unwrap(); // SIGKILL: no shutdown path runs
    child.wait().unwrap();

    let cluster = DevCluster::start_on(1, &data, base, &[]);
    let mut c = Resp::connect(cluster.ports()[0]);
    for key in &acked {
        let i = key.rsplit(':').next().unwrap();
        assert_eq!(
            c.cmd(&["GET", key]),
            Frame::Bulk(format!("v{i}").into()),
            "{durability}: acknowledged {key} lost"
        );
    }
}

#[test]
fn group_commit_acknowledged_writes_survive_kill_9() {
    write_then_kill_then_verify("group");
}

#[test]
fn always_acknowledged_writes_survive_kill_9() {
    write_then_kill_then_verify("always");
}

#[test]
fn periodic_acknowledged_writes_survive_kill_9() {
    write_then_kill_then_verify("periodic");
}

#[test]
fn none_acknowledged_writes_survive_kill_9() {
    write_then_kill_then_verify("none");
}

#[test]
fn invalid_configuration_is_refused_with_a_named_setting() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "max_clients = 0\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["dev", "--data"])
        .arg(dir.path().join("d"))
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_clients must be greater than 0"), "{err}");

    std::fs::write(&cfg, "no_such_setting = 1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["dev", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_such_setting"));

    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["dev", "--durability", "sometimes"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown durability 'sometimes'"));
}
