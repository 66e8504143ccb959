//! The proxy process around the requests: `max_clients`, `/status` and
//! `/metrics` on the admin port, and a shutdown that lets a request in
//! flight finish.

mod common;

use common::{Client, FakeNode, owner_script, proxy_with};
use keyway_resp::Frame;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A plain HTTP GET: status line and body.
async fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

#[tokio::test]
async fn a_client_over_max_clients_is_refused_and_the_admin_port_reports() {
    let dir = tempfile::tempdir().unwrap();
    let node = FakeNode::start(Arc::new(owner_script)).await;
    let proxy = proxy_with(&node.addr, dir.path(), |c| c.max_clients = 1).await;
    let mut first = Client::connect(proxy.resp_addr()).await;
    assert_eq!(first.cmd(&["SET", "k", "v"]).await, Frame::ok());
    let mut second = Client::connect(proxy.resp_addr()).await;
    assert_eq!(
        second.cmd(&["PING"]).await,
        Frame::error("ERR max number of clients reached")
    );

    let (line, body) = http_get(proxy.admin_addr(), "/status").await;
    assert!(line.contains("200"), "{line}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["ready"], serde_json::Value::Bool(true), "{status}");
    assert_eq!(status["clients"].as_u64(), Some(1), "{status}");
    assert_eq!(status["partitions"].as_u64(), Some(1), "{status}");
    let (_, metrics) = http_get(proxy.admin_addr(), "/metrics").await;
    assert!(
        metrics.contains("keyway_proxy_clients_refused_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("keyway_proxy_requests_total{kind=\"forwarded\"} 1"),
        "{metrics}"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn shutdown_lets_a_request_in_flight_finish() {
    let dir = tempfile::tempdir().unwrap();
    let node = FakeNode::start(Arc::new(owner_script)).await;
    let proxy = proxy_with(&node.addr, dir.path(), |_| {}).await;
    let mut client = Client::connect(proxy.resp_addr()).await;
    assert_eq!(client.cmd(&["GET", "k"]).await, Frame::bulk("v"));
    node.delay_ms.store(300, Ordering::SeqCst);
    let slow = tokio::spawn(async move { client.cmd(&["GET", "k"]).await });
    // Shut down once the slow request has reached the node.
    while node.seen().len() < 2 {
        tokio::task::yield_now().await;
    }
    proxy.shutdown().await;
    assert_eq!(slow.await.unwrap(), Frame::bulk("v"));
}
