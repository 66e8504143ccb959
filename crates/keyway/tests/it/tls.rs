//! TLS for Redis clients (`--tls-port` and friends), with real clients and
//! certificates generated per test (`rcgen`):
//! - the real `redis-cli --tls` runs SET/GET on a node's TLS port with a
//!   client certificate; without one (`tls-auth-clients yes`), or with one
//!   from another CA, it is refused (a counted failed handshake); the
//!   plain port keeps working beside it;
//! - redis-py with `ssl=True` runs SET/GET against a node and against the
//!   proxy, each over TLS, a 4 MiB value included;
//! - garbage, a plain-text RESP client and a client that never completes
//!   its handshake on the TLS port are each closed, counted, and do not
//!   disturb a TLS client connected meanwhile;
//! - invalid TLS settings are refused at start, in one line naming the
//!   setting, with exit status 2 (server and proxy).

use crate::common;
use crate::common::certs;

use certs::Certs;
use common::{DevCluster, Proc, free_port_block, http_get, redis_cli, run};
use keyway_testkit::wait_until;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// A Prometheus counter's value on an admin port's `/metrics` (0 if absent).
fn counter(admin: u16, name: &str) -> u64 {
    let body = http_get(admin, "/metrics").expect("/metrics answers");
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}_total ")))
        .map_or(0, |v| v.trim().parse().expect("a counter value"))
}

/// `redis-cli --tls --cacert CA [extra] -p PORT args...`: (success, stdout+stderr).
fn redis_cli_tls(certs: &Certs, port: u16, extra: &[&str], args: &[&str]) -> (bool, String) {
    let out = Command::new("redis-cli")
        .args(["--tls", "--cacert", &certs.ca.display().to_string()])
        .args(extra)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text.trim().to_string())
}

/// redis-py over TLS: SET then GET a key unique to `tag`, printing the value.
fn redis_py_tls(certs: &Certs, port: u16, tag: &str) -> String {
    let script = format!(
        r#"
import redis
r = redis.Redis(host="127.0.0.1", port={port}, ssl=True,
                ssl_ca_certs="{ca}", ssl_certfile="{cert}", ssl_keyfile="{key}",
                socket_timeout=10)
assert r.set("tls:{tag}", "over-tls-{tag}")
# A reply far larger than one TLS write buffer reaches a slow reader (a
# small receive buffer) whole: the server flushes what TLS kept back.
import socket, ssl
big = b"x" * (4 * 1024 * 1024)
assert r.set("tls:{tag}:big", big)
ctx = ssl.create_default_context(cafile="{ca}")
ctx.load_cert_chain("{cert}", "{key}")
raw = socket.socket()
raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
raw.settimeout(10)
raw.connect(("127.0.0.1", {port}))
s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
for _ in range(20):
    s.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len("tls:{tag}:big"), b"tls:{tag}:big"))
    want = len(b"$%d\r\n" % len(big)) + len(big) + 2
    got = 0
    while got < want:
        chunk = s.recv(65536)
        assert chunk, "closed"
        got += len(chunk)
    assert got == want, (got, want)
print(r.get("tls:{tag}").decode())
"#,
        ca = certs.ca.display(),
        cert = certs.client_cert.display(),
        key = certs.client_key.display(),
    );
    run(Command::new(python()).args(["-c", &script]))
        .trim()
        .to_string()
}

#[test]
fn redis_cli_and_redis_py_use_a_nodes_tls_port_and_a_client_certificate_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(&dir.path().join("certs"));
    let tls_port = free_port_block(1);
    let mut flags = certs.server_flags(tls_port, "yes");
    flags.push("--no-manager".into());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut cluster = DevCluster::start(1, &dir.path().join("data"), &flags);
    let (port, admin) = (cluster.ports()[0], cluster.admin_port);
    let with_cert = [
        "--cert",
        &certs.client_cert.display().to_string(),
        "--key",
        &certs.client_key.display().to_string(),
    ]
    .map(String::from);
    let with_cert: Vec<&str> = with_cert.iter().map(String::as_str).collect();

    let (ok, out) = redis_cli_tls(&certs, tls_port, &with_cert, &["SET", "k:tls", "v1"]);
    assert!(ok && out == "OK", "SET over TLS: {out}");
    let (ok, out) = redis_cli_tls(&certs, tls_port, &with_cert, &["GET", "k:tls"]);
    assert!(ok && out == "v1", "GET over TLS: {out}");

    // tls-auth-clients yes: no client certificate, or one from another CA,
    // is refused, and each refusal is a counted failed handshake.
    let failures = counter(admin, "keyway_tls_handshake_failures");
    let (_, out) = redis_cli_tls(&certs, tls_port, &[], &["PING"]);
    assert!(
        !out.contains("PONG"),
        "no client certificate was served: {out}"
    );
    let stranger = [
        "--cert",
        &certs.stranger_cert.display().to_string(),
        "--key",
        &certs.stranger_key.display().to_string(),
    ]
    .map(String::from);
    let stranger: Vec<&str> = stranger.iter().map(String::as_str).collect();
    let (_, out) = redis_cli_tls(&certs, tls_port, &stranger, &["PING"]);
    assert!(
        !out.contains("PONG"),
        "another CA's certificate was served: {out}"
    );
    wait_until(
        "two failed handshakes counted",
        Duration::from_secs(10),
        || (counter(admin, "keyway_tls_handshake_failures") >= failures + 2).then_some(()),
    )
    .unwrap();

    // The plain port still serves, the same data.
    assert_eq!(redis_cli(port, &["GET", "k:tls"]), "v1");
    // redis-py with ssl=True.
    assert_eq!(redis_py_tls(&certs, tls_port, "node"), "over-tls-node");
    assert_eq!(redis_cli(port, &["GET", "tls:node"]), "over-tls-node");
    cluster.stop();
}

#[test]
fn redis_py_and_redis_cli_use_the_proxys_tls_port() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(&dir.path().join("certs"));
    // Two nodes with TLS too: `keyway dev --tls-port P` gives node i P + i.
    let node_tls = free_port_block(2);
    let mut flags = certs.server_flags(node_tls, "yes");
    flags.push("--no-manager".into());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut cluster = DevCluster::start(2, &dir.path().join("data"), &flags);
    let base = free_port_block(3);
    let mut args: Vec<String> = [
        "proxy",
        "--meta",
        &format!("keyway://127.0.0.1:{}", cluster.meta_port),
        "--listen",
        &format!("127.0.0.1:{base}"),
        "--admin-listen",
        &format!("127.0.0.1:{}", base + 1),
    ]
    .map(String::from)
    .to_vec();
    args.extend(certs.server_flags(base + 2, "yes"));
    let _proxy = Proc::spawn(&args, "serving");
    let tls_port = base + 2;
    assert_eq!(redis_py_tls(&certs, tls_port, "proxy"), "over-tls-proxy");
    let with_cert = [
        "--cert",
        &certs.client_cert.display().to_string(),
        "--key",
        &certs.client_key.display().to_string(),
    ]
    .map(String::from);
    let with_cert: Vec<&str> = with_cert.iter().map(String::as_str).collect();
    let (ok, out) = redis_cli_tls(&certs, tls_port, &with_cert, &["GET", "tls:proxy"]);
    assert!(
        ok && out == "over-tls-proxy",
        "GET over the proxy's TLS: {out}"
    );
    for port in [node_tls, node_tls + 1] {
        let (ok, out) = redis_cli_tls(&certs, port, &with_cert, &["PING"]);
        assert!(ok && out == "PONG", "node TLS port {port}: {out}");
    }
    let failures = counter(base + 1, "keyway_proxy_tls_handshake_failures");
    let (_, out) = redis_cli_tls(&certs, tls_port, &[], &["PING"]);
    assert!(
        !out.contains("PONG"),
        "no client certificate was served: {out}"
    );
    wait_until(
        "a failed handshake counted",
        Duration::from_secs(10),
        || (counter(base + 1, "keyway_proxy_tls_handshake_failures") > failures).then_some(()),
    )
    .unwrap();
    // tls-auth-clients optional: no certificate is fine, one from another
    // CA is not; no: no certificate asked for.
    for (auth, stranger_served) in [("optional", false), ("no", true)] {
        let more = free_port_block(3);
        let mut args: Vec<String> = [
            "proxy",
            "--meta",
            &format!("keyway://127.0.0.1:{}", cluster.meta_port),
            "--listen",
            &format!("127.0.0.1:{more}"),
            "--admin-listen",
            &format!("127.0.0.1:{}", more + 1),
        ]
        .map(String::from)
        .to_vec();
        args.extend(certs.server_flags(more + 2, auth));
        let _p = Proc::spawn(&args, "serving");
        let (ok, out) = redis_cli_tls(&certs, more + 2, &[], &["GET", "tls:proxy"]);
        assert!(
            ok && out == "over-tls-proxy",
            "{auth}, no certificate: {out}"
        );
        let stranger = [
            "--cert",
            &certs.stranger_cert.display().to_string(),
            "--key",
            &certs.stranger_key.display().to_string(),
        ]
        .map(String::from);
        let stranger: Vec<&str> = stranger.iter().map(String::as_str).collect();
        let (_, out) = redis_cli_tls(&certs, more + 2, &stranger, &["PING"]);
        assert_eq!(
            out == "PONG",
            stranger_served,
            "{auth}, another CA's: {out}"
        );
    }
    // The plain ports: the proxy's and the node's see the same data.
    assert_eq!(redis_cli(base, &["GET", "tls:proxy"]), "over-tls-proxy");
    let owner = cluster.ports().into_iter().find_map(|port| {
        let got = redis_cli(port, &["GET", "tls:proxy"]);
        (!got.starts_with("MOVED")).then_some(got)
    });
    assert_eq!(owner.as_deref(), Some("over-tls-proxy"));
    cluster.stop();
}

/// Reads until the server closes (or 10 s pass): what it sent.
fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the TLS port did not close a bad client: {e} (got {got:?})"),
        }
    }
}

#[test]
fn garbage_plain_resp_and_stalled_handshakes_on_the_tls_port_harm_no_tls_client() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(&dir.path().join("certs"));
    let tls_port = free_port_block(1);
    let mut flags = certs.server_flags(tls_port, "yes");
    flags.extend(["--no-manager", "--tls-handshake-timeout-ms", "500"].map(String::from));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut cluster = DevCluster::start(1, &dir.path().join("data"), &flags);
    let admin = cluster.admin_port;

    // A redis-py TLS client connects, then waits for the test's go.
    let script = format!(
        r#"
import sys, redis
r = redis.Redis(host="127.0.0.1", port={tls_port}, ssl=True,
                ssl_ca_certs="{ca}", ssl_certfile="{cert}", ssl_keyfile="{key}",
                socket_timeout=10, single_connection_client=True)
assert r.ping()
print("connected", flush=True)
sys.stdin.readline()
for i in range(100):
    assert r.set(f"calm:{{i}}", str(i))
    assert r.get(f"calm:{{i}}") == str(i).encode()
print("ok", flush=True)
"#,
        ca = certs.ca.display(),
        cert = certs.client_cert.display(),
        key = certs.client_key.display(),
    );
    let mut py = Command::new(python())
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn python3");
    let mut lines = BufReader::new(py.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "connected");

    let failures = counter(admin, "keyway_tls_handshake_failures");
    // Garbage bytes, then a plain-text RESP client: each is closed, and
    // neither gets a reply to its PING.
    let mut garbage = TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
    garbage
        .write_all(b"\x00\xffnot tls at all\r\n\x16\x03\x01\x00\x05hello")
        .unwrap();
    let got = read_until_closed(&mut garbage);
    assert!(!String::from_utf8_lossy(&got).contains("PONG"), "{got:?}");
    let mut plain = TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
    plain.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let got = read_until_closed(&mut plain);
    assert!(!String::from_utf8_lossy(&got).contains("PONG"), "{got:?}");
    // A client that connects and never says anything is closed after
    // tls_handshake_timeout_ms.
    let mut silent = TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
    let got = read_until_closed(&mut silent);
    assert!(got.is_empty(), "{got:?}");
    wait_until(
        "three failed handshakes counted",
        Duration::from_secs(10),
        || (counter(admin, "keyway_tls_handshake_failures") >= failures + 3).then_some(()),
    )
    .unwrap();

    // The TLS client connected before all that carries on, on the same connection.
    writeln!(py.stdin.as_mut().unwrap(), "go").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "ok");
    assert!(py.wait().unwrap().success());
    cluster.stop();
}

/// Runs `keyway ARGS`, expecting a refusal: exit status 2 and one line on
/// stderr, which is returned.
fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run keyway");
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "{args:?}: not one line: {stderr}"
    );
    stderr
}

#[test]
fn invalid_tls_settings_are_refused_at_start_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(&dir.path().join("certs"));
    let other = Certs::generate(&dir.path().join("other"));
    let missing = dir.path().join("missing.pem");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "this is not PEM\n").unwrap();
    let p = |path: &std::path::Path| path.display().to_string();
    let (cert, key, ca) = (p(&certs.server_cert), p(&certs.server_key), p(&certs.ca));
    let tls = |cert: &str, key: &str, ca: &str| -> Vec<String> {
        [
            "--tls-port",
            "16999",
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            key,
            "--tls-ca-cert-file",
            ca,
        ]
        .map(String::from)
        .to_vec()
    };
    let (missing, not_pem) = (p(&missing), p(&not_pem));
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--tls-port".into(), "16999".into()],
            "tls_port is set but tls_cert_file is not",
        ),
        (
            vec!["--tls-cert-file".into(), cert.clone()],
            "tls_cert_file is set but tls_port is not",
        ),
        (
            vec![
                "--tls-port".into(),
                "16999".into(),
                "--tls-cert-file".into(),
                cert.clone(),
            ],
            "tls_key_file is not",
        ),
        (tls(&missing, &key, &ca), "tls_cert_file"),
        (tls(&not_pem, &key, &ca), "tls_cert_file"),
        (tls(&cert, &missing, &ca), "tls_key_file"),
        // A certificate where the key should be.
        (tls(&cert, &cert, &ca), "tls_key_file"),
        // Another certificate's key.
        (tls(&cert, &p(&other.server_key), &ca), "does not go with"),
        (tls(&cert, &key, &not_pem), "tls_ca_cert_file"),
        (tls(&cert, &key, &missing), "tls_ca_cert_file"),
        (
            vec![
                "--tls-port".into(),
                "16999".into(),
                "--tls-cert-file".into(),
                cert.clone(),
                "--tls-key-file".into(),
                key.clone(),
            ],
            "tls_auth_clients yes needs tls_ca_cert_file",
        ),
        (
            [
                tls(&cert, &key, &ca),
                vec!["--tls-auth-clients".into(), "maybe".into()],
            ]
            .concat(),
            "tls-auth-clients",
        ),
        (
            [
                tls(&cert, &key, &ca),
                vec!["--tls-handshake-timeout-ms".into(), "0".into()],
            ]
            .concat(),
            "tls_handshake_timeout_ms",
        ),
        (
            vec!["--protected-mode".into(), "maybe".into()],
            "expected yes or no, got 'maybe'",
        ),
    ];
    let data = p(&dir.path().join("data"));
    for (flags, named) in &cases {
        for process in ["server", "proxy"] {
            let mut args: Vec<&str> = vec![process, "--meta", "keyway://127.0.0.1:1"];
            if process == "server" {
                args.extend(["--data", &data]);
            }
            args.extend(flags.iter().map(String::as_str));
            let err = refused(&args);
            assert!(err.contains(named), "{process} {flags:?}: {err}");
        }
    }
    // The same settings from a TOML file (`keyway server --config`).
    let toml = dir.path().join("tls.toml");
    std::fs::write(&toml, format!("tls_cert_file = \"{cert}\"\n")).unwrap();
    let err = refused(&[
        "server",
        "--meta",
        "keyway://127.0.0.1:1",
        "--data",
        &data,
        "--config",
        &p(&toml),
    ]);
    assert!(
        err.contains("tls_cert_file is set but tls_port is not"),
        "{err}"
    );
}
