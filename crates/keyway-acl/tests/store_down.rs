//! A metadata store that goes away: the users last applied stay in force,
//! `ACL SETUSER`/`DELUSER` fail with a clear error and change nothing, and
//! the poll counts its failures. The store is a real embedded store served
//! over its RPC on a loopback port, stopped mid-test.

use bytes::Bytes;
use keyway_acl::{Acl, Catalog, acl_command, sync_once};
use keyway_meta::{EmbeddedMeta, EmbeddedOptions, MetaStore, RemoteMeta, RemoteOptions};
use keyway_resp::Frame;
use std::sync::Arc;
use std::time::Duration;

fn args(a: &[&str]) -> Vec<Bytes> {
    a.iter()
        .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_keeps_the_last_applied_acl() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn MetaStore> =
        Arc::new(EmbeddedMeta::open(dir.path(), EmbeddedOptions::default()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(keyway_meta::serve(store, listener, async move {
        let _ = stopped.await;
    }));
    let remote = RemoteMeta::connect_with(
        &addr.to_string(),
        RemoteOptions {
            rpc_timeout: Duration::from_millis(500),
            ..RemoteOptions::default()
        },
    )
    .await
    .unwrap();
    let catalog = Arc::new(Catalog::new([
        ("get".to_string(), vec!["@read", "@string", "@fast"]),
        ("set".to_string(), vec!["@write", "@string", "@slow"]),
    ]));
    let writer = Acl::new(catalog.clone(), None);
    let reader = Acl::new(catalog, None);
    let setuser = args(&["ACL", "SETUSER", "app", "on", ">pw", "~app:*", "+@read"]);
    assert_eq!(
        acl_command(&writer, &remote, "default", &setuser).await,
        Frame::ok()
    );
    assert!(
        sync_once(&reader, &remote).await.unwrap(),
        "the reader applies it"
    );
    assert!(reader.authenticate(b"app", b"pw").is_some());

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();

    let reply = acl_command(
        &writer,
        &remote,
        "default",
        &args(&["ACL", "SETUSER", "app", "off"]),
    )
    .await;
    let Frame::Error(text) = reply else {
        panic!("SETUSER with the store down must fail, got {reply:?}");
    };
    assert!(
        text.starts_with("ERR ACL SETUSER failed: the metadata store did not take the change"),
        "{text}"
    );
    assert!(
        writer.authenticate(b"app", b"pw").is_some(),
        "nothing changed"
    );
    let reply = acl_command(
        &writer,
        &remote,
        "default",
        &args(&["ACL", "DELUSER", "app"]),
    )
    .await;
    assert!(
        matches!(&reply, Frame::Error(t) if t.starts_with("ERR ACL DELUSER failed")),
        "{reply:?}"
    );
    assert!(sync_once(&reader, &remote).await.is_err(), "the poll fails");
    assert!(
        reader.authenticate(b"app", b"pw").is_some(),
        "the last applied users stay in force"
    );
}
