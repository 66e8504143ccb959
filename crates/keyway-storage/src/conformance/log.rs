//! The change log: contents, limits, truncation, `log_start` and
//! `LogTruncated`.

use super::{del, log_all, ok, put, rec, rk, val};
use crate::ChangeRecord;
use crate::engine::Engine;
use crate::error::StorageError;

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
    let bytes = |recs: &[crate::ChangeRecord]| -> u64 {
        recs.iter()
            .map(|r| 8 + r.mutation.encoded_len() as u64)
            .sum()
    };
    assert_eq!(
        e.log_bytes(),
        bytes(&expected),
        "log_bytes counts every record"
    );
    assert_eq!(ok(e.changes_since(0, 3)), expected[..3].to_vec());
    assert_eq!(ok(e.changes_since(17, 100)), expected[17..].to_vec());
    assert!(ok(e.changes_since(20, 100)).is_empty());
    assert!(ok(e.changes_since(1000, 100)).is_empty());

    ok(e.truncate_log(7));
    assert_eq!(e.log_start(), 8);
    assert_eq!(e.log_bytes(), bytes(&expected[7..]), "truncation subtracts");
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
    assert_eq!(e.log_bytes(), 0);
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

/// Batches in the change log: every record of one `apply` (or one
/// `apply_foreign`'s effects) but the last says its batch continues, and
/// `changes_since` never ends inside a batch (it reads past its limit to
/// the batch's end), so a consumer that ships or applies what it read
/// keeps every batch whole. The flag survives `ChangeRecord` encoding.
pub fn change_log_batches<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let k = |i: u32| rk(1, &format!("b{i}"));
    ok(e.apply(&[put(&k(1), "a")]));
    ok(e.apply(&[put(&k(2), "b"), put(&k(3), "c"), del(&k(1))]));
    ok(e.apply(&[put(&k(4), "d"), put(&k(5), "e")]));
    let flags: Vec<(u64, bool)> = log_all(&e)
        .iter()
        .map(|r| (r.seq, r.batch_continues))
        .collect();
    assert_eq!(
        flags,
        vec![
            (1, false),
            (2, true),
            (3, true),
            (4, false),
            (5, true),
            (6, false)
        ]
    );
    let seqs = |v: Vec<ChangeRecord>| v.iter().map(|r| r.seq).collect::<Vec<_>>();
    assert_eq!(seqs(ok(e.changes_since(0, 1))), vec![1]);
    assert_eq!(
        seqs(ok(e.changes_since(0, 2))),
        vec![1, 2, 3, 4],
        "read to the batch's end"
    );
    assert_eq!(seqs(ok(e.changes_since(1, 1))), vec![2, 3, 4]);
    assert_eq!(seqs(ok(e.changes_since(4, 1))), vec![5, 6]);
    assert_eq!(seqs(ok(e.changes_since(0, 4))), vec![1, 2, 3, 4]);
    for r in log_all(&e) {
        let back = ok(ChangeRecord::decode(&bytes::Bytes::from(r.encode())));
        assert_eq!(back, r, "the batch flag is encoded");
    }
    // A foreign batch's effects are one local batch (a record that changes
    // nothing is not logged, and the batch still ends).
    let f = make();
    let foreign: Vec<ChangeRecord> = log_all(&e);
    ok(f.apply_foreign(&foreign[1..4]));
    let got: Vec<bool> = log_all(&f).iter().map(|r| r.batch_continues).collect();
    assert_eq!(got.last(), Some(&false));
    assert!(got[..got.len() - 1].iter().all(|c| *c), "{got:?}");
    // Runs for atomic sub-batches end at batch ends.
    let all = log_all(&e);
    let runs: Vec<Vec<u64>> = crate::whole_batches(&all, 2)
        .into_iter()
        .map(|run| run.iter().map(|r| r.seq).collect())
        .collect();
    assert_eq!(runs, vec![vec![1, 2, 3, 4], vec![5, 6]]);
    let runs: Vec<usize> = crate::whole_batches(&all, 100)
        .iter()
        .map(|r| r.len())
        .collect();
    assert_eq!(runs, vec![6]);
}

/// `changes_since` and [`Engine::recent_changes`] (whenever it answers)
/// both give what a model of the log says: `limit` records after `after`,
/// then on to the end of the last one's batch, nothing past the last seq,
/// `LogTruncated` below the log's start. An engine that keeps records in
/// memory is armed first by a read from the start, as a stream's is.
pub fn recent_changes_agree<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let k = |i: u32| rk(1, &format!("t{i}"));
    assert!(
        e.recent_changes(0, 1)
            .is_none_or(|a| a.is_ok_and(|r| r.is_empty()))
    );
    // The model: every record, with its seq and batch flag.
    let mut model: Vec<ChangeRecord> = Vec::new();
    let mut apply = |batch: Vec<crate::Mutation>| {
        let last = ok(e.apply(&batch));
        let n = batch.len() as u64;
        for (j, m) in batch.into_iter().enumerate() {
            let seq = last - n + 1 + j as u64;
            model.push(ChangeRecord {
                seq,
                mutation: m,
                batch_continues: seq != last,
            });
        }
    };
    for i in 0..60u32 {
        apply((0..=(i % 4)).map(|j| put(&k(i * 4 + j), "v")).collect());
        if i % 9 == 0 {
            apply(vec![del(&k(i))]);
        }
    }
    let expect = |after: u64, limit: usize, log_start: u64| -> Result<Vec<ChangeRecord>, String> {
        if after + 1 < log_start {
            return Err(format!("truncated below {log_start}"));
        }
        let mut out: Vec<ChangeRecord> = Vec::new();
        for r in model.iter().filter(|r| r.seq > after) {
            if out.len() >= limit && out.last().is_none_or(|p| !p.batch_continues) {
                break;
            }
            out.push(r.clone());
        }
        Ok(out)
    };
    let check = |log_start: u64| {
        let last = e.last_seq();
        assert_eq!(last, model.len() as u64);
        for after in 0..=last + 2 {
            for limit in [0, 1, 2, 5, usize::MAX] {
                let want = expect(after, limit, log_start);
                let got = |a: Result<Vec<ChangeRecord>, StorageError>| match a {
                    Ok(r) => Ok(r),
                    Err(StorageError::LogTruncated { log_start, .. }) => {
                        Err(format!("truncated below {log_start}"))
                    }
                    Err(other) => panic!("after {after}, limit {limit}: {other}"),
                };
                assert_eq!(
                    got(e.changes_since(after, limit)),
                    want,
                    "changes_since({after}, {limit})"
                );
                if let Some(recent) = e.recent_changes(after, limit) {
                    assert_eq!(got(recent), want, "recent_changes({after}, {limit})");
                }
            }
        }
    };
    check(1);
    ok(e.truncate_log(40));
    check(41);
}

/// [`Engine::keep_log`]: while records are not kept, seqs still advance,
/// the log is truncated whole after every write, and reads after an older
/// seq are `LogTruncated`; switched back on, every record after the
/// returned seq is there. Foreign applies follow the same rule.
pub fn log_not_kept<E: Engine>(make: &dyn Fn() -> E) {
    let e = make();
    let k = |i: u32| rk(1, &format!("k{i}"));
    assert!(e.log_kept(), "engines start with records kept");
    for i in 1..=3u32 {
        ok(e.apply(&[put(&k(i), "a")]));
    }
    assert_eq!(ok(e.keep_log(true)), 3, "already kept: the last seq");
    assert_eq!(e.log_start(), 1, "kept already: nothing truncated");

    assert_eq!(ok(e.keep_log(false)), 3);
    assert!(!e.log_kept());
    assert_eq!((e.log_start(), e.log_bytes()), (4, 0), "truncated whole");
    assert_eq!(ok(e.keep_log(false)), 3, "idempotent");
    assert_eq!(ok(e.apply(&[put(&k(4), "b"), del(&k(1))])), 5);
    assert_eq!(ok(e.apply(&[del(&k(9))])), 6, "a no-op still takes a seq");
    assert_eq!(e.log_start(), 7, "follows the last seq");
    assert_eq!(e.log_bytes(), 0);
    assert_eq!(e.get(&k(4)).unwrap().unwrap().version, 4, "data is written");
    assert!(e.get(&k(1)).unwrap().is_none());
    assert!(matches!(
        e.changes_since(5, 10),
        Err(StorageError::LogTruncated { log_start: 7, .. })
    ));
    assert!(matches!(
        e.recent_changes(5, 10),
        Some(Err(StorageError::LogTruncated { .. }))
    ));
    assert!(ok(e.changes_since(6, 10)).is_empty());
    let foreign = rec(1000, put(&k(20), "f"));
    assert_eq!(ok(e.apply_foreign(std::slice::from_ref(&foreign))), 7);
    assert_eq!(e.log_start(), 8);
    assert_eq!(ok(e.scan(&super::slot_range(1), None, 100)).seq, 7);
    assert_eq!(ok(e.digest(&super::slot_range(1))).1, 7);
    ok(e.truncate_log(7));
    assert_eq!(e.log_start(), 8, "a truncation has nothing to do");

    assert_eq!(ok(e.keep_log(true)), 7, "on again after seq 7");
    assert!(e.log_kept());
    assert_eq!(e.log_start(), 8);
    assert!(matches!(
        e.changes_since(6, 10),
        Err(StorageError::LogTruncated { log_start: 8, .. })
    ));
    let m = put(&k(5), "c");
    assert_eq!(ok(e.apply(std::slice::from_ref(&m))), 8);
    assert_eq!(ok(e.changes_since(7, 10)), vec![rec(8, m.clone())]);
    assert_eq!(log_all(&e), vec![rec(8, m.clone())]);
    assert_eq!(e.log_bytes(), 8 + m.encoded_len() as u64);
    let w = ok(e.written_digests(&super::slot_range(1), 7, 10));
    assert_eq!((w.seq, w.keys), (8, vec![k(5)]));
}
