//! [`judge`]: the one place a run's history is judged, by
//! [`keyway_check::check`]: the history's shape, per-key linearizability
//! (Wing–Gong/Lowe over a Redis string register, unknown outcomes
//! optional), and the totals (acknowledged writes lost, INCRs applied
//! twice or answered twice, stale reads, torn MGETs). A key whose search
//! runs out of budget is *undecided*, and an undecided run fails: only a
//! decided, clean history passes.
//!
//! [`judge_recoveries`] judges what the history cannot show: that every
//! `permanent-loss` was re-replicated within the run's bound.

use crate::permanent_loss::LossRecord;
use keyway_check::{CheckOptions, CheckReport, History};

/// What the judge found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Decided linearizable and every total zero.
    pub ok: bool,
    /// Which checker judged.
    pub checker: &'static str,
    /// `Some(true)` every key linearizable, `Some(false)` a violation,
    /// `None` undecided (over budget) or an invalid history.
    pub linearizable: Option<bool>,
    /// Acknowledged writes lost.
    pub lost: u64,
    /// Acknowledged INCRs applied twice (and INCR replies given twice).
    pub double_incr: u64,
    /// Reads of a value older than a write certainly before them.
    pub stale: Option<u64>,
    /// The checker's one-line summary.
    pub summary: String,
    /// Everything behind a failing summary (violations, undecided keys,
    /// the totals' first findings); empty when it passed.
    pub details: String,
}

impl Verdict {
    pub fn of(report: &CheckReport) -> Verdict {
        let t = &report.totals;
        Verdict {
            ok: report.passed(),
            checker: "keyway-check",
            linearizable: report.linearizable(),
            lost: t.lost_writes as u64,
            double_incr: t.double_incr + t.duplicate_incr_replies as u64,
            stale: Some(t.stale_reads as u64),
            summary: report.to_string(),
            details: report.details(),
        }
    }
}

/// Judges a run's history with the checker's default options.
pub fn judge(history: &History) -> (Verdict, CheckReport) {
    let report = keyway_check::check(history, &CheckOptions::default());
    (Verdict::of(&report), report)
}

/// Why the run fails for its permanent losses (empty: it does not): each
/// must have been re-replicated (every partition back at its replication
/// factor of in-sync copies without the lost node) within
/// `recovery_timeout_ms` of the kill, decommissioned, and replaced by a
/// node with a new id. A loss skipped because it was never survivable
/// (`permanent_loss::safe_to_lose`) does not fail the run; the summary shows it.
pub fn judge_recoveries(losses: &[LossRecord], recovery_timeout_ms: u64) -> Vec<String> {
    let mut failures = Vec::new();
    for l in losses.iter().filter(|l| l.skipped.is_none()) {
        let what = format!("permanent loss of node{}", l.node);
        match (l.lost, l.replicated_ms) {
            (None, _) => failures.push(format!(
                "{what}: the node had no id on disk, so its re-replication could not be followed"
            )),
            (Some(_), Some(ms)) if ms <= recovery_timeout_ms => {}
            (Some(_), Some(ms)) => failures.push(format!(
                "{what}: re-replicated only {ms} ms after the kill (bound {recovery_timeout_ms} ms)"
            )),
            (Some(_), None) => failures.push(format!(
                "{what}: not re-replicated within {recovery_timeout_ms} ms of the kill: {}",
                l.short.as_deref().unwrap_or("?")
            )),
        }
        if l.replicated_ms.is_some() && !l.decommissioned {
            failures.push(format!("{what}: decommission --force failed"));
        }
        if l.replacement.is_none() || l.replacement == l.lost {
            failures.push(format!(
                "{what}: no new node with a new id took its place ({:?})",
                l.replacement
            ));
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_check::{Event, Op, Outcome, Reply};
    use keyway_map::NodeId;

    #[test]
    fn a_loss_not_re_replicated_within_the_bound_fails_the_run() {
        let good = LossRecord {
            node: 1,
            skipped: None,
            waited_ms: 0,
            lost: Some(NodeId(2)),
            replacement: Some(NodeId(5)),
            owned_at_kill: Some(4),
            failover_ms: Some(2_600),
            replicated_ms: Some(8_000),
            short: None,
            decommissioned: true,
        };
        assert!(judge_recoveries(std::slice::from_ref(&good), 30_000).is_empty());
        let late = judge_recoveries(std::slice::from_ref(&good), 5_000);
        assert!(late[0].contains("bound 5000 ms"), "{late:?}");
        let never = LossRecord {
            replicated_ms: None,
            short: Some("p3 (1 of 2 in sync)".into()),
            decommissioned: false,
            ..good.clone()
        };
        let f = judge_recoveries(&[never], 30_000);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("p3 (1 of 2 in sync)"), "{f:?}");
        let same_id = LossRecord {
            replacement: Some(NodeId(2)),
            ..good.clone()
        };
        assert!(judge_recoveries(&[same_id], 30_000)[0].contains("new id"));
        let undecommissioned = LossRecord {
            decommissioned: false,
            ..good.clone()
        };
        assert!(judge_recoveries(&[undecommissioned], 30_000)[0].contains("decommission"));
        let skipped = LossRecord {
            skipped: Some("it is the only in-sync copy of partitions 3".into()),
            replicated_ms: None,
            replacement: None,
            ..good
        };
        assert!(judge_recoveries(&[skipped], 30_000).is_empty());
    }

    fn ev(id: u64, client: u32, op: Op, at: (u64, Option<u64>), outcome: Outcome) -> Event {
        Event {
            id,
            client,
            op,
            invoke_us: at.0,
            complete_us: at.1,
            outcome,
        }
    }

    fn incr(id: u64, client: u32, at: (u64, u64), n: i64) -> Event {
        let op = Op::Incr { key: "c".into() };
        ev(
            id,
            client,
            op,
            (at.0, Some(at.1)),
            Outcome::Ok(Reply::Int(n)),
        )
    }

    #[test]
    fn a_clean_history_passes_and_a_doubled_incr_fails() {
        let clean = History::new(vec![incr(1, 0, (0, 10), 1), incr(2, 1, (20, 30), 2)]);
        let (v, _) = judge(&clean);
        assert!(v.ok, "{}", v.summary);
        assert_eq!(v.linearizable, Some(true));
        let doubled = History::new(vec![incr(1, 0, (0, 10), 1), incr(2, 1, (20, 30), 3)]);
        let (v, _) = judge(&doubled);
        assert!(!v.ok, "{}", v.summary);
        assert_eq!(v.linearizable, Some(false));
        assert!(!v.details.is_empty());
    }
}
