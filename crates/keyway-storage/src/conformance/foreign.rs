//! Foreign records (`apply_foreign`): newest-wins ordering, tombstone
//! markers, pending expiries, and the effects written to the local log.

use super::{del, expire, ok, put, put_exp, rec, rk, val};
use crate::engine::Engine;

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
    let continuing = |r: crate::ChangeRecord| crate::ChangeRecord {
        batch_continues: true,
        ..r
    };
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
        // One foreign call's effects are one local batch.
        vec![
            continuing(rec(2, put(&k, "a"))),
            continuing(rec(3, expire(&k, Some(3)))),
            continuing(rec(4, del(&k))),
            rec(5, put_exp(&k, "c", Some(9))),
        ]
    );
    // Foreign Delete of an absent key: marker only, nothing logged.
    ok(e.apply_foreign(&[rec(7, del(&rk(1, "nothing")))]));
    assert_eq!(e.last_seq(), 5);
}
