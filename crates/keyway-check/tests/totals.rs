//! The totals, each on a hand-made history, and zero on clean ones.

mod support;

use keyway_check::{CheckOptions, CheckReport, FindingKind, History, Reply, check};
use support::*;

fn run(h: &History) -> CheckReport {
    check(h, &CheckOptions::default())
}

#[test]
fn a_clean_history_has_every_total_at_zero() {
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 10, Reply::Ok);
    b.ok(1, set("k", "2"), 5, 15, Reply::Ok);
    b.ok(2, get("k"), 12, 14, val("1"));
    b.ok(2, get("k"), 20, 21, val("2"));
    b.ok(0, incr("n"), 20, 30, Reply::Int(1));
    b.ok(1, incr("n"), 20, 30, Reply::Int(2));
    b.ok(2, get("n"), 40, 41, val("2"));
    b.ok(0, append("a", "x"), 40, 41, Reply::Int(1));
    b.ok(0, get("a"), 42, 43, val("x"));
    b.ok(
        0,
        mset(&[("{t}p", "p1"), ("{t}q", "q1")]),
        50,
        51,
        Reply::Ok,
    );
    b.ok(
        0,
        mget(&["{t}p", "{t}q"]),
        52,
        53,
        vals(&[Some("p1"), Some("q1")]),
    );
    let r = run(&b.history());
    assert!(r.passed(), "{r}");
    assert_eq!(r.totals, Default::default());
}

#[test]
fn a_lost_acknowledged_set_is_counted_once() {
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    let lost = b.ok(0, set("k", "2"), 2, 3, Reply::Ok);
    b.ok(1, get("k"), 4, 5, val("1"));
    b.ok(1, get("k"), 6, 7, val("1"));
    let r = run(&b.history());
    assert_eq!(r.totals.lost_writes, 1, "{r}");
    let f = &r
        .totals
        .examples
        .iter()
        .find(|f| f.kind == FindingKind::LostWrite)
        .unwrap();
    assert_eq!(f.ids[0], lost);
}

#[test]
fn a_write_that_may_come_between_is_no_loss() {
    // "1b" runs alongside "2": the read may see it last.
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.ok(0, set("k", "2"), 2, 3, Reply::Ok);
    b.ok(1, set("k", "1b"), 2, 10, Reply::Ok);
    b.ok(2, get("k"), 4, 5, val("1b"));
    let r = run(&b.history());
    assert!(r.passed(), "{r}");
    // An unknown write that might take effect at any time disables the count,
    // though the history is still rejected.
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.ok(0, set("k", "2"), 2, 3, Reply::Ok);
    b.unknown(1, set("k", "3"), 2);
    b.ok(2, get("k"), 4, 5, val("1"));
    let r = run(&b.history());
    assert_eq!(r.linearizable(), Some(false));
    assert_eq!(r.totals.lost_writes, 0);
}

#[test]
fn a_lost_acknowledged_del_is_counted() {
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.ok(0, del("k"), 2, 3, Reply::Int(1));
    b.ok(1, get("k"), 4, 5, val("1"));
    let r = run(&b.history());
    assert_eq!(r.totals.lost_writes, 1, "{r}");
}

#[test]
fn a_lost_acknowledged_append_is_counted() {
    let mut b = B::default();
    b.ok(0, append("k", "a."), 0, 1, Reply::Int(2));
    b.ok(1, append("k", "b."), 0, 3, Reply::Int(4));
    b.ok(2, get("k"), 4, 5, val("b."));
    let r = run(&b.history());
    assert_eq!(r.totals.lost_writes, 1, "{r}");
    // Other APPENDs around it are fine.
    let mut b = B::default();
    b.ok(0, append("k", "a."), 0, 1, Reply::Int(2));
    b.ok(1, append("k", "b."), 0, 3, Reply::Int(4));
    b.ok(2, get("k"), 4, 5, val("a.b."));
    assert!(run(&b.history()).passed());
}

#[test]
fn an_incr_applied_twice_is_counted() {
    let mut b = B::default();
    b.ok(0, incr("n"), 0, 1, Reply::Int(1));
    b.ok(0, incr("n"), 2, 3, Reply::Int(2));
    b.ok(1, get("n"), 4, 5, val("3"));
    let r = run(&b.history());
    assert_eq!(r.totals.double_incr, 1, "{r}");
    assert_eq!(r.linearizable(), Some(false));
    // An unknown INCR invoked before the read explains the 3.
    let mut b = B::default();
    b.ok(0, incr("n"), 0, 1, Reply::Int(1));
    b.ok(0, incr("n"), 2, 3, Reply::Int(2));
    b.unknown(2, incr("n"), 3);
    b.ok(1, get("n"), 4, 5, val("3"));
    let r = run(&b.history());
    assert!(r.passed(), "{r}");
    // A key that is also SET is no counter: the rule does not apply.
    let mut b = B::default();
    b.ok(0, set("n", "5"), 0, 1, Reply::Ok);
    b.ok(0, incr("n"), 2, 3, Reply::Int(6));
    let r = run(&b.history());
    assert!(r.passed(), "{r}");
}

#[test]
fn duplicate_incr_replies_are_counted() {
    let mut b = B::default();
    for c in 0..3 {
        b.ok(c, incr("n"), 0, 10, Reply::Int(1));
    }
    b.ok(3, incr("n"), 0, 10, Reply::Int(2));
    let r = run(&b.history());
    assert_eq!(r.totals.duplicate_incr_replies, 2, "{r}");
}

#[test]
fn a_stale_read_is_counted_and_a_concurrent_one_is_not() {
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.ok(0, set("k", "2"), 2, 4, Reply::Ok);
    // Concurrent with the second write: may see the first.
    b.ok(1, get("k"), 3, 5, val("1"));
    let r = run(&b.history());
    assert!(r.passed(), "{r}");
    // Invoked after it completed: stale.
    b.ok(1, get("k"), 6, 7, val("1"));
    let r = run(&b.history());
    assert_eq!(r.totals.stale_reads, 1, "{r}");
    // A write that overlapped the first does not make it certainly older.
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 3, Reply::Ok);
    b.ok(1, set("k", "2"), 2, 4, Reply::Ok);
    b.ok(2, get("k"), 6, 7, val("1"));
    let r = run(&b.history());
    assert!(r.passed(), "{r}");
}

#[test]
fn values_written_twice_are_reported_and_skip_the_stale_count() {
    let mut b = B::default();
    b.ok(0, set("k", "same"), 0, 1, Reply::Ok);
    b.ok(0, set("k", "other"), 2, 3, Reply::Ok);
    b.ok(0, set("k", "same"), 4, 5, Reply::Ok);
    b.ok(1, get("k"), 6, 7, val("same"));
    let r = run(&b.history());
    assert!(r.totals.non_unique_keys.contains(&"k".to_string()), "{r}");
    assert_eq!(r.totals.stale_reads, 0);
    assert!(r.passed(), "{r}");
    assert!(
        r.to_string().ends_with("non-unique values on 1 keys"),
        "{r}"
    );
}
