//! `keyway sim`: seed 004's placement experiments on any parameters.
//!
//! Runs every scheme of `keyway-placement` (hash % N, rings, jump,
//! rendezvous, Maglev, bounded loads and Keyway's own placement) on the
//! same keys, adds nodes, and prints per scheme the fraction of keys moved
//! against the ideal and the busiest node's load over the mean (median and
//! worst over the layouts). The defaults are section 4.2's set-up.

use keyway_placement::{Report, Setup, run as run_setup};

#[derive(clap::Args)]
pub struct SimArgs {
    /// Keys `user:0 .. user:{K-1}` (before salting).
    #[arg(long, default_value_t = 200_000)]
    keys: usize,
    /// Nodes before the join.
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// Nodes that join (nodes after = nodes + add; 0 measures balance only).
    #[arg(long, default_value_t = 1)]
    add: usize,
    /// Ring tokens per node, one ring row per value.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16, 256])]
    tokens: Vec<usize>,
    /// Bounded loads: ring tokens per node.
    #[arg(long, default_value_t = 16)]
    bounded_tokens: usize,
    /// Bounded loads: no node holds more than this times the mean (HAProxy's
    /// hash-balance-factor / 100).
    #[arg(long, default_value_t = 1.25)]
    bounded_factor: f64,
    /// Keyway's partition count (slot ranges; at most 16384).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=16_384))]
    partitions: u32,
    /// Layouts (node-name and key-hash seeds) per scheme; median and worst are over these.
    #[arg(long, default_value_t = 9)]
    layouts: u32,
    /// Base seed of the layouts.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Zipf exponent of request popularity (0 = every key equally popular).
    #[arg(long, default_value_t = 0.0)]
    zipf: f64,
    /// Salt this many of the most popular keys (section 6.2).
    #[arg(long, default_value_t = 0)]
    salt_top: usize,
    /// Pieces each salted key is split into.
    #[arg(long, default_value_t = 8)]
    salt_ways: usize,
    /// Print the rows as a JSON list instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || simulate(&args)).await?
}

fn simulate(args: &SimArgs) -> anyhow::Result<()> {
    user_ensure!(args.keys > 0, "--keys must be greater than 0");
    user_ensure!(args.nodes > 0, "--nodes must be greater than 0");
    user_ensure!(args.layouts > 0, "--layouts must be greater than 0");
    user_ensure!(
        args.tokens.iter().all(|&t| t > 0),
        "--tokens values must be greater than 0"
    );
    user_ensure!(
        args.zipf.is_finite() && args.zipf >= 0.0,
        "--zipf must be 0 or more"
    );
    user_ensure!(args.salt_ways > 0, "--salt-ways must be greater than 0");
    user_ensure!(
        args.bounded_tokens > 0,
        "--bounded-tokens must be greater than 0"
    );
    user_ensure!(
        args.bounded_factor.is_finite() && args.bounded_factor >= 1.0,
        "--bounded-factor must be at least 1"
    );
    let setup = Setup {
        keys: args.keys,
        nodes: args.nodes,
        add: args.add,
        layouts: args.layouts,
        seed: args.seed,
        zipf: args.zipf,
        salt_top: args.salt_top,
        salt_ways: args.salt_ways,
        schemes: Setup::schemes(
            &args.tokens,
            args.bounded_tokens,
            args.bounded_factor,
            args.partitions,
        ),
    };
    let report = run_setup(&setup);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&report))?);
    } else {
        print!("{}", table(args, &report));
    }
    Ok(())
}

fn to_json(report: &Report) -> serde_json::Value {
    let rows = report.rows.iter().map(|r| {
        serde_json::json!({
            "scheme": r.scheme,
            "description": r.description,
            "moved_fraction": r.moved_fraction,
            "moved_fraction_worst": r.moved_fraction_worst,
            "ideal_fraction": r.ideal_fraction,
            "max_over_mean_median": r.max_over_mean_median,
            "max_over_mean_worst": r.max_over_mean_worst,
            "request_max_over_mean_median": r.request_max_over_mean_median,
            "request_max_over_mean_worst": r.request_max_over_mean_worst,
            "keys": report.keys,
            "nodes_before": report.nodes_before,
            "nodes_after": report.nodes_after,
            "layouts": report.layouts,
            "hottest_key_share": report.hottest_key_share,
        })
    });
    serde_json::Value::Array(rows.collect())
}

fn table(args: &SimArgs, report: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let requests = if args.zipf > 0.0 {
        let salt = if args.salt_top > 0 && args.salt_ways > 1 {
            format!(
                ", top {} keys salted {} ways",
                args.salt_top, args.salt_ways
            )
        } else {
            String::new()
        };
        format!(
            "Zipf s={}{salt}: hottest key {:.1}% of requests",
            args.zipf,
            100.0 * report.hottest_key_share
        )
    } else {
        "uniform requests".to_string()
    };
    let (before, after) = (report.nodes_before, report.nodes_after);
    let _ = writeln!(
        out,
        "{} keys, {before} -> {after} nodes, {} layouts (seed {}), {requests}",
        report.keys, report.layouts, args.seed
    );
    let ideal = report.rows.first().map_or(0.0, |r| r.ideal_fraction);
    let _ = writeln!(
        out,
        "moved: median fraction of keys whose node changed (ideal {}/{after} = {:.1}%)",
        after - before,
        100.0 * ideal
    );
    let _ = writeln!(
        out,
        "max/mean: busiest of the {after} nodes over the mean, median and worst layout\n"
    );
    let zipf = args.zipf > 0.0;
    let _ = write!(
        out,
        "{:<14} {:>7}  {:>15}",
        "scheme", "moved", "keys max/mean"
    );
    if zipf {
        let _ = write!(out, "  {:>18}", "requests max/mean");
    }
    let _ = writeln!(out, "  description");
    for r in &report.rows {
        let _ = write!(
            out,
            "{:<14} {:>6.1}%  {:>6.3} ({:>6.3})",
            r.scheme,
            100.0 * r.moved_fraction,
            r.max_over_mean_median,
            r.max_over_mean_worst
        );
        if zipf {
            let _ = write!(
                out,
                "  {:>9.3} ({:>6.3})",
                r.request_max_over_mean_median, r.request_max_over_mean_worst
            );
        }
        let _ = writeln!(out, "  {}", r.description);
    }
    if let (Some(k), Some((moved, balance))) = (report.row("keyway"), report.best_except("keyway"))
    {
        let _ = writeln!(
            out,
            "\nkeyway: moved {:.2}% (closest other: {} {:.2}%), max/mean {:.3} (best other: {} {:.3})",
            100.0 * k.moved_fraction,
            moved.scheme,
            100.0 * moved.moved_fraction,
            k.max_over_mean_median,
            balance.scheme,
            balance.max_over_mean_median
        );
    }
    out
}
