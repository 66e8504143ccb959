//! The migration data plane end to end: two `FjallEngine`s (temporary
//! directories) behind two real `Peer` servers on loopback port 0, driven
//! through `PeerClient`, `copy_range` and `catch_up`.

use bytes::Bytes;
use keyway_node::peer::serve_engine;
use keyway_peer::{self as peer, CopyChunk, PeerClient, PeerError, catch_up, copy_range};
use keyway_storage::{
    ChangeRecord, Engine, FjallEngine, FjallOptions, KeyRange, Mutation, RangeDigest, Seq,
    ValueKind,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A `Peer` server over a fresh engine; stops when dropped.
struct Server {
    engine: Arc<FjallEngine>,
    client: PeerClient,
    _stop: oneshot::Sender<()>,
}

async fn server() -> Server {
    let engine = Arc::new(FjallEngine::open_temporary(FjallOptions::for_tests()).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let dyn_engine: Arc<dyn Engine> = engine.clone();
    tokio::spawn(serve_engine(dyn_engine, listener, async move {
        let _ = stopped.await;
    }));
    Server {
        engine,
        client: PeerClient::connect(&addr.to_string()).unwrap(),
        _stop: stop,
    }
}

fn key(prefix: &str, i: u64) -> Bytes {
    Bytes::from(format!("{prefix}{i:05}"))
}

fn put(k: Bytes, data: impl Into<Bytes>, expire_at_ms: Option<u64>) -> Mutation {
    Mutation::Put {
        key: k,
        kind: ValueKind::String,
        expire_at_ms,
        data: data.into(),
    }
}

/// The range under migration: every key starting with `m/`.
fn range() -> KeyRange {
    KeyRange::prefix(Bytes::from_static(b"m/"))
}

/// `n` keys `m/00000..` in the range, plus 300 keys below (`a/`) and above (`z/`) it.
fn preload(e: &dyn Engine, n: u64) {
    let mut muts = Vec::new();
    for i in 0..n {
        let exp = (i % 7 == 0).then_some(4_000_000_000_000 + i);
        muts.push(put(key("m/", i), format!("v{i}"), exp));
    }
    for i in 0..300 {
        muts.push(put(key("a/", i), format!("a{i}"), None));
        muts.push(put(key("z/", i), format!("z{i}"), None));
    }
    for batch in muts.chunks(1000) {
        e.apply(batch).unwrap();
    }
}

async fn digest(c: &PeerClient, r: &KeyRange) -> RangeDigest {
    c.digest(r).await.unwrap().0
}

/// Applies every chunk of a paged snapshot to each target; returns the
/// first and the last chunk's seq.
async fn copy_to(
    source: &PeerClient,
    targets: &[&PeerClient],
    after: Option<Bytes>,
    limit: usize,
) -> (Seq, Seq) {
    let mut after = after;
    let mut first = None;
    loop {
        let c = source
            .snapshot_chunk(&range(), after.as_ref(), limit, 1 << 20)
            .await
            .unwrap();
        first.get_or_insert(c.seq);
        let recs: Vec<ChangeRecord> = c.entries.iter().map(|e| e.to_change_record()).collect();
        for t in targets {
            t.apply_foreign(&recs).await.unwrap();
        }
        match c.next {
            Some(n) => after = Some(n),
            None => return (first.unwrap(), c.seq),
        }
    }
}

/// (a) A 5,000-key copy under a concurrent writer (puts, deletes, expiry
/// changes, inside and outside the range), catch-up, writer stopped, catch-up
/// again: both sides digest the range identically and nothing outside the
/// range reached the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_under_writes_then_catch_up_converges() {
    let src = server().await;
    let dst = server().await;
    preload(&*src.engine, 5_000);

    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let writer = {
        let (engine, stop, ops) = (src.engine.clone(), stop.clone(), ops.clone());
        std::thread::spawn(move || {
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // xorshift64
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let prefix = match x % 10 {
                    0 => "a/",
                    1 => "z/",
                    _ => "m/",
                };
                // Some keys beyond the preloaded ones, so puts also create keys.
                let k = key(prefix, (x >> 8) % 5_500);
                let m = match (x >> 40) % 5 {
                    0 | 1 => put(k, format!("w{n}"), None),
                    2 => put(k, format!("e{n}"), Some(5_000_000_000_000 + n)),
                    3 => Mutation::Delete { key: k },
                    _ => Mutation::SetExpiry {
                        key: k,
                        expire_at_ms: n.is_multiple_of(2).then_some(6_000_000_000_000 + n),
                    },
                };
                engine.apply(&[m]).unwrap();
                n += 1;
                ops.store(n, Ordering::Relaxed);
                if n.is_multiple_of(4) {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        })
    };
    while ops.load(Ordering::Relaxed) < 200 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let r = range();
    let chunk = CopyChunk {
        entries: 100,
        bytes: 64 * 1024,
    };
    let report = copy_range(&src.client, &dst.client, &r, chunk)
        .await
        .unwrap();
    let copied_at = src.engine.last_seq();
    assert!(report.keys >= 4_000, "{report:?}");
    assert!(
        copied_at > report.snapshot_seq + 50,
        "the writer must have written during the copy ({report:?}, last seq {copied_at})"
    );
    let seq = catch_up(&src.client, &dst.client, &r, report.snapshot_seq)
        .await
        .unwrap();
    assert!(seq >= copied_at);

    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let seq = catch_up(&src.client, &dst.client, &r, seq).await.unwrap();
    assert_eq!(seq, src.engine.last_seq());

    let want = digest(&src.client, &r).await;
    assert!(want.keys > 3_000, "{want:?}");
    assert_eq!(digest(&dst.client, &r).await, want);
    // Nothing outside the range was copied.
    assert_eq!(digest(&dst.client, &KeyRange::all()).await, want);
    // Catching up again is a no-op.
    assert_eq!(
        catch_up(&src.client, &dst.client, &r, seq).await.unwrap(),
        seq
    );
    assert_eq!(digest(&dst.client, &r).await, want);
}

/// Writes that land on already-copied keys between the first and the last
/// chunk are recovered by catch-up from the FIRST chunk's seq, and lost from
/// the last chunk's seq (the negative control proves the test can fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_must_start_at_the_first_chunk() {
    let src = server().await;
    let good = server().await;
    let bad = server().await;
    preload(&*src.engine, 1_000);
    let r = range();

    let first = src
        .client
        .snapshot_chunk(&r, None, 100, 1 << 20)
        .await
        .unwrap();
    let recs: Vec<ChangeRecord> = first.entries.iter().map(|e| e.to_change_record()).collect();
    for t in [&good.client, &bad.client] {
        t.apply_foreign(&recs).await.unwrap();
    }
    // Writes to keys of the first chunk (already copied) and to later ones.
    src.engine
        .apply(&[
            Mutation::Delete { key: key("m/", 5) },
            Mutation::SetExpiry {
                key: key("m/", 6),
                expire_at_ms: Some(7_000_000_000_000),
            },
            Mutation::SetExpiry {
                key: key("m/", 7),
                expire_at_ms: None,
            },
            put(key("m/", 8), "new", None),
            put(key("m/", 500), "later", None),
            Mutation::Delete {
                key: key("m/", 600),
            },
        ])
        .unwrap();
    let (_, last) = copy_to(&src.client, &[&good.client, &bad.client], first.next, 100).await;
    assert!(last > first.seq);

    catch_up(&src.client, &good.client, &r, first.seq)
        .await
        .unwrap();
    catch_up(&src.client, &bad.client, &r, last).await.unwrap();
    let want = digest(&src.client, &r).await;
    assert_eq!(digest(&good.client, &r).await, want);
    assert_ne!(digest(&bad.client, &r).await, want);
    assert!(bad.engine.get(b"m/00005").unwrap().is_some());
    assert!(good.engine.get(b"m/00005").unwrap().is_none());
    assert_eq!(
        good.engine.get(b"m/00006").unwrap().unwrap().expire_at_ms,
        Some(7_000_000_000_000)
    );
    assert_eq!(
        good.engine.get(b"m/00007").unwrap().unwrap().expire_at_ms,
        None
    );
    assert_eq!(
        &good.engine.get(b"m/00008").unwrap().unwrap().data[..],
        b"new"
    );
}

/// A source that itself received the range by migration holds versions from
/// another node's seq space (here far above its own seqs). Its later local
/// deletes and expiry changes must still win at the target: the snapshot
/// entry is applied with its `as_of` seq, not the value's version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_versions_at_the_source_do_not_block_replay() {
    let src = server().await;
    let dst = server().await;
    let recs: Vec<ChangeRecord> = (0..10)
        .map(|i| ChangeRecord {
            batch_continues: false,
            seq: 1_000_000 + i,
            mutation: put(key("m/", i), format!("old{i}"), None),
        })
        .collect();
    src.engine.apply_foreign(&recs).unwrap();
    let r = range();
    let first = src
        .client
        .snapshot_chunk(&r, None, 100, 1 << 20)
        .await
        .unwrap();
    assert_eq!(first.entries.len(), 10);
    assert!(first.entries.iter().all(|e| e.value.version >= 1_000_000));
    let recs: Vec<ChangeRecord> = first.entries.iter().map(|e| e.to_change_record()).collect();
    dst.client.apply_foreign(&recs).await.unwrap();
    // Now the source owns the range and writes locally (small seqs).
    src.engine
        .apply(&[
            Mutation::Delete { key: key("m/", 1) },
            Mutation::SetExpiry {
                key: key("m/", 2),
                expire_at_ms: Some(9_000_000_000_000),
            },
            put(key("m/", 3), "new", None),
        ])
        .unwrap();
    catch_up(&src.client, &dst.client, &r, first.seq)
        .await
        .unwrap();
    assert_eq!(digest(&dst.client, &r).await, digest(&src.client, &r).await);
    assert!(dst.engine.get(b"m/00001").unwrap().is_none());
}

/// (b) Changes after a truncated log are a typed `LogTruncated`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_after_truncation_is_log_truncated() {
    let src = server().await;
    let dst = server().await;
    preload(&*src.engine, 100);
    let last = src.engine.last_seq();
    src.engine.truncate_log(50).unwrap();
    let err = src
        .client
        .changes(10, 100, 1 << 20, None)
        .await
        .unwrap_err();
    assert_eq!(err, PeerError::LogTruncated { log_start: 51 });
    let err = catch_up(&src.client, &dst.client, &range(), 0)
        .await
        .unwrap_err();
    assert_eq!(err, PeerError::LogTruncated { log_start: 51 });
    // From the truncation point on it works, and reports the log's bounds.
    let c = src.client.changes(50, 10, 1 << 20, None).await.unwrap();
    assert_eq!(c.records.len(), 10);
    assert_eq!(c.records[0].seq, 51);
    assert_eq!((c.last_seq, c.log_start, c.head_seq), (60, 51, last));
    assert_eq!(src.client.last_seq().await.unwrap(), last);
}

/// (c) Limits: a snapshot chunk never exceeds its entry limit or byte cap
/// (only a single oversized entry travels alone), pages cover the range
/// exactly once, large limits are clamped and zero limits refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_enforced() {
    let src = server().await;
    let r = range();
    let mut muts = Vec::new();
    for i in 0..600u64 {
        let len = ((i * 7919) % 3_000) as usize;
        muts.push(put(key("m/", i), vec![b'x'; len], None));
    }
    muts.push(put(key("m/", 300), vec![b'y'; 50_000], None)); // bigger than the cap
    src.engine.apply(&muts).unwrap();

    const CAP: u64 = 8 * 1024;
    let mut after: Option<Bytes> = None;
    let mut seen = Vec::new();
    let mut total = 0;
    loop {
        let c = src
            .client
            .snapshot_chunk(&r, after.as_ref(), 50, CAP)
            .await
            .unwrap();
        let bytes: u64 = c
            .entries
            .iter()
            .map(|e| (e.key.len() + e.value.data.len()) as u64)
            .sum();
        assert_eq!(bytes, c.bytes);
        assert!(c.entries.len() <= 50);
        assert!(
            bytes <= CAP || c.entries.len() == 1,
            "chunk of {} entries, {bytes} bytes",
            c.entries.len()
        );
        if c.entries.iter().any(|e| e.value.data.len() == 50_000) {
            assert_eq!(c.entries.len(), 1);
        }
        total += bytes;
        seen.extend(c.entries.into_iter().map(|e| e.key));
        match c.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let want: Vec<Bytes> = (0..600).map(|i| key("m/", i)).collect();
    assert_eq!(seen, want);
    assert_eq!((600, total), src.client.range_stats(&r).await.unwrap());

    // Changes: the byte cap holds too (one record at least).
    let mut after = 0;
    while after < src.engine.last_seq() {
        let c = src.client.changes(after, 1_000, CAP, None).await.unwrap();
        let bytes: usize = c.records.iter().map(|r| r.encode().len()).sum();
        assert!(bytes as u64 <= CAP || c.records.len() == 1);
        assert!(c.last_seq > after);
        after = c.last_seq;
    }

    // Over-large limits are clamped.
    let big: Vec<Mutation> = (0..12_000u64)
        .map(|i| put(Bytes::from(format!("n/{i:06}")), "v", None))
        .collect();
    src.engine.apply(&big).unwrap();
    let n = KeyRange::prefix(Bytes::from_static(b"n/"));
    let c = src
        .client
        .snapshot_chunk(&n, None, 1_000_000, u64::MAX)
        .await
        .unwrap();
    assert_eq!(c.entries.len(), peer::MAX_SNAPSHOT_ENTRIES as usize);
    let c = src
        .client
        .changes(0, 1_000_000, u64::MAX, None)
        .await
        .unwrap();
    assert_eq!(c.last_seq, u64::from(peer::MAX_CHANGES_RECORDS));

    // Zero limits and over-large writes are refused.
    for res in [
        src.client.snapshot_chunk(&r, None, 0, CAP).await.map(drop),
        src.client.snapshot_chunk(&r, None, 10, 0).await.map(drop),
        src.client.changes(0, 0, CAP, None).await.map(drop),
        src.client.changes(0, 10, 0, None).await.map(drop),
        src.client.drop_range_chunk(&r, 0).await.map(drop),
    ] {
        assert!(matches!(res, Err(PeerError::InvalidArgument(_))), "{res:?}");
    }
    let too_many: Vec<ChangeRecord> = (0..peer::MAX_APPLY_RECORDS as u64 + 1)
        .map(|i| ChangeRecord {
            batch_continues: false,
            seq: i + 1,
            mutation: Mutation::Delete { key: key("q/", i) },
        })
        .collect();
    let res = src.client.apply_foreign(&too_many).await;
    assert!(matches!(res, Err(PeerError::InvalidArgument(_))), "{res:?}");
}

/// (d) A drop_range_chunk loop empties the range and leaves the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_range_empties_only_the_range() {
    let src = server().await;
    preload(&*src.engine, 2_000);
    let r = range();
    let below = KeyRange::prefix(Bytes::from_static(b"a/"));
    let above = KeyRange::prefix(Bytes::from_static(b"z/"));
    let (d_below, d_above) = (
        digest(&src.client, &below).await,
        digest(&src.client, &above).await,
    );
    let seq = src.engine.last_seq();
    let mut calls = 0;
    let mut deleted = 0;
    loop {
        let n = src.client.drop_range_chunk(&r, 300).await.unwrap();
        assert!(n <= 300);
        calls += 1;
        if n == 0 {
            break;
        }
        deleted += n;
    }
    assert_eq!(deleted, 2_000);
    assert!(calls >= 7);
    assert_eq!(src.client.range_stats(&r).await.unwrap(), (0, 0));
    assert_eq!(digest(&src.client, &r).await, RangeDigest::EMPTY);
    assert_eq!(digest(&src.client, &below).await, d_below);
    assert_eq!(digest(&src.client, &above).await, d_above);
    assert_eq!(d_below.keys + d_above.keys, 600);
    // Local cleanup: no change records, no seqs consumed.
    assert_eq!(src.client.last_seq().await.unwrap(), seq);
}

/// An unreachable peer is `Unavailable`, within the call deadline.
#[tokio::test]
async fn unreachable_peer_is_unavailable() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let opts = peer::PeerOptions {
        rpc_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let c = PeerClient::connect_with(&addr.to_string(), opts).unwrap();
    let err = c.last_seq().await.unwrap_err();
    assert!(matches!(err, PeerError::Unavailable(_)), "{err:?}");
    assert!(matches!(
        PeerClient::connect("http://a/b"),
        Err(PeerError::InvalidArgument(_))
    ));
}
