//! The etcd harness against a real `etcd`: a single member and a
//! three-member cluster that loses and regains members.
//!
//! Fails (does not skip) when `etcd` is missing: run scripts/setup.sh.

use keyway_testkit::{EtcdCluster, Proc, wait_until};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

fn start(members: usize) -> EtcdCluster {
    EtcdCluster::start(members).unwrap_or_else(|e| panic!("start etcd: {e}"))
}

/// A v2-free, client-independent probe: `GET /version` answers while the
/// process serves HTTP.
fn answers(port: u16) -> bool {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    if conn
        .write_all(b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut out = String::new();
    let _ = conn.read_to_string(&mut out);
    out.contains("etcdserver")
}

#[test]
fn single_member_starts_answers_and_cleans_up() {
    let etcd = start(1);
    assert_eq!(etcd.len(), 1);
    let eps = etcd.endpoints();
    assert_eq!(eps.len(), 1);
    assert!(eps[0].starts_with("127.0.0.1:"));
    assert_eq!(etcd.url("/keyway/a"), format!("etcd://{}/keyway/a", eps[0]));
    assert_eq!(etcd.url("keyway/a"), etcd.url("/keyway/a"));
    assert!(answers(etcd.client_port(0)));
    let dir = etcd.dir().to_path_buf();
    assert!(etcd.log_path(0).exists());
    let port = etcd.client_port(0);
    drop(etcd);
    assert!(!dir.exists(), "the temporary directory is removed");
    assert!(!answers(port), "dropping the cluster kills its members");
}

#[test]
fn three_members_survive_losing_and_regaining_members() {
    let mut etcd = start(3);
    let eps = etcd.endpoints();
    assert_eq!(eps.len(), 3);
    assert_eq!(
        etcd.url("p"),
        format!("etcd://{},{},{}/p", eps[0], eps[1], eps[2])
    );
    etcd.kill_member(0);
    assert!(!etcd.is_running(0));
    assert!(!answers(etcd.client_port(0)));
    // Two of three still form a quorum.
    etcd.wait_healthy().unwrap();
    etcd.kill_member(1);
    etcd.restart_member(0).unwrap();
    etcd.restart_member(1).unwrap();
    etcd.wait_healthy().unwrap();
    assert!((0..3).all(|i| etcd.is_running(i)));

    etcd.pause_member(2).unwrap();
    etcd.resume_member(2).unwrap();
    etcd.wait_healthy().unwrap();
    etcd.stop_all();
    assert!((0..3).all(|i| !etcd.is_running(i)));
    assert!(etcd.pause_member(0).is_err());
}

#[test]
fn proc_wraps_any_child() {
    let mut p = Proc::spawn("sleep", Command::new("sleep").arg("30")).unwrap();
    assert_eq!(p.name(), "sleep");
    let pid = p.pid();
    p.pause().unwrap();
    p.resume().unwrap();
    p.kill9();
    wait_until("the pid to disappear", Duration::from_secs(10), || {
        (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    })
    .unwrap();
}

/// Set in the child run of `tether_child`.
const CHILD_ENV: &str = "KEYWAY_TESTKIT_TETHER_CHILD";

/// The child half of `an_undropped_cluster_dies_with_its_process`: starts a
/// cluster, prints where it is, and exits without dropping it.
#[test]
fn tether_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let etcd = start(1);
    println!("TETHER {} {}", etcd.client_port(0), etcd.dir().display());
    std::process::exit(0);
}

#[test]
fn an_undropped_cluster_dies_with_its_process() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "tether_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("TETHER ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("child printed no cluster: {stdout}"));
    let (port, dir) = line.split_once(' ').unwrap();
    let port: u16 = port.parse().unwrap();
    wait_until(
        "the tether to kill the member and remove its directory",
        Duration::from_secs(10),
        || (!answers(port) && !std::path::Path::new(dir).exists()).then_some(()),
    )
    .unwrap();
}
