//! [`RunReport`]: what one run did and found, printed as one line; and
//! [`Totals`] over runs, printed as the last line.

use crate::faults::{ChurnCounts, ChurnKind, FaultKind};
use crate::judge::Verdict;
use crate::observe::{MapChanges, Rejoin};
use crate::permanent_loss::LossRecord;
use keyway_check::{History, Outcome};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// One run's result.
#[derive(Clone, Debug)]
pub struct RunReport {
    pub seed: u64,
    pub faults: BTreeMap<FaultKind, u64>,
    pub churn: ChurnCounts,
    /// Migration records at the end, by state.
    pub migrations: BTreeMap<String, u64>,
    pub ops_ok: u64,
    pub ops_failed: u64,
    pub ops_unknown: u64,
    /// Successful operations by client library (`smart`, `plain`).
    pub ops_ok_by_kind: BTreeMap<String, u64>,
    /// Keys read successfully in the final reads (over all clients).
    pub final_reads: u64,
    /// Reads a replica answered (`READONLY`), judged like every read.
    pub replica_reads: u64,
    /// Keyspace 0's replication factor in this run.
    pub replication_factor: u8,
    /// Owner changes and failovers the map observer saw, and restarted
    /// nodes' times to in sync (`map.rejoins`).
    pub map: MapChanges,
    /// Every `permanent-loss`: kill to failover and to full replication.
    pub losses: Vec<LossRecord>,
    pub verdict: Verdict,
    /// Why the run failed besides the verdict (starved, did not recover, a crash).
    pub failures: Vec<String>,
    pub history_file: Option<PathBuf>,
    /// The failing key's events, cut small (`keyway_check`'s failure file).
    pub failure_file: Option<PathBuf>,
    pub kept_dir: Option<PathBuf>,
    pub duration: Duration,
}

impl RunReport {
    pub(crate) fn new(
        seed: u64,
        history: &History,
        verdict: Verdict,
        faults: BTreeMap<FaultKind, u64>,
        churn: ChurnCounts,
        migrations: BTreeMap<String, u64>,
    ) -> RunReport {
        let count = |f: fn(&Outcome) -> bool| {
            history.events.iter().filter(|e| f(&e.outcome)).count() as u64
        };
        RunReport {
            seed,
            faults,
            churn,
            migrations,
            ops_ok: count(|o| matches!(o, Outcome::Ok(_))),
            ops_failed: count(|o| *o == Outcome::Failed),
            ops_unknown: count(|o| *o == Outcome::Unknown),
            ops_ok_by_kind: BTreeMap::new(),
            final_reads: 0,
            replica_reads: 0,
            replication_factor: 1,
            map: MapChanges::default(),
            losses: Vec::new(),
            verdict,
            failures: Vec::new(),
            history_file: None,
            failure_file: None,
            kept_dir: None,
            duration: Duration::ZERO,
        }
    }

    /// No violation, and the run really ran (see `failures`).
    pub fn passed(&self) -> bool {
        self.verdict.ok && self.failures.is_empty()
    }
}

fn counts<K: fmt::Display>(m: &BTreeMap<K, u64>) -> String {
    if m.is_empty() {
        return "none".to_string();
    }
    m.iter()
        .map(|(k, n)| format!("{k}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn churn_text(c: &ChurnCounts) -> String {
    if c.requested.is_empty() {
        return "none".to_string();
    }
    c.requested
        .iter()
        .map(|(k, n)| {
            let failed = c.failed.get(k).copied().unwrap_or(0);
            format!("{}={n}({failed} failed)", k.name())
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn opt(v: Option<u64>) -> String {
    v.map_or("-".to_string(), |n| n.to_string())
}

fn secs(ms: Option<u64>) -> String {
    ms.map_or("never".to_string(), |ms| {
        format!("{:.1}s", ms as f64 / 1000.0)
    })
}

/// `node1 failover=2.6s rf=8.1s, ...` (kill to each), or `none`.
fn losses_text(losses: &[LossRecord]) -> String {
    if losses.is_empty() {
        return "none".to_string();
    }
    losses
        .iter()
        .map(|l| {
            if let Some(why) = &l.skipped {
                return format!("node{} skipped ({why})", l.node);
            }
            let failover = match l.owned_at_kill {
                Some(0) => "none(owned nothing)".to_string(),
                _ => secs(l.failover_ms),
            };
            format!(
                "node{} waited={} failover={failover} replicated={}",
                l.node,
                secs(Some(l.waited_ms)),
                secs(l.replicated_ms)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Restart to in sync: those after a failover first (`failover:`), then the rest.
fn rejoins_text(rejoins: &[Rejoin]) -> String {
    if rejoins.is_empty() {
        return "none".to_string();
    }
    let list = |after: bool| {
        rejoins
            .iter()
            .filter(|r| (r.after_failover == Some(true)) == after)
            .map(|r| format!("node{}={}", r.node, secs(r.in_sync_ms)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (failed_over, other) = (list(true), list(false));
    let mut parts = Vec::new();
    if !failed_over.is_empty() {
        parts.push(format!("after failover {failed_over}"));
    }
    if !other.is_empty() {
        parts.push(format!("other {other}"));
    }
    parts.join("; ")
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = &self.verdict;
        write!(
            f,
            "seed {} {} in {:.0}s | rf={} | faults: {} | churn: {} | migrations: {} | map: owner_changes={} failovers={} under_replicated={} | permanent loss (kill to): {} | rejoin (restart to in sync): {} | ops: ok={} ({}) failed={} unknown={} final_reads={} replica_reads={} | checker {}: {} lost={} double_incr={} stale={} linearizable={}",
            self.seed,
            if self.passed() { "PASS" } else { "FAIL" },
            self.duration.as_secs_f64(),
            self.replication_factor,
            counts(&self.faults),
            churn_text(&self.churn),
            counts(&self.migrations),
            self.map.owner_changes,
            self.map.failovers,
            self.map.under_replicated,
            losses_text(&self.losses),
            rejoins_text(&self.map.rejoins),
            self.ops_ok,
            counts(&self.ops_ok_by_kind),
            self.ops_failed,
            self.ops_unknown,
            self.final_reads,
            self.replica_reads,
            v.checker,
            v.summary,
            v.lost,
            v.double_incr,
            opt(v.stale),
            v.linearizable
                .map_or("not checked".to_string(), |l| l.to_string()),
        )?;
        for why in &self.failures {
            write!(f, "\n    failed: {why}")?;
        }
        if let Some(h) = &self.history_file {
            write!(f, "\n    history: {}", h.display())?;
        }
        if let Some(h) = &self.failure_file {
            write!(f, "\n    failing key's history: {}", h.display())?;
        }
        for line in self.verdict.details.lines().take(12) {
            write!(f, "\n    {line}")?;
        }
        if let Some(d) = &self.kept_dir {
            write!(f, "\n    logs and data: {}", d.display())?;
        }
        Ok(())
    }
}

/// Sums over runs.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub runs: u64,
    pub passed: u64,
    pub faults: BTreeMap<FaultKind, u64>,
    pub churn: BTreeMap<ChurnKind, u64>,
    pub ops_ok: u64,
    pub ops_failed: u64,
    pub ops_unknown: u64,
    pub replica_reads: u64,
    pub failovers: u64,
    /// Permanent losses, and the longest kill to full replication of them.
    pub losses: u64,
    pub max_replicated_ms: Option<u64>,
    /// Restarts after a failover timed to in sync, and the longest.
    pub rejoins_after_failover: u64,
    pub max_rejoin_ms: Option<u64>,
    /// Runs whose verdict was not ok.
    pub violations: u64,
    pub lost: u64,
    pub double_incr: u64,
    pub stale: Option<u64>,
    /// Runs that could not be carried out at all.
    pub errors: u64,
}

impl Totals {
    pub fn add(&mut self, r: &RunReport) {
        self.runs += 1;
        self.passed += u64::from(r.passed());
        for (k, n) in &r.faults {
            *self.faults.entry(*k).or_default() += n;
        }
        for (k, n) in &r.churn.requested {
            *self.churn.entry(*k).or_default() += n;
        }
        self.ops_ok += r.ops_ok;
        self.ops_failed += r.ops_failed;
        self.ops_unknown += r.ops_unknown;
        self.replica_reads += r.replica_reads;
        self.failovers += r.map.failovers;
        self.losses += r.losses.iter().filter(|l| l.skipped.is_none()).count() as u64;
        for ms in r.losses.iter().filter_map(|l| l.replicated_ms) {
            self.max_replicated_ms = Some(self.max_replicated_ms.unwrap_or(0).max(ms));
        }
        for j in r
            .map
            .rejoins
            .iter()
            .filter(|j| j.after_failover == Some(true))
        {
            self.rejoins_after_failover += 1;
            if let Some(ms) = j.in_sync_ms {
                self.max_rejoin_ms = Some(self.max_rejoin_ms.unwrap_or(0).max(ms));
            }
        }
        self.violations += u64::from(!r.verdict.ok);
        self.lost += r.verdict.lost;
        self.double_incr += r.verdict.double_incr;
        if let Some(s) = r.verdict.stale {
            self.stale = Some(self.stale.unwrap_or(0) + s);
        }
    }

    /// A run that could not be carried out (counts as failed).
    pub fn add_error(&mut self) {
        self.runs += 1;
        self.errors += 1;
    }

    pub fn all_passed(&self) -> bool {
        self.runs > 0 && self.passed == self.runs
    }
}

impl fmt::Display for Totals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let churn: BTreeMap<&str, u64> = self.churn.iter().map(|(k, n)| (k.name(), *n)).collect();
        write!(
            f,
            "total: {} runs, {} passed, {} failed ({} with violations, {} not carried out) | faults: {} | churn: {} | failovers={} | permanent losses={} (longest kill to replicated {}) | rejoins after failover={} (longest restart to in sync {}) | ops: ok={} failed={} unknown={} replica_reads={} | lost={} double_incr={} stale={}",
            self.runs,
            self.passed,
            self.runs - self.passed,
            self.violations,
            self.errors,
            counts(&self.faults),
            counts(&churn),
            self.failovers,
            self.losses,
            secs(self.max_replicated_ms),
            self.rejoins_after_failover,
            secs(self.max_rejoin_ms),
            self.ops_ok,
            self.ops_failed,
            self.ops_unknown,
            self.replica_reads,
            self.lost,
            self.double_incr,
            opt(self.stale),
        )
    }
}
