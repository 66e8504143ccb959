//! ACL users across a live `keyway dev` cluster (2 nodes) and a `keyway
//! proxy`, with the real `redis-cli` and redis-py:
//! - a user restricted to `~app:*` and `+@read` can `GET app:1` and gets
//!   `-NOPERM` for `SET app:1 x` and for `GET other`, on the node it was
//!   created on, on the other node, and through the proxy;
//! - a change made on one node is enforced on the other and on the proxy
//!   within a bounded time (waited for, never slept);
//! - a disabled user gets `-WRONGPASS` everywhere; `ACL DELUSER` through
//!   the proxy removes it everywhere;
//! - `ACL SETUSER default >pw` gives the default user a password on every
//!   node at run time;
//! - the denials are counted on `/metrics` and listed by `ACL LOG`;
//! - refusals inside `MULTI` abort the `EXEC`; `redis.call` runs as the
//!   script's caller.

use crate::common;

use common::{DevCluster, Proc, free_port_block, http_get};
use std::process::Command;
use std::time::Duration;

const NOPERM_CMD: &str = "NOPERM this user has no permissions to run the 'set' command";
const NOPERM_KEY: &str =
    "NOPERM this user has no permissions to access one of the keys used as arguments";
const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
/// How long a change may take to reach another process (the tests poll at
/// 100 ms).
const PROPAGATION: Duration = Duration::from_secs(10);

/// `redis-cli -p PORT ARGS...`: its output (stdout and stderr), trimmed,
/// whatever its exit status (error replies are what is checked).
fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    let mut text = String::from_utf8_lossy(&out.stdout).to_string();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text.trim().to_string()
}

/// `cli` logged in as `app`.
fn as_app(port: u16, cluster: bool, args: &[&str]) -> String {
    let mut all = vec!["--user", "app", "--pass", "pw", "--no-auth-warning"];
    if cluster {
        all.push("-c");
    }
    all.extend_from_slice(args);
    cli(port, &all)
}

/// `redis-cli` as `user` reading `input`'s commands (one per line).
fn piped(port: u16, user: &str, input: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("redis-cli")
        .args([
            "-p",
            &port.to_string(),
            "--user",
            user,
            "--pass",
            "pw",
            "--no-auth-warning",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run redis-cli");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write to redis-cli");
    let out = child.wait_with_output().expect("redis-cli output");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    lines.join("\n")
}

fn wait_for(what: &str, mut probe: impl FnMut() -> bool) {
    keyway_testkit::wait_until(what, PROPAGATION, || probe().then_some(()))
        .unwrap_or_else(|e| panic!("{e}"));
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

fn redis_py(mode: &str, port: u16, user: &str) -> Vec<String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/acl_user.py");
    let out = Command::new(python())
        .args([script, mode, &port.to_string(), user, "pw"])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "acl_user.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The user's refusals on one process (before any other process may know
/// the user: no redirect is followed).
fn assert_refused(where_: &str, port: u16) {
    assert_eq!(
        as_app(port, false, &["SET", "app:1", "x"]),
        NOPERM_CMD,
        "{where_}: SET"
    );
    assert_eq!(
        as_app(port, false, &["GET", "other"]),
        NOPERM_KEY,
        "{where_}: GET other"
    );
    assert!(
        as_app(port, false, &["ACL", "WHOAMI"]).contains("NOPERM"),
        "{where_}: WHOAMI needs @slow"
    );
}

fn assert_restricted(where_: &str, port: u16, cluster: bool) {
    assert_eq!(
        as_app(port, cluster, &["GET", "app:1"]),
        "v",
        "{where_}: GET app:1"
    );
    assert_refused(where_, port);
}

fn spawn_proxy(meta_port: u16) -> (Proc, u16, u16) {
    let base = free_port_block(2);
    let args: Vec<String> = [
        "proxy",
        "--meta",
        &format!("keyway://127.0.0.1:{meta_port}"),
        "--listen",
        &format!("127.0.0.1:{base}"),
        "--admin-listen",
        &format!("127.0.0.1:{}", base + 1),
        "--acl-poll-interval-ms",
        "100",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    (Proc::spawn(&args, "serving"), base, base + 1)
}

#[test]
fn acl_users_are_shared_and_enforced_by_nodes_and_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(
        2,
        &dir.path().join("data"),
        &[
            "--acl-poll-interval-ms",
            "100",
            "--no-rebalance",
            "--no-auto-split",
            "--no-auto-merge",
        ],
    );
    let (n1, n2) = (cluster.first_port, cluster.first_port + 1);
    assert_eq!(cli(n1, &["-c", "SET", "app:1", "v"]), "OK");
    assert_eq!(cli(n1, &["-c", "SET", "other", "w"]), "OK");

    // Created on node 1: enforced there at once.
    assert_eq!(
        cli(
            n1,
            &["ACL", "SETUSER", "app", "on", ">pw", "~app:*", "+@read"]
        ),
        "OK"
    );
    assert_eq!(cli(n1, &["AUTH", "app", "pw"]), "OK");
    assert_refused("node 1", n1);
    // ACL LOG: the newest denial first.
    let log = cli(n1, &["ACL", "LOG", "1"]);
    let fields: Vec<&str> = log.lines().collect();
    assert_eq!(
        &fields[..10],
        [
            "count",
            "1",
            "reason",
            "command",
            "context",
            "toplevel",
            "object",
            "acl|whoami",
            "username",
            "app"
        ],
        "{log}"
    );
    // redis.call inside a script runs as the script's caller.
    assert_eq!(
        cli(
            n1,
            &[
                "ACL",
                "SETUSER",
                "scr",
                "on",
                ">pw",
                "~app:*",
                "+@read",
                "+@scripting",
                "+@transaction"
            ]
        ),
        "OK"
    );
    let eval = |script: &str| {
        cli(
            n1,
            &[
                "-c",
                "--user",
                "scr",
                "--pass",
                "pw",
                "--no-auth-warning",
                "EVAL",
                script,
                "1",
                "app:1",
            ],
        )
    };
    wait_for("node 2 knows scr (redirects)", || {
        cli(n2, &["AUTH", "scr", "pw"]) == "OK"
    });
    assert_eq!(eval("return redis.call('get', KEYS[1])"), "v");
    assert!(
        eval("return redis.call('set', KEYS[1], 'x')")
            .starts_with("ERR The user executing the script can't run this command or subcommand"),
    );
    assert!(
        eval("return redis.call('get', 'other')")
            .starts_with("ERR The user executing the script can't access at least one of the keys"),
    );
    // Inside MULTI: refused at queue time, and the EXEC aborts.
    assert_eq!(
        piped(n1, "scr", "MULTI\nSET app:1 x\nEXEC\n"),
        format!("OK\n{NOPERM_CMD}\nEXECABORT Transaction discarded because of previous errors.")
    );
    assert_eq!(cli(n1, &["ACL", "DELUSER", "scr"]), "1");
    // On node 2 within the poll interval.
    wait_for("node 2 knows the user", || {
        cli(n2, &["AUTH", "app", "pw"]) == "OK"
    });
    assert_restricted("node 1", n1, true);
    assert_restricted("node 2", n2, true);
    // A cluster client also needs the topology (CLUSTER SLOTS) and the
    // command table (COMMAND), as with Redis.
    assert_eq!(
        cli(
            n2,
            &[
                "ACL",
                "SETUSER",
                "pyapp",
                "on",
                ">pw",
                "~app:*",
                "+@read",
                "+cluster|slots",
                "+command"
            ]
        ),
        "OK"
    );
    wait_for("node 1 knows pyapp", || {
        cli(n1, &["AUTH", "pyapp", "pw"]) == "OK"
    });
    let py = redis_py("cluster", n2, "pyapp");
    assert_eq!(
        py,
        [
            "GET app:1 -> v".to_string(),
            format!(
                "SET app:1 x -> ERR {}",
                NOPERM_CMD.trim_start_matches("NOPERM ")
            ),
            format!(
                "GET other -> ERR {}",
                NOPERM_KEY.trim_start_matches("NOPERM ")
            ),
        ],
        "redis-py through the nodes"
    );

    // The proxy reads the users from the store at start.
    let (_proxy, proxy, proxy_admin) = spawn_proxy(cluster.meta_port);
    assert_restricted("proxy", proxy, false);
    let py = redis_py("plain", proxy, "app");
    assert_eq!(
        py[0], "GET app:1 -> v",
        "redis-py through the proxy: {py:?}"
    );
    assert!(
        py[1].contains("no permissions to run the 'set' command"),
        "{py:?}"
    );
    assert!(
        py[2].contains("no permissions to access one of the keys"),
        "{py:?}"
    );

    // Denials are counted.
    let node_metrics = http_get(cluster.admin_port, "/metrics").expect("node /metrics");
    assert!(
        node_metrics.contains("keyway_acl_denied_total{reason=\"command\"}")
            && node_metrics.contains("keyway_acl_denied_total{reason=\"key\"}"),
        "node /metrics counts denials"
    );
    let proxy_metrics = http_get(proxy_admin, "/metrics").expect("proxy /metrics");
    assert!(proxy_metrics.contains("keyway_proxy_acl_denied_total{reason=\"command\"}"));
    let status = http_get(proxy_admin, "/status").expect("proxy /status");
    assert!(status.contains("\"acl_users\":3"), "{status}");

    // Disabled on node 2: WRONGPASS on node 1 and the proxy.
    assert_eq!(cli(n2, &["ACL", "SETUSER", "app", "off"]), "OK");
    assert_eq!(cli(n2, &["AUTH", "app", "pw"]), WRONGPASS);
    wait_for("node 1 sees the user disabled", || {
        cli(n1, &["AUTH", "app", "pw"]) == WRONGPASS
    });
    wait_for("the proxy sees the user disabled", || {
        cli(proxy, &["AUTH", "app", "pw"]) == WRONGPASS
    });

    // Deleted through the proxy: gone everywhere.
    assert_eq!(cli(n1, &["ACL", "SETUSER", "app", "on"]), "OK");
    wait_for("the proxy sees the user enabled", || {
        cli(proxy, &["AUTH", "app", "pw"]) == "OK"
    });
    assert_eq!(cli(proxy, &["ACL", "DELUSER", "app"]), "1");
    for port in [n1, n2] {
        wait_for("the nodes forget the user", || {
            cli(port, &["ACL", "USERS"]) == "default\npyapp"
                && cli(port, &["AUTH", "app", "pw"]) == WRONGPASS
        });
    }

    // The default user gets a password at run time, on every node.
    assert_eq!(cli(n1, &["ACL", "SETUSER", "default", ">s3cret"]), "OK");
    assert_eq!(
        cli(n1, &["AUTH", "s3cret"]),
        "OK",
        "the new password works where it was set"
    );
    wait_for("node 2 uses the default user's new password", || {
        cli(n2, &["AUTH", "wrong"]) == WRONGPASS && cli(n2, &["AUTH", "s3cret"]) == "OK"
    });
    drop(cluster);
}
