//! The cluster secret (`--cluster-secret-file`, crates/keyway-auth) against
//! real processes: a `keyway dev` cluster started with a secret, the real
//! `redis-cli`, raw HTTP, the node's `Peer` gRPC client and the metadata
//! RPC client.
//!
//! - peer calls without the secret, or with a wrong one, are refused with
//!   `UNAUTHENTICATED` and change nothing (the keys are still there);
//! - node and manager admin HTTP: 401 with the Basic challenge without the
//!   secret, 200 with Bearer and with Basic; the refusals are counted;
//! - the metadata RPC refuses a caller without the secret; `ctl` says so in
//!   one line; a node started with the wrong secret does not start;
//! - a partition move completes in a cluster with a secret;
//! - the admin limits: an oversized body is 413; invalid limits, a short
//!   secret and an open admin listener without a secret are refused at start.

use crate::common;

use common::{DevCluster, free_port_block, keyway_bin, redis_cli};
use keyway_auth::ClusterSecret;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A secret file (mode 0600) with `text`.
fn secret_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{text}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    path
}

const SECRET: &str = "test-cluster-secret-0123456789abcdef";
const WRONG: &str = "not-the-cluster-secret-0123456789";

fn secret() -> ClusterSecret {
    ClusterSecret::from_bytes(SECRET.as_bytes()).unwrap()
}

fn wrong() -> ClusterSecret {
    ClusterSecret::from_bytes(WRONG.as_bytes()).unwrap()
}

/// A raw HTTP/1.1 request to 127.0.0.1:`port`: (status, head, body).
fn http(port: u16, request: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

/// `GET path` with an optional `Authorization` value.
fn get(port: u16, path: &str, auth: Option<&str>) -> (u16, String, String) {
    let auth = auth.map_or(String::new(), |v| format!("Authorization: {v}\r\n"));
    http(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n"),
    )
}

fn start(dir: &Path, nodes: usize) -> (DevCluster, PathBuf) {
    let path = secret_file(dir, "secret", SECRET);
    let data = dir.join("data");
    let cluster = DevCluster::start(
        nodes,
        &data,
        &["--cluster-secret-file", path.to_str().unwrap()],
    );
    (cluster, path)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn peer(port: u16, secret: Option<ClusterSecret>) -> keyway_peer::PeerClient {
    keyway_peer::PeerClient::connect_with(
        &format!("127.0.0.1:{port}"),
        keyway_peer::PeerOptions {
            rpc_timeout: Duration::from_secs(5),
            secret,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn peer_calls_without_the_secret_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, _) = start(dir.path(), 1);
    let port = cluster.first_port;
    for i in 0..20 {
        assert_eq!(
            redis_cli(port, &["set", &format!("k{i}"), "v"]).trim(),
            "OK"
        );
    }
    let admin = cluster.admin_port;
    let rt = runtime();
    // The clients' lazy channels spawn their workers on this runtime.
    let _in_runtime = rt.enter();
    let all = keyway_storage::KeyRange::all();
    for (who, client) in [
        ("no secret", peer(admin, None)),
        ("a wrong secret", peer(admin, Some(wrong()))),
    ] {
        let err = rt
            .block_on(client.drop_range_chunk(&all, 10_000))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("refused this process") && err.contains("--cluster-secret-file"),
            "DropRangeChunk with {who}: {err}"
        );
        let err = rt
            .block_on(client.apply_foreign(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("refused this process"),
            "ApplyForeign with {who}: {err}"
        );
        let err = rt.block_on(client.last_seq()).unwrap_err().to_string();
        assert!(
            err.contains("refused this process"),
            "LastSeq with {who}: {err}"
        );
    }
    // Nothing was dropped: every key is still served.
    for i in 0..20 {
        assert_eq!(redis_cli(port, &["get", &format!("k{i}")]).trim(), "v");
    }
    // The same client with the secret is served.
    rt.block_on(peer(admin, Some(secret())).last_seq())
        .expect("a peer call with the secret is served");
    // The refusals are counted on the node's /metrics.
    let (status, _, metrics) = get(admin, "/metrics", Some(&secret().bearer()));
    assert_eq!(status, 200);
    let refused = |reason: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("keyway_auth_refused_total{")
                    && l.contains(&format!("reason=\"{reason}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(refused("missing"), 3, "{metrics}");
    assert_eq!(refused("wrong"), 3, "{metrics}");
    let (_, _, status) = get(admin, "/status", Some(&secret().bearer()));
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["admin_auth"]["cluster_secret"], true, "{status}");
    assert_eq!(status["admin_auth"]["refused"], 6, "{status}");
}

#[test]
fn admin_http_needs_the_secret_as_bearer_or_basic() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, _) = start(dir.path(), 1);
    let node_admin = cluster.admin_port;
    let manager_admin = cluster.admin_port + 1;
    let s = secret();
    for (what, port) in [("node", node_admin), ("manager", manager_admin)] {
        for path in ["/status", "/metrics"] {
            let (status, head, body) = get(port, path, None);
            assert_eq!(
                status, 401,
                "{what} {path} without the secret: {head}\n{body}"
            );
            assert!(
                head.to_ascii_lowercase()
                    .contains("www-authenticate: basic realm=\"keyway\""),
                "{what} {path}: {head}"
            );
            assert!(
                body.contains("missing cluster secret") && body.lines().count() == 1,
                "{what} {path}: {body:?}"
            );
            let (status, _, body) = get(port, path, Some(&wrong().bearer()));
            assert_eq!(status, 401, "{what} {path} with a wrong secret");
            assert!(body.contains("wrong cluster secret"), "{body}");
            let (status, _, _) = get(port, path, Some(&s.bearer()));
            assert_eq!(status, 200, "{what} {path} with Bearer");
            let basic = keyway_auth::basic_value("admin", &s);
            let (status, _, _) = get(port, path, Some(&basic));
            assert_eq!(status, 200, "{what} {path} with Basic");
        }
    }
    let (_, _, metrics) = get(manager_admin, "/metrics", Some(&s.bearer()));
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "keyway_manager_auth_refused_total{listener=\"admin\",reason=\"missing\"} 2"
        )),
        "{metrics}"
    );
}

/// Runs `keyway ctl` with `args`: (success, stdout, stderr).
fn ctl(meta_port: u16, secret: Option<&Path>, args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(keyway_bin());
    cmd.args(["ctl", "--meta", &format!("keyway://127.0.0.1:{meta_port}")])
        .env("KEYWAY_LOG", "warn")
        .env_remove("KEYWAY_CLUSTER_SECRET_FILE");
    if let Some(path) = secret {
        cmd.arg("--cluster-secret-file").arg(path);
    }
    let out = cmd.args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_metadata_rpc_needs_the_secret_and_a_wrong_node_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, path) = start(dir.path(), 1);
    let meta = format!("keyway://127.0.0.1:{}", cluster.meta_port);
    let rt = runtime();
    for bad in [None, Some(wrong())] {
        let err = rt
            .block_on(async {
                let client = keyway_meta::RemoteMeta::connect_with(
                    &meta,
                    keyway_meta::RemoteOptions {
                        secret: bad.clone(),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
                keyway_meta::MetaStore::get_map(&client).await
            })
            .unwrap_err();
        assert!(
            matches!(err, keyway_meta::MetaError::Unauthenticated(_)),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("the metadata server at 127.0.0.1:"),
            "{err}"
        );
    }
    // ctl: one line, exit status 2, naming the flag.
    let (ok, _, stderr) = ctl(cluster.meta_port, None, &["nodes"]);
    assert!(!ok);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: the metadata server at 127.0.0.1:")
            && stderr.contains("wrong or missing cluster secret (--cluster-secret-file)"),
        "{stderr}"
    );
    let (ok, stdout, stderr) = ctl(cluster.meta_port, Some(&path), &["nodes"]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");

    // A node with the wrong secret cannot register: it exits, saying why.
    let wrong_path = secret_file(dir.path(), "wrong", WRONG);
    let base = free_port_block(2);
    let mut child = Command::new(keyway_bin())
        .args(["server", "--meta", &meta])
        .args(["--listen", &format!("127.0.0.1:{base}")])
        .args(["--admin-listen", &format!("127.0.0.1:{}", base + 1)])
        .arg("--data")
        .arg(dir.path().join("intruder"))
        .arg("--cluster-secret-file")
        .arg(&wrong_path)
        .env("KEYWAY_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("a node with the wrong secret is still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("refused this process") && stderr.contains("--cluster-secret-file"),
        "{stderr}"
    );
    // Only the one real node is registered.
    let (_, stdout, _) = ctl(cluster.meta_port, Some(&path), &["nodes"]);
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
}

#[test]
fn a_cluster_with_a_secret_moves_a_partition() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, path) = start(dir.path(), 2);
    let port = cluster.first_port;
    for i in 0..50 {
        redis_cli(port, &["-c", "set", &format!("m{i}"), &i.to_string()]);
    }
    let (ok, map, stderr) = ctl(cluster.meta_port, Some(&path), &["--json", "map"]);
    assert!(ok, "{stderr}");
    let map: serde_json::Value = serde_json::from_str(&map).unwrap();
    let first = map["partitions"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap();
    let owner = first["owner"].as_u64().unwrap();
    let target = map["nodes"]
        .as_object()
        .unwrap()
        .values()
        .find(|n| n["id"].as_u64() != Some(owner))
        .expect("a second node");
    let partition = first["id"].to_string();
    let (ok, stdout, stderr) = ctl(
        cluster.meta_port,
        Some(&path),
        &[
            "move",
            &partition,
            "--to",
            target["resp_addr"].as_str().unwrap(),
            "--wait",
            "--timeout-secs",
            "60",
        ],
    );
    assert!(ok && stdout.contains(" DONE"), "{stdout}\n{stderr}");
    for i in 0..50 {
        assert_eq!(
            redis_cli(port, &["-c", "get", &format!("m{i}")]).trim(),
            i.to_string()
        );
    }
}

#[test]
fn admin_limits_and_start_checks() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, _) = start(dir.path(), 1);
    let bearer = secret().bearer();
    for port in [cluster.admin_port, cluster.admin_port + 1] {
        let (status, _, body) = http(
            port,
            &format!(
                "POST /status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {bearer}\r\n\
                 Content-Length: 70000\r\nConnection: close\r\n\r\n"
            ),
        );
        assert_eq!(status, 413, "{body}");
        assert!(body.contains("admin_max_body_bytes (65536)"), "{body}");
    }
    drop(cluster);

    // Refused at start, one line, exit status 2, naming the setting.
    let short = secret_file(dir.path(), "short", "tooshort");
    let good = secret_file(dir.path(), "good", SECRET);
    let meta = "keyway://127.0.0.1:1";
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--admin-max-body-bytes".into(), "0".into()],
            "admin_max_body_bytes",
        ),
        (
            vec!["--admin-request-timeout-ms".into(), "0".into()],
            "admin_request_timeout_ms",
        ),
        (
            vec!["--admin-max-concurrent-requests".into(), "0".into()],
            "admin_max_concurrent_requests",
        ),
        (
            vec!["--cluster-secret-file".into(), short.display().to_string()],
            "--cluster-secret-file",
        ),
        (
            vec![
                "--cluster-secret-file".into(),
                dir.path().join("absent").display().to_string(),
            ],
            "--cluster-secret-file",
        ),
        (
            vec!["--admin-listen".into(), "0.0.0.0:0".into()],
            "--admin-allow-unauthenticated",
        ),
    ];
    for command in ["server", "manager", "proxy"] {
        for (flags, named) in &cases {
            let mut cmd = Command::new(keyway_bin());
            cmd.args([command, "--meta", meta]);
            if command == "server" {
                cmd.arg("--data").arg(dir.path().join("unused"));
            }
            let out = cmd
                .args(flags)
                .env("KEYWAY_LOG", "error")
                .env("RUST_BACKTRACE", "1")
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{command} {flags:?}: {stderr}");
            assert_eq!(
                stderr.trim().lines().count(),
                1,
                "{command} {flags:?}: {stderr}"
            );
            assert!(stderr.contains(named), "{command} {flags:?}: {stderr}");
        }
    }
    // With the secret, a public admin listener is accepted: the proxy
    // binds it (and then waits for the unreachable store's map).
    let base = free_port_block(2);
    let mut child = Command::new(keyway_bin())
        .args(["proxy", "--meta", meta])
        .args(["--admin-listen", &format!("0.0.0.0:{base}")])
        .args(["--listen", &format!("127.0.0.1:{}", base + 1)])
        .arg("--cluster-secret-file")
        .arg(&good)
        .env("KEYWAY_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", base)).is_err() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the proxy with a secret and a public admin listener exited"
        );
        assert!(
            Instant::now() < deadline,
            "the proxy never bound its admin port"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, _, _) = get(base, "/status", None);
    assert_eq!(status, 401, "the public admin listener needs the secret");
    // With it, the proxy answers: 503, not ready (it has no map yet).
    let (status, _, _) = get(base, "/status", Some(&secret().bearer()));
    assert_eq!(status, 503, "the proxy's admin port with the secret");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn keyway_dev_makes_a_secret_by_default_and_says_where() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = free_port_block(4);
    let mut child = Command::new(keyway_bin())
        .args(["dev", "--nodes", "1", "--replication-factor", "1"])
        .args(["--meta-port", &base.to_string()])
        .args(["--port", &(base + 1).to_string()])
        .args(["--admin-port", &(base + 2).to_string()])
        .args(["--manager-admin-port", &(base + 3).to_string()])
        .arg("--data")
        .arg(&data)
        .env("KEYWAY_LOG", "warn")
        .env_remove("KEYWAY_CLUSTER_SECRET_FILE")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let up = line.starts_with("Ctrl-C stops");
        seen.push(line);
        if up {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let path = data.join("cluster-secret");
    assert!(
        seen.iter().any(|l| l.contains(&format!(
            "cluster secret   --cluster-secret-file {}",
            path.display()
        ))),
        "{seen:?}"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the secret file is private: {mode:o}");
    }
    let made = ClusterSecret::from_file(&path).unwrap();
    assert_eq!(get(base + 2, "/status", None).0, 401);
    assert_eq!(get(base + 2, "/status", Some(&made.bearer())).0, 200);
    assert_eq!(get(base + 3, "/status", Some(&made.bearer())).0, 200);
    // ctl with the printed file reaches the store; redis-cli is unaffected.
    let (ok, stdout, stderr) = ctl(base, Some(&path), &["nodes"]);
    assert!(ok && stdout.lines().count() == 2, "{stdout}{stderr}");
    assert_eq!(redis_cli(base + 1, &["ping"]).trim(), "PONG");
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(unix)]
#[test]
fn a_secret_file_others_can_read_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = secret_file(dir.path(), "shared", SECRET);
    let warned = |mode: u32| {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = Command::new(keyway_bin())
            .args([
                "ctl",
                "--meta",
                "keyway://127.0.0.1:1",
                "--cluster-secret-file",
            ])
            .arg(&path)
            .arg("leases")
            .env("KEYWAY_LOG", "warn")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).contains("readable by group or others")
    };
    assert!(warned(0o644));
    assert!(warned(0o640));
    assert!(!warned(0o600));
}
