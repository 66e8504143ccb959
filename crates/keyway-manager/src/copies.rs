//! Copy progress, cluster-wide: the copies the nodes report (keyway-node
//! `copies.rs`: every migration push's copy phase and every replica
//! catch-up, counted by the sending node) turned into progress an operator
//! and the manager's duties can act on: bytes sent and written, bytes
//! remaining (against the sender's size estimate), the rate over the last
//! interval and the time left.
//!
//! The nodes' lists travel in the `PartitionStats` RPC the load monitor
//! already polls every `stats_interval_ms` ([`crate::ClusterLoad::copies`]);
//! a [`CopyTracker`] follows the monitor's rounds and keeps, per copy, the
//! previous sample, so the rate is over the last round. `keyway ctl
//! recovery` uses the same pure [`progress`] over its own polls.
//!
//! Rates are measured on the sending node's clock (the difference of the
//! copy's own `duration_ms` between two samples), so the poll's latency
//! does not distort them. With one sample the rate is the average since the
//! copy started ([`RateBasis::SinceStart`]); a finished copy's is its
//! average over the whole copy.

use keyway_map::{NodeId, PartitionId};
use keyway_peer::copies::{CopyKind, CopyOutcome, CopyReport};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// What a rate was measured over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RateBasis {
    /// Between the last two samples of a running copy.
    LastInterval,
    /// One sample of a running copy: its average since it started.
    SinceStart,
    /// A finished copy: its average over the whole copy.
    WholeCopy,
}

/// One copy's progress (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CopyProgress {
    pub partition: PartitionId,
    /// The sending node (the migration's source, or the primary).
    pub from: NodeId,
    /// The receiving node (the migration's target, or the replica).
    pub to: NodeId,
    pub kind: CopyKind,
    /// The migration's id (kind `migration`), else 0.
    pub migration: u64,
    pub outcome: CopyOutcome,
    pub bytes_sent: u64,
    pub bytes_written: u64,
    /// The sender's estimate of the partition's payload bytes (`None`: not
    /// sized yet).
    pub bytes_total_estimate: Option<u64>,
    /// `estimate - sent` while running (0 when the copy is past the
    /// estimate: writes grew it), 0 once done; `None` without an estimate.
    pub bytes_remaining: Option<u64>,
    /// Bytes sent per second, over [`Self::rate_basis`]; `None` before any
    /// time passed.
    pub rate_bytes_per_sec: Option<f64>,
    pub rate_basis: RateBasis,
    /// Time left at the rate, ms (0 once done; `None` without an estimate
    /// or a rate).
    pub eta_ms: Option<u64>,
    pub started_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    pub duration_ms: u64,
    pub error: Option<String>,
}

impl CopyProgress {
    pub fn running(&self) -> bool {
        self.outcome == CopyOutcome::Running
    }
}

/// Which sample of which copy (a copy is identified by its sender,
/// partition, receiver, kind and start).
type CopyKey = (NodeId, PartitionId, NodeId, CopyKind, u64);

fn key(from: NodeId, r: &CopyReport) -> CopyKey {
    (from, r.partition, r.peer, r.kind, r.started_at_ms)
}

/// The progress of copy `now` (sent by `from`), with its previous sample
/// `before` if there is one (pure).
pub fn progress(from: NodeId, now: &CopyReport, before: Option<&CopyReport>) -> CopyProgress {
    let per_sec = |bytes: u64, ms: u64| (ms > 0).then(|| bytes as f64 * 1000.0 / ms as f64);
    let running = now.outcome == CopyOutcome::Running;
    let (rate, basis) = match before {
        Some(b) if running && now.duration_ms > b.duration_ms => (
            per_sec(
                now.bytes_sent.saturating_sub(b.bytes_sent),
                now.duration_ms - b.duration_ms,
            ),
            RateBasis::LastInterval,
        ),
        _ if running => (
            per_sec(now.bytes_sent, now.duration_ms),
            RateBasis::SinceStart,
        ),
        _ => (
            per_sec(now.bytes_sent, now.duration_ms),
            RateBasis::WholeCopy,
        ),
    };
    let remaining = match now.outcome {
        CopyOutcome::Running => now
            .bytes_total_estimate
            .map(|t| t.saturating_sub(now.bytes_sent)),
        CopyOutcome::Done => Some(0),
        CopyOutcome::Failed => None,
    };
    let eta_ms = match (remaining, rate) {
        (Some(0), _) => Some(0),
        (Some(left), Some(r)) if r > 0.0 => Some((left as f64 / r * 1000.0) as u64),
        _ => None,
    };
    CopyProgress {
        partition: now.partition,
        from,
        to: now.peer,
        kind: now.kind,
        migration: now.migration,
        outcome: now.outcome,
        bytes_sent: now.bytes_sent,
        bytes_written: now.bytes_written,
        bytes_total_estimate: now.bytes_total_estimate,
        bytes_remaining: remaining,
        rate_bytes_per_sec: rate,
        rate_basis: basis,
        eta_ms,
        started_at_ms: now.started_at_ms,
        finished_at_ms: now.finished_at_ms,
        duration_ms: now.duration_ms,
        error: now.error.clone(),
    }
}

/// Every copy's progress from one round of node reports, given the
/// previous round's samples (which this replaces).
fn observe(
    samples: &mut BTreeMap<CopyKey, CopyReport>,
    round: &BTreeMap<NodeId, Vec<CopyReport>>,
) -> Vec<CopyProgress> {
    let mut next = BTreeMap::new();
    let mut out = Vec::new();
    for (from, reports) in round {
        for r in reports {
            let k = key(*from, r);
            out.push(progress(*from, r, samples.get(&k)));
            next.insert(k, r.clone());
        }
    }
    *samples = next;
    out
}

/// The totals of the running copies: bytes remaining (of those with an
/// estimate), their summed rate, and the time left at it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CopyTotals {
    pub running: usize,
    pub bytes_sent: u64,
    pub bytes_written: u64,
    pub bytes_remaining: u64,
    pub rate_bytes_per_sec: f64,
    /// `None` while some running copy has no estimate or no rate.
    pub eta_ms: Option<u64>,
}

/// [`CopyTotals`] of `copies` (the running ones count).
pub fn totals<'a>(copies: impl IntoIterator<Item = &'a CopyProgress>) -> CopyTotals {
    let mut t = CopyTotals::default();
    let mut eta_known = true;
    for c in copies.into_iter().filter(|c| c.running()) {
        t.running += 1;
        t.bytes_sent += c.bytes_sent;
        t.bytes_written += c.bytes_written;
        t.rate_bytes_per_sec += c.rate_bytes_per_sec.unwrap_or(0.0);
        match c.bytes_remaining {
            Some(left) => t.bytes_remaining += left,
            None => eta_known = false,
        }
        eta_known &= c.rate_bytes_per_sec.is_some_and(|r| r > 0.0) || c.bytes_remaining == Some(0);
    }
    t.eta_ms = match (eta_known, t.bytes_remaining) {
        (true, 0) => Some(0),
        (true, left) if t.rate_bytes_per_sec > 0.0 => {
            Some((left as f64 / t.rate_bytes_per_sec * 1000.0) as u64)
        }
        _ => None,
    };
    t
}

#[derive(Default)]
struct State {
    samples: BTreeMap<CopyKey, CopyReport>,
    latest: Vec<CopyProgress>,
}

/// The copies of the latest round, with progress (see the module docs).
/// Cheap to clone; fed by [`CopyTracker::follow`] (the load monitor's
/// rounds) or [`CopyTracker::observe`].
#[derive(Clone, Default)]
pub struct CopyTracker(Arc<Mutex<State>>);

impl CopyTracker {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes one round of node reports (by sending node).
    pub fn observe(&self, round: &BTreeMap<NodeId, Vec<CopyReport>>) {
        let mut st = self.state();
        let latest = observe(&mut st.samples, round);
        st.latest = latest;
    }

    /// Every copy of the latest round (running and recently finished).
    pub fn list(&self) -> Vec<CopyProgress> {
        self.state().latest.clone()
    }

    /// The copy of `partition` to node `to`: the running one if any, else
    /// the one that started last (a finished copy stays listed while its
    /// sender keeps it among its last finished ones). `None`: no node
    /// reported one in the latest round.
    pub fn copy_progress(&self, partition: PartitionId, to: NodeId) -> Option<CopyProgress> {
        self.state()
            .latest
            .iter()
            .filter(|c| c.partition == partition && c.to == to)
            .max_by_key(|c| (c.running(), c.started_at_ms))
            .cloned()
    }

    /// Follows the load monitor: every published round is observed (a
    /// cleared channel, when this manager stops leading, empties the list).
    pub fn follow(&self, mut rx: crate::monitor::LoadReceiver) -> tokio::task::JoinHandle<()> {
        let tracker = self.clone();
        tokio::spawn(async move {
            loop {
                let round = rx.borrow_and_update().clone();
                match round {
                    Some(snapshot) => tracker.observe(&snapshot.load.copies),
                    None => tracker.observe(&BTreeMap::new()),
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(sent: u64, duration_ms: u64, outcome: CopyOutcome) -> CopyReport {
        CopyReport {
            partition: PartitionId(3),
            peer: NodeId(2),
            kind: CopyKind::Replica,
            migration: 0,
            bytes_sent: sent,
            bytes_written: sent,
            bytes_total_estimate: Some(10_000),
            started_at_ms: 1_000,
            finished_at_ms: (outcome != CopyOutcome::Running).then_some(1_000 + duration_ms),
            duration_ms,
            outcome,
            error: None,
        }
    }

    #[test]
    fn the_rate_is_over_the_last_interval_and_the_eta_follows() {
        let first = report(2_000, 1_000, CopyOutcome::Running);
        let p = progress(NodeId(1), &first, None);
        assert_eq!(p.rate_basis, RateBasis::SinceStart);
        assert_eq!(p.rate_bytes_per_sec, Some(2_000.0));
        assert_eq!(p.bytes_remaining, Some(8_000));
        assert_eq!(p.eta_ms, Some(4_000));
        // A slower interval next: 500 bytes in 1 s (of the node's clock).
        let second = report(2_500, 2_000, CopyOutcome::Running);
        let p = progress(NodeId(1), &second, Some(&first));
        assert_eq!(p.rate_basis, RateBasis::LastInterval);
        assert_eq!(p.rate_bytes_per_sec, Some(500.0));
        assert_eq!(p.bytes_remaining, Some(7_500));
        assert_eq!(p.eta_ms, Some(15_000));
        let done = report(10_000, 5_000, CopyOutcome::Done);
        let p = progress(NodeId(1), &done, Some(&second));
        assert_eq!(p.rate_basis, RateBasis::WholeCopy);
        assert_eq!(p.rate_bytes_per_sec, Some(2_000.0));
        assert_eq!((p.bytes_remaining, p.eta_ms), (Some(0), Some(0)));
    }

    #[test]
    fn the_tracker_keeps_the_previous_sample_per_copy() {
        let t = CopyTracker::default();
        let round = |r: CopyReport| BTreeMap::from([(NodeId(1), vec![r])]);
        t.observe(&round(report(1_000, 1_000, CopyOutcome::Running)));
        t.observe(&round(report(4_000, 2_000, CopyOutcome::Running)));
        let p = t.copy_progress(PartitionId(3), NodeId(2)).unwrap();
        assert_eq!(p.rate_bytes_per_sec, Some(3_000.0));
        assert_eq!(p.rate_basis, RateBasis::LastInterval);
        assert_eq!(p.from, NodeId(1));
        assert!(t.copy_progress(PartitionId(3), NodeId(9)).is_none());
        // A new copy of the same partition (a later start) is another copy.
        let mut again = report(500, 1_000, CopyOutcome::Running);
        again.started_at_ms = 9_000;
        let mut old = report(4_000, 2_000, CopyOutcome::Failed);
        old.error = Some("x".into());
        t.observe(&BTreeMap::from([(NodeId(1), vec![again, old])]));
        let p = t.copy_progress(PartitionId(3), NodeId(2)).unwrap();
        assert_eq!(p.started_at_ms, 9_000, "the running copy is preferred");
        assert_eq!(p.rate_basis, RateBasis::SinceStart);
        let sum = totals(&t.list());
        assert_eq!((sum.running, sum.bytes_remaining), (1, 9_500));
        assert_eq!(sum.eta_ms, Some(19_000));
        t.observe(&BTreeMap::new());
        assert!(t.list().is_empty());
    }
}
