//! Concurrency: parallel writers get gap-free, correctly placed seqs, and
//! readers see consistent snapshots while writes are in flight.

use std::sync::atomic::{AtomicBool, Ordering};

use super::{log_all, ok, put, rec, rk, slot_range};
use crate::engine::Engine;
use crate::value::{Mutation, Seq};

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
