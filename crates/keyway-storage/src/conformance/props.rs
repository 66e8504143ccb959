//! Property checks: random operation sequences against the reference
//! model, foreign-record permutations, and a replica following the log.

use std::collections::HashSet;

use proptest::prelude::*;

use super::model::{Model, Op, check_against_model, mutation_strategy, op_strategy, ranges};
use super::{ok, rec, run_prop, scan_all, strip_versions};
use crate::engine::Engine;
use crate::range::KeyRange;
use crate::value::Seq;

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
                    let at = model.log.len();
                    muts.iter().for_each(|m| model.local(m));
                    model.end_batch(at);
                    prop_assert_eq!(seq, model.last_seq);
                }
                Op::Foreign(recs) => {
                    // One seq names one record (as in a real source log).
                    let recs: Vec<_> = recs
                        .into_iter()
                        .filter(|r| used_foreign_seqs.insert(r.seq))
                        .collect();
                    let seq = ok(e.apply_foreign(&recs));
                    let at = model.log.len();
                    recs.iter().for_each(|r| model.foreign(r));
                    model.end_batch(at);
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
