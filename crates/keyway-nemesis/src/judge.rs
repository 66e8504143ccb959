//! [`judge`]: the one place a run's history is judged.
//!
//! THE CHECKER PLUGS IN HERE. `keyway_check::check(&History, &CheckOptions)
//! -> CheckReport` (per-key Wing–Gong/Lowe linearizability and the
//! lost/double-INCR/stale totals) replaces the body of [`judge`]; the rest
//! of the harness only reads the [`Verdict`].
//!
//! Until then the body is a minimal, honest local check, and says so in its
//! summary: the history's shape ([`History::validate`]), the outcome
//! counts, and on counter keys (which only get INCR and GET) two bounds
//! that need no linearizability search: two acknowledged INCRs of one key
//! must not return the same value (a lost or doubled increment), and the
//! last successful read of a counter after every INCR completed must lie
//! between the acknowledged INCRs and those plus the unknown ones. It does
//! not check registers at all: `linearizable` stays `None`.

use keyway_check::{History, Op, Outcome, Reply};
use std::collections::{BTreeMap, BTreeSet};

/// What the judge found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// No violation found.
    pub ok: bool,
    /// Which checker judged (`local` until `keyway_check::check` plugs in).
    pub checker: &'static str,
    /// Whether every key's history is linearizable; `None` when not checked.
    pub linearizable: Option<bool>,
    /// Acknowledged writes lost (an acknowledged INCR missing from a counter).
    pub lost: u64,
    /// Acknowledged INCRs counted twice.
    pub double_incr: u64,
    /// Reads of a value older than the last acknowledged write; `None` when not checked.
    pub stale: Option<u64>,
    /// One line: what was found, or why the history is unusable.
    pub summary: String,
}

/// Judges a run's history (see the module docs for what is checked today).
pub fn judge(history: &History) -> Verdict {
    if let Err(e) = history.validate() {
        return Verdict {
            ok: false,
            checker: "local",
            linearizable: None,
            lost: 0,
            double_incr: 0,
            stale: None,
            summary: format!("malformed history: {e}"),
        };
    }
    let counters = counter_keys(history);
    let mut lost = 0;
    let mut double_incr = 0;
    let mut findings = Vec::new();
    for key in &counters {
        let c = CounterFacts::of(history, key);
        if let Some(dup) = c.duplicate_reply {
            double_incr += 1;
            findings.push(format!("{key}: two acknowledged INCRs returned {dup}"));
        }
        if let Some(v) = c.final_value {
            if v < c.acked {
                lost += c.acked - v;
                findings.push(format!(
                    "{key}: reads {v} after {} acknowledged INCRs",
                    c.acked
                ));
            }
            if v > c.acked + c.unknown {
                double_incr += v - (c.acked + c.unknown);
                findings.push(format!(
                    "{key}: reads {v} after {} acknowledged and {} unknown INCRs",
                    c.acked, c.unknown
                ));
            }
        }
    }
    let ok = findings.is_empty();
    let summary = if ok {
        format!(
            "local check passed ({} counter keys bounded; registers not checked: keyway_check::check plugs in at judge())",
            counters.len()
        )
    } else {
        findings.join("; ")
    };
    Verdict {
        ok,
        checker: "local",
        linearizable: None,
        lost,
        double_incr,
        stale: None,
        summary,
    }
}

/// Keys that only ever get INCR and GET, with at least one INCR.
fn counter_keys(history: &History) -> BTreeSet<String> {
    let mut incr = BTreeSet::new();
    let mut other = BTreeSet::new();
    for e in &history.events {
        match &e.op {
            Op::Incr { key } => {
                incr.insert(key.clone());
            }
            Op::Get { .. } => {}
            op => other.extend(op.keys().into_iter().map(str::to_string)),
        }
    }
    incr.retain(|k| !other.contains(k));
    incr
}

/// What the history says about one counter key.
struct CounterFacts {
    acked: u64,
    unknown: u64,
    duplicate_reply: Option<i64>,
    /// The last successful GET invoked after every acknowledged INCR
    /// completed and every unknown INCR was invoked, if any.
    final_value: Option<u64>,
}

impl CounterFacts {
    fn of(history: &History, key: &str) -> CounterFacts {
        let mut acked = 0;
        let mut unknown = 0;
        let mut replies: BTreeMap<i64, u32> = BTreeMap::new();
        let mut last_write_us = 0;
        for e in &history.events {
            if !matches!(&e.op, Op::Incr { key: k } if k == key) {
                continue;
            }
            match &e.outcome {
                Outcome::Ok(Reply::Int(n)) => {
                    acked += 1;
                    *replies.entry(*n).or_default() += 1;
                    last_write_us = last_write_us.max(e.complete_us.unwrap_or(e.invoke_us));
                }
                Outcome::Ok(_) => {}
                Outcome::Failed => {}
                Outcome::Unknown => {
                    unknown += 1;
                    last_write_us = last_write_us.max(e.invoke_us);
                }
            }
        }
        let final_value = history
            .events
            .iter()
            .filter(|e| matches!(&e.op, Op::Get { key: k } if k == key))
            .filter(|e| e.invoke_us >= last_write_us)
            .filter_map(|e| match &e.outcome {
                Outcome::Ok(Reply::Value(v)) => Some((e.invoke_us, v.clone())),
                _ => None,
            })
            .max_by_key(|(at, _)| *at)
            .map(|(_, v)| v.and_then(|s| s.parse::<u64>().ok()).unwrap_or(0));
        CounterFacts {
            acked,
            unknown,
            duplicate_reply: replies.into_iter().find(|(_, n)| *n > 1).map(|(v, _)| v),
            final_value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_check::Event;

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
    fn incr(id: u64, client: u32, at: (u64, Option<u64>), outcome: Outcome) -> Event {
        ev(id, client, Op::Incr { key: "c".into() }, at, outcome)
    }
    fn get(id: u64, client: u32, at: u64, v: Option<&str>) -> Event {
        ev(
            id,
            client,
            Op::Get { key: "c".into() },
            (at, Some(at + 1)),
            Outcome::Ok(Reply::Value(v.map(String::from))),
        )
    }

    #[test]
    fn counters_within_bounds_pass() {
        let h = History::new(vec![
            incr(1, 0, (0, Some(5)), Outcome::Ok(Reply::Int(1))),
            incr(2, 1, (1, None), Outcome::Unknown),
            incr(3, 2, (2, Some(6)), Outcome::Ok(Reply::Int(3))),
            get(4, 0, 10, Some("3")),
        ]);
        let v = judge(&h);
        assert!(v.ok, "{v:?}");
        assert_eq!(
            v.linearizable, None,
            "the local judge claims no linearizability"
        );
    }

    #[test]
    fn a_lost_increment_and_a_doubled_one_are_found() {
        let lost = History::new(vec![
            incr(1, 0, (0, Some(5)), Outcome::Ok(Reply::Int(1))),
            incr(2, 1, (1, Some(6)), Outcome::Ok(Reply::Int(2))),
            get(3, 0, 10, Some("1")),
        ]);
        let v = judge(&lost);
        assert!(!v.ok && v.lost == 1, "{v:?}");
        let doubled = History::new(vec![
            incr(1, 0, (0, Some(5)), Outcome::Ok(Reply::Int(2))),
            get(2, 0, 10, Some("2")),
        ]);
        let v = judge(&doubled);
        assert!(!v.ok && v.double_incr == 1, "{v:?}");
        let same_reply = History::new(vec![
            incr(1, 0, (0, Some(5)), Outcome::Ok(Reply::Int(1))),
            incr(2, 1, (0, Some(5)), Outcome::Ok(Reply::Int(1))),
        ]);
        assert!(!judge(&same_reply).ok);
        let malformed = History::new(vec![incr(1, 0, (5, Some(1)), Outcome::Ok(Reply::Int(1)))]);
        assert!(judge(&malformed).summary.contains("malformed"));
    }
}
