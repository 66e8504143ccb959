//! The simple totals of a run: lost acknowledged writes, double-applied
//! INCRs, stale reads and torn MGETs.
//!
//! The linearizability search ([`crate::linear`]) is the verdict; these
//! totals name the *kind* of damage in words a person counts. Each counts
//! only **definite** anomalies: a history that is linearizable always has
//! every total at zero (each rule below shows an impossibility in every
//! linearization). They may miss anomalies the search finds.
//!
//! Real-time order is the checker's one rule: `y` precedes `x` iff
//! `y.complete_us <= x.invoke_us`. "Write" means a non-failed SET, MSET
//! (each key), DEL, INCR or APPEND; an unknown write may take effect at any
//! moment after its invoke. A history starts on an empty store.
//!
//! - **Lost acknowledged write.** An acknowledged SET/MSET/DEL `A` of key
//!   `k` and a read `R` of `k` (GET, or an MGET's value for `k`) invoked
//!   after `A` completed, such that every other write of `k` that could
//!   come before `R` (invoked before `R` completed) certainly came before
//!   `A` (completed before `A` was invoked). Then `A` is the last write
//!   before `R` in every linearization, so `R` must return `A`'s value (nil
//!   for DEL); if it does not, `A` was lost. For an acknowledged APPEND
//!   the rule is the same but other APPENDs may come between (only SET,
//!   MSET, DEL and INCR writes count as overwriting): `R` must then contain
//!   `A`'s value. (An APPEND is checked against the first and the last
//!   read it qualifies for; a SET or DEL against every one.) Counted once
//!   per lost write. Needs no assumption on values.
//! - **Double-applied INCR.** On a *counter key* (every write of it is an
//!   INCR), an observation of `n` (an INCR's reply, or a read of the
//!   integer `n`) at operation `X` while only `m < n` INCRs (acknowledged
//!   or unknown) were invoked before `X` completed means at least `n - m`
//!   INCRs were applied more than once. The total is the sum over counter
//!   keys of the largest such excess. Separately, two acknowledged INCRs of
//!   one key with the same reply mean one of them did not apply on top of
//!   the other (a lost or duplicated increment): counted as
//!   `duplicate_incr_replies` (replies minus distinct replies).
//! - **Stale read.** On a key written only by SET/MSET/DEL with **unique
//!   values** (no two writes of the key write the same value), a read that
//!   returned `v` although another acknowledged SET/MSET/DEL of the key
//!   started after `v`'s only writer completed and itself completed before
//!   the read was invoked: `v` was certainly overwritten before the read.
//! - **Torn MGET.** On such keys, an MGET whose values for keys `a` and `b`
//!   come from two different MSETs each of which wrote both `a` and `b`:
//!   whichever MSET is later overwrote the other's value on both keys, so
//!   no single instant shows both (MSET/MGET are atomic in Keyway). This is
//!   the one cross-key check; the per-key search cannot see it.
//!
//! The unique-values assumption is checked, not trusted: a key where two
//! writes carry the same value is listed in [`Totals::non_unique_keys`] and
//! skipped by the stale and torn rules (the lost-write and INCR rules do
//! not need it).

use crate::history::{Event, History, Op, Outcome, Reply};
use crate::model::{KeyOp, parse_i64};
use crate::project::KeyEvent;
use std::collections::{BTreeMap, HashMap, HashSet};

/// How many findings of each kind [`Totals::examples`] keeps.
pub const MAX_EXAMPLES_PER_KIND: usize = 5;

/// The kind of a [`Finding`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FindingKind {
    LostWrite,
    DoubleIncr,
    DuplicateIncrReply,
    StaleRead,
    TornMget,
}

/// One anomaly, for a person: the key, the events involved, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub kind: FindingKind,
    pub key: String,
    pub ids: Vec<u64>,
    pub detail: String,
}

/// The totals of one history (see the module doc for each rule).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    pub lost_writes: usize,
    pub double_incr: u64,
    pub duplicate_incr_replies: usize,
    pub stale_reads: usize,
    pub torn_mgets: usize,
    /// Keys whose writes do not carry unique values: skipped by the stale
    /// and torn rules.
    pub non_unique_keys: Vec<String>,
    /// The first few findings of each kind.
    pub examples: Vec<Finding>,
}

impl Totals {
    /// True if every total is zero.
    pub fn clean(&self) -> bool {
        self.lost_writes == 0
            && self.double_incr == 0
            && self.duplicate_incr_replies == 0
            && self.stale_reads == 0
            && self.torn_mgets == 0
    }

    fn note(&mut self, kind: FindingKind, key: &str, ids: Vec<u64>, detail: String) {
        if self.examples.iter().filter(|f| f.kind == kind).count() < MAX_EXAMPLES_PER_KIND {
            self.examples.push(Finding {
                kind,
                key: key.to_string(),
                ids,
                detail,
            });
        }
    }
}

/// An end time where unknown means "never".
fn end(e: &KeyEvent) -> u64 {
    e.complete_us.unwrap_or(u64::MAX)
}

fn acked(e: &KeyEvent) -> bool {
    matches!(&e.outcome, Outcome::Ok(r) if !matches!(r, Reply::Error(_)))
}

/// Reads of a key that returned a value: (event, value).
fn reads(events: &[KeyEvent]) -> Vec<(&KeyEvent, &Option<String>)> {
    events
        .iter()
        .filter(|e| e.op == KeyOp::Get)
        .filter_map(|e| match &e.outcome {
            Outcome::Ok(Reply::Value(v)) => Some((e, v)),
            _ => None,
        })
        .collect()
}

/// Writes sorted by invoke with the running maximum of their ends: for a
/// read completing at `t`, `before(t)` is how many could come before it.
struct ByInvoke<'a> {
    writes: Vec<&'a KeyEvent>,
    max_end: Vec<u64>,
}

impl<'a> ByInvoke<'a> {
    fn new(mut writes: Vec<&'a KeyEvent>) -> Self {
        writes.sort_by_key(|e| (e.invoke_us, e.id));
        let mut max_end = Vec::with_capacity(writes.len());
        let mut m = 0;
        for w in &writes {
            m = m.max(end(w));
            max_end.push(m);
        }
        ByInvoke { writes, max_end }
    }

    /// How many writes were invoked before `t`.
    fn before(&self, t: u64) -> usize {
        self.writes.partition_point(|w| w.invoke_us < t)
    }

    /// The latest end among the first `n` writes (0 if none).
    fn max_end_of(&self, n: usize) -> u64 {
        if n == 0 { 0 } else { self.max_end[n - 1] }
    }
}

/// Computes every total of `history`, given its per-key projection.
pub fn totals(history: &History, projected: &BTreeMap<String, Vec<KeyEvent>>) -> Totals {
    let mut t = Totals::default();
    let mut writers: HashMap<&str, HashMap<&str, u64>> = HashMap::new();
    for (key, events) in projected {
        lost_writes(key, events, &mut t);
        incr_totals(key, events, &mut t);
        if let Some(w) = unique_writers(key, events, &mut t) {
            stale_reads(key, events, &w, &mut t);
            writers.insert(key, w);
        }
    }
    torn_mgets(history, &writers, &mut t);
    t
}

fn lost_writes(key: &str, events: &[KeyEvent], t: &mut Totals) {
    let writes: Vec<&KeyEvent> = events
        .iter()
        .filter(|e| e.op.is_write() && e.outcome != Outcome::Failed)
        .collect();
    let all = ByInvoke::new(writes.clone());
    let overwriters = ByInvoke::new(
        writes
            .iter()
            .copied()
            .filter(|e| !matches!(e.op, KeyOp::Append(_)))
            .collect(),
    );
    let mut reads = reads(events);
    reads.sort_by_key(|(r, _)| (end(r), r.id));
    // A write event touches its key once, so its id names it here.
    let mut lost: HashSet<u64> = HashSet::new();
    let mut report = |t: &mut Totals, a: &KeyEvent, r: &KeyEvent, v: &Option<String>| {
        if lost.insert(a.id) {
            t.lost_writes += 1;
            t.note(
                FindingKind::LostWrite,
                key,
                vec![a.id, r.id],
                format!(
                    "acknowledged {} (#{}) was the last write before read #{}, which returned {:?}",
                    a.op, a.id, r.id, v
                ),
            );
        }
    };
    // SET and DEL: the one write that may be last before each read.
    for &(r, v) in &reads {
        let n = all.before(end(r));
        if n == 0 {
            continue;
        }
        let a = all.writes[n - 1];
        if !acked(a) || end(a) > r.invoke_us || all.max_end_of(n - 1) > a.invoke_us {
            continue;
        }
        let expected = match &a.op {
            KeyOp::Set(x) => Some(x),
            KeyOp::Del => None,
            _ => continue,
        };
        if v.as_ref() != expected {
            report(t, a, r, v);
        }
    }
    // APPEND: its value must be inside every read it qualifies for.
    for a in writes.iter().copied() {
        let KeyOp::Append(x) = &a.op else { continue };
        if !acked(a) {
            continue;
        }
        let qualifies = |r: &KeyEvent| {
            end(a) <= r.invoke_us
                && overwriters.max_end_of(overwriters.before(end(r))) <= a.invoke_us
        };
        let first = reads.iter().find(|(r, _)| end(a) <= r.invoke_us);
        let last = reads.last();
        for &(r, v) in first.into_iter().chain(last) {
            if qualifies(r) && !v.as_ref().is_some_and(|s| s.contains(x.as_str())) {
                report(t, a, r, v);
            }
        }
    }
}

fn incr_totals(key: &str, events: &[KeyEvent], t: &mut Totals) {
    let writes: Vec<&KeyEvent> = events
        .iter()
        .filter(|e| e.op.is_write() && e.outcome != Outcome::Failed)
        .collect();
    if writes.is_empty() || writes.iter().any(|e| e.op != KeyOp::Incr) {
        return;
    }
    let incrs = ByInvoke::new(writes);
    let mut observations: Vec<(&KeyEvent, i64)> = Vec::new();
    let mut replies: HashMap<i64, Vec<u64>> = HashMap::new();
    for e in events {
        match (&e.op, &e.outcome) {
            (KeyOp::Incr, Outcome::Ok(Reply::Int(n))) => {
                observations.push((e, *n));
                replies.entry(*n).or_default().push(e.id);
            }
            (KeyOp::Get, Outcome::Ok(Reply::Value(Some(s)))) => {
                if let Some(n) = parse_i64(s.as_bytes()) {
                    observations.push((e, n));
                }
            }
            _ => {}
        }
    }
    let mut worst: Option<(u64, &KeyEvent, i64, usize)> = None;
    for (e, n) in observations {
        let bound = incrs.before(end(e));
        let excess = n.saturating_sub(bound as i64);
        if excess > 0 && worst.is_none_or(|w| excess as u64 > w.0) {
            worst = Some((excess as u64, e, n, bound));
        }
    }
    if let Some((excess, e, n, bound)) = worst {
        t.double_incr += excess;
        t.note(
            FindingKind::DoubleIncr,
            key,
            vec![e.id],
            format!(
                "#{} saw {n} although only {bound} INCRs had been invoked before it completed",
                e.id
            ),
        );
    }
    let mut dups: Vec<(i64, Vec<u64>)> = replies
        .into_iter()
        .filter(|(_, ids)| ids.len() > 1)
        .collect();
    dups.sort();
    for (n, ids) in dups {
        t.duplicate_incr_replies += ids.len() - 1;
        t.note(
            FindingKind::DuplicateIncrReply,
            key,
            ids.clone(),
            format!("{} acknowledged INCRs all returned {n}", ids.len()),
        );
    }
}

/// For a key written only by SET/MSET/DEL: each SET value's one writer
/// (event id). `None` if the key has other writes, or (noted in
/// `non_unique_keys`) a value written twice.
fn unique_writers<'a>(
    key: &str,
    events: &'a [KeyEvent],
    t: &mut Totals,
) -> Option<HashMap<&'a str, u64>> {
    let mut writers = HashMap::new();
    for e in events
        .iter()
        .filter(|e| e.op.is_write() && e.outcome != Outcome::Failed)
    {
        match &e.op {
            KeyOp::Set(v) => {
                if writers.insert(v.as_str(), e.id).is_some() {
                    t.non_unique_keys.push(key.to_string());
                    return None;
                }
            }
            KeyOp::Del => {}
            _ => return None,
        }
    }
    Some(writers)
}

fn stale_reads(key: &str, events: &[KeyEvent], writers: &HashMap<&str, u64>, t: &mut Totals) {
    let by_id: HashMap<u64, &KeyEvent> = events
        .iter()
        .filter(|e| e.op.is_write())
        .map(|e| (e.id, e))
        .collect();
    // Acknowledged writes by end, with the running latest invoke.
    let mut acked_writes: Vec<&KeyEvent> = events
        .iter()
        .filter(|e| e.op.is_write() && acked(e))
        .collect();
    acked_writes.sort_by_key(|e| (end(e), e.id));
    let mut latest: Vec<&KeyEvent> = Vec::with_capacity(acked_writes.len());
    for w in &acked_writes {
        match latest.last() {
            Some(&l) if l.invoke_us >= w.invoke_us => latest.push(l),
            _ => latest.push(w),
        }
    }
    for (r, v) in reads(events) {
        let Some(v) = v else { continue };
        let Some(w) = writers.get(v.as_str()).and_then(|id| by_id.get(id)) else {
            continue;
        };
        let Some(w_end) = w.complete_us else { continue };
        let n = acked_writes.partition_point(|x| end(x) <= r.invoke_us);
        if n == 0 {
            continue;
        }
        let w2 = latest[n - 1];
        if w2.invoke_us >= w_end && w2.id != w.id {
            t.stale_reads += 1;
            t.note(
                FindingKind::StaleRead,
                key,
                vec![r.id, w.id, w2.id],
                format!(
                    "read #{} returned {v:?} (written by #{}) although #{} ({}) started after #{} and completed before the read",
                    r.id, w.id, w2.id, w2.op, w.id
                ),
            );
        }
    }
}

fn torn_mgets(history: &History, writers: &HashMap<&str, HashMap<&str, u64>>, t: &mut Totals) {
    let msets: HashMap<u64, &Event> = history
        .events
        .iter()
        .filter(|e| matches!(e.op, Op::MSet { .. }) && e.outcome != Outcome::Failed)
        .map(|e| (e.id, e))
        .collect();
    let wrote =
        |id: u64, key: &str| -> bool { msets.get(&id).is_some_and(|e| e.op.keys().contains(&key)) };
    for e in &history.events {
        let (Op::MGet { keys }, Outcome::Ok(Reply::Values(vs))) = (&e.op, &e.outcome) else {
            continue;
        };
        if vs.len() != keys.len() {
            continue;
        }
        let seen: Vec<(&str, u64)> = keys
            .iter()
            .zip(vs)
            .filter_map(|(k, v)| {
                let w = writers.get(k.as_str())?.get(v.as_deref()?)?;
                Some((k.as_str(), *w))
            })
            .collect();
        let torn = seen.iter().enumerate().find_map(|(i, &(a, wa))| {
            seen[i + 1..]
                .iter()
                .find(|&&(b, wb)| {
                    a != b
                        && wa != wb
                        && wrote(wa, b)
                        && wrote(wb, a)
                        && wrote(wa, a)
                        && wrote(wb, b)
                })
                .map(|&(b, wb)| (a, wa, b, wb))
        });
        if let Some((a, wa, b, wb)) = torn {
            t.torn_mgets += 1;
            t.note(
                FindingKind::TornMget,
                a,
                vec![e.id, wa, wb],
                format!("MGET #{} saw {a:?} from MSET #{wa} and {b:?} from MSET #{wb}; each MSET wrote both", e.id),
            );
        }
    }
}
