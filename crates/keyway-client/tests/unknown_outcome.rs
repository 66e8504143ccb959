//! The smart client re-sends a command only when doing so cannot apply it
//! twice: after a rejection or a failure before the request was written
//! (any command), or after a lost reply (retry-safe commands only). A
//! fake node on port 0 answers `KW.MAP` and, for data commands, does what
//! the test says: answer, or read the request and drop the connection.

use bytes::{Bytes, BytesMut};
use keyway_client::{Client, ClientConfig, ClientError};
use keyway_map::{MapVersion, NodeId, NodeInfo, PartitionMap, encode_map};
use keyway_resp::{Frame, Limits, Protocol, RequestParser, encode};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the fake node does with a data command it read.
enum Action {
    Reply(Frame),
    /// Drop the connection without answering.
    Drop,
    /// Keep the connection, never answer.
    Hang,
}

/// What the fake node does with the `n`th (0-based) data command it reads.
type Handler = Arc<dyn Fn(&str, usize) -> Action + Send + Sync>;

/// The map the fake node at the given address serves for its `n`th `KW.MAP`.
type Maps = Arc<dyn Fn(&str, usize) -> PartitionMap + Send + Sync>;

struct FakeNode {
    addr: String,
    /// Data commands read (the command under `KW.AT`), in order.
    seen: Arc<Mutex<Vec<String>>>,
}

/// A one-node map of version `version` whose node is at `addr`.
fn map_at(addr: &str, version: u64) -> PartitionMap {
    let node = NodeInfo::up(NodeId(1), addr.to_string());
    let mut map = PartitionMap::bootstrap(&[node], 1).unwrap();
    map.version = MapVersion(version);
    map
}

/// Starts a fake node. `maps` answers its `n`th `KW.MAP` request; `data`
/// decides each data command.
async fn fake_node(maps: Maps, data: Handler) -> FakeNode {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let map_calls = Arc::new(Mutex::new(0usize));
    let (me, log) = (addr.clone(), seen.clone());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (maps, data, log, map_calls, me) = (
                maps.clone(),
                data.clone(),
                log.clone(),
                map_calls.clone(),
                me.clone(),
            );
            tokio::spawn(async move {
                let mut parser = RequestParser::new(Limits::default());
                let mut buf = BytesMut::new();
                loop {
                    let args = match parser.parse(&mut buf) {
                        Ok(Some(args)) => args,
                        Ok(None) => match stream.read_buf(&mut buf).await {
                            Ok(n) if n > 0 => continue,
                            _ => return,
                        },
                        Err(_) => return,
                    };
                    let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
                    let reply = if name == "KW.MAP" {
                        let n = {
                            let mut calls = map_calls.lock().unwrap();
                            *calls += 1;
                            *calls - 1
                        };
                        Frame::Bulk(Bytes::from(encode_map(&maps(&me, n))))
                    } else {
                        let command = if name == "KW.AT" {
                            String::from_utf8_lossy(&args[3]).to_ascii_uppercase()
                        } else {
                            name
                        };
                        let n = {
                            let mut seen = log.lock().unwrap();
                            seen.push(command.clone());
                            seen.iter().filter(|c| **c == command).count() - 1
                        };
                        match data(&command, n) {
                            Action::Reply(reply) => reply,
                            // Read, maybe applied, never answered.
                            Action::Drop => return,
                            Action::Hang => {
                                let _ = stream.read_buf(&mut buf).await;
                                return;
                            }
                        }
                    };
                    let mut out = BytesMut::new();
                    encode(&reply, Protocol::Resp2, &mut out);
                    if stream.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    FakeNode { addr, seen }
}

impl FakeNode {
    fn seen(&self, command: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|c| *c == command)
            .count()
    }
}

fn config() -> ClientConfig {
    ClientConfig {
        min_refresh_interval_ms: 0,
        ..ClientConfig::default()
    }
}

/// Its own address in every map it serves.
fn self_map() -> Maps {
    Arc::new(|me, n| map_at(me, 1 + n as u64))
}

#[tokio::test]
async fn an_incr_whose_reply_was_lost_is_not_sent_again() {
    let node = fake_node(self_map(), Arc::new(|_, _| Action::Drop)).await;
    let client = Client::connect(&[node.addr.as_str()], config())
        .await
        .unwrap();
    match client.incr_by(b"counter", 1).await {
        Err(ClientError::UnknownOutcome { addr, .. }) => assert_eq!(addr, node.addr),
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
    assert_eq!(node.seen("INCRBY"), 1, "the INCR was sent exactly once");
    assert_eq!(client.stats().unknown_outcomes, 1);
    let append = client.command(&[b"APPEND", b"k", b"x"]).await;
    assert!(
        matches!(append, Err(ClientError::UnknownOutcome { .. })),
        "{append:?}"
    );
    assert_eq!(node.seen("APPEND"), 1);
    let text = client.incr_by(b"counter", 1).await.unwrap_err().to_string();
    assert!(
        text.contains("may or may not have been applied"),
        "the error says the outcome is unknown: {text}"
    );
}

#[tokio::test]
async fn a_get_whose_reply_was_lost_is_sent_again() {
    let node = fake_node(
        self_map(),
        Arc::new(|_, n| match n {
            0 => Action::Drop,
            _ => Action::Reply(Frame::bulk("v")),
        }),
    )
    .await;
    let client = Client::connect(&[node.addr.as_str()], config())
        .await
        .unwrap();
    assert_eq!(
        client.get(b"k").await.unwrap(),
        Some(Bytes::from_static(b"v"))
    );
    assert_eq!(node.seen("GET"), 2, "dropped once, answered on the retry");
    assert_eq!(client.stats().unknown_outcomes, 0);
}

#[tokio::test]
async fn a_refused_connection_is_retried_on_the_refreshed_route() {
    // An address nothing listens on: the first map routes there.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let maps: Maps = {
        let dead = dead.clone();
        Arc::new(move |me, n| match n {
            0 => map_at(&dead, 1),
            _ => map_at(me, 2),
        })
    };
    let node = fake_node(maps, Arc::new(|_, _| Action::Reply(Frame::Integer(1)))).await;
    let client = Client::connect(&[node.addr.as_str()], config())
        .await
        .unwrap();
    assert_eq!(client.map().nodes[&NodeId(1)].resp_addr, dead);
    assert_eq!(client.incr_by(b"counter", 1).await.unwrap(), 1);
    assert_eq!(node.seen("INCRBY"), 1);
    assert_eq!(client.map().nodes[&NodeId(1)].resp_addr, node.addr);
    let stats = client.stats();
    assert_eq!((stats.io_errors, stats.unknown_outcomes), (1, 0));
}

#[tokio::test]
async fn an_incr_that_timed_out_after_it_was_sent_is_not_sent_again() {
    let node = fake_node(self_map(), Arc::new(|_, _| Action::Hang)).await;
    let client = Client::connect(
        &[node.addr.as_str()],
        ClientConfig {
            request_timeout_ms: 200,
            ..config()
        },
    )
    .await
    .unwrap();
    match client.incr_by(b"counter", 1).await {
        Err(ClientError::UnknownOutcome { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::TimedOut)
        }
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
    assert_eq!(node.seen("INCRBY"), 1);
}
