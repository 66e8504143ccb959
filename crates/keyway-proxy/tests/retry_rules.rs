//! The proxy's retry rules against scripted fake nodes (a real proxy, a
//! real embedded metadata store, nodes that answer what the test says):
//! - a rejected request did not run, so it is re-sent, even `INCR`, and a
//!   `-KWMOVED` record is patched into the map (the next request goes
//!   straight to the new owner);
//! - `-CLUSTERDOWN` is waited out within the request deadline;
//! - a request whose connection died after it was sent may have run: `GET`
//!   is re-sent, `INCR` and `SET` are answered with an error saying their
//!   outcome is unknown, and are sent exactly once (a re-sent `SET` could
//!   bring back a value a later acknowledged write replaced).

mod common;

use bytes::Bytes;
use common::{Client, FakeNode, owner_script, proxy_over};
use keyway_resp::Frame;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

#[tokio::test]
async fn a_lost_reply_fails_incr_and_set_once_and_retries_get() {
    let dir = tempfile::tempdir().unwrap();
    let node = FakeNode::start(Arc::new(owner_script)).await;
    let proxy = proxy_over(&node.addr, dir.path()).await;
    let mut client = Client::connect(proxy.resp_addr()).await;

    node.drop_next.store(true, Ordering::SeqCst);
    let reply = client.cmd(&["INCR", "k"]).await;
    let Frame::Error(msg) = &reply else {
        panic!("INCR after a lost reply must fail, got {reply:?}")
    };
    assert!(
        msg.contains("INCR may or may not have been applied"),
        "{msg}"
    );
    let incrs = |n: &FakeNode| n.seen().iter().filter(|r| r.contains(" INCR ")).count();
    assert_eq!(incrs(&node), 1, "INCR is never re-sent: {:?}", node.seen());

    node.drop_next.store(true, Ordering::SeqCst);
    let reply = client.cmd(&["SET", "k", "v"]).await;
    assert!(
        matches!(&reply, Frame::Error(m) if m.contains("SET may or may not have been applied")),
        "SET after a lost reply must fail, got {reply:?}"
    );
    let sets = |n: &FakeNode| n.seen().iter().filter(|r| r.contains(" SET ")).count();
    assert_eq!(sets(&node), 1, "SET is never re-sent: {:?}", node.seen());

    node.drop_next.store(true, Ordering::SeqCst);
    assert_eq!(client.cmd(&["GET", "k"]).await, Frame::bulk("v"));
    // Every request carried the partition and epoch it was routed by.
    assert!(
        node.seen().iter().all(|r| r.starts_with("KW.AT 1 1 ")),
        "{:?}",
        node.seen()
    );

    let status = proxy.status();
    assert_eq!(status.unknown_outcomes, 2, "{status:?}");
    assert!(status.upstream_errors >= 3, "{status:?}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_rejection_is_followed_at_once_even_for_incr_and_patches_the_map() {
    let dir = tempfile::tempdir().unwrap();
    let owner = FakeNode::start(Arc::new(owner_script)).await;
    // The node the map names answers every request with the record of a
    // move to `owner` (node 2, epoch 2).
    let moved = format!("KWMOVED 1 2 0 0000 - {:040x} {}", 2, owner.addr);
    let old = FakeNode::start(Arc::new(move |_: &[Bytes]| Frame::Error(moved.clone()))).await;
    let proxy = proxy_over(&old.addr, dir.path()).await;
    let mut client = Client::connect(proxy.resp_addr()).await;

    // A rejection proves the command did not run: even INCR is re-sent.
    assert_eq!(client.cmd(&["INCR", "counter"]).await, Frame::Integer(7));
    assert_eq!(old.seen(), vec!["KW.AT 1 1 INCR counter"]);
    assert_eq!(owner.seen(), vec!["KW.AT 1 2 INCR counter"]);
    // The record was patched in: the next request goes straight to the owner.
    assert_eq!(client.cmd(&["GET", "other"]).await, Frame::bulk("v"));
    assert_eq!(old.seen().len(), 1);
    assert_eq!(owner.seen().len(), 2);
    let status = proxy.status();
    assert_eq!(status.rejections_followed, 1, "{status:?}");
    assert_eq!(status.unknown_outcomes, 0, "{status:?}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn clusterdown_is_waited_out_and_a_deadline_ends_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    // Down for the first three requests, then serving.
    let calls = Arc::new(Mutex::new(0));
    let counted = calls.clone();
    let node = FakeNode::start(Arc::new(move |args: &[Bytes]| {
        let mut n = counted.lock().unwrap();
        *n += 1;
        if args
            .get(3)
            .is_some_and(|c| c.eq_ignore_ascii_case(b"PERSIST"))
        {
            return Frame::error("CLUSTERDOWN The cluster is down (node lease lapsed)");
        }
        if *n <= 3 {
            Frame::error("CLUSTERDOWN partition 1 is in its migration cutover; retry")
        } else {
            owner_script(args)
        }
    }))
    .await;
    let proxy = proxy_over(&node.addr, dir.path()).await;
    let mut client = Client::connect(proxy.resp_addr()).await;
    assert_eq!(client.cmd(&["INCR", "k"]).await, Frame::Integer(7));
    assert_eq!(*calls.lock().unwrap(), 4);
    // A node that stays down: the last error, once the deadline passes.
    let started = std::time::Instant::now();
    let reply = client.cmd(&["PERSIST", "k"]).await;
    assert_eq!(
        reply,
        Frame::error("CLUSTERDOWN The cluster is down (node lease lapsed)")
    );
    assert!(started.elapsed() >= std::time::Duration::from_millis(2_900));
    assert_eq!(proxy.status().timeouts, 1);
    proxy.shutdown().await;
}
