//! `keyway bench routing --json` on a small cluster: the output has one row
//! per way of routing with every figure and its ratio to the hybrid row,
//! and the qualitative result of seed 000 holds — an idle redirect client
//! needs a rejection per moved partition it touches, an idle hybrid client
//! converges with at most one rejection and one refresh.

use serde_json::Value;
use std::process::Command;

fn num(row: &Value, field: &str) -> f64 {
    row[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{}: {field} is not a number: {row}", row["name"]))
}

#[test]
fn bench_routing_reports_every_row_and_seed_000_shows() {
    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args([
            "--log",
            "warn",
            "bench",
            "routing",
            "--json",
            "--clients",
            "4",
            "--idle-fraction",
            "0.5",
            "--moves",
            "4",
            "--parallel",
            "4",
            "--partitions-per-node",
            "8",
            "--keys",
            "512",
            "--rate",
            "200",
            "--baseline-secs",
            "1",
            "--lookup-ttl-ms",
            "500",
        ])
        .output()
        .expect("keyway runs");
    assert!(
        out.status.success(),
        "bench routing failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(report["reference"], "hybrid");
    assert_eq!(report["config"]["idle_clients"], 2);
    assert_eq!(
        report["problems"].as_array().map(Vec::len),
        Some(0),
        "{}",
        report["problems"]
    );
    let rows = report["rows"].as_array().expect("rows");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["redirect", "lookup", "hybrid", "proxy"]);
    for row in rows {
        assert_eq!(row["moves_done"], 4, "{row}");
        assert!(num(row, "requests") > 0.0, "{row}");
        assert!(num(row, "requests_before") > 0.0, "{row}");
        assert!(num(row, "requests_during") > 0.0, "{row}");
        for field in [
            "extra_round_trips_per_request",
            "map_requests",
            "losing_node_rejections",
            "p99_before_ms",
            "p99_during_ms",
            "p99_added_ms",
        ] {
            num(row, field);
        }
        assert!(row["rejections_idle"]["mean"].is_number(), "{row}");
        assert!(row["vs_reference"].is_object(), "{row}");
    }
    let row = |name: &str| rows.iter().find(|r| r["name"] == name).unwrap();
    let (redirect, hybrid) = (row("redirect"), row("hybrid"));
    assert_eq!(hybrid["vs_reference"]["p99_during"], 1.0);

    // Seed 000: the idle clients' burst after a multi-partition move.
    let idle_rejections = |r: &Value| r["rejections_idle"]["mean"].as_f64().unwrap();
    assert!(
        idle_rejections(redirect) >= 2.0,
        "a redirect client patches one entry per rejection: {redirect}"
    );
    assert!(
        idle_rejections(redirect) >= idle_rejections(hybrid),
        "redirect {redirect}\nhybrid {hybrid}"
    );
    assert!(
        hybrid["rejections_idle"]["max"].as_u64().unwrap() <= 1,
        "{hybrid}"
    );
    assert!(
        hybrid["refreshes_idle"]["max"].as_u64().unwrap() <= 1,
        "{hybrid}"
    );
    // Clients never see the proxy's rejections; its refreshes are a watch.
    assert!(row("proxy")["refreshes_idle"].is_null());
}
