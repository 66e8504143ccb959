//! One client connection's pipeline through the proxy: replies come back
//! in request order, requests on one key run in order even when the first
//! has to wait and retry, and requests on other keys do not wait for it.

mod common;

use bytes::Bytes;
use common::{Client, FakeNode, owner_script, proxy_over};
use keyway_resp::Frame;
use std::sync::{Arc, Mutex};

#[tokio::test]
async fn a_retried_write_still_runs_before_a_later_read_of_its_key() {
    let dir = tempfile::tempdir().unwrap();
    // The first SET is refused (a cutover): the proxy retries it shortly.
    let refused = Arc::new(Mutex::new(false));
    let flag = refused.clone();
    let node = FakeNode::start(Arc::new(move |args: &[Bytes]| {
        let is_set = args.get(3).is_some_and(|c| c.eq_ignore_ascii_case(b"SET"));
        let mut refused = flag.lock().unwrap();
        if is_set && !*refused {
            *refused = true;
            return Frame::error("CLUSTERDOWN partition 1 is in its migration cutover; retry");
        }
        match args.get(3).map(|c| c.to_ascii_uppercase()).as_deref() {
            Some(b"GET") => Frame::Bulk(args[4].clone()),
            Some(b"MGET") => Frame::Array(args[4..].iter().cloned().map(Frame::Bulk).collect()),
            _ => owner_script(args),
        }
    }))
    .await;
    let proxy = proxy_over(&node.addr, dir.path()).await;
    let mut client = Client::connect(proxy.resp_addr()).await;
    let replies = client
        .pipeline(&[
            &["SET", "k", "v"],
            &["GET", "k"],
            &["GET", "other"],
            &["PING"],
            &["MGET", "k", "other"],
        ])
        .await;
    assert_eq!(
        replies,
        vec![
            Frame::ok(),
            Frame::bulk("k"),
            Frame::bulk("other"),
            Frame::Simple("PONG".into()),
            // Split by slot, merged back in the client's key order.
            Frame::Array(vec![Frame::bulk("k"), Frame::bulk("other")]),
        ]
    );
    let seen = node.seen();
    let at = |req: &str| {
        seen.iter()
            .position(|r| r.ends_with(req))
            .unwrap_or_else(|| panic!("{req} never reached the node: {seen:?}"))
    };
    let last_set = seen.iter().rposition(|r| r.ends_with("SET k v")).unwrap();
    assert_eq!(
        seen.iter().filter(|r| r.ends_with("SET k v")).count(),
        2,
        "{seen:?}"
    );
    assert!(
        last_set < at("GET k"),
        "GET k ran before the SET it follows: {seen:?}"
    );
    assert!(
        at("GET other") < last_set,
        "GET other waited for the SET of another key: {seen:?}"
    );
    proxy.shutdown().await;
}
