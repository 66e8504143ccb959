//! `keyway sim --json` on seed 004's section 4.2 set-up (200,000 keys, 10
//! nodes growing to 11) shows the chapter's pattern, and Keyway's own
//! placement matches the best row on both columns.

use serde_json::Value;
use std::process::Command;

fn sim(args: &[&str]) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .arg("sim")
        .args(args)
        .arg("--json")
        .output()
        .expect("run keyway sim");
    assert!(
        out.status.success(),
        "keyway sim failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout).expect("sim prints JSON") {
        Value::Array(rows) => rows,
        other => panic!("expected a list of rows, got {other}"),
    }
}

fn row<'a>(rows: &'a [Value], scheme: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["scheme"] == scheme)
        .unwrap_or_else(|| panic!("no row {scheme} in {rows:?}"))
}

fn num(r: &Value, field: &str) -> f64 {
    r[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} missing in {r}"))
}

#[test]
fn chapter_set_up_shows_the_pattern() {
    // Section 4.2's keys and nodes; five layouts instead of nine keep the
    // debug build fast.
    let rows = sim(&[
        "--keys",
        "200000",
        "--nodes",
        "10",
        "--add",
        "1",
        "--tokens",
        "1,256",
        "--layouts",
        "5",
    ]);
    let ideal = 1.0 / 11.0;
    for r in &rows {
        for field in [
            "moved_fraction",
            "ideal_fraction",
            "max_over_mean_median",
            "max_over_mean_worst",
        ] {
            num(r, field);
        }
        assert!((num(r, "ideal_fraction") - ideal).abs() < 1e-12, "{r}");
        assert!(num(r, "max_over_mean_median") <= num(r, "max_over_mean_worst"));
    }

    // hash % N moves about N/(N+1) and balances.
    let modulo = row(&rows, "modulo");
    assert!(
        (num(modulo, "moved_fraction") - 10.0 / 11.0).abs() < 0.01,
        "{modulo}"
    );
    assert!(num(modulo, "max_over_mean_worst") < 1.05, "{modulo}");

    // One token per node is badly unbalanced, 256 nearly balanced.
    let (one, many) = (row(&rows, "ring-1"), row(&rows, "ring-256"));
    assert!(num(one, "max_over_mean_median") > 1.8, "{one}");
    assert!(
        num(one, "max_over_mean_worst") > num(many, "max_over_mean_worst") + 0.8,
        "{one} vs {many}"
    );
    assert!(num(many, "max_over_mean_worst") < 1.3, "{many}");
    assert!(
        (num(many, "moved_fraction") - ideal).abs() < 0.25 * ideal,
        "{many}"
    );

    // Jump and rendezvous move about the ideal and balance within a few percent.
    for name in ["jump", "rendezvous"] {
        let r = row(&rows, name);
        assert!(
            (num(r, "moved_fraction") - ideal).abs() < 0.15 * ideal,
            "{r}"
        );
        assert!(num(r, "max_over_mean_worst") < 1.1, "{r}");
    }

    // Keyway's placement matches the best other row on both columns.
    let keyway = row(&rows, "keyway");
    let others = || rows.iter().filter(|r| r["scheme"] != "keyway");
    let best_dev = others()
        .map(|r| (num(r, "moved_fraction") - ideal).abs())
        .fold(f64::INFINITY, f64::min);
    let best_balance = others()
        .map(|r| num(r, "max_over_mean_median"))
        .fold(f64::INFINITY, f64::min);
    let dev = (num(keyway, "moved_fraction") - ideal).abs();
    assert!(
        dev <= best_dev + 0.005,
        "keyway {keyway}, best deviation {best_dev}"
    );
    assert!(
        num(keyway, "max_over_mean_median") <= best_balance + 0.01,
        "keyway {keyway}, best max/mean {best_balance}"
    );
    assert!(num(keyway, "max_over_mean_worst") < 1.03, "{keyway}");
}

#[test]
fn a_hot_key_dominates_and_salting_spreads_it() {
    // Section 6.1 scaled down: Zipf s=1 on 10 nodes, then the top 100 keys
    // salted 8 ways.
    let base = [
        "--keys", "50000", "--nodes", "10", "--add", "0", "--tokens", "256",
    ];
    let hot = sim(&[&base[..], &["--zipf", "1", "--layouts", "3"]].concat());
    let salted = sim(&[
        &base[..],
        &[
            "--zipf",
            "1",
            "--layouts",
            "3",
            "--salt-top",
            "100",
            "--salt-ways",
            "8",
        ],
    ]
    .concat());
    // H(50000) ~ 11.4: the hottest key alone takes ~8.8% of requests.
    let share = num(&hot[0], "hottest_key_share");
    assert!((share - 0.0877).abs() < 0.002, "{share}");
    for name in ["modulo", "jump", "rendezvous", "keyway"] {
        let (h, s) = (row(&hot, name), row(&salted, name));
        assert!(num(h, "request_max_over_mean_median") > 1.6, "{h}");
        assert!(
            num(s, "request_max_over_mean_median") < num(h, "request_max_over_mean_median") - 0.3,
            "{h} vs {s}"
        );
        assert_eq!(num(h, "moved_fraction"), 0.0);
    }
}
