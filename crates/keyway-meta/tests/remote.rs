//! The conformance suite against `RemoteMeta` -> gRPC server on a real
//! loopback port -> `EmbeddedMeta`, plus the remote-only behaviour: the
//! server restarting on the same port under a client that is not recreated,
//! watch streams ending with an error when the server goes away, and RPC
//! deadlines.

use futures::StreamExt;
use keyway_map::{MapVersion, NodeId};
use keyway_meta::conformance::{self, DEADLINE, Fixture, eventually};
use keyway_meta::{
    EmbeddedMeta, EmbeddedOptions, MapTxn, MapUpdate, MetaError, MetaStore, RemoteMeta,
    RemoteOptions, serve,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const HISTORY: usize = 16;

/// A `keyway meta`-like server: an embedded store served on a port.
struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), MetaError>>>,
}

impl Server {
    /// Opens the store in `dir` (polling: the previous server may still be
    /// releasing it) and serves it on `listener`.
    async fn start(dir: &Path, listener: TcpListener) -> Server {
        let addr = listener.local_addr().unwrap();
        let store = eventually("the store directory to be free", DEADLINE, || async {
            let opts = EmbeddedOptions {
                history_versions: HISTORY,
                ..EmbeddedOptions::default()
            };
            EmbeddedMeta::open(dir, opts).ok()
        })
        .await;
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(serve(Arc::new(store), listener, async move {
            let _ = rx.await;
        }));
        Server {
            addr,
            stop: Some(tx),
            task: Some(task),
        }
    }

    async fn on_port_zero(dir: &Path) -> Server {
        Server::start(dir, TcpListener::bind("127.0.0.1:0").await.unwrap()).await
    }

    /// Shuts down gracefully and waits until it has stopped.
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let task = self.task.take().unwrap();
        tokio::time::timeout(DEADLINE, task)
            .await
            .expect("server did not stop within the deadline")
            .unwrap()
            .unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::on_port_zero(dir.path()).await;
    let client = RemoteMeta::connect(&format!("keyway://{}", server.addr))
        .await
        .unwrap();
    Fixture {
        store: Arc::new(client),
        history_versions: HISTORY,
        keep: Box::new((server, dir)),
    }
}

keyway_meta::meta_conformance_tests!(crate::fixture());

async fn rebind(addr: SocketAddr) -> TcpListener {
    eventually("the port to be free again", DEADLINE, || async {
        TcpListener::bind(addr).await.ok()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_recovers_when_the_server_restarts_on_the_same_port() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::on_port_zero(dir.path()).await;
    let addr = server.addr;
    let client = RemoteMeta::connect(&addr.to_string()).await.unwrap();
    let map = conformance::bootstrapped(&client, 2, 2).await;
    let mut watch = client.watch(map.version).await.unwrap();

    server.stop().await;
    // The watch ends with an error item (callers re-watch), then ends.
    let item = tokio::time::timeout(DEADLINE, watch.next())
        .await
        .expect("watch must notice the server going away")
        .expect("an error item, not a silent end");
    assert!(matches!(item, Err(MetaError::Unavailable(_))), "{item:?}");
    assert!(watch.next().await.is_none());
    let err = client.get_map().await.unwrap_err();
    assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");

    let server = Server::start(dir.path(), rebind(addr).await).await;
    let recovered = eventually(
        "the same client to reach the restarted server",
        DEADLINE,
        || async { client.get_map().await.ok() },
    )
    .await;
    assert_eq!(recovered, map, "the map survived the restart");

    let mut watch = client.watch(map.version).await.unwrap();
    let v = client.commit(MapTxn::default()).await.unwrap();
    assert_eq!(v, MapVersion(map.version.0 + 1));
    let update = conformance::next_update(&mut watch).await.unwrap();
    assert_eq!(update, MapUpdate::Delta(vec![(v, vec![])]));
    assert_eq!(
        client.register_node(None, "c:1".into(), "c:2".into()).await,
        Ok(NodeId(3))
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_restart_through_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().to_path_buf();
    let running: Arc<tokio::sync::Mutex<Option<Server>>> = Arc::default();
    conformance::survives_restart(|| {
        let path = path.clone();
        let running = running.clone();
        async move {
            let mut slot = running.lock().await;
            if let Some(old) = slot.take() {
                old.stop().await;
            }
            let server = Server::on_port_zero(&path).await;
            let client = RemoteMeta::connect(&server.addr.to_string()).await.unwrap();
            *slot = Some(server);
            let store: Arc<dyn MetaStore> = Arc::new(client);
            store
        }
    })
    .await;
}

#[tokio::test]
async fn a_call_to_a_server_that_never_answers_times_out_as_unavailable() {
    // Accepts TCP connections and never speaks HTTP/2.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let opts = RemoteOptions {
        rpc_timeout: Duration::from_millis(300),
        ..RemoteOptions::default()
    };
    let client = RemoteMeta::connect_with(&addr.to_string(), opts)
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let err = client.get_map().await.unwrap_err();
    assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");
    assert!(started.elapsed() < DEADLINE, "the deadline bounds the call");
    let err = client.commit(MapTxn::default()).await.unwrap_err();
    assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");
    silent.abort();
}

#[tokio::test]
async fn nothing_listening_is_unavailable_not_a_hang() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = RemoteMeta::connect(&format!("keyway://{addr}"))
        .await
        .unwrap();
    for _ in 0..2 {
        let err = client.leases().await.unwrap_err();
        assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");
    }
    let err = client.watch(MapVersion(0)).await.err().unwrap();
    assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");
}
