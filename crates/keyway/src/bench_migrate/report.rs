//! The results: what is reported (and serialized for `--json`), the
//! nearest-rank percentiles, the per-size summaries, the foreground latency
//! windows and each move's client view of its cutover, the PROBLEMS checks,
//! and the printed tables.

use super::load::{LoadShared, Sample};
use super::{fmt_size, mib};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

#[derive(Serialize)]
pub(super) struct Report {
    pub(super) config: ConfigOut,
    pub(super) loaded: Vec<Loaded>,
    pub(super) sizes: Vec<SizeSummary>,
    pub(super) moves: Vec<MoveResult>,
    pub(super) foreground: Option<Foreground>,
    pub(super) verify: Verify,
    pub(super) problems: Vec<String>,
}

#[derive(Serialize)]
pub(super) struct ConfigOut {
    pub(super) cpus: usize,
    /// 1-minute load average at the start and at the end (other work on the
    /// machine shows up in every latency here).
    pub(super) loadavg_start: Option<f64>,
    pub(super) loadavg_end: Option<f64>,
    pub(super) nodes: usize,
    pub(super) partitions: usize,
    pub(super) durability: String,
    pub(super) throttle_bytes_per_sec: u64,
    pub(super) cleanup_grace_ms: u64,
    pub(super) load_rate_per_sec: u64,
    pub(super) load_keys: u64,
    pub(super) value_size: u64,
    pub(super) moves_per_size: usize,
}

#[derive(Serialize, Clone)]
pub(super) struct Loaded {
    pub(super) partition: u64,
    pub(super) first_slot: u16,
    pub(super) last_slot: u16,
    pub(super) requested_bytes: u64,
    pub(super) keys: usize,
    pub(super) value_bytes: u64,
    pub(super) load_secs: f64,
    #[serde(skip)]
    pub(super) key_list: Vec<Vec<u8>>,
}

#[derive(Serialize, Clone)]
pub(super) struct MoveResult {
    pub(super) migration: u64,
    pub(super) partition: u64,
    pub(super) size_bytes: u64,
    pub(super) from: String,
    pub(super) to: String,
    pub(super) state: &'static str,
    pub(super) abort_reason: Option<String>,
    pub(super) total_bytes: u64,
    pub(super) copy_ms: Option<u64>,
    pub(super) copy_bytes_per_sec: Option<f64>,
    pub(super) pause_ms: Option<u64>,
    /// The cutover's steps as the driver timed them.
    pub(super) cutover_steps: Option<keyway_migration::CutoverSteps>,
    /// Slowest write to the partition in flight during the cutover (client view).
    pub(super) client_stall_ms: Option<f64>,
    /// Writes to the partition in flight during the cutover.
    pub(super) client_writes_in_cutover: usize,
    /// Slowest write to the partition over the whole move.
    pub(super) client_worst_move_ms: Option<f64>,
    /// Request → target serving.
    pub(super) to_flip_ms: Option<u64>,
    /// Request → DONE (includes the cleanup grace and the source's drop).
    pub(super) to_done_ms: u64,
    /// Times a source paused its copy because its foreground latency was
    /// above the backoff threshold (node metric `migration_backoffs`).
    pub(super) copy_backoffs: u64,
    #[serde(skip)]
    pub(super) cutover_us: Option<(u64, u64)>,
    #[serde(skip)]
    pub(super) copy_us: Option<(u64, u64)>,
    #[serde(skip)]
    pub(super) move_us: (u64, u64),
}

#[derive(Serialize)]
pub(super) struct SizeSummary {
    size_bytes: u64,
    partition: u64,
    moves: usize,
    done: usize,
    pause_ms: Option<Pcts>,
    /// Fence request -> target serving (the drain included), and its steps.
    fence_to_serving_ms: Option<Pcts>,
    fence_ms: Option<Pcts>,
    digest_ms: Option<Pcts>,
    flip_ms: Option<Pcts>,
    serve_ms: Option<Pcts>,
    client_stall_ms: Option<Pcts>,
    copy_bytes_per_sec_p50: Option<f64>,
    copy_vs_throttle: Option<f64>,
    to_flip_ms_p50: Option<f64>,
    to_done_ms_p50: Option<f64>,
}

#[derive(Serialize, Clone, Copy)]
pub(super) struct Pcts {
    p50: f64,
    p99: f64,
    max: f64,
}

#[derive(Serialize)]
pub(super) struct Foreground {
    rate_per_sec: u64,
    before: Window,
    during: Window,
    /// The part of `during` in which a snapshot was being copied.
    during_copy: Window,
    after: Window,
    p99_during_over_before: Option<f64>,
    p99_during_over_after: Option<f64>,
    redirects_followed: u64,
    retried_errors: BTreeMap<String, u64>,
    final_errors: BTreeMap<String, u64>,
}

#[derive(Serialize, Default)]
pub(super) struct Window {
    secs: f64,
    writes: usize,
    failed: usize,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
}

#[derive(Serialize, Default)]
pub(super) struct Verify {
    pub(super) keys: usize,
    pub(super) missing: usize,
    pub(super) wrong: usize,
}

// ---------------------------------------------------------------------------
// Percentiles and summaries

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn pcts(mut v: Vec<f64>) -> Option<Pcts> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(Pcts {
        p50: pct(&v, 0.5),
        p99: pct(&v, 0.99),
        max: *v.last().expect("non-empty"),
    })
}

fn median(v: Vec<f64>) -> Option<f64> {
    pcts(v).map(|p| p.p50)
}

/// The moves of one loaded partition, summed up (percentiles over the moves
/// that reached `DONE`).
pub(super) fn summarize(l: &Loaded, moves: &[MoveResult], throttle: u64) -> SizeSummary {
    let mine: Vec<&MoveResult> = moves
        .iter()
        .filter(|m| m.partition == l.partition)
        .collect();
    let done: Vec<&&MoveResult> = mine.iter().filter(|m| m.state == "DONE").collect();
    let copy = median(done.iter().filter_map(|m| m.copy_bytes_per_sec).collect());
    let step = |f: fn(&keyway_migration::CutoverSteps) -> u64| {
        pcts(
            done.iter()
                .filter_map(|m| m.cutover_steps.as_ref().map(|s| f(s) as f64 / 1000.0))
                .collect(),
        )
    };
    SizeSummary {
        fence_to_serving_ms: step(|s| s.total_us()),
        fence_ms: step(|s| s.fence_us),
        digest_ms: step(|s| s.digest_us),
        flip_ms: step(|s| s.flip_us),
        serve_ms: step(|s| s.serve_us),
        size_bytes: l.requested_bytes,
        partition: l.partition,
        moves: mine.len(),
        done: done.len(),
        pause_ms: pcts(
            done.iter()
                .filter_map(|m| m.pause_ms.map(|p| p as f64))
                .collect(),
        ),
        client_stall_ms: pcts(done.iter().filter_map(|m| m.client_stall_ms).collect()),
        copy_bytes_per_sec_p50: copy,
        copy_vs_throttle: copy.filter(|_| throttle > 0).map(|c| c / throttle as f64),
        to_flip_ms_p50: median(
            done.iter()
                .filter_map(|m| m.to_flip_ms.map(|v| v as f64))
                .collect(),
        ),
        to_done_ms_p50: median(done.iter().map(|m| m.to_done_ms as f64).collect()),
    }
}

// ---------------------------------------------------------------------------
// The foreground load's view

/// Where the run's phases begin and end, µs since the load's base instant.
pub(super) struct Phases {
    /// End of the warm-up, left out of the "before" window.
    pub(super) warm_us: u64,
    pub(super) moves_start_us: u64,
    pub(super) moves_end_us: u64,
    pub(super) after_end_us: u64,
}

/// Takes the load's samples: fills in each move's client view (the writes to
/// its partition in flight during the cutover and during the whole move),
/// and sums the load up in windows before, during and after the moves.
/// Writes that failed during the moves are a problem.
pub(super) fn foreground(
    shared: &LoadShared,
    rate: u64,
    phases: &Phases,
    loaded: &[Loaded],
    moves: &mut [MoveResult],
    problems: &mut Vec<String>,
) -> Foreground {
    let samples = std::mem::take(&mut *shared.samples.lock().expect("samples"));
    for r in moves.iter_mut() {
        let l = loaded
            .iter()
            .find(|l| l.partition == r.partition)
            .expect("a loaded partition");
        let in_part = |s: &&Sample| s.slot >= l.first_slot && s.slot <= l.last_slot;
        let overlapping = |(a, b): (u64, u64)| {
            samples
                .iter()
                .filter(in_part)
                .filter(move |s| s.start_us <= b && s.start_us + s.lat_us as u64 >= a)
        };
        if let Some(w) = r.cutover_us {
            let lats: Vec<f64> = overlapping(w).map(|s| s.lat_us as f64 / 1000.0).collect();
            r.client_writes_in_cutover = lats.len();
            r.client_stall_ms = lats.into_iter().reduce(f64::max);
        }
        r.client_worst_move_ms = overlapping(r.move_us)
            .map(|s| s.lat_us as f64 / 1000.0)
            .reduce(f64::max);
    }
    let before = window(&samples, phases.warm_us, phases.moves_start_us);
    let during = window(&samples, phases.moves_start_us, phases.moves_end_us);
    let copies: Vec<(u64, u64)> = moves.iter().filter_map(|m| m.copy_us).collect();
    let during_copy = window_where(
        &samples,
        copies.iter().map(|(a, b)| b - a).sum::<u64>(),
        |t| copies.iter().any(|&(a, b)| t >= a && t < b),
    );
    let after = window(&samples, phases.moves_end_us, phases.after_end_us);
    let ratio =
        |w: &Window| (w.p99_ms > 0.0 && during.writes > 0).then(|| during.p99_ms / w.p99_ms);
    let (over_before, over_after) = (ratio(&before), ratio(&after));
    if during.failed > 0 {
        problems.push(format!(
            "{} foreground writes failed during the moves: {:?}",
            during.failed,
            shared.final_errors.lock().expect("errors")
        ));
    }
    Foreground {
        rate_per_sec: rate,
        before,
        during,
        during_copy,
        after,
        p99_during_over_before: over_before,
        p99_during_over_after: over_after,
        redirects_followed: shared.redirects.load(Ordering::Relaxed),
        retried_errors: shared.retried_errors.lock().expect("errors").clone(),
        final_errors: shared.final_errors.lock().expect("errors").clone(),
    }
}

fn window(samples: &[Sample], from_us: u64, to_us: u64) -> Window {
    window_where(samples, to_us.saturating_sub(from_us), |t| {
        t >= from_us && t < to_us
    })
}

/// The writes that started at a time `inside` accepts (µs since the base).
fn window_where(samples: &[Sample], span_us: u64, inside: impl Fn(u64) -> bool) -> Window {
    let inside: Vec<&Sample> = samples.iter().filter(|s| inside(s.start_us)).collect();
    let mut lats: Vec<f64> = inside
        .iter()
        .filter(|s| s.ok)
        .map(|s| s.lat_us as f64 / 1000.0)
        .collect();
    lats.sort_by(|a, b| a.total_cmp(b));
    Window {
        secs: span_us as f64 / 1e6,
        writes: inside.len(),
        failed: inside.iter().filter(|s| !s.ok).count(),
        p50_ms: pct(&lats, 0.5),
        p99_ms: pct(&lats, 0.99),
        p999_ms: pct(&lats, 0.999),
        max_ms: lats.last().copied().unwrap_or(0.0),
    }
}

// ---------------------------------------------------------------------------
// PROBLEMS

/// The limits a run is held to, per size and for the foreground load: a
/// cutover pause or a client stall above 100 ms, a copy below half the
/// throttle, a foreground p99 during the moves above 3x the one before.
pub(super) fn check_limits(
    sizes: &[SizeSummary],
    loaded: &[Loaded],
    moves: &[MoveResult],
    throttle: u64,
    foreground: Option<&Foreground>,
    problems: &mut Vec<String>,
) {
    for (s, l) in sizes.iter().zip(loaded) {
        if let Some(p) = s.pause_ms
            && p.max > 100.0
        {
            problems.push(format!(
                "partition {} ({}): cutover pause up to {} ms (record), above 100 ms",
                l.partition,
                fmt_size(l.requested_bytes),
                p.max
            ));
        }
        if let Some(p) = s.client_stall_ms
            && p.max > 100.0
        {
            problems.push(format!(
                "partition {} ({}): a write waited {:.1} ms during a cutover (client view), above 100 ms",
                l.partition,
                fmt_size(l.requested_bytes),
                p.max
            ));
        }
    }
    for (s, l) in sizes.iter().zip(loaded) {
        let backoffs: u64 = moves
            .iter()
            .filter(|m| m.partition == l.partition)
            .map(|m| m.copy_backoffs)
            .sum();
        if let Some(c) = s.copy_bytes_per_sec_p50
            && throttle > 0
            && c < 0.5 * throttle as f64
        {
            problems.push(format!(
                "partition {} ({}): the copy ran at {:.1} MiB/s, {:.2}x the {} MiB/s throttle ({backoffs} latency backoffs)",
                l.partition,
                fmt_size(l.requested_bytes),
                mib(c),
                c / throttle as f64,
                mib(throttle as f64)
            ));
        }
    }
    if let Some(f) = foreground
        && f.p99_during_over_before.is_some_and(|r| r > 3.0)
    {
        problems.push(format!(
            "foreground p99 {:.1} ms during the moves vs {:.1} ms before ({:.1}x) and {:.1} ms after",
            f.during.p99_ms,
            f.before.p99_ms,
            f.p99_during_over_before.unwrap_or(0.0),
            f.after.p99_ms
        ));
    }
}

// ---------------------------------------------------------------------------
// Output

pub(super) fn print_report(r: &Report) {
    let ms = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
    let trip = |p: Option<Pcts>| {
        p.map(|p| format!("{:.1}/{:.1}/{:.1}", p.p50, p.p99, p.max))
            .unwrap_or_else(|| "-".into())
    };
    println!();
    println!(
        "Machine: {} CPUs, load average {} at the start, {} at the end",
        r.config.cpus,
        r.config
            .loadavg_start
            .map_or("?".into(), |v| format!("{v:.2}")),
        r.config
            .loadavg_end
            .map_or("?".into(), |v| format!("{v:.2}"))
    );
    println!(
        "Moves under load ({} per size, throttle {}/s; pause = fence confirmed -> target serving, \
         as the record measures it; stall = slowest write to the partition in flight during the cutover)",
        r.config.moves_per_size,
        if r.config.throttle_bytes_per_sec == 0 {
            "unlimited".to_string()
        } else {
            fmt_size(r.config.throttle_bytes_per_sec)
        }
    );
    println!(
        "{:<10} {:>5} {:>10} {:>22} {:>22} {:>12} {:>10} {:>9} {:>9}",
        "size",
        "part",
        "done/moves",
        "pause ms p50/p99/max",
        "stall ms p50/p99/max",
        "copy MiB/s",
        "/throttle",
        "flip s",
        "done s"
    );
    for s in &r.sizes {
        println!(
            "{:<10} {:>5} {:>10} {:>22} {:>22} {:>12} {:>10} {:>9} {:>9}",
            fmt_size(s.size_bytes),
            s.partition,
            format!("{}/{}", s.done, s.moves),
            trip(s.pause_ms),
            trip(s.client_stall_ms),
            ms(s.copy_bytes_per_sec_p50.map(mib)),
            s.copy_vs_throttle
                .map(|v| format!("{v:.2}x"))
                .unwrap_or_else(|| "-".into()),
            s.to_flip_ms_p50
                .map(|v| format!("{:.2}", v / 1000.0))
                .unwrap_or_else(|| "-".into()),
            s.to_done_ms_p50
                .map(|v| format!("{:.2}", v / 1000.0))
                .unwrap_or_else(|| "-".into()),
        );
    }
    println!("(copy MiB/s and flip/done seconds are medians; flip = request -> target serving)");
    println!();
    println!(
        "Cutover steps as the driver timed them, ms p50/p99/max (total = fence request -> target \
         serving: the write pause starts inside the fence step, when the source fences)"
    );
    println!(
        "{:<10} {:>20} {:>20} {:>20} {:>20} {:>20}",
        "size", "total", "fence+drain", "digest", "flip", "serve"
    );
    for s in &r.sizes {
        println!(
            "{:<10} {:>20} {:>20} {:>20} {:>20} {:>20}",
            fmt_size(s.size_bytes),
            trip(s.fence_to_serving_ms),
            trip(s.fence_ms),
            trip(s.digest_ms),
            trip(s.flip_ms),
            trip(s.serve_ms),
        );
    }
    if let Some(f) = &r.foreground {
        println!();
        println!(
            "Foreground SET load, {} /s open loop over {} keys ({} B values), latency incl. redirects",
            f.rate_per_sec, r.config.load_keys, r.config.value_size
        );
        println!(
            "{:<14} {:>7} {:>8} {:>7} {:>8} {:>8} {:>9} {:>9}",
            "window", "secs", "writes", "failed", "p50 ms", "p99 ms", "p99.9 ms", "max ms"
        );
        for (name, w) in [
            ("before moves", &f.before),
            ("during moves", &f.during),
            (" (copying)", &f.during_copy),
            ("after moves", &f.after),
        ] {
            println!(
                "{:<14} {:>7.1} {:>8} {:>7} {:>8.2} {:>8.2} {:>9.2} {:>9.2}",
                name, w.secs, w.writes, w.failed, w.p50_ms, w.p99_ms, w.p999_ms, w.max_ms
            );
        }
        let x = |v: Option<f64>| v.map(|v| format!("{v:.2}x")).unwrap_or_else(|| "-".into());
        println!(
            "p99 during / before: {}   p99 during / after: {}",
            x(f.p99_during_over_before),
            x(f.p99_during_over_after)
        );
        println!(
            "redirects followed: {}; errors retried: {:?}; writes failed: {:?}",
            f.redirects_followed, f.retried_errors, f.final_errors
        );
    }
    println!();
    println!(
        "Loaded keys read back after the moves: {} of {} intact ({} missing, {} wrong)",
        r.verify.keys - r.verify.missing - r.verify.wrong,
        r.verify.keys,
        r.verify.missing,
        r.verify.wrong
    );
    if r.problems.is_empty() {
        println!("No problems seen.");
    } else {
        println!("PROBLEMS:");
        for p in &r.problems {
            println!("  - {p}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(pct(&v, 0.5), 50.0);
        assert_eq!(pct(&v, 0.99), 99.0);
        assert_eq!(pct(&[7.0], 0.99), 7.0);
    }
}
