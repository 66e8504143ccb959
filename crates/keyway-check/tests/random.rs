//! Random histories: linearizable by construction (the checker must say
//! yes and every total must be zero), and the same with one read changed
//! to a value never written (the checker must say no).

mod support;

use keyway_check::{CheckOptions, History, Op, Outcome, Reply, Verdict, check};
use proptest::prelude::*;
use support::{Shape, generate};

fn shape() -> impl Strategy<Value = Shape> {
    (
        1u32..7,
        3usize..40,
        1usize..4,
        0usize..3,
        0u64..15,
        0u64..10,
        2u64..60,
    )
        .prop_map(
            |(
                clients,
                ops_per_client,
                keys,
                counters,
                unknown_pct,
                failed_pct,
                max_duration_us,
            )| Shape {
                clients,
                ops_per_client,
                keys,
                counters,
                unknown_pct,
                failed_pct,
                max_duration_us,
                value_pool: None,
            },
        )
}

/// Changes the value of one completed read (the `pick`-th) to a value no
/// operation writes; false if the history has no such read.
fn corrupt_one_read(h: &mut History, pick: usize) -> bool {
    let reads: Vec<usize> = (0..h.events.len())
        .filter(|&i| match (&h.events[i].op, &h.events[i].outcome) {
            (Op::Get { .. }, Outcome::Ok(Reply::Value(_))) => true,
            (Op::MGet { keys }, Outcome::Ok(Reply::Values(vs))) => keys.len() == vs.len(),
            _ => false,
        })
        .collect();
    if reads.is_empty() {
        return false;
    }
    let e = &mut h.events[reads[pick % reads.len()]];
    let never = Some("zz-never-written".to_string());
    match &mut e.outcome {
        Outcome::Ok(Reply::Value(v)) => *v = never,
        Outcome::Ok(Reply::Values(vs)) => {
            let at = pick % vs.len();
            vs[at] = never;
        }
        _ => unreachable!(),
    }
    true
}

proptest! {
    // 200 cases unless PROPTEST_CASES says otherwise.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(200),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_history_made_by_running_the_model_is_linearizable(seed in any::<u64>(), shape in shape()) {
        let h = generate(seed, shape);
        h.validate().unwrap();
        let r = check(&h, &CheckOptions::default());
        prop_assert_eq!(r.linearizable(), Some(true), "{}\n{:#?}", r, r.violations().next());
        prop_assert!(r.totals.clean(), "{} {:?}", r, r.totals.examples);
        prop_assert!(r.totals.non_unique_keys.is_empty());
    }

    #[test]
    fn the_same_history_with_a_read_of_a_value_never_written_is_not(
        seed in any::<u64>(),
        shape in shape(),
        pick in any::<usize>(),
    ) {
        let mut h = generate(seed, shape);
        prop_assume!(corrupt_one_read(&mut h, pick));
        let r = check(&h, &CheckOptions::default());
        prop_assert_eq!(r.linearizable(), Some(false), "{}", r);
    }

    /// Few keys, many clients, many unknown outcomes: where the search's
    /// pruning of unknown operations does the most.
    #[test]
    fn contended_histories_with_many_unknowns_are_judged_right(
        seed in any::<u64>(),
        clients in 4u32..10,
        ops_per_client in 5usize..30,
        unknown_pct in 10u64..40,
        pick in any::<usize>(),
        value_pool in prop::option::of(2u64..6),
    ) {
        let shape = Shape { clients, ops_per_client, keys: 1, counters: 1, unknown_pct, failed_pct: 5, max_duration_us: 50, value_pool };
        let mut h = generate(seed, shape);
        let r = check(&h, &CheckOptions::default());
        prop_assert_eq!(r.linearizable(), Some(true), "{}\n{:#?}", r, r.violations().next());
        prop_assert!(r.totals.clean(), "{} {:?}", r, r.totals.examples);
        if value_pool.is_none() {
            prop_assert!(r.totals.non_unique_keys.is_empty());
        }
        if corrupt_one_read(&mut h, pick) {
            // Never a pass. Proving the violation means exhausting every
            // placement of the unknown writes; with repeated values and
            // this many unknowns on one key it can exceed the budget
            // (seen once in 4000 cases: undecided, which fails a run too).
            let r = check(&h, &CheckOptions::default());
            prop_assert_ne!(r.linearizable(), Some(true), "{}", r);
            prop_assert!(!r.passed());
        }
    }
}

#[test]
fn a_big_concurrent_history_is_decided_within_the_budget() {
    let shape = Shape {
        clients: 16,
        ops_per_client: 1250,
        keys: 16,
        counters: 4,
        unknown_pct: 2,
        failed_pct: 2,
        max_duration_us: 400,
        value_pool: None,
    };
    let h = generate(7, shape);
    assert_eq!(h.events.len(), 20_000);
    let started = std::time::Instant::now();
    let r = check(&h, &CheckOptions::default());
    let worst = r.keys.iter().map(|k| k.verdict.steps()).max().unwrap();
    println!(
        "{r}\n{} keys, {} steps in all, worst key {worst} steps, {:?}",
        r.keys.len(),
        r.steps(),
        started.elapsed()
    );
    assert_eq!(r.keys.len(), 20);
    assert!(
        r.keys
            .iter()
            .all(|k| matches!(k.verdict, Verdict::Linearizable { .. })),
        "{r}"
    );
    assert!(r.passed(), "{r}");

    // On two threads: the same verdicts.
    let two = check(
        &h,
        &CheckOptions {
            threads: 2,
            ..CheckOptions::default()
        },
    );
    assert_eq!(two, r);

    // The same history with one read corrupted is decided too, and a no.
    let mut bad = h.clone();
    assert!(corrupt_one_read(&mut bad, 12_345));
    let r = check(&bad, &CheckOptions::default());
    println!("{r}");
    assert_eq!(r.linearizable(), Some(false), "{r}");
}

#[test]
fn a_contended_history_with_many_unknowns_is_decided_within_the_budget() {
    // 16 clients on 5 keys and a counter, 5% unknown outcomes.
    let shape = Shape {
        clients: 16,
        ops_per_client: 600,
        keys: 5,
        counters: 1,
        unknown_pct: 5,
        failed_pct: 5,
        max_duration_us: 400,
        value_pool: None,
    };
    for seed in [11, 12, 13] {
        let h = generate(seed, shape);
        let started = std::time::Instant::now();
        let r = check(&h, &CheckOptions::default());
        let worst = r.keys.iter().map(|k| k.verdict.steps()).max().unwrap();
        println!(
            "{r}\n{} steps in all, worst key {worst} steps, {:?}",
            r.steps(),
            started.elapsed()
        );
        assert!(r.passed(), "{r}");
    }
}

#[test]
fn fifty_thousand_events_on_ten_keys_with_ten_percent_unknown_are_decided() {
    let shape = Shape {
        clients: 16,
        ops_per_client: 3125,
        keys: 8,
        counters: 2,
        unknown_pct: 10,
        failed_pct: 5,
        max_duration_us: 2000,
        value_pool: None,
    };
    let h = generate(5, shape);
    assert_eq!(h.events.len(), 50_000);
    let started = std::time::Instant::now();
    let r = check(&h, &CheckOptions::default());
    let worst = r.keys.iter().map(|k| k.verdict.steps()).max().unwrap();
    println!(
        "{r}\n{} steps in all, worst key {worst} steps, {:?}",
        r.steps(),
        started.elapsed()
    );
    assert!(r.passed(), "{r}");
}
