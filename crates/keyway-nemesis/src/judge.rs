//! [`judge`]: the one place a run's history is judged, by
//! [`keyway_check::check`]: the history's shape, per-key linearizability
//! (Wing–Gong/Lowe over a Redis string register, unknown outcomes
//! optional), and the totals (acknowledged writes lost, INCRs applied
//! twice or answered twice, stale reads, torn MGETs). A key whose search
//! runs out of budget is *undecided*, and an undecided run fails: only a
//! decided, clean history passes.

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

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_check::{Event, Op, Outcome, Reply};

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
