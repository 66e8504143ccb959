//! The results: the counters each row read, what they come to per row
//! (serialized for `--json`), the ratios to the hybrid row, the printed
//! tables.
//!
//! Windows: "the window" runs from the first move's request to the end of
//! the idle clients' burst; "the burst" is the idle clients' read of every
//! key after the moves (the active load has stopped by then, so what the
//! nodes and the proxy count in it is the idle clients' doing).

use super::clients::{ActiveOut, ReadAll};
use keyway_client::ClientStats;
use serde::Serialize;
use std::collections::BTreeMap;

/// Counters at one instant.
pub(super) struct Counts {
    /// Per client (idle ones first); None for plain connections.
    pub(super) clients: Vec<Option<ClientStats>>,
    /// Per node, in the cluster's order.
    pub(super) nodes: Vec<NodeCounts>,
    pub(super) proxy: Option<ProxyCounts>,
}

#[derive(Clone, Copy, Default)]
pub(super) struct NodeCounts {
    /// Requests rejected by the ownership check (every kind).
    pub(super) rejections: u64,
    /// `KW.MAP SINCE` replies (delta and full).
    pub(super) map_since: u64,
}

#[derive(Clone, Copy, Default)]
pub(super) struct ProxyCounts {
    pub(super) requests: u64,
    pub(super) rejections_followed: u64,
    pub(super) upstream_errors: u64,
    /// Whole-map loads from the metadata store.
    pub(super) map_reloads: u64,
    /// Watch updates from the metadata store.
    pub(super) map_updates: u64,
}

impl ProxyCounts {
    fn since(&self, e: &ProxyCounts) -> ProxyCounts {
        ProxyCounts {
            requests: self.requests.saturating_sub(e.requests),
            rejections_followed: self
                .rejections_followed
                .saturating_sub(e.rejections_followed),
            upstream_errors: self.upstream_errors.saturating_sub(e.upstream_errors),
            map_reloads: self.map_reloads.saturating_sub(e.map_reloads),
            map_updates: self.map_updates.saturating_sub(e.map_updates),
        }
    }

    /// Metadata-store reads: whole maps and watch updates.
    fn map_reads(&self) -> u64 {
        self.map_reloads + self.map_updates
    }
}

/// What one row measured, before summing up.
pub(super) struct RowRaw {
    pub(super) name: &'static str,
    pub(super) idle: usize,
    /// Index of the node the partitions moved off.
    pub(super) losing_node: usize,
    pub(super) warm: Vec<ReadAll>,
    pub(super) burst: Vec<ReadAll>,
    pub(super) load: ActiveOut,
    pub(super) warm_us: u64,
    pub(super) moves_start_us: u64,
    pub(super) moves_end_us: u64,
    pub(super) moves_done: usize,
    pub(super) moves_secs: f64,
    pub(super) problems: Vec<String>,
    pub(super) at_moves: Counts,
    pub(super) at_burst: Counts,
    pub(super) at_end: Counts,
}

#[derive(Serialize)]
pub(super) struct Report {
    pub(super) config: ConfigOut,
    /// The row every ratio is taken against.
    pub(super) reference: &'static str,
    pub(super) rows: Vec<Row>,
    pub(super) problems: Vec<String>,
}

#[derive(Serialize)]
pub(super) struct ConfigOut {
    pub(super) cpus: usize,
    pub(super) loadavg_start: Option<f64>,
    pub(super) loadavg_end: Option<f64>,
    pub(super) nodes: usize,
    pub(super) partitions: usize,
    pub(super) clients: usize,
    pub(super) idle_clients: usize,
    pub(super) rate_per_sec: u64,
    pub(super) keys: usize,
    pub(super) moves: usize,
    pub(super) parallel: usize,
    pub(super) baseline_secs: u64,
    pub(super) lookup_ttl_ms: u64,
    pub(super) min_refresh_interval_ms: u64,
    pub(super) durability: String,
    pub(super) seed: u64,
}

/// Mean and largest over clients.
#[derive(Serialize, Clone, Copy, Default)]
pub(super) struct Spread {
    pub(super) mean: f64,
    /// None when only a total is known (the proxy's counters).
    pub(super) max: Option<u64>,
}

impl Spread {
    fn of(values: &[u64]) -> Option<Spread> {
        (!values.is_empty()).then(|| Spread {
            mean: values.iter().sum::<u64>() as f64 / values.len() as f64,
            max: values.iter().copied().max(),
        })
    }

    fn total(total: u64, clients: usize) -> Option<Spread> {
        (clients > 0).then(|| Spread {
            mean: total as f64 / clients as f64,
            max: None,
        })
    }
}

#[derive(Serialize)]
pub(super) struct Row {
    pub(super) name: &'static str,
    pub(super) moves_done: usize,
    pub(super) moves_secs: f64,
    /// Client requests in the window (active and idle).
    pub(super) requests: u64,
    /// Round trips beyond one per request in the window: the smart clients'
    /// retries and map requests; the proxy's retries to the nodes.
    pub(super) extra_round_trips: u64,
    pub(super) extra_round_trips_per_request: f64,
    /// Rejections per active client in the window (proxy: those it
    /// followed, per client, while the active load ran).
    pub(super) rejections_active: Option<Spread>,
    /// Rejections per idle client in the burst (proxy: those it followed
    /// during the burst, per idle client).
    pub(super) rejections_idle: Option<Spread>,
    /// Map refreshes per client (None for the proxy: it watches the store).
    pub(super) refreshes_active: Option<Spread>,
    pub(super) refreshes_idle: Option<Spread>,
    /// Load on the map service in the window: `KW.MAP SINCE` replies the
    /// nodes served (smart clients), or the proxy's metadata-store reads
    /// (whole maps plus watch updates).
    pub(super) map_requests: u64,
    /// The same during the burst only.
    pub(super) map_requests_burst: u64,
    /// Rejections at the node the partitions moved off, in the window.
    pub(super) losing_node_rejections: u64,
    /// `KW.MAP SINCE` replies by that node in the window.
    pub(super) losing_node_map_replies: u64,
    /// Rejections at every node in the window.
    pub(super) all_nodes_rejections: u64,
    pub(super) p50_before_ms: f64,
    pub(super) p99_before_ms: f64,
    pub(super) p50_during_ms: f64,
    pub(super) p99_during_ms: f64,
    /// p99 during the moves minus p99 before them.
    pub(super) p99_added_ms: f64,
    pub(super) requests_before: usize,
    pub(super) requests_during: usize,
    /// Mean seconds an idle client's burst took, and its slowest GET.
    pub(super) burst_secs_mean: Option<f64>,
    pub(super) burst_max_get_ms: Option<f64>,
    pub(super) failed_requests: u64,
    pub(super) errors: BTreeMap<String, u64>,
    pub(super) vs_reference: Ratios,
}

/// This row's figure over the reference row's (None when the reference is 0).
#[derive(Serialize, Default)]
pub(super) struct Ratios {
    pub(super) extra_round_trips_per_request: Option<f64>,
    pub(super) rejections_active_mean: Option<f64>,
    pub(super) rejections_idle_mean: Option<f64>,
    pub(super) map_requests: Option<f64>,
    pub(super) losing_node_rejections: Option<f64>,
    pub(super) p99_during: Option<f64>,
    pub(super) p99_added: Option<f64>,
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Latencies (ms, sorted) of the successful requests started in `[from, to)` µs.
fn window(load: &ActiveOut, from: u64, to: u64) -> Vec<f64> {
    let mut v: Vec<f64> = load
        .samples
        .iter()
        .filter(|s| s.ok && s.start_us >= from && s.start_us < to)
        .map(|s| s.lat_us as f64 / 1000.0)
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

fn node_delta(now: &Counts, then: &Counts, f: impl Fn(&NodeCounts) -> u64) -> Vec<u64> {
    now.nodes
        .iter()
        .zip(&then.nodes)
        .map(|(a, b)| f(a).saturating_sub(f(b)))
        .collect()
}

fn summarize(raw: &RowRaw, problems: &mut Vec<String>) -> Row {
    let (start, end) = (&raw.at_moves, &raw.at_end);
    let deltas: Vec<Option<ClientStats>> = end
        .clients
        .iter()
        .zip(&start.clients)
        .map(|(a, b)| Some(a.as_ref()?.since(b.as_ref()?)))
        .collect();
    let active = deltas.len() - raw.idle;
    let burst_requests: u64 = raw.burst.len() as u64 * raw.keys_read();
    let pick = |idle: bool, f: fn(&ClientStats) -> u64| -> Vec<u64> {
        let range = if idle {
            0..raw.idle
        } else {
            raw.idle..deltas.len()
        };
        deltas[range].iter().flatten().map(f).collect()
    };
    let map_since = node_delta(end, start, |n| n.map_since);
    let burst_map_since = node_delta(end, &raw.at_burst, |n| n.map_since);
    let rejections = node_delta(end, start, |n| n.rejections);
    let (requests, extra, rej_active, rej_idle, refr_active, refr_idle, map, map_burst) =
        match (&end.proxy, &start.proxy, &raw.at_burst.proxy) {
            (Some(e), Some(s), Some(b)) => {
                let whole = e.since(s);
                let (load, burst) = (b.since(s), e.since(b));
                (
                    raw.load
                        .samples
                        .iter()
                        .filter(|x| x.start_us >= raw.moves_start_us)
                        .count() as u64
                        + burst_requests,
                    whole.rejections_followed + whole.upstream_errors,
                    Spread::total(load.rejections_followed, active),
                    Spread::total(burst.rejections_followed, raw.idle),
                    None,
                    None,
                    whole.map_reads(),
                    burst.map_reads(),
                )
            }
            _ => (
                deltas.iter().flatten().map(|d| d.requests).sum(),
                deltas.iter().flatten().map(|d| d.extra_round_trips).sum(),
                Spread::of(&pick(false, |d| d.rejections)),
                Spread::of(&pick(true, |d| d.rejections)),
                Spread::of(&pick(false, |d| d.refreshes)),
                Spread::of(&pick(true, |d| d.refreshes)),
                map_since.iter().sum(),
                burst_map_since.iter().sum(),
            ),
        };
    let before = window(&raw.load, raw.warm_us, raw.moves_start_us);
    let during = window(&raw.load, raw.moves_start_us, raw.moves_end_us);
    let failed = raw.load.errors.values().sum::<u64>()
        + raw
            .warm
            .iter()
            .chain(&raw.burst)
            .map(|r| r.failed)
            .sum::<u64>();
    let missing = raw.load.missing
        + raw
            .warm
            .iter()
            .chain(&raw.burst)
            .map(|r| r.missing)
            .sum::<u64>();
    for p in &raw.problems {
        problems.push(format!("{}: {p}", raw.name));
    }
    if failed > 0 {
        problems.push(format!(
            "{}: {failed} requests failed ({:?})",
            raw.name, raw.load.errors
        ));
    }
    if missing > 0 {
        problems.push(format!(
            "{}: {missing} GETs found nothing for a preloaded key",
            raw.name
        ));
    }
    let (p99_before, p99_during) = (pct(&before, 0.99), pct(&during, 0.99));
    Row {
        name: raw.name,
        moves_done: raw.moves_done,
        moves_secs: raw.moves_secs,
        requests,
        extra_round_trips: extra,
        extra_round_trips_per_request: if requests > 0 {
            extra as f64 / requests as f64
        } else {
            0.0
        },
        rejections_active: rej_active,
        rejections_idle: rej_idle,
        refreshes_active: refr_active,
        refreshes_idle: refr_idle,
        map_requests: map,
        map_requests_burst: map_burst,
        losing_node_rejections: rejections.get(raw.losing_node).copied().unwrap_or(0),
        losing_node_map_replies: map_since.get(raw.losing_node).copied().unwrap_or(0),
        all_nodes_rejections: rejections.iter().sum(),
        p50_before_ms: pct(&before, 0.5),
        p99_before_ms: p99_before,
        p50_during_ms: pct(&during, 0.5),
        p99_during_ms: p99_during,
        p99_added_ms: p99_during - p99_before,
        requests_before: before.len(),
        requests_during: during.len(),
        burst_secs_mean: (!raw.burst.is_empty())
            .then(|| raw.burst.iter().map(|b| b.secs).sum::<f64>() / raw.burst.len() as f64),
        burst_max_get_ms: raw.burst.iter().map(|b| b.max_ms).reduce(f64::max),
        failed_requests: failed,
        errors: raw.load.errors.clone(),
        vs_reference: Ratios::default(),
    }
}

impl RowRaw {
    /// Keys each idle pass reads (every preloaded key).
    fn keys_read(&self) -> u64 {
        self.burst.first().map(|b| b.reads).unwrap_or(0)
    }
}

fn ratio(a: f64, reference: f64) -> Option<f64> {
    (reference > 0.0).then(|| a / reference)
}

/// Sums every row up and sets the ratios to the hybrid row.
pub(super) fn build(config: ConfigOut, raws: Vec<RowRaw>) -> Report {
    let mut problems = Vec::new();
    let mut rows: Vec<Row> = raws.iter().map(|r| summarize(r, &mut problems)).collect();
    let reference = "hybrid";
    if let Some(h) = rows.iter().position(|r| r.name == reference) {
        let mean = |s: Option<Spread>| s.map_or(0.0, |s| s.mean);
        let (h_xrt, h_act, h_idle, h_map, h_rej, h_p99, h_add) = {
            let h = &rows[h];
            (
                h.extra_round_trips_per_request,
                mean(h.rejections_active),
                mean(h.rejections_idle),
                h.map_requests as f64,
                h.losing_node_rejections as f64,
                h.p99_during_ms,
                h.p99_added_ms,
            )
        };
        for r in &mut rows {
            r.vs_reference = Ratios {
                extra_round_trips_per_request: ratio(r.extra_round_trips_per_request, h_xrt),
                rejections_active_mean: ratio(mean(r.rejections_active), h_act),
                rejections_idle_mean: ratio(mean(r.rejections_idle), h_idle),
                map_requests: ratio(r.map_requests as f64, h_map),
                losing_node_rejections: ratio(r.losing_node_rejections as f64, h_rej),
                p99_during: ratio(r.p99_during_ms, h_p99),
                p99_added: ratio(r.p99_added_ms, h_add),
            };
        }
    }
    Report {
        config,
        reference,
        rows,
        problems,
    }
}

// ---------------------------------------------------------------------------
// Output

fn spread(s: Option<Spread>) -> String {
    match s {
        Some(Spread {
            mean,
            max: Some(max),
        }) => format!("{mean:.1}/{max}"),
        Some(Spread { mean, max: None }) => format!("{mean:.1}/-"),
        None => "-".into(),
    }
}

fn mean_of(s: Option<Spread>) -> String {
    s.map_or("-".into(), |s| format!("{:.1}", s.mean))
}

fn x(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}x"))
}

pub(super) fn print_report(r: &Report) {
    let c = &r.config;
    println!();
    println!(
        "Machine: {} CPUs, load average {} at the start, {} at the end",
        c.cpus,
        c.loadavg_start.map_or("?".into(), |v| format!("{v:.2}")),
        c.loadavg_end.map_or("?".into(), |v| format!("{v:.2}"))
    );
    println!(
        "Each row: a fresh cluster ({} nodes, {} partitions, durability {}), {} keys, {} clients \
         ({} idle), {} req/s, {} partitions moved off n1 ({} at a time); smart clients with \
         lookup_ttl_ms {} and min_refresh_interval_ms {}",
        c.nodes,
        c.partitions,
        c.durability,
        c.keys,
        c.clients,
        c.idle_clients,
        c.rate_per_sec,
        c.moves,
        c.parallel,
        c.lookup_ttl_ms,
        c.min_refresh_interval_ms
    );
    println!();
    println!(
        "{:<9} {:>5} {:>8} {:>8} {:>11} {:>11} {:>11} {:>9} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8}",
        "row",
        "moves",
        "requests",
        "xrt/req",
        "rej active",
        "rej idle",
        "refr a/i",
        "map reqs",
        "n1 rej",
        "n1 map",
        "p99 bef",
        "p99 dur",
        "p99 add",
        "burst s"
    );
    for row in &r.rows {
        println!(
            "{:<9} {:>5} {:>8} {:>8.4} {:>11} {:>11} {:>11} {:>9} {:>7} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>8}",
            row.name,
            row.moves_done,
            row.requests,
            row.extra_round_trips_per_request,
            spread(row.rejections_active),
            spread(row.rejections_idle),
            format!(
                "{}/{}",
                mean_of(row.refreshes_active),
                mean_of(row.refreshes_idle)
            ),
            format!("{} ({})", row.map_requests, row.map_requests_burst),
            row.losing_node_rejections,
            row.losing_node_map_replies,
            row.p99_before_ms,
            row.p99_during_ms,
            row.p99_added_ms,
            row.burst_secs_mean
                .map_or("-".into(), |s| format!("{s:.2}")),
        );
    }
    println!();
    println!(
        "Against the {} row of this run (its figure = 1.00x; - where it is 0):",
        r.reference
    );
    println!(
        "{:<9} {:>8} {:>11} {:>11} {:>9} {:>8} {:>8} {:>8}",
        "row", "xrt/req", "rej active", "rej idle", "map reqs", "n1 rej", "p99 dur", "p99 add"
    );
    for row in &r.rows {
        let v = &row.vs_reference;
        println!(
            "{:<9} {:>8} {:>11} {:>11} {:>9} {:>8} {:>8} {:>8}",
            row.name,
            x(v.extra_round_trips_per_request),
            x(v.rejections_active_mean),
            x(v.rejections_idle_mean),
            x(v.map_requests),
            x(v.losing_node_rejections),
            x(v.p99_during),
            x(v.p99_added)
        );
    }
    println!();
    println!(
        "requests and every count: from the first move to the end of the idle clients' burst. \
         xrt/req: round trips beyond one per request (smart clients: retries plus map requests; \
         proxy: its retries to the nodes, on top of the client->proxy hop every request pays). \
         rej active/idle: rejections per client, mean/max (idle: in the burst; proxy: the \
         rejections it followed for them, total / clients). refr a/i: map refreshes per active / \
         idle client. map reqs: KW.MAP SINCE replies the nodes served (proxy: its metadata-store \
         reads, whole maps + watch updates), burst's in brackets. n1 rej / n1 map: rejections and \
         KW.MAP SINCE replies at n1, the node the partitions moved off. p99 bef/dur/add: active \
         requests' p99 ms before the moves, during them, and the difference. burst s: mean \
         seconds of an idle client's read of every key."
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
    fn spreads_and_ratios() {
        let s = Spread::of(&[1, 3, 8]).unwrap();
        assert_eq!((s.mean, s.max), (4.0, Some(8)));
        assert!(Spread::of(&[]).is_none());
        assert_eq!(Spread::total(6, 3).unwrap().mean, 2.0);
        assert!(Spread::total(6, 0).is_none());
        assert_eq!(ratio(3.0, 1.5), Some(2.0));
        assert_eq!(ratio(3.0, 0.0), None);
        assert_eq!(pct(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
        assert_eq!(pct(&[], 0.99), 0.0);
    }
}
