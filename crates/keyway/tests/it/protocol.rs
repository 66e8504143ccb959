//! Connection-level behaviour: RESP3 via HELLO, AUTH with requirepass,
//! max_clients, SCAN/DBSIZE, and the admin HTTP endpoints.

use crate::common;

use common::{DevCluster, Resp};

fn http_get(port: u16, path: &str) -> String {
    common::http_get(port, path).unwrap_or_else(|| panic!("GET {path} failed"))
}
use keyway_resp::Frame;
use std::io::Read;

#[test]
fn hello_3_switches_to_resp3_and_auth_guards_everything() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(
        1,
        dir.path(),
        &["--requirepass", "s3cret", "--max-clients", "3"],
    );
    let port = cluster.ports()[0];

    let mut c = Resp::connect(port);
    assert_eq!(
        c.cmd(&["GET", "x"]),
        Frame::Error("NOAUTH Authentication required.".into())
    );
    assert_eq!(
        c.cmd(&["AUTH", "wrong"]),
        Frame::Error("WRONGPASS invalid username-password pair or user is disabled.".into())
    );
    assert_eq!(c.cmd(&["AUTH", "s3cret"]), Frame::Simple("OK".into()));
    assert_eq!(c.cmd(&["GET", "x"]), Frame::Null);

    let mut r3 = Resp::connect(port);
    let Frame::Map(fields) = r3.cmd(&["HELLO", "3", "AUTH", "default", "s3cret", "SETNAME", "t"])
    else {
        panic!("HELLO 3 must answer a RESP3 map");
    };
    assert!(fields.contains(&(Frame::Bulk("proto".into()), Frame::Integer(3))));
    assert!(fields.contains(&(Frame::Bulk("mode".into()), Frame::Bulk("cluster".into()))));
    // A missing key is RESP3's null "_", which the parser reads as Null.
    r3.send_raw(b"*2\r\n$3\r\nGET\r\n$1\r\nx\r\n").unwrap();
    let mut raw = [0u8; 3];
    r3.stream.read_exact(&mut raw).unwrap();
    assert_eq!(&raw, b"_\r\n");
    assert_eq!(r3.cmd(&["CLIENT", "GETNAME"]), Frame::Bulk("t".into()));

    // Two connections are open; the third is allowed, the fourth refused.
    let _third = Resp::connect(port);
    let mut fourth = Resp::connect(port);
    assert_eq!(
        fourth.read_reply().unwrap(),
        Frame::Error("ERR max number of clients reached".into())
    );
}

#[test]
fn scan_dbsize_and_admin_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(1, dir.path(), &[]);
    let port = cluster.ports()[0];
    let mut c = Resp::connect(port);
    for i in 0..250 {
        assert_eq!(
            c.cmd(&["SET", &format!("scan:{i}"), "v"]),
            Frame::Simple("OK".into())
        );
    }
    assert_eq!(c.cmd(&["SET", "other", "v"]), Frame::Simple("OK".into()));
    assert_eq!(c.cmd(&["DBSIZE"]), Frame::Integer(251));
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor = "0".to_string();
    loop {
        let Frame::Array(reply) = c.cmd(&["SCAN", &cursor, "MATCH", "scan:*", "COUNT", "37"])
        else {
            panic!("SCAN reply")
        };
        let (Frame::Bulk(next), Frame::Array(keys)) = (&reply[0], &reply[1]) else {
            panic!("SCAN shape")
        };
        for k in keys {
            let Frame::Bulk(k) = k else { panic!("key") };
            assert!(
                seen.insert(String::from_utf8(k.to_vec()).unwrap()),
                "SCAN returned a key twice"
            );
        }
        cursor = String::from_utf8(next.to_vec()).unwrap();
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(seen.len(), 250);
    assert_eq!(
        c.cmd(&["SCAN", "12345"]),
        Frame::Error("ERR invalid cursor".into())
    );

    let admin = cluster.admin_port;
    let metrics = http_get(admin, "/metrics");
    assert!(metrics.contains("keyway_commands_total"), "{metrics}");
    assert!(metrics.contains("keyway_map_version"), "{metrics}");
    let map = http_get(admin, "/map");
    assert!(
        map.contains("\"partitions\"") && map.contains("\"epoch\""),
        "{map}"
    );
    let status = http_get(admin, "/status");
    assert!(status.contains("\"serving\":true"), "{status}");
}
