//! Hand-made histories the checker must accept or reject.

mod support;

use keyway_check::{CheckOptions, CheckReport, History, Reply, Verdict, check, check_file};
use support::*;

fn run(h: &History) -> CheckReport {
    check(h, &CheckOptions::default())
}

fn verdict_of<'a>(r: &'a CheckReport, key: &str) -> &'a Verdict {
    &r.keys
        .iter()
        .find(|k| k.key == key)
        .expect("key checked")
        .verdict
}

fn assert_linearizable(h: &History) -> CheckReport {
    let r = run(h);
    assert_eq!(r.linearizable(), Some(true), "{r}\n{:#?}", r.keys);
    r
}

fn assert_violation(h: &History, key: &str) -> CheckReport {
    let r = run(h);
    assert_eq!(r.linearizable(), Some(false), "{r}");
    assert!(
        matches!(verdict_of(&r, key), Verdict::Violation(_)),
        "{:#?}",
        r.keys
    );
    r
}

#[test]
fn a_sequential_history_is_linearizable() {
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.ok(0, get("k"), 2, 3, val("1"));
    b.ok(0, append("k", "2"), 4, 5, Reply::Int(2));
    b.ok(0, get("k"), 6, 7, val("12"));
    b.ok(0, incr("k"), 8, 9, Reply::Int(13));
    b.ok(0, del("k"), 10, 11, Reply::Int(1));
    b.ok(0, get("k"), 12, 13, nil());
    let r = assert_linearizable(&b.history());
    assert!(r.passed());
    assert_eq!(r.details(), "");
    assert_eq!(
        r.to_string(),
        "linearizable: yes (1 keys) | ops ok 7 failed 0 unknown 0 | lost 0 | double-incr 0 | dup-incr 0 | stale 0 | torn-mget 0"
    );
}

#[test]
fn concurrent_writes_may_be_seen_in_either_order() {
    for (first, second) in [("a", "b"), ("b", "a")] {
        let mut b = B::default();
        b.ok(0, set("k", "a"), 0, 10, Reply::Ok);
        b.ok(1, set("k", "b"), 0, 10, Reply::Ok);
        // Reads concurrent with both writes may see either, then the other.
        b.ok(2, get("k"), 1, 3, val(first));
        b.ok(2, get("k"), 4, 6, val(second));
        // After both completed, the last one stays.
        b.ok(3, get("k"), 20, 21, val(second));
        let r = assert_linearizable(&b.history());
        assert!(r.totals.clean(), "{r}");
    }
}

#[test]
fn a_stale_read_is_a_violation() {
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.ok(0, set("k", "2"), 2, 3, Reply::Ok);
    let read = b.ok(1, get("k"), 4, 5, val("1"));
    let r = assert_violation(&b.history(), "k");
    let v = r.violations().next().unwrap();
    assert_eq!(v.blocking.id, read, "{v}");
    assert_eq!(v.expected, val("2"));
    assert_eq!(v.state, Some("2".into()));
    assert_eq!((v.linearized, v.completed), (2, 3));
    assert_eq!(r.totals.stale_reads, 1);
    assert_eq!(r.totals.lost_writes, 1);
    assert!(!r.passed());
    assert!(
        r.to_string()
            .starts_with("linearizable: NO (1 of 1 keys: \"k\")"),
        "{r}"
    );
}

#[test]
fn two_incrs_acknowledged_with_the_same_value_are_a_lost_update() {
    let mut b = B::default();
    b.ok(0, incr("n"), 0, 10, Reply::Int(1));
    b.ok(1, incr("n"), 0, 10, Reply::Int(1));
    let r = assert_violation(&b.history(), "n");
    assert_eq!(r.totals.duplicate_incr_replies, 1);
}

#[test]
fn an_acknowledged_set_overwritten_by_the_past_is_a_violation() {
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.ok(0, set("k", "2"), 2, 3, Reply::Ok);
    for i in 0..5 {
        b.ok(1, get("k"), 10 + 10 * i, 12 + 10 * i, val("1"));
    }
    let r = assert_violation(&b.history(), "k");
    assert_eq!(r.totals.lost_writes, 1, "{r}");
}

#[test]
fn a_write_seen_then_unseen_is_a_violation() {
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.ok(0, set("k", "2"), 2, 100, Reply::Ok);
    b.ok(1, get("k"), 3, 4, val("2"));
    b.ok(1, get("k"), 5, 6, val("1"));
    assert_violation(&b.history(), "k");
}

#[test]
fn an_unknown_write_is_taken_when_a_read_needs_it() {
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.unknown(1, set("k", "2"), 2);
    b.ok(2, get("k"), 5, 6, val("1"));
    b.ok(2, get("k"), 50, 60, val("2"));
    b.ok(2, get("k"), 70, 80, val("2"));
    let r = assert_linearizable(&b.history());
    assert!(r.passed(), "{r}");
    // Once seen, the old value cannot come back.
    b.ok(2, get("k"), 90, 91, val("1"));
    assert_violation(&b.history(), "k");
}

#[test]
fn an_unknown_write_that_never_shows_is_dropped() {
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.unknown(1, set("k", "2"), 2);
    b.unknown(2, incr("k"), 3);
    b.unknown(3, del("k"), 4);
    b.ok(4, get("k"), 5, 6, val("1"));
    b.ok(4, get("k"), 1000, 1001, val("1"));
    assert_linearizable(&b.history());
    // An unknown DEL explains a later nil; then DEL replies 0.
    b.ok(4, get("k"), 1002, 1003, nil());
    b.ok(4, del("k"), 1004, 1005, Reply::Int(0));
    assert_linearizable(&b.history());
}

#[test]
fn unknown_incrs_may_each_apply_once() {
    let mut b = B::default();
    b.ok(0, incr("n"), 0, 1, Reply::Int(1));
    for c in 1..=3 {
        b.unknown(c, incr("n"), 2);
    }
    b.ok(9, incr("n"), 10, 11, Reply::Int(4));
    let r = assert_linearizable(&b.history());
    assert!(r.passed(), "{r}");
    // Three unknown INCRs cannot make 5 from 1 with one more INCR.
    let mut b = B::default();
    b.ok(0, incr("n"), 0, 1, Reply::Int(1));
    for c in 1..=3 {
        b.unknown(c, incr("n"), 2);
    }
    b.ok(9, incr("n"), 10, 11, Reply::Int(6));
    let r = assert_violation(&b.history(), "n");
    assert_eq!(r.totals.double_incr, 1, "{r}");
}

#[test]
fn failed_operations_have_no_effect() {
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.failed(0, set("k", "2"), 2, 3);
    b.ok(0, get("k"), 4, 5, val("1"));
    assert_linearizable(&b.history());
    b.ok(0, get("k"), 6, 7, val("2"));
    assert_violation(&b.history(), "k");
}

#[test]
fn incr_of_a_non_integer_must_be_an_error() {
    let mut b = B::default();
    b.ok(0, set("k", "abc"), 0, 1, Reply::Ok);
    b.ok(
        0,
        incr("k"),
        2,
        3,
        Reply::Error("ERR value is not an integer or out of range".into()),
    );
    b.ok(0, get("k"), 4, 5, val("abc"));
    assert_linearizable(&b.history());
    let mut b = B::default();
    b.ok(0, set("k", "abc"), 0, 1, Reply::Ok);
    b.ok(0, incr("k"), 2, 3, Reply::Int(1));
    assert_violation(&b.history(), "k");
    // And an error where an integer was due.
    let mut b = B::default();
    b.ok(0, set("k", "7"), 0, 1, Reply::Ok);
    b.ok(0, incr("k"), 2, 3, Reply::Error("ERR whatever".into()));
    assert_violation(&b.history(), "k");
}

#[test]
fn del_counts_what_it_removed() {
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.ok(0, del("k"), 2, 3, Reply::Int(1));
    b.ok(0, del("k"), 4, 5, Reply::Int(0));
    assert_linearizable(&b.history());
    b.ok(0, del("k"), 6, 7, Reply::Int(1));
    assert_violation(&b.history(), "k");
    // Two concurrent DELs of a present key: exactly one removes it.
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.ok(1, del("k"), 2, 10, Reply::Int(1));
    b.ok(2, del("k"), 2, 10, Reply::Int(0));
    assert_linearizable(&b.history());
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 1, Reply::Ok);
    b.ok(1, del("k"), 2, 10, Reply::Int(1));
    b.ok(2, del("k"), 2, 10, Reply::Int(1));
    assert_violation(&b.history(), "k");
}

#[test]
fn append_replies_the_new_length() {
    let mut b = B::default();
    b.ok(0, append("k", "ab"), 0, 1, Reply::Int(2));
    b.ok(1, append("k", "cde"), 2, 10, Reply::Int(6));
    b.ok(2, append("k", "f"), 2, 10, Reply::Int(3));
    // "ab" then "f" then "cde".
    b.ok(0, get("k"), 20, 21, val("abfcde"));
    assert_linearizable(&b.history());
    let mut b = B::default();
    b.ok(0, append("k", "ab"), 0, 1, Reply::Int(2));
    b.ok(0, append("k", "c"), 2, 3, Reply::Int(2));
    assert_violation(&b.history(), "k");
}

#[test]
fn mset_and_mget_are_checked_per_key() {
    let mut b = B::default();
    b.ok(0, mset(&[("{t}a", "1"), ("{t}b", "1")]), 0, 1, Reply::Ok);
    b.ok(
        0,
        mget(&["{t}a", "{t}b"]),
        2,
        3,
        vals(&[Some("1"), Some("1")]),
    );
    b.ok(1, set("{t}b", "2"), 4, 5, Reply::Ok);
    b.ok(
        0,
        mget(&["{t}b", "{t}a"]),
        6,
        7,
        vals(&[Some("2"), Some("1")]),
    );
    let r = assert_linearizable(&b.history());
    assert_eq!(r.keys.len(), 2);
    b.ok(0, mget(&["{t}a", "{t}b"]), 8, 9, vals(&[Some("1"), None]));
    let r = assert_violation(&b.history(), "{t}b");
    assert!(matches!(
        verdict_of(&r, "{t}a"),
        Verdict::Linearizable { .. }
    ));
}

#[test]
fn a_torn_mget_fails_the_run_though_each_key_is_linearizable() {
    let mut b = B::default();
    b.ok(0, mset(&[("{t}a", "x1"), ("{t}b", "y1")]), 0, 10, Reply::Ok);
    b.ok(1, mset(&[("{t}a", "x2"), ("{t}b", "y2")]), 0, 10, Reply::Ok);
    b.ok(
        2,
        mget(&["{t}a", "{t}b"]),
        20,
        21,
        vals(&[Some("x1"), Some("y2")]),
    );
    let r = run(&b.history());
    assert_eq!(r.linearizable(), Some(true), "per key this is fine: {r}");
    assert_eq!(r.totals.torn_mgets, 1);
    assert!(!r.passed());
    // Seeing one MSET whole is fine.
    let mut b = B::default();
    b.ok(0, mset(&[("{t}a", "x1"), ("{t}b", "y1")]), 0, 10, Reply::Ok);
    b.ok(1, mset(&[("{t}a", "x2"), ("{t}b", "y2")]), 0, 10, Reply::Ok);
    b.ok(
        2,
        mget(&["{t}a", "{t}b"]),
        20,
        21,
        vals(&[Some("x1"), Some("y1")]),
    );
    assert!(run(&b.history()).passed());
}

#[test]
fn the_search_budget_gives_undecided_not_a_pass() {
    let mut b = B::default();
    for c in 0..8 {
        b.ok(c, set("k", &format!("v{c}")), 0, 100, Reply::Ok);
    }
    b.ok(9, get("k"), 200, 201, val("v0"));
    let options = CheckOptions {
        max_search_steps: 3,
        ..CheckOptions::default()
    };
    let r = check(&b.history(), &options);
    assert!(
        matches!(verdict_of(&r, "k"), Verdict::Unknown { .. }),
        "{:?}",
        r.keys
    );
    assert_eq!(r.linearizable(), None);
    assert!(!r.passed());
    assert!(
        r.to_string()
            .starts_with("linearizable: UNDECIDED (1 of 1 keys"),
        "{r}"
    );
    assert!(run(&b.history()).passed());
}

#[test]
fn options_that_cannot_work_are_refused() {
    assert!(CheckOptions::default().validate().is_ok());
    let no_steps = CheckOptions {
        max_search_steps: 0,
        ..CheckOptions::default()
    };
    assert!(no_steps.validate().is_err());
    let no_events = CheckOptions {
        max_failure_events: 0,
        ..CheckOptions::default()
    };
    assert!(no_events.validate().is_err());
    let no_threads = CheckOptions {
        threads: 0,
        ..CheckOptions::default()
    };
    assert!(no_threads.validate().is_err());
}

#[test]
fn a_malformed_history_is_reported_invalid() {
    let mut b = B::default();
    b.ok(0, set("k", "1"), 0, 10, Reply::Ok);
    b.ok(0, get("k"), 5, 12, val("1"));
    let r = run(&b.history());
    assert!(r.invalid.is_some());
    assert_eq!(r.linearizable(), None);
    assert!(r.to_string().starts_with("history INVALID"), "{r}");
}

#[test]
fn a_failing_history_is_written_small_and_fails_again_when_reread() {
    // A long clean history on two keys, then a stale read of one.
    let mut b = B::default();
    let mut t = 0;
    for i in 0..300 {
        b.ok(0, set("{t}a", &format!("a{i}")), t, t + 1, Reply::Ok);
        b.ok(
            1,
            mset(&[("{t}b", &format!("b{i}")), ("{t}a", &format!("m{i}"))]),
            t + 2,
            t + 3,
            Reply::Ok,
        );
        b.ok(
            2,
            mget(&["{t}a", "{t}b"]),
            t + 4,
            t + 5,
            vals(&[Some(&format!("m{i}")), Some(&format!("b{i}"))]),
        );
        t += 10;
    }
    let stale = b.ok(2, get("{t}b"), t, t + 1, val("b7"));
    for i in 0..50 {
        b.ok(0, get("{t}a"), t + 10 + 2 * i, t + 11 + 2 * i, val("m299"));
    }
    let h = b.history();
    let options = CheckOptions::default();
    let r = check(&h, &options);
    assert_eq!(r.linearizable(), Some(false), "{r}");
    let dir = tempfile::tempdir().unwrap();
    let files = r
        .write_failure(&h, &options, dir.path(), "run-1")
        .unwrap()
        .expect("a violation to write");
    assert_eq!(files.key, "{t}b");
    assert!(files.reproduces);
    // About `max_failure_events`: the cut moves back to a write every
    // earlier operation completed before, so nothing it leaves out matters.
    assert!(files.events <= 2 * options.max_failure_events, "{files:?}");
    let again = check_file(&files.jsonl).unwrap();
    let first = std::fs::read_to_string(&files.jsonl).unwrap();
    let first = first.lines().next().unwrap();
    assert!(
        first.contains("\"m_set\"") || first.contains("\"set\""),
        "{first}"
    );
    assert_eq!(again.linearizable(), Some(false), "{again}");
    assert_eq!(again.keys.len(), 1, "only the violating key is written");
    let text = std::fs::read_to_string(&files.text).unwrap();
    assert!(text.contains(&format!("#{stale} c2")), "{text}");
    assert!(text.contains("could not place"), "{text}");
    assert!(text.lines().count() < 80, "{text}");
}

#[test]
fn a_set_of_the_value_already_there_is_not_a_forced_move() {
    // The second SET "a" must go after SET "b", though it changes nothing
    // where the search first meets it.
    let mut b = B::default();
    b.ok(0, set("k", "a"), 0, 1, Reply::Ok);
    b.ok(1, set("k", "a"), 2, 20, Reply::Ok);
    b.ok(2, set("k", "b"), 3, 4, Reply::Ok);
    b.ok(3, get("k"), 5, 6, val("b"));
    b.ok(3, get("k"), 21, 22, val("a"));
    assert_linearizable(&b.history());
    // Likewise APPEND "" (length 0 both on an absent key and on "").
    let mut b = B::default();
    b.ok(0, set("k", ""), 0, 1, Reply::Ok);
    b.ok(1, append("k", ""), 2, 20, Reply::Int(0));
    b.ok(2, del("k"), 3, 4, Reply::Int(1));
    b.ok(3, get("k"), 21, 22, val(""));
    assert_linearizable(&b.history());
}
