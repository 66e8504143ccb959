//! Single-engine basics: a fresh engine, put/get/delete, batch composition,
//! `SetExpiry`, and rejection of invalid input without side effects.

use bytes::Bytes;

use super::{del, expire, log_all, ok, put, put_exp, rec, rk, val};
use crate::digest::RangeDigest;
use crate::engine::Engine;
use crate::error::StorageError;
use crate::range::KeyRange;
use crate::value::{ChangeRecord, MAX_KEY_LEN, Mutation, ValueKind};

/// A fresh engine is empty: seq 0, log_start 1, nothing to read.
pub fn empty_engine<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    assert_eq!(e.last_seq(), 0);
    assert_eq!(e.log_start(), 1);
    assert_eq!(ok(e.get(&rk(1, "a"))), None);
    let c = ok(e.scan(&KeyRange::all(), None, 10));
    assert!(c.entries.is_empty());
    assert_eq!(c.next, None);
    assert_eq!(c.seq, 0);
    assert!(log_all(&e).is_empty());
    assert_eq!(ok(e.digest(&KeyRange::all())), (RangeDigest::EMPTY, 0));
    assert_eq!(ok(e.range_stats(&KeyRange::all())), (0, 0));
    assert_eq!(ok(e.delete_range_chunk(&KeyRange::all(), 10)), 0);
    assert_eq!(ok(e.apply(&[])), 0);
    ok(e.sync());
    ok(e.truncate_log(5));
    assert_eq!(e.log_start(), 1, "truncation is clamped to last_seq");
}

/// Put/overwrite/delete of single keys; versions are the assigning seqs.
pub fn put_get_delete<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let (a, b) = (rk(1, "a"), rk(1, "b"));
    assert_eq!(ok(e.apply(&[put(&a, "1")])), 1);
    assert_eq!(e.last_seq(), 1);
    assert_eq!(ok(e.get(&a)), Some(val("1", None, 1)));
    assert_eq!(ok(e.apply(&[put_exp(&a, "2", Some(99))])), 2);
    assert_eq!(ok(e.get(&a)), Some(val("2", Some(99), 2)));
    assert_eq!(ok(e.apply(&[put(&b, "")])), 3);
    assert_eq!(
        ok(e.get(&b)),
        Some(val("", None, 3)),
        "empty data is a value"
    );
    assert_eq!(ok(e.apply(&[del(&a)])), 4);
    assert_eq!(ok(e.get(&a)), None);
    // Deleting an absent key still consumes a seq and is logged.
    assert_eq!(ok(e.apply(&[del(&a)])), 5);
    assert_eq!(log_all(&e).len(), 5);
    assert_eq!(ok(e.get(&b)), Some(val("", None, 3)));
    ok(e.sync());
    // Large-ish binary key and value round-trip.
    let big_key = Bytes::from(vec![0xab; MAX_KEY_LEN]);
    let big_val = Bytes::from((0..100_000u32).map(|i| i as u8).collect::<Vec<_>>());
    let seq = ok(e.apply(&[Mutation::Put {
        key: big_key.clone(),
        kind: ValueKind::String,
        expire_at_ms: None,
        data: big_val.clone(),
    }]));
    assert_eq!(
        ok(e.get(&big_key)).map(|v| (v.data, v.version)),
        Some((big_val, seq))
    );
}

/// Multi-mutation batches: consecutive seqs, composition within the batch.
pub fn batch_semantics<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let (a, b, c) = (rk(1, "a"), rk(1, "b"), rk(2, "c"));
    let last = ok(e.apply(&[put(&a, "1"), put(&b, "2"), put(&c, "3")]));
    assert_eq!(last, 3);
    assert_eq!(ok(e.get(&a)).unwrap().version, 1);
    assert_eq!(ok(e.get(&b)).unwrap().version, 2);
    assert_eq!(ok(e.get(&c)).unwrap().version, 3);
    // Same key several times in one batch: applied in order.
    let last = ok(e.apply(&[
        put(&a, "x"),
        expire(&a, Some(5)),
        del(&b),
        put(&b, "y"),
        put(&c, "z"),
        del(&c),
    ]));
    assert_eq!(last, 9);
    assert_eq!(ok(e.get(&a)), Some(val("x", Some(5), 5)));
    assert_eq!(ok(e.get(&b)), Some(val("y", None, 7)));
    assert_eq!(ok(e.get(&c)), None);
    // SetExpiry after Delete in the same batch: key stays absent.
    let last = ok(e.apply(&[del(&a), expire(&a, Some(1))]));
    assert_eq!(last, 11);
    assert_eq!(ok(e.get(&a)), None);
    // Empty batch: no seq consumed.
    assert_eq!(ok(e.apply(&[])), 11);
    let log = log_all(&e);
    assert_eq!(log.len(), 11);
    // Batches are seqs 1..=3, 4..=9 and 10..=11: all but a batch's last continue.
    let continuing = |seq: u64, m| ChangeRecord {
        batch_continues: true,
        ..rec(seq, m)
    };
    assert_eq!(log[3], continuing(4, put(&a, "x")));
    assert_eq!(log[9], continuing(10, del(&a)));
    assert_eq!(log[10], rec(11, expire(&a, Some(1))));
}

/// SetExpiry sets/clears the expiry of existing keys only; expired values are still returned.
pub fn set_expiry<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let (a, missing) = (rk(1, "a"), rk(1, "missing"));
    ok(e.apply(&[put(&a, "v")]));
    assert_eq!(ok(e.apply(&[expire(&a, Some(1))])), 2);
    assert_eq!(
        ok(e.get(&a)),
        Some(val("v", Some(1), 2)),
        "already expired values are still stored"
    );
    assert_eq!(ok(e.apply(&[expire(&a, None)])), 3);
    assert_eq!(ok(e.get(&a)), Some(val("v", None, 3)));
    // Absent key: no-op, but the seq is consumed and the record logged.
    assert_eq!(ok(e.apply(&[expire(&missing, Some(7))])), 4);
    assert_eq!(ok(e.get(&missing)), None);
    assert_eq!(log_all(&e).last(), Some(&rec(4, expire(&missing, Some(7)))));
    // A later Put is not affected by the earlier no-op SetExpiry.
    ok(e.apply(&[put(&missing, "w")]));
    assert_eq!(ok(e.get(&missing)), Some(val("w", None, 5)));
}

/// Invalid keys/limits fail without any effect.
pub fn invalid_input<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let a = rk(1, "a");
    ok(e.apply(&[put(&a, "1")]));
    let too_long = Bytes::from(vec![1u8; MAX_KEY_LEN + 1]);
    for bad in [
        put(&Bytes::new(), "x"),
        put(&too_long, "x"),
        del(&Bytes::new()),
        expire(&too_long, None),
    ] {
        let r = e.apply(&[put(&a, "2"), bad.clone()]);
        assert!(
            matches!(r, Err(StorageError::InvalidKey { .. })),
            "{bad:?} accepted: {r:?}"
        );
        let r = e.apply_foreign(&[rec(100, bad.clone())]);
        assert!(
            matches!(r, Err(StorageError::InvalidKey { .. })),
            "{bad:?} accepted: {r:?}"
        );
    }
    assert_eq!(e.last_seq(), 1, "failed batches must not consume seqs");
    assert_eq!(
        ok(e.get(&a)),
        Some(val("1", None, 1)),
        "failed batches must have no effect"
    );
    assert_eq!(ok(e.get(b"")), None);
    assert_eq!(ok(e.get(&too_long)), None);
    assert!(matches!(
        e.scan(&KeyRange::all(), None, 0),
        Err(StorageError::InvalidArgument(_))
    ));
    assert!(matches!(
        e.delete_range_chunk(&KeyRange::all(), 0),
        Err(StorageError::InvalidArgument(_))
    ));
    assert_eq!(ok(e.changes_since(0, 0)), Vec::new());
}
