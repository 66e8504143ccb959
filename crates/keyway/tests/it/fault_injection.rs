//! `keyway server --fault-injection` (testing only): `POST /fault/fsync-fail`
//! on the admin port makes every later fsync fail; the real process then
//! refuses writes and reads for good, and `/status` and `/metrics` say so.
//! Without the flag the fault paths answer 404.

use crate::common;

use common::{Proc, Resp, free_port_block, spawn_servers};
use keyway_resp::Frame;
use keyway_testkit::wait_until;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A plain HTTP/1.1 request on 127.0.0.1: (status code, body).
fn http(port: u16, method: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("admin port answers");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

fn error_text(frame: &Frame) -> String {
    match frame {
        Frame::Error(e) => e.to_string(),
        other => panic!("expected an error reply, got {other:?}"),
    }
}

#[test]
fn an_injected_fsync_failure_stops_the_real_process_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_port_block(5);
    let meta_addr = format!("127.0.0.1:{base}");
    let meta_dir = dir.path().join("meta").display().to_string();
    let _meta = Proc::spawn(
        &[
            "meta",
            "--listen",
            &meta_addr,
            "--data",
            &meta_dir,
            "--bootstrap-nodes",
            "1",
        ]
        .map(String::from),
        "keyway meta listening",
    );
    let meta_url = format!("keyway://{meta_addr}");
    let (ports, _servers) = spawn_servers(
        &meta_url,
        1,
        base + 1,
        &dir.path().join("faulty"),
        &["--fault-injection".to_string()],
    );
    let (port, admin) = (ports[0], base + 2);
    let mut c = Resp::connect(port);
    wait_until("the node serves", Duration::from_secs(30), || {
        (c.cmd(&["SET", "before", "1"]) == Frame::Simple("OK".into())).then_some(())
    })
    .unwrap();
    let (status, body) = http(admin, "GET", "/fault");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""sync_fault":"none""#), "{body}");
    assert!(
        http(admin, "GET", "/status")
            .1
            .contains(r#""storage":"ok""#)
    );

    let (status, body) = http(admin, "POST", "/fault/fsync-fail");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""sync_fault":"always""#), "{body}");
    // The write whose fsync fails is not acknowledged...
    let first = error_text(&c.cmd(&["SET", "during", "2"]));
    assert!(first.contains("fsync failed"), "{first}");
    // ...and from then on nothing is served, even after the disk heals.
    assert_eq!(http(admin, "POST", "/fault/heal").0, 200);
    let write = error_text(&c.cmd(&["SET", "after", "3"]));
    assert!(write.contains("storage failed (fsync error"), "{write}");
    let read = error_text(&c.cmd(&["GET", "before"]));
    assert!(read.contains("storage failed"), "{read}");

    let (_, status) = http(admin, "GET", "/status");
    assert!(
        status.contains(r#""storage":"failed: fsync error"#),
        "{status}"
    );
    let (_, metrics) = http(admin, "GET", "/metrics");
    assert!(metrics.contains("\nkeyway_storage_failed 1"), "{metrics}");
    let (_, fault) = http(admin, "GET", "/fault");
    assert!(fault.contains(r#""sync_failures":1"#), "{fault}");

    // A node started without the flag has no fault paths.
    let (_, _plain) = spawn_servers(&meta_url, 1, base + 3, &dir.path().join("plain"), &[]);
    let plain_admin = base + 4;
    assert_eq!(http(plain_admin, "GET", "/fault").0, 404);
    assert_eq!(http(plain_admin, "POST", "/fault/fsync-fail").0, 404);
    assert!(
        http(plain_admin, "GET", "/status")
            .1
            .contains(r#""storage":"ok""#)
    );
}
