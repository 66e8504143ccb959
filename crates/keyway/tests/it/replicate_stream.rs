//! The `ReplicateStream` peer call on a real node, driven by hand through
//! `keyway_peer::replicate_stream` (a primary's stream does the same):
//! calls queued at once, while the replica side is stalled, are answered
//! one each and in the order sent; a refused call ends the stream (the
//! next answer is an error without a call being served), and a new stream
//! carries a new chain of the same sender.

use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_peer::migration::RefusalReason;
use keyway_peer::{PeerClient, PeerError, pb};

/// A stream call of sender 77 (no partitions, no records: a heartbeat,
/// which the replica orders and answers like any call).
fn call(incarnation: u64, call: u64, after_call: u64) -> pb::ReplicateRequest {
    pb::ReplicateRequest {
        sender: 77,
        incarnation,
        call,
        prev_token: 0,
        partitions: vec![],
        records: vec![],
        sync: false,
        read_lease_ms: 0,
        drop_partition: 0,
        drop_limit: 0,
        stream: true,
        after_call,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_calls_are_answered_in_order_and_a_refusal_ends_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(1, dir.path().to_path_buf());
    spec.manager = None;
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    let node = c.node(0).unwrap();
    let replica = node.shared().replication.replica.clone();
    let metrics = node.shared().replication.metrics.clone();
    let peer = PeerClient::connect(node.admin_addr()).unwrap();

    // Three calls, each continuing the one before, queued while the
    // replica side is stalled: they arrive together and race to its
    // ordered section; the answers come back one each, in call order.
    replica.set_paused(true);
    let mut stream = peer.replicate_stream();
    for n in 1..=3 {
        stream.send(call(5, n, n - 1));
    }
    let waiting = tokio::time::timeout(std::time::Duration::from_millis(200), stream.answer());
    assert!(waiting.await.is_err(), "answered while the replica stalls");
    replica.set_paused(false);
    let mut tokens = Vec::new();
    for _ in 0..3 {
        tokens.push(stream.answer().await.expect("answered").token);
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]) && tokens[0] != 0,
        "answers in call order: {tokens:?}"
    );

    // A call older than one applied is refused (stale): the stream ends
    // with it, so the call queued behind it gets no answer on it.
    let refused_before = metrics.replica_refusals.get();
    stream.send(call(5, 2, 1));
    stream.send(call(5, 4, 3));
    match stream.answer().await {
        Err(PeerError::Refused {
            reason: RefusalReason::Stale,
            ..
        }) => {}
        other => panic!("expected a stale refusal, got {other:?}"),
    }
    assert!(
        matches!(stream.answer().await, Err(PeerError::Unavailable(_))),
        "a failed stream answers nothing more"
    );
    assert_eq!(metrics.replica_refusals.get(), refused_before + 1);

    // A new stream: the sender's new chain (after_call 0) is served.
    let mut again = peer.replicate_stream();
    again.send(call(5, 10, 0));
    let answer = again.answer().await.expect("a new stream is served");
    assert!(
        answer.token > tokens[2],
        "{} after {tokens:?}",
        answer.token
    );
    drop(again);
    c.shutdown().await;
}
