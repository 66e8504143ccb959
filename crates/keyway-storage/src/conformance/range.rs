//! Range operations: paged scans (bounds, cursors, snapshots), chunked
//! local range deletion, range digests/stats, and written-key digests.

use super::{
    del, digest_of, expire, log_all, ok, put, put_exp, rec, rk, scan_all, slot_range, val,
};
use crate::digest::{Digester, RangeDigest};
use crate::engine::Engine;
use crate::error::StorageError;
use crate::range::KeyRange;
use crate::value::Mutation;

/// Range scans: bounds, cursors, exact exhaustion, empty ranges, snapshot seq.
pub fn scan_paging<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let mut muts = Vec::new();
    for slot in [0u16, 1, 2, 0xffff] {
        for i in 0..10 {
            muts.push(put(&rk(slot, &format!("k{i:02}")), &format!("{slot}-{i}")));
        }
    }
    ok(e.apply(&muts));
    ok(e.apply(&[del(&rk(1, "k03")), expire(&rk(1, "k04"), Some(1))]));
    let all = scan_all(&e, &KeyRange::all(), 1000);
    assert_eq!(all.len(), 39);
    for chunk in [1, 2, 3, 7, 38, 39, 40] {
        assert_eq!(scan_all(&e, &KeyRange::all(), chunk), all, "chunk {chunk}");
    }
    let s1 = scan_all(&e, &slot_range(1), 4);
    assert_eq!(s1.len(), 9);
    assert!(s1.iter().all(|(k, _)| k.starts_with(&rk(1, ""))));
    assert_eq!(s1[3].0, rk(1, "k04"));
    assert_eq!(s1[3].1.expire_at_ms, Some(1));
    // Exact fit: the last full chunk reports exhaustion.
    let c = ok(e.scan(&slot_range(2), None, 10));
    assert_eq!(c.entries.len(), 10);
    assert_eq!(c.next, None, "range exhausted exactly at the limit");
    assert_eq!(c.seq, 42);
    // Cursor semantics: strictly after, clamped to the range.
    let c = ok(e.scan(&slot_range(2), Some(&rk(2, "k04")), 2));
    assert_eq!(
        c.entries.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        vec![rk(2, "k05"), rk(2, "k06")]
    );
    assert_eq!(c.next, Some(rk(2, "k06")));
    let c = ok(e.scan(&slot_range(2), Some(&rk(2, "k04x")), 1));
    assert_eq!(
        c.entries[0].0,
        rk(2, "k05"),
        "cursor need not be an existing key"
    );
    let c = ok(e.scan(&slot_range(2), Some(&rk(1, "zzz")), 1));
    assert_eq!(
        c.entries[0].0,
        rk(2, "k00"),
        "cursor before the range starts at range.start"
    );
    let c = ok(e.scan(&slot_range(2), Some(&rk(3, "")), 5));
    assert!(
        c.entries.is_empty() && c.next.is_none(),
        "cursor past the range"
    );
    // Half-open bounds.
    let r = KeyRange::new(rk(0, "k03"), Some(rk(0, "k05")));
    let keys: Vec<_> = scan_all(&e, &r, 1).into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec![rk(0, "k03"), rk(0, "k04")]);
    // Empty and inverted ranges.
    for r in [
        KeyRange::new(rk(0, "k05"), Some(rk(0, "k05"))),
        KeyRange::new(rk(0, "k06"), Some(rk(0, "k05"))),
        KeyRange::new(rk(5, ""), Some(rk(6, ""))),
    ] {
        let c = ok(e.scan(&r, None, 3));
        assert!(c.entries.is_empty() && c.next.is_none());
        assert_eq!(c.seq, 42);
        assert_eq!(ok(e.digest(&r)).0, RangeDigest::EMPTY);
        assert_eq!(ok(e.range_stats(&r)), (0, 0));
        assert_eq!(ok(e.delete_range_chunk(&r, 3)), 0);
    }
    // Unbounded tail.
    let tail = scan_all(&e, &KeyRange::new(rk(0xffff, "k08"), None), 1);
    assert_eq!(tail.len(), 2);
    // Chunks are independent snapshots: a write between chunks is visible later.
    let c1 = ok(e.scan(&slot_range(0), None, 5));
    ok(e.apply(&[put(&rk(0, "k09"), "new")]));
    let c2 = ok(e.scan(&slot_range(0), c1.next.as_deref(), 5));
    assert_eq!(c1.seq, 42);
    assert_eq!(c2.seq, 43);
    assert_eq!(c2.entries.last().unwrap().1, val("new", None, 43));
}

/// Reverse scans: descending order, `before` cursors, bounds, exhaustion.
pub fn scan_rev_paging<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let mut muts = Vec::new();
    for slot in [0u16, 1, 2] {
        for i in 0..10 {
            muts.push(put(&rk(slot, &format!("k{i:02}")), &format!("{slot}-{i}")));
        }
    }
    ok(e.apply(&muts));
    ok(e.apply(&[del(&rk(1, "k03"))]));
    let forward = scan_all(&e, &slot_range(1), 100);
    for chunk in [1, 2, 3, 8, 9, 10] {
        let mut back = Vec::new();
        let mut before: Option<bytes::Bytes> = None;
        loop {
            let c = ok(e.scan_rev(&slot_range(1), before.as_deref(), chunk));
            assert!(c.entries.len() <= chunk);
            assert!(c.entries.windows(2).all(|w| w[0].0 > w[1].0), "descending");
            back.extend(c.entries);
            match c.next {
                Some(n) => before = Some(n),
                None => break,
            }
        }
        back.reverse();
        assert_eq!(back, forward, "chunk {chunk}");
    }
    let c = ok(e.scan_rev(&slot_range(2), None, 10));
    assert_eq!(c.entries.len(), 10);
    assert_eq!(c.next, None, "range exhausted exactly at the limit");
    let c = ok(e.scan_rev(&slot_range(2), Some(&rk(2, "k04x")), 2));
    assert_eq!(
        c.entries.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        vec![rk(2, "k04"), rk(2, "k03")]
    );
    assert_eq!(c.next, Some(rk(2, "k03")));
    let c = ok(e.scan_rev(&slot_range(2), Some(&rk(9, "")), 1));
    assert_eq!(c.entries[0].0, rk(2, "k09"), "cursor past the range end");
    let c = ok(e.scan_rev(&slot_range(2), Some(&rk(2, "k00")), 5));
    assert!(
        c.entries.is_empty() && c.next.is_none(),
        "cursor at the start"
    );
    let r = KeyRange::new(rk(0, "k03"), Some(rk(0, "k05")));
    let c = ok(e.scan_rev(&r, None, 5));
    assert_eq!(
        c.entries.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        vec![rk(0, "k04"), rk(0, "k03")]
    );
    assert!(
        ok(e.scan_rev(&KeyRange::new(rk(0, "k05"), Some(rk(0, "k05"))), None, 3))
            .entries
            .is_empty()
    );
    assert!(e.scan_rev(&slot_range(0), None, 0).is_err());
}

/// Chunked local range deletion: no log records, no seqs, markers too.
pub fn delete_range_chunk<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let mut muts = Vec::new();
    for slot in [1u16, 2, 3] {
        for i in 0..25 {
            muts.push(put(&rk(slot, &format!("k{i:02}")), "v"));
        }
    }
    ok(e.apply(&muts));
    // A foreign tombstone marker inside slot 2 and one inside slot 3.
    ok(e.apply_foreign(&[
        rec(1_000, del(&rk(2, "gone"))),
        rec(1_000, del(&rk(3, "gone"))),
    ]));
    let seq = e.last_seq();
    let log_len = log_all(&e).len();

    let mut total = 0;
    let mut rounds = 0;
    loop {
        let n = ok(e.delete_range_chunk(&slot_range(2), 7));
        assert!(n <= 7);
        if n == 0 {
            break;
        }
        total += n;
        rounds += 1;
        if rounds == 2 {
            // A key written behind the cleanup cursor must still be removed.
            ok(e.apply(&[put(&rk(2, "k00"), "late")]));
        }
    }
    assert_eq!(total, 25 + 1 + 1, "25 keys + the late key + 1 marker");
    assert!(scan_all(&e, &slot_range(2), 10).is_empty());
    assert_eq!(scan_all(&e, &slot_range(1), 100).len(), 25);
    assert_eq!(scan_all(&e, &slot_range(3), 100).len(), 25);
    assert_eq!(e.last_seq(), seq + 1, "only the late put consumed a seq");
    assert_eq!(
        log_all(&e).len(),
        log_len + 1,
        "cleanup writes no change records"
    );
    assert_eq!(ok(e.delete_range_chunk(&slot_range(2), 7)), 0);

    // The marker in slot 2 is gone: an old foreign Put is accepted again.
    // The marker in slot 3 still protects its key.
    ok(e.apply_foreign(&[
        rec(5, put(&rk(2, "gone"), "old")),
        rec(5, put(&rk(3, "gone"), "old")),
    ]));
    assert_eq!(ok(e.get(&rk(2, "gone"))), Some(val("old", None, 5)));
    assert_eq!(ok(e.get(&rk(3, "gone"))), None);

    // Whole key space.
    while ok(e.delete_range_chunk(&KeyRange::all(), 1000)) > 0 {}
    assert!(scan_all(&e, &KeyRange::all(), 10).is_empty());
    ok(e.apply_foreign(&[rec(5, put(&rk(3, "gone"), "old"))]));
    assert_eq!(
        ok(e.get(&rk(3, "gone"))),
        Some(val("old", None, 5)),
        "markers removed by cleanup"
    );
}

/// Digest and stats: equal contents ⇒ equal digests regardless of versions.
pub fn digest_and_stats<E: Engine>(make: &dyn Fn() -> E) {
    let a = make();
    let b = make();
    let muts = vec![
        put(&rk(1, "x"), "1"),
        put_exp(&rk(1, "y"), "22", Some(5)),
        put(&rk(2, "z"), "333"),
    ];
    ok(a.apply(&muts));
    // b: other writes first, so versions differ; then the same contents.
    ok(b.apply(&[
        put(&rk(1, "x"), "old"),
        put(&rk(9, "w"), "w"),
        del(&rk(9, "w")),
    ]));
    ok(b.apply(&muts));
    let (da, sa) = ok(a.digest(&KeyRange::all()));
    let (db, sb) = ok(b.digest(&KeyRange::all()));
    assert_eq!((sa, sb), (3, 6));
    assert_eq!(da, db);
    assert_eq!(da, digest_of(&scan_all(&a, &KeyRange::all(), 2)));
    // Keys are 7 bytes each; data 1 + 2 + 3 bytes.
    assert_eq!((da.keys, da.bytes), (3, 3 * 7 + 6));
    assert_eq!(ok(a.range_stats(&KeyRange::all())), (3, 27));
    assert_eq!(ok(a.range_stats(&slot_range(1))), (2, 17));
    let (d1, _) = ok(a.digest(&slot_range(1)));
    assert_eq!(d1, digest_of(&scan_all(&a, &slot_range(1), 1)));
    assert_ne!(d1, da);
    // Any content change changes the digest.
    ok(b.apply(&[expire(&rk(1, "y"), Some(6))]));
    assert_ne!(ok(b.digest(&KeyRange::all())).0.digest, da.digest);
    ok(b.apply(&[expire(&rk(1, "y"), Some(5))]));
    assert_eq!(ok(b.digest(&KeyRange::all())).0, da);
    ok(b.apply(&[put(&rk(2, "z"), "334")]));
    assert_ne!(ok(b.digest(&KeyRange::all())).0.digest, da.digest);
    // Foreign-applied copy has the same digest.
    let c = make();
    let recs: Vec<_> = scan_all(&a, &KeyRange::all(), 10)
        .into_iter()
        .map(|(k, v)| {
            rec(
                v.version + 100,
                Mutation::Put {
                    key: k,
                    kind: v.kind,
                    expire_at_ms: v.expire_at_ms,
                    data: v.data,
                },
            )
        })
        .collect();
    ok(c.apply_foreign(&recs));
    assert_eq!(ok(c.digest(&KeyRange::all())).0, da);
}

/// [`Engine::written_digests`]: the keys of the range written after a seq,
/// once each and sorted, digested in parts at one snapshot (absent keys
/// count), and refused once the log after that seq is gone.
pub fn written_digests<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let (x, y, z, w) = (rk(1, "x"), rk(1, "y"), rk(1, "z"), rk(2, "w"));
    ok(e.apply(&[put(&x, "0"), put(&w, "0")]));
    let after = e.last_seq();
    ok(e.apply(&[put(&z, "1"), put(&x, "2")]));
    ok(e.apply(&[put(&y, "3"), del(&z)]));
    ok(e.apply(&[put(&w, "4"), put(&x, "5")]));
    let got = ok(e.written_digests(&slot_range(1), after, 2));
    assert_eq!(got.seq, e.last_seq());
    assert_eq!(got.keys, vec![x.clone(), y.clone(), z.clone()]);
    assert_eq!(got.parts.len(), 2, "3 keys in parts of 2");
    let mut d = Digester::new();
    d.add(&x, &ok(e.get(&x)).expect("x is live"));
    d.add(&y, &ok(e.get(&y)).expect("y is live"));
    assert_eq!(got.parts[0], d.finish());
    let mut d = Digester::new();
    d.add_absent(&z);
    assert_eq!(got.parts[1], d.finish());
    // Nothing written since: no keys, no parts, the same seq.
    let none = ok(e.written_digests(&slot_range(1), e.last_seq(), 2));
    assert_eq!(
        (none.seq, none.keys.len(), none.parts.len()),
        (e.last_seq(), 0, 0)
    );
    assert!(matches!(
        e.written_digests(&slot_range(1), after, 0),
        Err(StorageError::InvalidArgument(_))
    ));
    // A truncated log cannot tell what was written.
    ok(e.truncate_log(after + 2));
    assert!(matches!(
        e.written_digests(&slot_range(1), after, 2),
        Err(StorageError::LogTruncated { .. })
    ));
    let rest = ok(e.written_digests(&slot_range(1), after + 2, 8));
    assert_eq!(rest.keys, vec![x, y, z]);
    // One snapshot: under concurrent writes of a pair in one batch, both
    // keys always read from the same batch, and the seq is a batch end.
    let (a, b) = (rk(3, "a"), rk(3, "b"));
    let from = e.last_seq();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 1..=300u32 {
                ok(e.apply(&[put(&a, &i.to_string()), put(&b, &i.to_string())]));
            }
            stop.store(true, std::sync::atomic::Ordering::Release);
        });
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            let got = ok(e.written_digests(&slot_range(3), from, 1));
            assert_eq!((got.seq - from) % 2, 0, "seq must be a batch end");
            if got.keys.is_empty() {
                continue;
            }
            let same = ok(e.get(&a)).map(|v| v.data);
            let mut pair = Digester::new();
            let value = crate::value::Value {
                kind: crate::value::ValueKind::String,
                expire_at_ms: None,
                version: 0,
                data: bytes::Bytes::from(((got.seq - from) / 2).to_string()),
            };
            pair.add(&a, &value);
            assert_eq!(
                got.parts[0],
                pair.finish(),
                "a read at the snapshot ({same:?} now)"
            );
            let mut pair = Digester::new();
            pair.add(&b, &value);
            assert_eq!(got.parts[1], pair.finish(), "b read at the snapshot");
        }
    });
}
