//! Protected mode, Redis's rule, seen by the real `redis-cli` from a network
//! namespace (a non-loopback client) and from loopback:
//! - a node bound to 0.0.0.0 with no password answers the namespaced client
//!   Redis 7.0.15's exact `-DENIED` error and closes, on its client port
//!   and on its replica endpoint, and counts it; loopback gets `PONG`;
//! - with `requirepass`, or a default-user password set with `ACL SETUSER`,
//!   the namespaced client can AUTH and PING; with
//!   `--protected-mode no` it gets `PONG` without a password;
//! - the proxy, the same three ways.
//!
//! The namespace and its veth pair come from the nemesis harness's
//! [`keyway_nemesis::Network`], removed on drop also when a test fails.
//! These tests need root (the CI runs as root): they fail, not skip, when
//! the namespace cannot be made.

use crate::common;

use common::{DevCluster, Proc, free_port_block, http_get, redis_cli};
use keyway_nemesis::Network;
use std::process::Command;

/// The `-DENIED` line as `redis-cli` prints it (no `-`, no CRLF).
fn denied_text() -> &'static str {
    keyway_tls::protected_mode::DENIED
        .strip_prefix('-')
        .unwrap()
        .trim_end()
}

fn network() -> Network {
    Network::create(1).unwrap_or_else(|e| {
        panic!(
            "protected-mode tests need a network namespace (run as root, with `ip netns`; the CI does): {e}"
        )
    })
}

/// `ip netns exec <ns> redis-cli -h <host ip> -p PORT ARGS...`: its stdout
/// and stderr, trimmed.
fn ns_redis_cli(net: &Network, port: u16, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &net.netns(0),
            "redis-cli",
            "--no-auth-warning",
        ])
        .args(["-h", &net.host_ip().to_string(), "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run ip netns exec redis-cli");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .trim()
    .to_string()
}

fn counter(admin: u16, name: &str) -> u64 {
    let body = http_get(admin, "/metrics").expect("/metrics answers");
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}_total ")))
        .map_or(0, |v| v.trim().parse().expect("a counter value"))
}

fn dev(dir: &std::path::Path, extra: &[&str]) -> DevCluster {
    // `--host 0.0.0.0` puts the admin port there too; the harness runs it
    // open (no cluster secret), which a public admin port must say.
    let mut flags = vec![
        "--host",
        "0.0.0.0",
        "--no-manager",
        "--admin-allow-unauthenticated",
    ];
    flags.extend(extra);
    DevCluster::start(1, dir, &flags)
}

#[test]
fn a_node_without_a_password_refuses_non_loopback_clients() {
    let net = network();
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = dev(&dir.path().join("default"), &[]);
    let (port, admin) = (cluster.ports()[0], cluster.admin_port);
    assert_eq!(
        counter(admin, "keyway_protected_mode_refused_connections"),
        0
    );
    assert_eq!(ns_redis_cli(&net, port, &["PING"]), denied_text());
    assert_eq!(redis_cli(port, &["PING"]), "PONG");
    // The replica endpoint too.
    let status: serde_json::Value =
        serde_json::from_str(&http_get(admin, "/status").expect("/status")).unwrap();
    let replica = status["replica_addr"]
        .as_str()
        .unwrap_or_else(|| panic!("no replica_addr in {status}"));
    let replica_port: u16 = replica.rsplit_once(':').unwrap().1.parse().unwrap();
    assert_eq!(ns_redis_cli(&net, replica_port, &["PING"]), denied_text());
    assert_eq!(redis_cli(replica_port, &["PING"]), "PONG");
    assert_eq!(
        counter(admin, "keyway_protected_mode_refused_connections"),
        2
    );
    // A password given to the default user at run time (ACL, not
    // requirepass) ends protected mode too: the rule asks the ACL.
    assert_eq!(
        redis_cli(port, &["ACL", "SETUSER", "default", ">runtime-pw"]),
        "OK"
    );
    assert_eq!(
        ns_redis_cli(&net, port, &["-a", "runtime-pw", "PING"]),
        "PONG"
    );
    cluster.stop();

    // With requirepass: AUTH then PING from the namespace.
    let mut cluster = dev(&dir.path().join("pass"), &["--requirepass", "s3cret"]);
    let port = cluster.ports()[0];
    assert_eq!(ns_redis_cli(&net, port, &["-a", "s3cret", "PING"]), "PONG");
    let noauth = ns_redis_cli(&net, port, &["PING"]);
    assert!(noauth.starts_with("NOAUTH"), "{noauth}");
    cluster.stop();

    // With protected mode off: PONG without a password.
    let mut cluster = dev(&dir.path().join("off"), &["--protected-mode", "no"]);
    assert_eq!(ns_redis_cli(&net, cluster.ports()[0], &["PING"]), "PONG");
    cluster.stop();
}

/// A `keyway proxy` on 0.0.0.0: (process, RESP port, admin port).
fn proxy(meta_port: u16, extra: &[&str]) -> (Proc, u16, u16) {
    let base = free_port_block(2);
    let mut args: Vec<String> = [
        "proxy",
        "--meta",
        &format!("keyway://127.0.0.1:{meta_port}"),
        "--listen",
        &format!("0.0.0.0:{base}"),
        "--admin-listen",
        &format!("127.0.0.1:{}", base + 1),
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    (Proc::spawn(&args, "serving"), base, base + 1)
}

#[test]
fn the_proxy_without_a_password_refuses_non_loopback_clients() {
    let net = network();
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = dev(dir.path(), &["--protected-mode", "no"]);
    let meta = cluster.meta_port;

    let (_p, port, admin) = proxy(meta, &[]);
    assert_eq!(ns_redis_cli(&net, port, &["PING"]), denied_text());
    assert_eq!(redis_cli(port, &["PING"]), "PONG");
    assert_eq!(
        counter(admin, "keyway_proxy_protected_mode_refused_connections"),
        1
    );
    let status = http_get(admin, "/status").expect("/status");
    assert!(
        status.contains("\"protected_mode_active\":true"),
        "{status}"
    );

    let (_p, port, _) = proxy(meta, &["--requirepass", "s3cret"]);
    assert_eq!(ns_redis_cli(&net, port, &["-a", "s3cret", "PING"]), "PONG");
    let noauth = ns_redis_cli(&net, port, &["PING"]);
    assert!(noauth.starts_with("NOAUTH"), "{noauth}");

    let (_p, port, _) = proxy(meta, &["--protected-mode", "no"]);
    assert_eq!(ns_redis_cli(&net, port, &["PING"]), "PONG");
    cluster.stop();
}
