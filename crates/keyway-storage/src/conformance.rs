//! Conformance suite every [`Engine`] implementation must pass.
//!
//! Each check is a public generic function taking a factory of fresh, empty
//! engines. [`run_all`] runs them all; [`conformance_tests!`](crate::conformance_tests)
//! expands to one `#[test]` per check (better reporting and parallelism):
//!
//! ```ignore
//! mod mem {
//!     keyway_storage::conformance_tests!(keyway_storage::MemEngine::new, cases = 128);
//! }
//! ```
//!
//! Property checks use proptest with a random seed per run (a failure prints
//! the minimal failing input); `PROPTEST_CASES` overrides the case count.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestCaseError, TestRunner};

use crate::digest::{Digester, RangeDigest};
use crate::engine::Engine;
use crate::error::StorageError;
use crate::range::KeyRange;
use crate::value::{ChangeRecord, MAX_KEY_LEN, Mutation, Seq, Value, ValueKind};

/// Default number of proptest cases per property in [`run_all`].
pub const DEFAULT_CASES: u32 = 64;

/// Expands to one `#[test]` per conformance check for the engine built by
/// `$make` (an expression usable as `&dyn Fn() -> E`), e.g. a closure or a
/// function path. `cases` = proptest cases per property (default 64).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!($make, cases = $crate::conformance::DEFAULT_CASES);
    };
    ($make:expr, cases = $cases:expr) => {
        $crate::conformance_tests!(@tests $make, $cases;
            empty_engine, put_get_delete, batch_semantics, set_expiry, invalid_input,
            scan_paging, change_log, delete_range_chunk, digest_and_stats, foreign_basics,
            foreign_pending_expiry, foreign_effects_logged, concurrent_apply,
            concurrent_scan_consistency;
            prop_model, prop_foreign_permutation, prop_replica_follow);
    };
    (@tests $make:expr, $cases:expr; $($plain:ident),*; $($prop:ident),*) => {
        $(
            #[test]
            fn $plain() {
                $crate::conformance::$plain(&$make);
            }
        )*
        $(
            #[test]
            fn $prop() {
                $crate::conformance::$prop(&$make, $cases);
            }
        )*
    };
}

/// Runs every check with `cases` proptest cases per property.
pub fn run_all<E: Engine>(make: impl Fn() -> E, cases: u32) {
    let make: &dyn Fn() -> E = &make;
    empty_engine(make);
    put_get_delete(make);
    batch_semantics(make);
    set_expiry(make);
    invalid_input(make);
    scan_paging(make);
    change_log(make);
    delete_range_chunk(make);
    digest_and_stats(make);
    foreign_basics(make);
    foreign_pending_expiry(make);
    foreign_effects_logged(make);
    concurrent_apply(make);
    concurrent_scan_consistency(make);
    prop_model(make, cases);
    prop_foreign_permutation(make, cases);
    prop_replica_follow(make, cases);
}

// ---------------------------------------------------------------------------
// helpers

fn ok<T>(r: Result<T, StorageError>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("engine call failed: {e}"),
    }
}

/// A routing key: `keyspace u32 BE | slot u16 BE | user key`.
fn rk(slot: u16, user: &str) -> Bytes {
    let mut k = Vec::with_capacity(6 + user.len());
    k.extend_from_slice(&7u32.to_be_bytes());
    k.extend_from_slice(&slot.to_be_bytes());
    k.extend_from_slice(user.as_bytes());
    Bytes::from(k)
}

fn slot_range(slot: u16) -> KeyRange {
    KeyRange::prefix(rk(slot, ""))
}

fn put(key: &Bytes, data: &str) -> Mutation {
    put_exp(key, data, None)
}

fn put_exp(key: &Bytes, data: &str, expire_at_ms: Option<u64>) -> Mutation {
    Mutation::Put {
        key: key.clone(),
        kind: ValueKind::String,
        expire_at_ms,
        data: Bytes::copy_from_slice(data.as_bytes()),
    }
}

fn del(key: &Bytes) -> Mutation {
    Mutation::Delete { key: key.clone() }
}

fn expire(key: &Bytes, expire_at_ms: Option<u64>) -> Mutation {
    Mutation::SetExpiry {
        key: key.clone(),
        expire_at_ms,
    }
}

fn rec(seq: Seq, mutation: Mutation) -> ChangeRecord {
    ChangeRecord { seq, mutation }
}

fn val(data: &str, expire_at_ms: Option<u64>, version: Seq) -> Value {
    Value {
        kind: ValueKind::String,
        expire_at_ms,
        version,
        data: Bytes::copy_from_slice(data.as_bytes()),
    }
}

/// Pages through `range` with chunks of `chunk`, checking the paging contract.
fn scan_all<E: Engine + ?Sized>(e: &E, range: &KeyRange, chunk: usize) -> Vec<(Bytes, Value)> {
    let mut out: Vec<(Bytes, Value)> = Vec::new();
    let mut after: Option<Bytes> = None;
    loop {
        let c = ok(e.scan(range, after.as_deref(), chunk));
        assert!(c.entries.len() <= chunk, "chunk larger than limit");
        for (k, _) in &c.entries {
            assert!(range.contains(k), "scan returned key outside range");
            if let Some((prev, _)) = out.last() {
                assert!(prev < k, "scan keys not strictly ascending");
            }
            if let Some(a) = &after {
                assert!(k > a, "scan returned key not after cursor");
            }
        }
        out.extend(c.entries.iter().cloned());
        match c.next {
            Some(n) => {
                assert_eq!(c.entries.len(), chunk, "next set on a short chunk");
                assert_eq!(
                    Some(&n),
                    c.entries.last().map(|(k, _)| k),
                    "next must be the last key returned"
                );
                after = Some(n);
            }
            None => return out,
        }
    }
}

fn log_all<E: Engine + ?Sized>(e: &E) -> Vec<ChangeRecord> {
    ok(e.changes_since(e.log_start() - 1, usize::MAX))
}

fn strip_versions(entries: Vec<(Bytes, Value)>) -> Vec<(Bytes, Value)> {
    entries
        .into_iter()
        .map(|(k, mut v)| {
            v.version = 0;
            (k, v)
        })
        .collect()
}

fn digest_of(entries: &[(Bytes, Value)]) -> RangeDigest {
    let mut d = Digester::new();
    for (k, v) in entries {
        d.add(k, v);
    }
    d.finish()
}

fn prop_runner(cases: u32) -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(cases);
    TestRunner::new(PropConfig {
        cases,
        failure_persistence: None,
        ..PropConfig::default()
    })
}

fn run_prop<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let mut runner = prop_runner(cases);
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{name}: {e}");
    }
}

// ---------------------------------------------------------------------------
// plain checks

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
    assert_eq!(log[3], rec(4, put(&a, "x")));
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

/// Change log: contents, limits, truncation, `log_start`, `LogTruncated`.
pub fn change_log<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let k = |i: u32| rk(1, &format!("k{i}"));
    let mut expected = Vec::new();
    for i in 1..=20u32 {
        let m = if i % 5 == 0 {
            del(&k(i - 1))
        } else {
            put(&k(i), &i.to_string())
        };
        assert_eq!(ok(e.apply(std::slice::from_ref(&m))), u64::from(i));
        expected.push(rec(u64::from(i), m));
    }
    assert_eq!(log_all(&e), expected);
    assert_eq!(ok(e.changes_since(0, 3)), expected[..3].to_vec());
    assert_eq!(ok(e.changes_since(17, 100)), expected[17..].to_vec());
    assert!(ok(e.changes_since(20, 100)).is_empty());
    assert!(ok(e.changes_since(1000, 100)).is_empty());

    ok(e.truncate_log(7));
    assert_eq!(e.log_start(), 8);
    assert_eq!(e.last_seq(), 20, "truncation never changes last_seq");
    assert_eq!(ok(e.changes_since(7, 100)), expected[7..].to_vec());
    assert!(matches!(
        e.changes_since(6, 100),
        Err(StorageError::LogTruncated {
            after: 6,
            log_start: 8
        })
    ));
    assert!(matches!(
        e.changes_since(0, 1),
        Err(StorageError::LogTruncated { .. })
    ));
    ok(e.truncate_log(3));
    assert_eq!(e.log_start(), 8, "lower truncation is a no-op");
    ok(e.truncate_log(7));
    assert_eq!(e.log_start(), 8);

    // Truncate everything (clamped to last_seq): counter continues.
    ok(e.truncate_log(1_000));
    assert_eq!(e.log_start(), 21);
    assert!(ok(e.changes_since(20, 10)).is_empty());
    assert!(matches!(
        e.changes_since(19, 10),
        Err(StorageError::LogTruncated { .. })
    ));
    assert_eq!(ok(e.apply(&[put(&k(1), "again")])), 21);
    assert_eq!(
        ok(e.changes_since(20, 10)),
        vec![rec(21, put(&k(1), "again"))]
    );
    assert_eq!(
        ok(e.get(&k(2))),
        Some(val("2", None, 2)),
        "truncation keeps the data"
    );

    // Large truncation spanning several internal chunks.
    let muts: Vec<_> = (0..10_000u32).map(|i| put(&k(i % 50), "x")).collect();
    assert_eq!(ok(e.apply(&muts)), 10_021);
    ok(e.truncate_log(9_999));
    assert_eq!(e.log_start(), 10_000);
    let rest = ok(e.changes_since(9_999, usize::MAX));
    assert_eq!(rest.len(), 22);
    assert_eq!(rest[0].seq, 10_000);
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

/// Foreign records: newer wins, stale ignored, tombstones, local writes reset versions.
pub fn foreign_basics<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let k = rk(1, "k");
    assert_eq!(ok(e.apply_foreign(&[rec(10, put(&k, "a"))])), 1);
    assert_eq!(
        ok(e.get(&k)),
        Some(val("a", None, 10)),
        "version is the source seq"
    );
    // Stale and duplicate records are ignored and not logged.
    assert_eq!(
        ok(e.apply_foreign(&[rec(9, put(&k, "old")), rec(10, put(&k, "dup"))])),
        1
    );
    assert_eq!(ok(e.get(&k)).unwrap().data, "a");
    assert_eq!(ok(e.apply_foreign(&[rec(12, put(&k, "b"))])), 2);
    // Delete leaves a marker: an older Put replayed later cannot resurrect.
    assert_eq!(ok(e.apply_foreign(&[rec(15, del(&k))])), 3);
    assert_eq!(ok(e.get(&k)), None);
    ok(e.apply_foreign(&[rec(14, put(&k, "resurrect?")), rec(13, expire(&k, Some(1)))]));
    assert_eq!(ok(e.get(&k)), None);
    assert_eq!(e.last_seq(), 3);
    // Newer Put after the tombstone wins.
    ok(e.apply_foreign(&[rec(16, put(&k, "c"))]));
    assert_eq!(ok(e.get(&k)), Some(val("c", None, 16)));
    // SetExpiry: applies only if newer than the value's version.
    ok(e.apply_foreign(&[rec(15, expire(&k, Some(1)))]));
    assert_eq!(ok(e.get(&k)).unwrap().expire_at_ms, None);
    ok(e.apply_foreign(&[rec(17, expire(&k, Some(77)))]));
    assert_eq!(ok(e.get(&k)), Some(val("c", Some(77), 17)));

    // A local write is authoritative and resets the version to the local seq…
    let j = rk(1, "j");
    ok(e.apply_foreign(&[rec(50, del(&j))]));
    let s = ok(e.apply(&[put(&j, "local")]));
    assert_eq!(ok(e.get(&j)), Some(val("local", None, s)));
    // …so foreign records are compared with it numerically.
    ok(e.apply_foreign(&[rec(s, put(&j, "same seq"))]));
    assert_eq!(ok(e.get(&j)).unwrap().data, "local");
    ok(e.apply_foreign(&[rec(s + 1_000, put(&j, "newer"))]));
    assert_eq!(ok(e.get(&j)), Some(val("newer", None, s + 1_000)));
    // A local Delete removes the marker too (local deletes leave no tombstone).
    ok(e.apply_foreign(&[rec(5_000, del(&j))]));
    ok(e.apply(&[del(&j)]));
    ok(e.apply_foreign(&[rec(1, put(&j, "after local delete"))]));
    assert_eq!(ok(e.get(&j)), Some(val("after local delete", None, 1)));

    // Several records for one key in one call compose in order.
    let m = rk(2, "m");
    ok(e.apply_foreign(&[
        rec(3, put(&m, "x")),
        rec(4, expire(&m, Some(9))),
        rec(2, del(&m)),
        rec(5, del(&m)),
    ]));
    assert_eq!(ok(e.get(&m)), None);
    ok(e.apply_foreign(&[rec(4, put(&m, "stale"))]));
    assert_eq!(ok(e.get(&m)), None);
}

/// A foreign SetExpiry that arrives before the (older) Put it applies to.
pub fn foreign_pending_expiry<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let k = rk(1, "k");
    ok(e.apply_foreign(&[rec(7, expire(&k, Some(70)))]));
    assert_eq!(ok(e.get(&k)), None);
    ok(e.apply_foreign(&[rec(5, put_exp(&k, "v", Some(50)))]));
    assert_eq!(
        ok(e.get(&k)),
        Some(val("v", Some(70), 7)),
        "in seq order: Put@5 then SetExpiry@7"
    );
    // A Put between the two updates the data but keeps the newer expiry.
    ok(e.apply_foreign(&[rec(6, put(&k, "w"))]));
    assert_eq!(ok(e.get(&k)), Some(val("w", Some(70), 7)));
    // A Put newer than the expiry replaces everything.
    ok(e.apply_foreign(&[rec(8, put(&k, "z"))]));
    assert_eq!(ok(e.get(&k)), Some(val("z", None, 8)));

    // Pending expiry survives an older Delete, not a newer one.
    let j = rk(1, "j");
    ok(e.apply_foreign(&[rec(20, expire(&j, Some(1))), rec(18, del(&j))]));
    ok(e.apply_foreign(&[rec(19, put(&j, "p"))]));
    assert_eq!(ok(e.get(&j)), Some(val("p", Some(1), 20)));
    let i = rk(1, "i");
    ok(e.apply_foreign(&[rec(20, expire(&i, Some(1))), rec(21, del(&i))]));
    ok(e.apply_foreign(&[rec(19, put(&i, "p"))]));
    assert_eq!(ok(e.get(&i)), None);
}

/// Foreign records go to the local log as their visible effect, with local seqs.
pub fn foreign_effects_logged<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let k = rk(1, "k");
    ok(e.apply(&[put(&rk(9, "local"), "x")]));
    ok(e.apply_foreign(&[
        rec(100, put(&k, "a")),        // Put           -> local 2
        rec(90, put(&k, "stale")),     // ignored
        rec(101, expire(&k, Some(3))), // SetExpiry     -> local 3
        rec(103, del(&k)),             // Delete        -> local 4
        rec(102, put(&k, "b")),        // ignored (older than the delete)
        rec(110, expire(&k, Some(9))), // pending only, not logged
        rec(105, put(&k, "c")),        // Put with the pending expiry -> local 5
    ]));
    assert_eq!(e.last_seq(), 5);
    assert_eq!(ok(e.get(&k)), Some(val("c", Some(9), 110)));
    let log = ok(e.changes_since(1, 100));
    assert_eq!(
        log,
        vec![
            rec(2, put(&k, "a")),
            rec(3, expire(&k, Some(3))),
            rec(4, del(&k)),
            rec(5, put_exp(&k, "c", Some(9))),
        ]
    );
    // Foreign Delete of an absent key: marker only, nothing logged.
    ok(e.apply_foreign(&[rec(7, del(&rk(1, "nothing")))]));
    assert_eq!(e.last_seq(), 5);
}

/// Many threads applying concurrently: per-thread seqs strictly increase, the
/// log has no gaps and every record is where its seq says.
pub fn concurrent_apply<E: Engine>(make: &dyn Fn() -> E) {
    const THREADS: usize = 4;
    const ROUNDS: usize = 150;
    let e = make();
    let results: Vec<Vec<(Seq, Vec<Mutation>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let e = &e;
                s.spawn(move || {
                    let mut mine = Vec::with_capacity(ROUNDS);
                    let mut prev = 0;
                    for i in 0..ROUNDS {
                        let n = 1 + (i % 3);
                        let muts: Vec<_> = (0..n)
                            .map(|j| {
                                put(&rk(t as u16, &format!("{i}-{j}")), &format!("{t}/{i}/{j}"))
                            })
                            .collect();
                        let last = if i % 10 == 9 {
                            ok(e.apply_foreign(
                                &muts.iter().map(|m| rec(1, m.clone())).collect::<Vec<_>>(),
                            ))
                        } else {
                            ok(e.apply(&muts))
                        };
                        assert!(last > prev, "seqs must strictly increase per thread");
                        prev = last;
                        if i % 50 == 0 {
                            ok(e.sync());
                        }
                        mine.push((last, muts));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("writer thread"))
            .collect()
    });
    let total: usize = (0..ROUNDS).map(|i| 1 + (i % 3)).sum::<usize>() * THREADS;
    assert_eq!(e.last_seq(), total as Seq);
    let log = log_all(&e);
    assert_eq!(log.len(), total);
    for (i, r) in log.iter().enumerate() {
        assert_eq!(r.seq, i as Seq + 1, "log has a gap");
    }
    for mine in results {
        for (last, muts) in mine {
            let first = last - muts.len() as Seq + 1;
            for (j, m) in muts.iter().enumerate() {
                assert_eq!(
                    &log[(first as usize) + j - 1].mutation,
                    m,
                    "batch not contiguous in the log"
                );
            }
        }
    }
    ok(e.sync());
}

/// Scans, digests and `changes_since` run against concurrent writers read
/// consistent snapshots: every batch writes the same value to two keys, and
/// the snapshot seq matches the newest version seen.
pub fn concurrent_scan_consistency<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let (a, b) = (rk(1, "a"), rk(1, "b"));
    ok(e.apply(&[put(&a, "0"), put(&b, "0")]));
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            for i in 1..=400u32 {
                ok(e.apply(&[put(&a, &i.to_string()), put(&b, &i.to_string())]));
            }
            stop.store(true, Ordering::Release);
        });
        let mut checks = 0;
        while !stop.load(Ordering::Acquire) || checks < 10 {
            let c = ok(e.scan(&slot_range(1), None, 10));
            assert_eq!(c.entries.len(), 2);
            assert_eq!(
                c.entries[0].1.data, c.entries[1].1.data,
                "torn batch in scan"
            );
            assert_eq!(
                c.entries[1].1.version, c.seq,
                "scan seq must match its snapshot"
            );
            assert_eq!(c.entries[0].1.version + 1, c.seq);
            let (d, seq) = ok(e.digest(&slot_range(1)));
            assert_eq!(d.keys, 2);
            assert_eq!(seq % 2, 0, "digest seq must be a batch boundary");
            let log = ok(e.changes_since(0, usize::MAX));
            assert_eq!(log.len() % 2, 0, "changes_since must not split a batch");
            checks += 1;
        }
        writer.join().expect("writer thread");
    });
    assert_eq!(e.last_seq(), 802);
}

// ---------------------------------------------------------------------------
// model-based properties

const KEYS: &[&[u8]] = &[
    b"\x00\x01a",
    b"\x00\x01b",
    b"\x00\x02",
    b"\x00\x02a",
    b"\x01",
    b"\xff\xff",
];

fn ranges() -> Vec<KeyRange> {
    vec![
        KeyRange::all(),
        KeyRange::prefix(Bytes::from_static(b"\x00\x01")),
        KeyRange::new(
            Bytes::from_static(b"\x00\x02"),
            Some(Bytes::from_static(b"\x01")),
        ),
        KeyRange::new(Bytes::from_static(b"\x01"), None),
        KeyRange::new(
            Bytes::from_static(b"\x00\x01b"),
            Some(Bytes::from_static(b"\x00\x02a")),
        ),
    ]
}

fn key_strategy() -> impl Strategy<Value = Bytes> {
    prop::sample::select(KEYS).prop_map(Bytes::from_static)
}

fn mutation_strategy() -> impl Strategy<Value = Mutation> {
    const DATA: &[&[u8]] = &[b"", b"x", b"y", b"xy"];
    let data = prop::sample::select(DATA).prop_map(Bytes::from_static);
    let expiry = prop_oneof![Just(None), (1u64..4).prop_map(Some)];
    prop_oneof![
        3 => (key_strategy(), expiry.clone(), data).prop_map(|(key, expire_at_ms, data)| Mutation::Put {
            key,
            kind: ValueKind::String,
            expire_at_ms,
            data,
        }),
        1 => key_strategy().prop_map(|key| Mutation::Delete { key }),
        2 => (key_strategy(), expiry).prop_map(|(key, expire_at_ms)| Mutation::SetExpiry { key, expire_at_ms }),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Apply(Vec<Mutation>),
    Foreign(Vec<ChangeRecord>),
    Truncate(u8),
    DeleteRange(usize, usize),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(mutation_strategy(), 0..4).prop_map(Op::Apply),
        3 => prop::collection::vec((1u64..60, mutation_strategy()), 1..5)
            .prop_map(|v| Op::Foreign(v.into_iter().map(|(seq, mutation)| ChangeRecord { seq, mutation }).collect())),
        1 => any::<u8>().prop_map(Op::Truncate),
        1 => (0..5usize, 1usize..4).prop_map(|(r, l)| Op::DeleteRange(r, l)),
    ]
}

/// Reference model: per key, the state left by the last local write plus the
/// foreign records received since; visible state = fold in seq order.
#[derive(Default)]
struct Model {
    keys: BTreeMap<Bytes, (Option<Value>, Vec<ChangeRecord>)>,
    log: Vec<ChangeRecord>,
    last_seq: Seq,
    log_start: Seq,
}

/// Visible state of a key: `base` (from the last local write) then `history`
/// applied in seq order, each record only if newer than the current version
/// (a Delete's seq counts as the version of the absence).
fn fold(base: &Option<Value>, history: &[ChangeRecord]) -> Option<Value> {
    let mut cur = base.clone();
    let mut ver = base.as_ref().map_or(0, |v| v.version);
    let mut sorted: Vec<&ChangeRecord> = history.iter().collect();
    sorted.sort_by_key(|r| r.seq);
    for r in sorted {
        if r.seq <= ver {
            continue;
        }
        match &r.mutation {
            Mutation::Put {
                kind,
                expire_at_ms,
                data,
                ..
            } => {
                cur = Some(Value {
                    kind: *kind,
                    expire_at_ms: *expire_at_ms,
                    version: r.seq,
                    data: data.clone(),
                });
                ver = r.seq;
            }
            Mutation::Delete { .. } => {
                cur = None;
                ver = r.seq;
            }
            Mutation::SetExpiry { expire_at_ms, .. } => {
                if let Some(v) = &mut cur {
                    v.expire_at_ms = *expire_at_ms;
                    v.version = r.seq;
                    ver = r.seq;
                }
            }
        }
    }
    cur
}

impl Model {
    fn new() -> Self {
        Model {
            log_start: 1,
            ..Model::default()
        }
    }

    fn visible(&self, key: &[u8]) -> Option<Value> {
        self.keys.get(key).and_then(|(base, hist)| fold(base, hist))
    }

    fn live(&self, range: &KeyRange) -> Vec<(Bytes, Value)> {
        self.keys
            .keys()
            .filter(|k| range.contains(k))
            .filter_map(|k| self.visible(k).map(|v| (k.clone(), v)))
            .collect()
    }

    fn local(&mut self, m: &Mutation) {
        self.last_seq += 1;
        let seq = self.last_seq;
        self.log.push(rec(seq, m.clone()));
        let key = m.key().clone();
        match m {
            Mutation::Put {
                kind,
                expire_at_ms,
                data,
                ..
            } => {
                let v = Value {
                    kind: *kind,
                    expire_at_ms: *expire_at_ms,
                    version: seq,
                    data: data.clone(),
                };
                self.keys.insert(key, (Some(v), Vec::new()));
            }
            Mutation::Delete { .. } => {
                self.keys.remove(&key);
            }
            Mutation::SetExpiry { expire_at_ms, .. } => {
                if let Some(mut v) = self.visible(&key) {
                    v.expire_at_ms = *expire_at_ms;
                    v.version = seq;
                    self.keys.insert(key, (Some(v), Vec::new()));
                }
            }
        }
    }

    fn foreign(&mut self, r: &ChangeRecord) {
        let key = r.mutation.key().clone();
        let before = self.visible(&key);
        self.keys.entry(key.clone()).or_default().1.push(r.clone());
        let after = self.visible(&key);
        if before != after {
            let effect = match (&before, &after) {
                (_, None) => del(&key),
                (Some(b), Some(a)) if b.kind == a.kind && b.data == a.data => {
                    expire(&key, a.expire_at_ms)
                }
                (_, Some(a)) => Mutation::Put {
                    key: key.clone(),
                    kind: a.kind,
                    expire_at_ms: a.expire_at_ms,
                    data: a.data.clone(),
                },
            };
            self.last_seq += 1;
            self.log.push(rec(self.last_seq, effect));
        }
    }

    fn truncate(&mut self, upto: Seq) {
        let upto = upto.min(self.last_seq);
        if upto >= self.log_start {
            self.log_start = upto + 1;
            self.log.retain(|r| r.seq > upto);
        }
    }

    fn delete_range(&mut self, range: &KeyRange) {
        self.keys.retain(|k, _| !range.contains(k));
    }
}

fn check_against_model<E: Engine>(e: &E, model: &Model, chunk: usize) -> Result<(), TestCaseError> {
    for k in KEYS {
        prop_assert_eq!(ok(e.get(k)), model.visible(k), "get {:?}", k);
    }
    prop_assert_eq!(e.last_seq(), model.last_seq);
    prop_assert_eq!(e.log_start(), model.log_start);
    for r in ranges() {
        let expected = model.live(&r);
        prop_assert_eq!(scan_all(e, &r, chunk), expected.clone(), "scan {:?}", r);
        let (d, seq) = ok(e.digest(&r));
        prop_assert_eq!(d, digest_of(&expected));
        prop_assert_eq!(seq, model.last_seq);
        prop_assert_eq!(ok(e.range_stats(&r)), (d.keys, d.bytes));
    }
    prop_assert_eq!(log_all(e), model.log.clone());
    Ok(())
}

/// Random local writes, foreign records, truncations and range cleanups
/// against the reference `Model`; after every step `get`, chunked scans
/// (concatenation == model range), digests, stats, seqs and the log agree.
pub fn prop_model<E: Engine>(make: &dyn Fn() -> E, cases: u32) {
    let strategy = (prop::collection::vec(op_strategy(), 1..30), 1usize..5);
    run_prop("prop_model", cases, strategy, |(ops, chunk)| {
        let e = make();
        let mut model = Model::new();
        let mut used_foreign_seqs = HashSet::new();
        let ranges = ranges();
        for op in ops {
            match op {
                Op::Apply(muts) => {
                    let seq = ok(e.apply(&muts));
                    muts.iter().for_each(|m| model.local(m));
                    prop_assert_eq!(seq, model.last_seq);
                }
                Op::Foreign(recs) => {
                    // One seq names one record (as in a real source log).
                    let recs: Vec<_> = recs
                        .into_iter()
                        .filter(|r| used_foreign_seqs.insert(r.seq))
                        .collect();
                    let seq = ok(e.apply_foreign(&recs));
                    recs.iter().for_each(|r| model.foreign(r));
                    prop_assert_eq!(seq, model.last_seq);
                }
                Op::Truncate(frac) => {
                    let upto = (model.last_seq * Seq::from(frac)) / 200;
                    ok(e.truncate_log(upto));
                    model.truncate(upto);
                }
                Op::DeleteRange(r, limit) => {
                    while ok(e.delete_range_chunk(&ranges[r], limit)) > 0 {}
                    model.delete_range(&ranges[r]);
                }
            }
            check_against_model(&e, &model, chunk)?;
        }
        Ok(())
    });
}

/// Any permutation (and batching) of a set of foreign records yields the
/// same state as applying them one by one in seq order, which is the
/// seq-order fold of the model.
pub fn prop_foreign_permutation<E: Engine>(make: &dyn Fn() -> E, cases: u32) {
    let strategy = prop::collection::vec(mutation_strategy(), 1..14)
        .prop_map(|muts| {
            muts.into_iter()
                .enumerate()
                .map(|(i, m)| rec(i as Seq + 1, m))
                .collect::<Vec<_>>()
        })
        .prop_flat_map(|recs| {
            let n = recs.len();
            (
                Just(recs.clone()),
                Just(recs).prop_shuffle(),
                prop::collection::vec(1usize..4, n),
            )
        });
    run_prop(
        "prop_foreign_permutation",
        cases,
        strategy,
        |(in_order, shuffled, splits)| {
            let ordered = make();
            for r in &in_order {
                ok(ordered.apply_foreign(std::slice::from_ref(r)));
            }
            let permuted = make();
            let mut rest = &shuffled[..];
            let mut i = 0;
            while !rest.is_empty() {
                let n = splits[i].min(rest.len());
                ok(permuted.apply_foreign(&rest[..n]));
                rest = &rest[n..];
                i += 1;
            }
            let want = scan_all(&ordered, &KeyRange::all(), 100);
            prop_assert_eq!(scan_all(&permuted, &KeyRange::all(), 100), want.clone());
            let mut model = Model::new();
            in_order.iter().for_each(|r| model.foreign(r));
            prop_assert_eq!(want, model.live(&KeyRange::all()));
            // Re-applying everything is a no-op.
            let seq = permuted.last_seq();
            ok(permuted.apply_foreign(&shuffled));
            prop_assert_eq!(permuted.last_seq(), seq);
            Ok(())
        },
    );
}

/// A replica that applies this engine's change log (via `apply_foreign`, in
/// random chunk sizes, interleaved with the primary's writes) ends up with the
/// same visible contents (versions aside) and digest.
pub fn prop_replica_follow<E: Engine>(make: &dyn Fn() -> E, cases: u32) {
    let strategy = (
        prop::collection::vec(op_strategy(), 1..25),
        prop::collection::vec(1usize..6, 25),
    );
    run_prop("prop_replica_follow", cases, strategy, |(ops, chunks)| {
        let primary = make();
        let replica = make();
        let mut pos: Seq = 0;
        let mut used = HashSet::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Apply(muts) => {
                    ok(primary.apply(&muts));
                }
                Op::Foreign(recs) => {
                    let recs: Vec<_> = recs.into_iter().filter(|r| used.insert(r.seq)).collect();
                    ok(primary.apply_foreign(&recs));
                }
                // Truncation and cleanup are not replicated through the log.
                Op::Truncate(_) | Op::DeleteRange(..) => {}
            }
            loop {
                let recs = ok(primary.changes_since(pos, chunks[i]));
                let Some(last) = recs.last() else { break };
                pos = last.seq;
                ok(replica.apply_foreign(&recs));
            }
            prop_assert_eq!(
                strip_versions(scan_all(&replica, &KeyRange::all(), 100)),
                strip_versions(scan_all(&primary, &KeyRange::all(), 100))
            );
            prop_assert_eq!(
                ok(replica.digest(&KeyRange::all())).0,
                ok(primary.digest(&KeyRange::all())).0
            );
            // The replica's versions are the primary's seqs.
            for (_, v) in scan_all(&replica, &KeyRange::all(), 100) {
                prop_assert!(v.version <= primary.last_seq());
            }
        }
        Ok(())
    });
}
