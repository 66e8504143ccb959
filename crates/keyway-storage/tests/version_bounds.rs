//! A foreign `Put` newer than every version the engine stores for its key
//! skips the read of that key (`version_bounds.rs`); everything else takes
//! the full last-writer-wins rule. These tests pin both halves: the read is
//! skipped where it may be, and a record it would wrongly let through
//! (older than a local write, a foreign delete, or an earlier record of the
//! same batch) still loses.

use bytes::Bytes;
use keyway_storage::{
    ChangeRecord, Engine, FjallEngine, FjallOptions, KeyRange, Mutation, ValueKind,
};

fn open() -> (tempfile::TempDir, FjallEngine) {
    let dir = tempfile::tempdir().unwrap();
    let e = FjallEngine::open(dir.path(), FjallOptions::for_tests()).unwrap();
    (dir, e)
}

fn put(key: &str, data: &str) -> Mutation {
    Mutation::Put {
        key: Bytes::copy_from_slice(key.as_bytes()),
        kind: ValueKind::String,
        expire_at_ms: None,
        data: Bytes::copy_from_slice(data.as_bytes()),
    }
}

fn rec(seq: u64, m: Mutation) -> ChangeRecord {
    ChangeRecord::single(seq, m)
}

/// Cleans `p:`'s range the way a replica's catch-up does, until it is empty.
fn clean(e: &FjallEngine) {
    while e
        .delete_range_chunk(&KeyRange::prefix("p:"), 1_000)
        .unwrap()
        > 0
    {}
}

fn value(e: &FjallEngine, key: &str) -> Option<Bytes> {
    e.get(key.as_bytes()).unwrap().map(|v| v.data)
}

#[test]
fn a_newer_put_in_a_cleaned_range_skips_the_read_and_an_older_one_still_loses() {
    let (_d, e) = open();
    e.apply_foreign(&[rec(3, put("p:k", "before the clean"))])
        .unwrap();
    assert_eq!(e.foreign_reads_skipped(), 0, "no range is tracked yet");
    clean(&e);
    assert_eq!(value(&e, "p:k"), None);
    e.apply_foreign(&[rec(10, put("p:k", "a"))]).unwrap();
    assert_eq!(e.foreign_reads_skipped(), 1);
    assert_eq!(value(&e, "p:k").as_deref(), Some(&b"a"[..]));
    e.apply_foreign(&[rec(5, put("p:k", "older"))]).unwrap();
    assert_eq!(value(&e, "p:k").as_deref(), Some(&b"a"[..]));
    assert_eq!(
        e.foreign_reads_skipped(),
        1,
        "an older record takes the rule"
    );
    e.apply_foreign(&[rec(12, put("p:k", "b"))]).unwrap();
    assert_eq!(value(&e, "p:k").as_deref(), Some(&b"b"[..]));
    assert_eq!(e.foreign_reads_skipped(), 2);
    e.apply_foreign(&[rec(100, put("q:k", "outside"))]).unwrap();
    assert_eq!(e.foreign_reads_skipped(), 2, "outside the cleaned range");
    // The skipped reads still logged their effects.
    let logged = e.changes_since(0, 100).unwrap();
    assert!(
        logged.iter().any(|r| r.mutation == put("p:k", "b")),
        "{logged:?}"
    );
}

#[test]
fn a_local_write_raises_the_bound() {
    let (_d, e) = open();
    clean(&e);
    for i in 0..50 {
        e.apply(&[put("p:other", &i.to_string())]).unwrap();
    }
    e.apply(&[put("p:k", "local")]).unwrap();
    let local_seq = e.last_seq();
    assert!(local_seq > 20);
    // Older than the local write's version: the rule keeps the local value
    // (without the raise, the bound 0 would let it through unread).
    e.apply_foreign(&[rec(20, put("p:k", "foreign"))]).unwrap();
    assert_eq!(value(&e, "p:k").as_deref(), Some(&b"local"[..]));
    assert_eq!(e.foreign_reads_skipped(), 0);
}

#[test]
fn a_foreign_delete_raises_the_bound() {
    let (_d, e) = open();
    clean(&e);
    e.apply_foreign(&[rec(
        30,
        Mutation::Delete {
            key: Bytes::from_static(b"p:k"),
        },
    )])
    .unwrap();
    e.apply_foreign(&[rec(25, put("p:k", "older than the delete"))])
        .unwrap();
    assert_eq!(value(&e, "p:k"), None);
    e.apply_foreign(&[rec(31, put("p:k", "newer"))]).unwrap();
    assert_eq!(value(&e, "p:k").as_deref(), Some(&b"newer"[..]));
}

#[test]
fn an_earlier_record_of_the_same_batch_is_not_overwritten_by_an_older_one() {
    let (_d, e) = open();
    clean(&e);
    e.apply_foreign(&[rec(12, put("p:k", "new")), rec(11, put("p:k", "old"))])
        .unwrap();
    assert_eq!(value(&e, "p:k").as_deref(), Some(&b"new"[..]));
    assert_eq!(e.foreign_reads_skipped(), 1, "only the first touch skips");
}

#[test]
fn random_foreign_records_end_the_same_with_and_without_bounds() {
    // Engine `a` tracks the range (cleaned), `b` does not: the same records,
    // in the same batches and order, must leave the same visible state.
    let (_da, a) = open();
    let (_db, b) = open();
    clean(&a);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let keys: Vec<String> = (0..12).map(|i| format!("p:{i}")).collect();
    let mut seq = 1_000u64;
    // One seq names one record (the rule's precondition).
    let mut used = std::collections::HashSet::new();
    for _ in 0..400 {
        let mut batch = Vec::new();
        for _ in 0..(1 + next() % 4) {
            // Mostly increasing, sometimes older than what came before.
            seq += 1 + next() % 3;
            let s = if next() % 5 == 0 {
                seq - next() % 20
            } else {
                seq
            };
            if !used.insert(s) {
                continue;
            }
            let key = Bytes::copy_from_slice(keys[(next() % 12) as usize].as_bytes());
            let m = match next() % 6 {
                0 => Mutation::Delete { key },
                1 => Mutation::SetExpiry {
                    key,
                    expire_at_ms: Some(4_000_000_000_000 + next() % 1000),
                },
                _ => Mutation::Put {
                    key,
                    kind: ValueKind::String,
                    expire_at_ms: None,
                    data: Bytes::from(format!("v{s}")),
                },
            };
            batch.push(rec(s, m));
        }
        a.apply_foreign(&batch).unwrap();
        b.apply_foreign(&batch).unwrap();
    }
    for k in &keys {
        assert_eq!(
            a.get(k.as_bytes()).unwrap(),
            b.get(k.as_bytes()).unwrap(),
            "{k}"
        );
    }
    assert!(
        a.foreign_reads_skipped() > 100,
        "{}",
        a.foreign_reads_skipped()
    );
    assert_eq!(b.foreign_reads_skipped(), 0);
}
