//! Scripted fake nodes, a proxy over them, and a plain RESP client: what
//! the proxy's own tests drive it with.

#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use keyway_meta::MetaStore;
use keyway_proxy::{Proxy, ProxyConfig};
use keyway_resp::{Frame, Limits, Protocol, RequestParser, ResponseParser, encode, encode_command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub type Script = Arc<dyn Fn(&[Bytes]) -> Frame + Send + Sync>;

/// A node that records every request and answers with `script`.
pub struct FakeNode {
    pub addr: String,
    pub seen: Arc<Mutex<Vec<Vec<Bytes>>>>,
    /// Close the connection instead of answering the next request.
    pub drop_next: Arc<AtomicBool>,
    /// Milliseconds to wait before each reply.
    pub delay_ms: Arc<AtomicU64>,
}

impl FakeNode {
    pub async fn start(script: Script) -> FakeNode {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let drop_next = Arc::new(AtomicBool::new(false));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (s, d, w) = (seen.clone(), drop_next.clone(), delay_ms.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let behaviour = Behaviour {
                    script: script.clone(),
                    seen: s.clone(),
                    drop_next: d.clone(),
                    delay_ms: w.clone(),
                };
                tokio::spawn(serve(stream, behaviour));
            }
        });
        FakeNode {
            addr,
            seen,
            drop_next,
            delay_ms,
        }
    }

    /// The requests seen so far, as text.
    pub fn seen(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|args| {
                args.iter()
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }
}

struct Behaviour {
    script: Script,
    seen: Arc<Mutex<Vec<Vec<Bytes>>>>,
    drop_next: Arc<AtomicBool>,
    delay_ms: Arc<AtomicU64>,
}

async fn serve(mut stream: TcpStream, b: Behaviour) {
    let mut parser = RequestParser::new(Limits::default());
    let mut buf = BytesMut::new();
    loop {
        while let Some(args) = parser.parse(&mut buf).unwrap() {
            let reply = if args[0].eq_ignore_ascii_case(b"HELLO") {
                Frame::Map(vec![(Frame::bulk("proto"), Frame::Integer(3))])
            } else if args[0].eq_ignore_ascii_case(b"READONLY") {
                // Part of the proxy's connection handshake, as HELLO.
                Frame::Simple("OK".into())
            } else {
                b.seen.lock().unwrap().push(args.clone());
                if b.drop_next.swap(false, Ordering::SeqCst) {
                    return; // the request arrived; its reply is lost
                }
                let delay = b.delay_ms.load(Ordering::SeqCst);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                (b.script)(&args)
            };
            let mut out = BytesMut::new();
            encode(&reply, Protocol::Resp3, &mut out);
            stream.write_all(&out).await.unwrap();
        }
        if stream.read_buf(&mut buf).await.unwrap_or(0) == 0 {
            return;
        }
    }
}

/// A proxy whose map puts every slot on one node, at `addr`, at epoch 1.
pub async fn proxy_over(addr: &str, dir: &std::path::Path) -> Proxy {
    proxy_with(addr, dir, |_| {}).await
}

/// [`proxy_over`] with `edit` applied to the test configuration.
pub async fn proxy_with(
    addr: &str,
    dir: &std::path::Path,
    edit: impl FnOnce(&mut ProxyConfig),
) -> Proxy {
    let meta: Arc<dyn MetaStore> = keyway_meta::connect(&format!("file://{}", dir.display()))
        .await
        .unwrap();
    meta.register_node(None, addr.to_string(), String::new())
        .await
        .unwrap();
    assert!(meta.bootstrap_if_empty(1, 1).await.unwrap());
    let mut config = ProxyConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        request_timeout_ms: 3_000,
        connect_timeout_ms: 500,
        ..ProxyConfig::default()
    };
    edit(&mut config);
    Proxy::start(config, meta).await.unwrap()
}

/// A plain RESP client of the proxy.
pub struct Client {
    stream: TcpStream,
    parser: ResponseParser,
    buf: BytesMut,
}

impl Client {
    pub async fn connect(addr: &str) -> Client {
        Client {
            stream: TcpStream::connect(addr).await.unwrap(),
            parser: ResponseParser::new(Limits::default()),
            buf: BytesMut::new(),
        }
    }

    pub async fn cmd(&mut self, args: &[&str]) -> Frame {
        self.pipeline(&[args]).await.remove(0)
    }

    /// Writes every command in one go, then reads their replies.
    pub async fn pipeline(&mut self, commands: &[&[&str]]) -> Vec<Frame> {
        let mut out = BytesMut::new();
        for args in commands {
            encode_command(args, &mut out);
        }
        self.stream.write_all(&out).await.unwrap();
        let mut replies = Vec::new();
        while replies.len() < commands.len() {
            if let Some(frame) = self.parser.parse(&mut self.buf).unwrap() {
                replies.push(frame);
                continue;
            }
            assert!(self.stream.read_buf(&mut self.buf).await.unwrap() > 0);
        }
        replies
    }
}

/// What a healthy owner answers to `KW.AT p e <command...>`.
pub fn owner_script(args: &[Bytes]) -> Frame {
    match args.get(3).map(|c| c.to_ascii_uppercase()).as_deref() {
        Some(b"SET") => Frame::ok(),
        Some(b"GET") => Frame::bulk("v"),
        Some(b"INCR") => Frame::Integer(7),
        _ => Frame::error("ERR unexpected"),
    }
}
