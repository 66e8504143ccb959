//! [`connect`]: opens a metadata store from a URL, the one way the rest of
//! Keyway names a metadata store (`--meta` flags, config files).

use crate::{
    EmbeddedMeta, EmbeddedOptions, EtcdMeta, EtcdOptions, MetaError, MetaStore, RemoteMeta,
    RemoteOptions,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const ACCEPTED: &str = "keyway://host:port (a `keyway meta` server), file:///absolute/dir (an embedded store opened in this process) or etcd://host:port[,host:port...]/key/prefix (an etcd cluster)";

/// Opens a store from a URL:
/// - `keyway://host:port` -> [`RemoteMeta`], a gRPC client of a `keyway meta`
///   server (lazy: succeeds even while the server is down);
/// - `file:///abs/dir` -> [`EmbeddedMeta`] opened in-process on that
///   directory (created if missing; the path is taken literally, without
///   percent-decoding);
/// - `etcd://host:port[,host:port...]/<key prefix>` -> [`EtcdMeta`] on
///   those etcd members, every key under the prefix (one prefix per Keyway
///   cluster, e.g. `/keyway/prod`; lazy: succeeds while etcd is down);
///   a malformed one is refused saying what is wrong;
/// - anything else is refused with [`MetaError::InvalidArgument`] naming
///   the accepted schemes.
pub async fn connect(url: &str) -> Result<Arc<dyn MetaStore>, MetaError> {
    connect_with(url, None).await
}

/// [`connect`], with every call's deadline `rpc_timeout` instead of the
/// client's default (2 s) for a `keyway://` or `etcd://` store (an embedded
/// store has no calls to time out). `keyway ctl` waits longer than a node
/// does: an operator's command should not fail because the store took a
/// little over 2 s on a busy machine.
pub async fn connect_with(
    url: &str,
    rpc_timeout: Option<Duration>,
) -> Result<Arc<dyn MetaStore>, MetaError> {
    if url.starts_with("keyway://") {
        let mut opts = RemoteOptions::default();
        if let Some(t) = rpc_timeout {
            opts.rpc_timeout = t;
        }
        return Ok(Arc::new(RemoteMeta::connect_with(url, opts).await?));
    }
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(MetaError::InvalidArgument(format!(
                "metadata store URL {url:?}: a file URL needs an absolute path, as in file:///var/lib/keyway/meta"
            )));
        }
        let dir = PathBuf::from(path);
        let store = tokio::task::spawn_blocking(move || {
            EmbeddedMeta::open(&dir, EmbeddedOptions::default())
        })
        .await
        .map_err(|e| MetaError::Internal(format!("open embedded metadata store: {e}")))??;
        return Ok(Arc::new(store));
    }
    if url.starts_with("etcd://") {
        let mut opts = EtcdOptions::default();
        if let Some(t) = rpc_timeout {
            opts.rpc_timeout = t;
        }
        return Ok(Arc::new(EtcdMeta::connect_with(url, opts).await?));
    }
    Err(MetaError::InvalidArgument(format!(
        "metadata store URL {url:?} has an unknown scheme; accepted: {ACCEPTED}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn refused(url: &str) -> String {
        match connect(url).await {
            Err(MetaError::InvalidArgument(msg)) => msg,
            Err(e) => panic!("{url}: expected InvalidArgument, got {e:?}"),
            Ok(_) => panic!("{url}: expected InvalidArgument, got a store"),
        }
    }

    #[tokio::test]
    async fn unknown_schemes_name_the_accepted_ones() {
        for url in ["redis://x:1", "localhost:7000", "", "file:relative"] {
            let msg = refused(url).await;
            assert!(
                msg.contains("keyway://") && msg.contains("file:///") && msg.contains("etcd://"),
                "{msg}"
            );
        }
        let msg = refused("etcd://127.0.0.1:2379").await;
        assert!(msg.contains("no key prefix"), "{msg}");
        let msg = refused("etcd://127.0.0.1/keyway/x").await;
        assert!(msg.contains("not host:port"), "{msg}");
        let msg = refused("file://relative/dir").await;
        assert!(msg.contains("absolute"), "{msg}");
        assert!(refused("keyway://").await.contains("host:port"));
        assert!(refused("keyway://h:1/path").await.contains("host:port"));
    }

    #[tokio::test]
    async fn file_url_opens_an_embedded_store_and_keyway_url_a_lazy_client() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().join("meta").display());
        let store = connect(&url).await.unwrap();
        let id = store
            .register_node(None, "a:1".into(), "a:2".into())
            .await
            .unwrap();
        assert_eq!(id, keyway_map::NodeId(1));
        assert!(dir.path().join("meta").join(crate::JOURNAL_FILE).exists());
        // Nothing listens there: creating the client still succeeds (lazy).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let remote = connect(&format!("keyway://{addr}")).await.unwrap();
        assert!(matches!(
            remote.get_map().await,
            Err(MetaError::Unavailable(_))
        ));
    }

    /// A server that accepts connections and never answers: a call fails
    /// at the deadline `connect_with` set, not at the default 2 s, in both
    /// directions.
    #[tokio::test]
    async fn connect_with_sets_every_calls_deadline() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut held = Vec::new();
        let accept = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let url = format!("keyway://{addr}");
        let short = connect_with(&url, Some(Duration::from_millis(200)))
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let err = short.get_map().await.unwrap_err();
        assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_millis(1_900),
            "a 200 ms deadline failed the call after {took:?}"
        );
        let long = connect_with(&url, Some(Duration::from_secs(30)))
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(2_500), long.get_map())
                .await
                .is_err(),
            "a 30 s deadline still waits past the default 2 s"
        );
        accept.abort();
    }

    #[tokio::test]
    async fn etcd_url_opens_a_lazy_etcd_store() {
        // Nothing listens there: opening succeeds, calls are Unavailable.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let store = connect(&format!("etcd://{addr}/keyway/test"))
            .await
            .unwrap();
        let err = store.get_map().await.unwrap_err();
        assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");
    }
}
