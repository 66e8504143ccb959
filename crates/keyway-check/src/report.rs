//! The whole check of one history, and what it prints and writes.
//!
//! [`check`] validates the history, projects it per key, runs the
//! linearizability search on every key ([`crate::linear`]), computes the
//! totals ([`crate::totals`]) and counts outcomes. The [`CheckReport`]'s
//! `Display` is the one-line summary a nemesis run prints;
//! [`CheckReport::write_failure`] writes a failing key's history, cut down
//! to a few events that still fail, as JSON lines (re-checkable with
//! [`check_file`]) beside a text rendering.
//!
//! A key whose search ran out of budget is **undecided**: the report says
//! so and [`CheckReport::passed`] is false.

use crate::history::{Event, History, HistoryError, Op, Outcome};
use crate::linear::{self, SearchOptions, Verdict, Violation, render_reply};
use crate::project::{self, KeyEvent, restrict_event};
use crate::totals::{self, Totals};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The checker's knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckOptions {
    /// Model evaluations per key before its search stops undecided.
    pub max_search_steps: u64,
    /// Operations of the longest linearizable prefix a violation shows.
    pub report_prefix_ops: usize,
    /// The failing history file keeps at most about this many events when
    /// a cut that small still fails (it doubles until one does).
    pub max_failure_events: usize,
    /// Keys are checked on this many threads at once.
    pub threads: usize,
}

impl Default for CheckOptions {
    fn default() -> Self {
        let search = SearchOptions::default();
        CheckOptions {
            max_search_steps: search.max_search_steps,
            report_prefix_ops: search.report_prefix_ops,
            max_failure_events: 40,
            threads: 1,
        }
    }
}

/// A [`CheckOptions`] value the checker refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("max_search_steps must be at least 1")]
    NoSearchSteps,
    #[error("max_failure_events must be at least 1")]
    NoFailureEvents,
    #[error("threads must be at least 1")]
    NoThreads,
}

impl CheckOptions {
    /// Refuses options that cannot work (call it where the options are
    /// read, e.g. from flags; [`check`] asserts it).
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.max_search_steps == 0 {
            return Err(OptionsError::NoSearchSteps);
        }
        if self.max_failure_events == 0 {
            return Err(OptionsError::NoFailureEvents);
        }
        if self.threads == 0 {
            return Err(OptionsError::NoThreads);
        }
        Ok(())
    }

    pub fn search(&self) -> SearchOptions {
        SearchOptions {
            max_search_steps: self.max_search_steps,
            report_prefix_ops: self.report_prefix_ops,
        }
    }
}

/// One key's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyResult {
    pub key: String,
    pub verdict: Verdict,
    /// Completed (ok) operations on the key.
    pub completed: usize,
    /// Unknown-outcome operations on the key.
    pub unknown: usize,
}

/// Operations by outcome, in total and per op kind (`SET`, `MGET`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutcomeCounts {
    pub ok: usize,
    pub failed: usize,
    pub unknown: usize,
    /// kind → [ok, failed, unknown]
    pub by_kind: BTreeMap<&'static str, [usize; 3]>,
}

/// The name of an op's kind.
pub fn op_kind(op: &Op) -> &'static str {
    match op {
        Op::Set { .. } => "SET",
        Op::Get { .. } => "GET",
        Op::Del { .. } => "DEL",
        Op::Incr { .. } => "INCR",
        Op::Append { .. } => "APPEND",
        Op::MSet { .. } => "MSET",
        Op::MGet { .. } => "MGET",
    }
}

impl OutcomeCounts {
    pub fn of(history: &History) -> Self {
        let mut c = OutcomeCounts::default();
        for e in &history.events {
            let slot = match e.outcome {
                Outcome::Ok(_) => 0,
                Outcome::Failed => 1,
                Outcome::Unknown => 2,
            };
            match slot {
                0 => c.ok += 1,
                1 => c.failed += 1,
                _ => c.unknown += 1,
            }
            c.by_kind.entry(op_kind(&e.op)).or_default()[slot] += 1;
        }
        c
    }
}

/// Everything the checker found in one history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// Why the history is malformed, if it is (then nothing else is checked).
    pub invalid: Option<String>,
    pub keys: Vec<KeyResult>,
    pub outcomes: OutcomeCounts,
    pub totals: Totals,
}

/// Checks `history`: validity, per-key linearizability, totals, outcomes.
pub fn check(history: &History, options: &CheckOptions) -> CheckReport {
    if let Err(e) = options.validate() {
        panic!("check called with invalid options: {e}");
    }
    let outcomes = OutcomeCounts::of(history);
    if let Err(e) = history.validate() {
        return CheckReport {
            invalid: Some(e.to_string()),
            keys: Vec::new(),
            outcomes,
            totals: Totals::default(),
        };
    }
    let projected = project::project(history);
    let keys = check_keys(&projected, options);
    let totals = totals::totals(history, &projected);
    CheckReport {
        invalid: None,
        keys,
        outcomes,
        totals,
    }
}

/// Every key's verdict, in key order, on `options.threads` threads.
fn check_keys(
    projected: &BTreeMap<String, Vec<KeyEvent>>,
    options: &CheckOptions,
) -> Vec<KeyResult> {
    let search = options.search();
    let keys: Vec<(&String, &Vec<KeyEvent>)> = projected.iter().collect();
    let one = |(key, events): (&String, &Vec<KeyEvent>)| KeyResult {
        key: key.clone(),
        verdict: linear::check_key(key, events, &search),
        completed: events
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Ok(_)))
            .count(),
        unknown: events
            .iter()
            .filter(|e| e.outcome == Outcome::Unknown)
            .count(),
    };
    if options.threads <= 1 || keys.len() <= 1 {
        return keys.into_iter().map(one).collect();
    }
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, KeyResult)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..options.threads.min(keys.len()))
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&k) = keys.get(i) else { break };
                        mine.push((i, one(k)));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a key's check panicked"))
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    assert_eq!(done.len(), keys.len(), "every key checked once");
    done.into_iter().map(|(_, r)| r).collect()
}

/// Reads a JSON-lines history (as [`History::write_jsonl`] writes it) and
/// checks it with the default options.
pub fn check_file(path: impl AsRef<Path>) -> Result<CheckReport, HistoryError> {
    let file = std::fs::File::open(path)?;
    let history = History::read_jsonl(std::io::BufReader::new(file))?;
    Ok(check(&history, &CheckOptions::default()))
}

/// The two files [`CheckReport::write_failure`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureFiles {
    pub jsonl: PathBuf,
    pub text: PathBuf,
    pub key: String,
    pub events: usize,
    /// True if the written cut was re-checked and still fails.
    pub reproduces: bool,
}

impl CheckReport {
    /// `Some(true)` if every key is linearizable, `Some(false)` if some key
    /// is not, `None` if undecided (invalid history, or a key over budget
    /// and none violating).
    pub fn linearizable(&self) -> Option<bool> {
        if self.invalid.is_some() {
            return None;
        }
        if self.violations().next().is_some() {
            return Some(false);
        }
        if self.undecided().next().is_some() {
            return None;
        }
        Some(true)
    }

    pub fn violations(&self) -> impl Iterator<Item = &Violation> {
        self.keys.iter().filter_map(|k| match &k.verdict {
            Verdict::Violation(v) => Some(&**v),
            _ => None,
        })
    }

    /// Keys whose search ran out of budget.
    pub fn undecided(&self) -> impl Iterator<Item = &KeyResult> {
        self.keys
            .iter()
            .filter(|k| matches!(k.verdict, Verdict::Unknown { .. }))
    }

    /// True only if the history is valid, every key linearizable and every
    /// total zero.
    pub fn passed(&self) -> bool {
        self.linearizable() == Some(true) && self.totals.clean()
    }

    /// Everything behind a failing summary, for a person: each violation,
    /// each undecided key, the totals' first findings, the keys with
    /// repeated values. Empty when the run passed.
    pub fn details(&self) -> String {
        let mut out = String::new();
        if let Some(why) = &self.invalid {
            out.push_str(&format!("history invalid: {why}\n"));
        }
        for v in self.violations() {
            out.push_str(&v.to_string());
        }
        for k in self.undecided() {
            if let Verdict::Unknown {
                steps,
                linearized,
                completed,
            } = k.verdict
            {
                out.push_str(&format!(
                    "key {:?}: UNDECIDED after {steps} search steps ({linearized} of {completed} completed operations placed; {} unknown)\n",
                    k.key, k.unknown
                ));
            }
        }
        for f in &self.totals.examples {
            out.push_str(&format!("{:?} on {:?}: {}\n", f.kind, f.key, f.detail));
        }
        if !self.totals.non_unique_keys.is_empty() {
            out.push_str(&format!(
                "values written more than once (stale and torn rules skipped) on: {}\n",
                some_keys(self.totals.non_unique_keys.iter().map(String::as_str))
            ));
        }
        out
    }

    /// Search steps over all keys.
    pub fn steps(&self) -> u64 {
        self.keys.iter().map(|k| k.verdict.steps()).sum()
    }

    /// Writes the first violating key's history, cut to the events up to
    /// the failure and then to the last `max_failure_events` of them (more
    /// if a cut that small does not fail on its own), as `<stem>.jsonl`
    /// and `<stem>.txt` in `dir`. Multi-key events keep only that key.
    /// `None` if no key is in violation.
    pub fn write_failure(
        &self,
        history: &History,
        options: &CheckOptions,
        dir: &Path,
        stem: &str,
    ) -> Result<Option<FailureFiles>, HistoryError> {
        let Some(v) = self.violations().next() else {
            return Ok(None);
        };
        let (cut, shown) = cut_failure(history, v, options);
        let jsonl = dir.join(format!("{stem}.jsonl"));
        let text = dir.join(format!("{stem}.txt"));
        std::fs::create_dir_all(dir)?;
        cut.write_jsonl(std::io::BufWriter::new(std::fs::File::create(&jsonl)?))?;
        let mut out = String::new();
        out.push_str(&format!("run: {self}\n\n"));
        let reproduces = shown.is_some();
        match &shown {
            Some(again) => out.push_str(&format!(
                "this file ({} events of key {:?}, cut where no earlier operation can matter) fails on its own:\n{again}\n",
                cut.events.len(),
                v.key
            )),
            None => out.push_str(&format!(
                "the whole run's verdict (this cut of {} events does not fail on its own):\n{v}\n",
                cut.events.len()
            )),
        }
        out.push_str("events (id, client, invoke..complete in us from the first, op, outcome):\n");
        let t0 = cut.events.iter().map(|e| e.invoke_us).min().unwrap_or(0);
        for e in &cut.events {
            out.push_str(&render_event(e, t0));
            out.push('\n');
        }
        std::fs::write(&text, out)?;
        Ok(Some(FailureFiles {
            jsonl,
            text,
            key: v.key.clone(),
            events: cut.events.len(),
            reproduces,
        }))
    }
}

/// The cut of `history` to write for `v`, and the violation it shows on
/// its own (if it does).
fn cut_failure(
    history: &History,
    v: &Violation,
    options: &CheckOptions,
) -> (History, Option<Violation>) {
    let mut events: Vec<Event> = history
        .events
        .iter()
        .filter_map(|e| restrict_event(e, &v.key))
        .collect();
    events.sort_by_key(|e| (e.invoke_us, e.id));
    let fails = |evs: &[Event]| -> Option<Violation> {
        let h = History::new(evs.to_vec());
        let p = project::project(&h);
        match linear::check_key(&v.key, p.get(&v.key)?, &options.search()) {
            Verdict::Violation(found) => Some(*found),
            _ => None,
        }
    };
    let (_, end_us) = v.window_us();
    let upto = events.partition_point(|e| e.invoke_us <= end_us);
    let mut base = &events[..upto];
    if fails(base).is_none() {
        base = &events[..];
    }
    // A cut may start only where the key's history can be cut without
    // changing it: at an acknowledged SET/MSET/DEL of the key (it sets the
    // whole state) that every earlier operation completed before (none can
    // be linearized after it; an unknown one never completes). From there
    // the cut is exactly the whole history's behaviour.
    let mut quiet = vec![false; base.len()];
    let mut done_before = 0u64;
    for (i, e) in base.iter().enumerate() {
        let sets_all = matches!(e.op, Op::Set { .. } | Op::MSet { .. } | Op::Del { .. })
            && matches!(e.outcome, Outcome::Ok(_));
        quiet[i] = i == 0 || (sets_all && done_before <= e.invoke_us);
        done_before = done_before.max(e.complete_us.unwrap_or(u64::MAX));
    }
    let mut n = options.max_failure_events;
    loop {
        let mut from = base.len().saturating_sub(n);
        while !quiet[from] {
            from -= 1;
        }
        let cut = &base[from..];
        if let Some(found) = fails(cut) {
            return (History::new(cut.to_vec()), Some(found));
        }
        if from == 0 {
            return (History::new(cut.to_vec()), None);
        }
        n = (base.len() - from) * 2;
    }
}

/// One line for an event: `#id c3 +120..+340 SET k "v" -> OK`.
pub fn render_event(e: &Event, t0: u64) -> String {
    let done = e
        .complete_us
        .map_or("?".to_string(), |c| format!("+{}", c.saturating_sub(t0)));
    let op = match &e.op {
        Op::Set { key, value } => format!("SET {key} {value:?}"),
        Op::Get { key } => format!("GET {key}"),
        Op::Del { key } => format!("DEL {key}"),
        Op::Incr { key } => format!("INCR {key}"),
        Op::Append { key, value } => format!("APPEND {key} {value:?}"),
        Op::MSet { pairs } => {
            let parts: Vec<String> = pairs.iter().map(|(k, v)| format!("{k} {v:?}")).collect();
            format!("MSET {}", parts.join(" "))
        }
        Op::MGet { keys } => format!("MGET {}", keys.join(" ")),
    };
    let outcome = match &e.outcome {
        Outcome::Ok(r) => render_reply(r),
        Outcome::Failed => "failed".to_string(),
        Outcome::Unknown => "unknown".to_string(),
    };
    format!(
        "#{} c{} +{}..{} {} -> {}",
        e.id,
        e.client,
        e.invoke_us.saturating_sub(t0),
        done,
        op,
        outcome
    )
}

/// Up to three keys, quoted, then "...".
fn some_keys<'a>(keys: impl Iterator<Item = &'a str>) -> String {
    let keys: Vec<&str> = keys.collect();
    let mut s: Vec<String> = keys.iter().take(3).map(|k| format!("{k:?}")).collect();
    if keys.len() > 3 {
        s.push("...".to_string());
    }
    s.join(", ")
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.keys.len();
        match (&self.invalid, self.linearizable()) {
            (Some(why), _) => write!(f, "history INVALID: {why}")?,
            (None, Some(true)) => write!(f, "linearizable: yes ({n} keys)")?,
            (None, Some(false)) => {
                let bad: Vec<&str> = self.violations().map(|v| v.key.as_str()).collect();
                write!(
                    f,
                    "linearizable: NO ({} of {n} keys: {})",
                    bad.len(),
                    some_keys(bad.into_iter())
                )?;
            }
            (None, None) => {
                let over: Vec<&str> = self.undecided().map(|k| k.key.as_str()).collect();
                write!(
                    f,
                    "linearizable: UNDECIDED ({} of {n} keys over the search budget: {})",
                    over.len(),
                    some_keys(over.into_iter())
                )?;
            }
        }
        if self.invalid.is_none()
            && self.linearizable() == Some(false)
            && self.undecided().next().is_some()
        {
            write!(f, " (+{} undecided)", self.undecided().count())?;
        }
        let o = &self.outcomes;
        let t = &self.totals;
        write!(
            f,
            " | ops ok {} failed {} unknown {} | lost {} | double-incr {} | dup-incr {} | stale {} | torn-mget {}",
            o.ok,
            o.failed,
            o.unknown,
            t.lost_writes,
            t.double_incr,
            t.duplicate_incr_replies,
            t.stale_reads,
            t.torn_mgets
        )?;
        if !t.non_unique_keys.is_empty() {
            write!(
                f,
                " | non-unique values on {} keys",
                t.non_unique_keys.len()
            )?;
        }
        Ok(())
    }
}
