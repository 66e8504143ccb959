//! Bad input never crashes a node nor disturbs other clients: random bytes,
//! truncated frames, huge declared lengths, unknown commands, wrong arity.

use crate::common;

use common::{DevCluster, Resp};
use keyway_resp::Frame;
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

fn error_text(frame: &Frame) -> &str {
    match frame {
        Frame::Error(e) => e,
        other => panic!("expected an error reply, got {other:?}"),
    }
}

/// Reads until the server closes the connection; returns what it sent.
fn read_to_close(c: &mut Resp) -> Vec<u8> {
    let mut all = Vec::new();
    let _ = c.stream.read_to_end(&mut all);
    all
}

#[test]
fn malformed_requests_get_redis_errors_and_closed_connections() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(1, dir.path(), &[]);
    let port = cluster.ports()[0];

    let mut c = Resp::connect(port);
    c.send_raw(b"*1\r\n$99999999999\r\n").unwrap();
    assert_eq!(
        read_to_close(&mut c),
        b"-ERR Protocol error: invalid bulk length\r\n"
    );

    let mut c = Resp::connect(port);
    c.send_raw(b"*99999999999\r\n").unwrap();
    assert_eq!(
        read_to_close(&mut c),
        b"-ERR Protocol error: invalid multibulk length\r\n"
    );

    let mut c = Resp::connect(port);
    c.send_raw(b"*2\r\n:1\r\n").unwrap();
    assert_eq!(
        read_to_close(&mut c),
        b"-ERR Protocol error: expected '$', got ':'\r\n"
    );

    let mut c = Resp::connect(port);
    c.send_raw(b"GET \"unbalanced\r\n").unwrap();
    assert_eq!(
        read_to_close(&mut c),
        b"-ERR Protocol error: unbalanced quotes in request\r\n"
    );

    // Recoverable errors keep the connection open.
    let mut c = Resp::connect(port);
    assert_eq!(
        error_text(&c.cmd(&["NOSUCH", "a", "b"])),
        "ERR unknown command 'NOSUCH', with args beginning with: 'a' 'b' "
    );
    assert_eq!(
        error_text(&c.cmd(&["GET"])),
        "ERR wrong number of arguments for 'get' command"
    );
    assert_eq!(
        error_text(&c.cmd(&["SET", "{a}1", "v", "NX", "XX"])),
        "ERR syntax error"
    );
    assert_eq!(
        error_text(&c.cmd(&["MGET", "a", "b"])),
        "CROSSSLOT Keys in request don't hash to the same slot"
    );
    assert_eq!(c.cmd(&["PING"]), Frame::Simple("PONG".into()));

    // A truncated frame just waits for the rest; the connection still works after it completes.
    let mut c = Resp::connect(port);
    c.send_raw(b"*1\r\n$4\r\nPI").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    c.send_raw(b"NG\r\n").unwrap();
    assert_eq!(c.read_reply().unwrap(), Frame::Simple("PONG".into()));
}

#[test]
fn random_bytes_never_crash_a_node_and_a_good_client_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = DevCluster::start(1, dir.path(), &[]);
    let port = cluster.ports()[0];
    let stop = Arc::new(AtomicBool::new(false));
    let good_ops = Arc::new(AtomicU64::new(0));

    let good = {
        let (stop, good_ops) = (stop.clone(), good_ops.clone());
        std::thread::spawn(move || {
            let mut c = Resp::connect(port);
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) || i < 200 {
                let key = format!("{{good}}{i}");
                let value = format!("value-{i}");
                assert_eq!(c.cmd(&["SET", &key, &value]), Frame::Simple("OK".into()));
                assert_eq!(c.cmd(&["GET", &key]), Frame::Bulk(value.into()));
                good_ops.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
        })
    };

    let fuzzers: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                for round in 0..150u64 {
                    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                        continue;
                    };
                    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                    let len = 1 + (rand::random::<u16>() % 2048) as usize;
                    let mut junk: Vec<u8> = (0..len).map(|_| rand::random::<u8>()).collect();
                    // Half the rounds start like a RESP frame, to reach deeper parser states.
                    if (t + round) % 2 == 0 {
                        junk.splice(0..0, b"*3\r\n$3\r\nSET\r\n$".iter().copied());
                    }
                    use std::io::Write;
                    let _ = s.write_all(&junk);
                    let mut sink = [0u8; 4096];
                    let _ = s.read(&mut sink);
                }
            })
        })
        .collect();
    for f in fuzzers {
        f.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    good.join()
        .expect("the well-behaved client saw a wrong answer");
    assert!(good_ops.load(Ordering::SeqCst) >= 200);
    let mut c = Resp::connect(port);
    assert_eq!(c.cmd(&["PING"]), Frame::Simple("PONG".into()), "node died");
}
