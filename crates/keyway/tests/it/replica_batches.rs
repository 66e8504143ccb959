//! A replica shows the primary's atomic batches wholly or not at all: the
//! change log marks batch ends (`ChangeRecord::batch_continues`), the stream
//! ships whole batches, the replica applies them in runs that end at batch
//! ends, and a `READONLY` read (which reads the engine several times for a
//! collection) never interleaves with an apply. Here an in-process 2-node
//! cluster with every partition replicated on the other node: a writer on
//! the primary rewrites all 600 fields of a hash per `HSET` (one batch of
//! 601 records, more than the replica's 128-record apply runs and the
//! hash's 512-entry scan chunks), and a reader on the replica's endpoint
//! checks that every `HGETALL` it is served holds one generation only.

use crate::common;

use common::replica::{raw_command, replicate_everything};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{DEFAULT_KEYSPACE, key_hash_slot};
use keyway_resp::Frame;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

const FIELDS: usize = 600;
const WRITES: usize = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_reads_never_see_half_of_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(2, dir.path().to_path_buf());
    spec.partitions_per_node = 2;
    spec.manager = None;
    spec.node.lease_ttl_ms = 30_000;
    spec.node.replica_lag_timeout_ms = 5_000;
    spec.node.replica_read_lease_ms = 2_000;
    spec.node.replica_heartbeat_ms = 100;
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    let map = replicate_everything(&c).await;
    let key = "{batches}h";
    let p = map
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(key.as_bytes()))
        .unwrap()
        .clone();
    let index = |id| {
        (0..c.len())
            .find(|i| c.node(*i).unwrap().id() == id)
            .unwrap()
    };
    let primary = c.node(index(p.owner)).unwrap();
    let replica = c.node(index(p.replicas[0])).unwrap();
    let mut writer = tokio::net::TcpStream::connect(primary.resp_addr())
        .await
        .unwrap();
    let mut reader = tokio::net::TcpStream::connect(replica.replica_addr().expect("on by default"))
        .await
        .unwrap();

    let hset = |generation: usize| -> Vec<String> {
        let mut args = vec!["HSET".to_string(), key.to_string()];
        for f in 0..FIELDS {
            args.push(format!("f{f}"));
            args.push(format!("g{generation}"));
        }
        args
    };
    let done = Arc::new(AtomicBool::new(false));
    let write = {
        let done = done.clone();
        tokio::spawn(async move {
            for generation in 0..WRITES {
                let args = hset(generation);
                let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
                let reply = raw_command(&mut writer, &args).await;
                assert!(matches!(reply, Frame::Integer(_)), "HSET: {reply:?}");
            }
            done.store(true, Ordering::Release);
        })
    };
    let (mut served, mut generations_seen) = (0usize, std::collections::BTreeSet::new());
    while !done.load(Ordering::Acquire) {
        let reply = raw_command(&mut reader, &["HGETALL", key]).await;
        let items = match reply {
            Frame::Array(items) => items,
            Frame::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
            // Not in sync or no read lease at this moment: refused, not torn.
            Frame::Error(e) if e.starts_with("MOVED") => continue,
            other => panic!("HGETALL on the replica: {other:?}"),
        };
        if items.is_empty() {
            continue;
        }
        assert_eq!(items.len(), 2 * FIELDS, "a whole hash or none");
        let values: std::collections::BTreeSet<String> = items
            .iter()
            .skip(1)
            .step_by(2)
            .map(|v| format!("{v:?}"))
            .collect();
        assert_eq!(values.len(), 1, "one generation per read, saw {values:?}");
        generations_seen.extend(values);
        served += 1;
    }
    write.await.unwrap();
    assert!(
        served >= 10 && generations_seen.len() >= 3,
        "the replica served {served} reads of {} generations: too few to say anything",
        generations_seen.len()
    );
    eprintln!(
        "replica served {served} HGETALLs over {} generations, none torn",
        generations_seen.len()
    );
    c.shutdown().await;
}
