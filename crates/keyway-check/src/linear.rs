//! A linearizability checker for one key, in the Wing–Gong / Lowe (WGL)
//! style of Porcupine and Knossos.
//!
//! **Input.** The key's [`KeyEvent`]s (see [`crate::project`]). Failed
//! operations had no effect and are dropped; an unknown-outcome read
//! observed nothing and is dropped. What is left is *completed* operations
//! (a reply, an invoke and a return time) and *unknown* writes (an invoke
//! time, no return: they took effect once, at some moment after their
//! invoke, or never).
//!
//! **Search.** Every operation's invoke and return are entries in one
//! doubly linked list in time order. The search linearizes one operation
//! at a time: an operation may go next iff it was invoked before the first
//! return still in the list (no remaining operation finished before it
//! began). It runs the [`crate::model`] on the chosen operation; if the
//! model's reply matches the recorded one, the operation is lifted out of
//! the list and the search goes on; if no candidate fits, it backtracks.
//! The history is linearizable once every *completed* operation is placed:
//! unknown writes are optional (Porcupine's treatment), so the ones never
//! needed are never placed.
//!
//! **Pruning and order** (each keeps the search exact; the property tests
//! in `tests/random.rs` check both directions on random histories):
//! - Lowe's memoisation: a configuration is (completed operations placed,
//!   unknown operations placed, model state). One already explored, or on
//!   the current path, is not explored again. Because unknown operations
//!   are optional, a configuration is also skipped when one with the same
//!   completed set and state but a *subset* of its unknown operations was
//!   seen: that one has every option this one has.
//! - A completed operation that changes no state it fits (a read, an
//!   INCR error, a DEL that replied 0) and fits the state now is a forced
//!   move: in any linearization from here it can be moved to the front
//!   (nothing it must follow remains, and it changed nothing where it
//!   was), so no other candidate is tried at that point. (Not a SET of the
//!   value already there: where it really goes, it may change the state.)
//! - Completed candidates that fit are tried first, those whose new state
//!   a pending read observed before the others. Unknown candidates are
//!   only computed once those are used up (most configurations never get
//!   there).
//! - Interchangeable unknown operations, both invocable now, are tried
//!   once (the earliest): the same op (`INCR`, `DEL`, the same `SET`), or
//!   a SET/APPEND whose value no read ever shows and that makes the value
//!   a non-integer, of the same length ([`class_key`]).
//! - An unknown `SET` or `DEL` is never placed right after another unknown
//!   operation: placing it alone gives the same state with fewer unknowns
//!   used.
//! - An unknown operation is placed only if some completed candidate may
//!   fit after it (and after further unknown APPENDs/INCRs): the first
//!   completed operation after a run of unknown ones is one of the current
//!   candidates. A candidate SET (or a DEL that fits already) never needs
//!   one: it would end in the same state without it.
//!
//! What remains exponential: many clients on one key *and* many unknown
//! outcomes (the unknowns never expire, so each stays a candidate for the
//! rest of the history). Measured with the generator of `tests/random.rs`
//! (16 clients, debug build): 50k events on 10 keys with 10% unknown
//! decide in ~560k steps; 20k events on 4 keys with 20% unknown in ~950k;
//! 20k events on 2 keys with 10% unknown and long operations (~1000
//! unknowns per key) exceed 2M steps on a key and stay undecided. Spread
//! the workload over more keys rather than raise the budget.
//!
//! **Budget.** The search counts model evaluations; past
//! `max_search_steps` it stops with [`Verdict::Unknown`]. That is not a
//! pass: the report says the key could not be decided.
//!
//! **Report.** For a violation: the deepest point the search reached (the
//! longest linearizable prefix, its last few operations and the state after
//! it), the completed operation whose return bounds what can come next (it
//! could not be placed there), and the operations concurrent with it, each
//! with the reply the model predicts in that state.
//!
//! Real-time order uses one rule everywhere: `y` precedes `x` iff
//! `y.complete_us <= x.invoke_us` (the recorder takes both on one
//! monotonic clock; a zero-length operation is taken as concurrent with
//! everything invoked in its microsecond).

use crate::history::{Outcome, Reply};
use crate::model::{self, KeyOp, State};
use crate::project::KeyEvent;
use crate::unknowns::{ClassKey, class_key, may_fit_after_chain};
use crate::violation::REPORT_CONCURRENT_OPS;
pub use crate::violation::{Violation, render_key_event, render_reply};
use std::collections::{BTreeSet, HashMap};

/// The knobs of one key's search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchOptions {
    /// Model evaluations per key before the search gives up with
    /// [`Verdict::Unknown`].
    pub max_search_steps: u64,
    /// How many operations of the longest linearizable prefix a violation
    /// report shows.
    pub report_prefix_ops: usize,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            max_search_steps: 2_000_000,
            report_prefix_ops: 8,
        }
    }
}

/// The answer for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable {
        steps: u64,
    },
    Violation(Box<Violation>),
    /// The step budget ran out: the key is not decided (not a pass).
    Unknown {
        steps: u64,
        /// Completed operations placed at the deepest point reached.
        linearized: usize,
        completed: usize,
    },
}

impl Verdict {
    pub fn steps(&self) -> u64 {
        match self {
            Verdict::Linearizable { steps } | Verdict::Unknown { steps, .. } => *steps,
            Verdict::Violation(v) => v.steps,
        }
    }
}

/// A completed operation. Times are doubled so that one comparison gives
/// the real-time rule: `call = 2 * invoke + 1`, `ret = 2 * complete`.
struct Done {
    op: KeyOp,
    reply: Reply,
    call: u64,
    ret: u64,
    ev: usize,
}

/// An unknown-outcome write.
struct Unk {
    op: KeyOp,
    call: u64,
    ev: usize,
    /// Interchangeable unknowns (the same op) share a class.
    class: usize,
    /// SET or DEL: the state after it does not depend on the state before.
    overwrites: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cand {
    Done(usize),
    Unk(usize),
}

/// A move taken: the candidate placed and what to restore when undone.
struct Frame {
    cand: Cand,
    prev_state: u32,
    prev_hi: usize,
}

/// The candidates of one configuration, in the order they are tried, each
/// with the state it leads to; `next` is the first not yet tried.
struct Level {
    cands: Vec<(Cand, u32)>,
    next: usize,
    /// The unknown ops are added to `cands` only once the completed ones
    /// are used up (most configurations never get there): until then,
    /// the first return still in the list, and whether the last move
    /// placed an unknown op.
    unknowns_pending: Option<(u64, bool)>,
}

fn prepare(events: &[KeyEvent]) -> (Vec<Done>, Vec<Unk>) {
    let mut done = Vec::new();
    let mut unk = Vec::new();
    let mut classes: HashMap<ClassKey, usize> = HashMap::new();
    // Every value a completed read returned, to tell which unknown writes
    // no read ever shows.
    let mut read_values = String::new();
    for e in events {
        if let (KeyOp::Get, Outcome::Ok(Reply::Value(Some(v)))) = (&e.op, &e.outcome) {
            read_values.push_str(v);
            read_values.push('\0');
        }
    }
    for (i, e) in events.iter().enumerate() {
        match (&e.outcome, e.complete_us) {
            (Outcome::Ok(reply), Some(complete)) => {
                let call = 2 * e.invoke_us + 1;
                let mut ret = 2 * complete;
                if ret < call {
                    // complete == invoke: concurrent with its own microsecond.
                    ret = call + 1;
                }
                done.push(Done {
                    op: e.op.clone(),
                    reply: reply.clone(),
                    call,
                    ret,
                    ev: i,
                });
            }
            (Outcome::Unknown, _) if e.op.is_write() => {
                let n = classes.len();
                let class = *classes.entry(class_key(&e.op, &read_values)).or_insert(n);
                unk.push(Unk {
                    op: e.op.clone(),
                    call: 2 * e.invoke_us + 1,
                    ev: i,
                    class,
                    overwrites: matches!(e.op, KeyOp::Set(_) | KeyOp::Del),
                });
            }
            _ => {}
        }
    }
    done.sort_by_key(|d| (d.call, d.ev));
    unk.sort_by_key(|u| (u.call, u.ev));
    (done, unk)
}

/// Entry `e` is a call (even) or a return (odd).
fn is_call(e: usize) -> bool {
    e & 1 == 0
}

/// The entries of the completed operations: op `j` has call entry `2j`
/// and return entry `2j + 1`; `head` and `tail` are sentinels.
struct List {
    next: Vec<usize>,
    prev: Vec<usize>,
    time: Vec<u64>,
    head: usize,
    tail: usize,
}

impl List {
    fn new(done: &[Done]) -> List {
        let n = 2 * done.len();
        let time: Vec<u64> = (0..n)
            .map(|e| {
                if is_call(e) {
                    done[e / 2].call
                } else {
                    done[e / 2].ret
                }
            })
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&e| (time[e], e));
        let (head, tail) = (n, n + 1);
        let mut next = vec![tail; n + 2];
        let mut prev = vec![head; n + 2];
        let mut last = head;
        for &e in &order {
            next[last] = e;
            prev[e] = last;
            last = e;
        }
        next[last] = tail;
        prev[tail] = last;
        List {
            next,
            prev,
            time,
            head,
            tail,
        }
    }

    fn unlink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = n;
        self.prev[n] = p;
    }

    fn relink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = e;
        self.prev[n] = e;
    }

    fn lift(&mut self, j: usize) {
        self.unlink(2 * j);
        self.unlink(2 * j + 1);
    }

    fn unlift(&mut self, j: usize) {
        self.relink(2 * j + 1);
        self.relink(2 * j);
    }
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A remembered configuration: the state and `[prefix, n_extras,
/// extras.., unknowns..]`: completed ops `0..prefix` all placed plus the
/// `extras` beyond it, and the placed unknown ops (both sorted).
struct Seen {
    state: u32,
    key: Box<[u32]>,
}

struct Search<'a> {
    done: &'a [Done],
    unk: &'a [Unk],
    list: List,
    placed: Vec<u64>,
    prefix: usize,
    hi: usize,
    placed_unk: Vec<u32>,
    unk_free: Vec<BTreeSet<usize>>,
    /// Zobrist hash of the placed completed ops.
    hash: u64,
    states: Vec<State>,
    state_ids: HashMap<State, u32>,
    seen: HashMap<u64, Vec<Seen>>,
    /// The key has unknown APPENDs / INCRs (chains of them can follow an
    /// unknown op).
    unk_appends: bool,
    unk_incrs: bool,
}

impl<'a> Search<'a> {
    fn new(done: &'a [Done], unk: &'a [Unk]) -> Self {
        let classes = unk.iter().map(|u| u.class + 1).max().unwrap_or(0);
        let mut unk_free = vec![BTreeSet::new(); classes];
        for (i, u) in unk.iter().enumerate() {
            unk_free[u.class].insert(i);
        }
        let mut state_ids = HashMap::new();
        state_ids.insert(None, 0);
        Search {
            done,
            unk,
            list: List::new(done),
            placed: vec![0; done.len().div_ceil(64)],
            prefix: 0,
            hi: 0,
            placed_unk: Vec::new(),
            unk_free,
            hash: 0,
            states: vec![None],
            state_ids,
            seen: HashMap::new(),
            unk_appends: unk.iter().any(|u| matches!(u.op, KeyOp::Append(_))),
            unk_incrs: unk.iter().any(|u| u.op == KeyOp::Incr),
        }
    }

    fn intern(&mut self, s: State) -> u32 {
        if let Some(&id) = self.state_ids.get(&s) {
            return id;
        }
        let id = u32::try_from(self.states.len()).expect("fewer than 2^32 states");
        self.states.push(s.clone());
        self.state_ids.insert(s, id);
        id
    }

    fn is_placed(&self, j: usize) -> bool {
        self.placed[j / 64] & (1 << (j % 64)) != 0
    }

    /// The candidates of the current configuration (state `state`; the
    /// last move placed an unknown op if `after_unknown`), in trying order:
    /// a forced move alone if there is one; else the completed ops that
    /// fit, those whose new state some read candidate observes first; then
    /// the unknown ops, likewise. Returns the level and the model steps run.
    fn expand(&mut self, state: u32, after_unknown: bool) -> (Level, u64) {
        let mut steps = 0;
        let mut writes: Vec<(Cand, u32)> = Vec::new();
        let mut e = self.list.next[self.list.head];
        while e != self.list.tail && is_call(e) {
            let j = e / 2;
            e = self.list.next[e];
            let d = &self.done[j];
            steps += 1;
            let before = &self.states[state as usize];
            let next = if d.op.is_write() {
                let (next, expected) = model::step(before, &d.op);
                if !model::matches(&expected, &d.reply) {
                    continue;
                }
                self.intern(next)
            } else if model::fits(before, &d.op, &d.reply) {
                state
            } else {
                continue;
            };
            if next == state && model::preserves_state(&d.op, &d.reply) {
                // Fits, and changes nothing wherever it fits: a forced move.
                return (
                    Level {
                        cands: vec![(Cand::Done(j), state)],
                        next: 0,
                        unknowns_pending: None,
                    },
                    steps,
                );
            }
            writes.push((Cand::Done(j), next));
        }
        let t_min = if e == self.list.tail {
            u64::MAX
        } else {
            self.list.time[e]
        };
        let cands = demanded_first(writes, &self.wanted(state));
        (
            Level {
                cands,
                next: 0,
                unknowns_pending: Some((t_min, after_unknown)),
            },
            steps,
        )
    }

    /// The states the read candidates observed (known states only).
    fn wanted(&self, state: u32) -> Vec<u32> {
        let mut wanted = Vec::new();
        let mut r = self.list.next[self.list.head];
        while r != self.list.tail && is_call(r) {
            let d = &self.done[r / 2];
            if let (KeyOp::Get, Reply::Value(v)) = (&d.op, &d.reply)
                && let Some(&id) = self.state_ids.get(v)
                && id != state
            {
                wanted.push(id);
            }
            r = self.list.next[r];
        }
        wanted
    }

    /// The unknown candidates of a configuration whose completed ones are
    /// used up: the earliest free op of each class invoked before `t_min`
    /// (no SET or DEL right after another unknown op), those leading to a
    /// state a read candidate observed first. Returns them and the model
    /// steps run.
    fn unknown_candidates(
        &mut self,
        state: u32,
        t_min: u64,
        after_unknown: bool,
    ) -> (Vec<(Cand, u32)>, u64) {
        let mut steps = 0;
        // The completed candidates an unknown op could be placed for: not
        // a SET, nor a DEL that fits already.
        let before = &self.states[state as usize];
        let mut needy: Vec<usize> = Vec::new();
        let mut e = self.list.next[self.list.head];
        while e != self.list.tail && is_call(e) {
            let j = e / 2;
            e = self.list.next[e];
            let d = &self.done[j];
            let settled = match d.op {
                KeyOp::Set(_) => true,
                KeyOp::Del => model::fits(before, &d.op, &d.reply),
                _ => false,
            };
            if !settled {
                needy.push(j);
            }
        }
        let mut unknowns: Vec<(Cand, u32)> = Vec::new();
        if needy.is_empty() {
            return (unknowns, steps);
        }
        for class in 0..self.unk_free.len() {
            let Some(&u) = self.unk_free[class].first() else {
                continue;
            };
            let x = &self.unk[u];
            if x.call >= t_min || (x.overwrites && after_unknown) {
                continue;
            }
            steps += 1;
            let (next, _) = model::step(&self.states[state as usize], &x.op);
            let next = self.intern(next);
            if next == state {
                continue;
            }
            let after = &self.states[next as usize];
            for &j in &needy {
                steps += 1;
                let d = &self.done[j];
                if may_fit_after_chain(after, &d.op, &d.reply, self.unk_appends, self.unk_incrs) {
                    unknowns.push((Cand::Unk(u), next));
                    break;
                }
            }
        }
        (demanded_first(unknowns, &self.wanted(state)), steps)
    }

    fn place(&mut self, c: Cand) {
        match c {
            Cand::Done(j) => {
                self.placed[j / 64] |= 1 << (j % 64);
                self.hash ^= mix(j as u64);
                self.hi = self.hi.max(j);
                while self.prefix < self.done.len() && self.is_placed(self.prefix) {
                    self.prefix += 1;
                }
            }
            Cand::Unk(u) => {
                let u32_ = u as u32;
                let at = self.placed_unk.binary_search(&u32_).unwrap_err();
                self.placed_unk.insert(at, u32_);
                self.unk_free[self.unk[u].class].remove(&u);
            }
        }
    }

    fn unplace(&mut self, c: Cand) {
        match c {
            Cand::Done(j) => {
                self.placed[j / 64] &= !(1 << (j % 64));
                self.hash ^= mix(j as u64);
                self.prefix = self.prefix.min(j);
            }
            Cand::Unk(u) => {
                let at = self.placed_unk.binary_search(&(u as u32)).expect("placed");
                self.placed_unk.remove(at);
                self.unk_free[self.unk[u].class].insert(u);
            }
        }
    }

    /// Remembers the current configuration with `state`; false if it (or
    /// one that dominates it) was seen before.
    fn remember(&mut self, state: u32) -> bool {
        let mut key: Vec<u32> = vec![self.prefix as u32, 0];
        if self.prefix < self.done.len() {
            for j in self.prefix..=self.hi.max(self.prefix) {
                if self.is_placed(j) {
                    key.push(j as u32);
                }
            }
        }
        key[1] = (key.len() - 2) as u32;
        let done_len = key.len();
        // The bucket depends on the completed ops and the state only: the
        // unknown ops are compared as sets (dominance).
        let bucket = self
            .seen
            .entry(self.hash ^ mix(u64::from(state)))
            .or_default();
        for s in bucket.iter() {
            if s.state == state
                && s.key.len() >= 2
                && s.key[..(2 + s.key[1] as usize)] == key[..]
                && is_subset(&s.key[done_len..], &self.placed_unk)
            {
                return false;
            }
        }
        key.extend_from_slice(&self.placed_unk);
        bucket.push(Seen {
            state,
            key: key.into_boxed_slice(),
        });
        true
    }
}

/// `cands` with those leading to a `wanted` state first (else in order).
fn demanded_first(cands: Vec<(Cand, u32)>, wanted: &[u32]) -> Vec<(Cand, u32)> {
    let (mut hit, miss): (Vec<_>, Vec<_>) =
        cands.into_iter().partition(|(_, st)| wanted.contains(st));
    hit.extend(miss);
    hit
}

fn is_subset(small: &[u32], big: &[u32]) -> bool {
    let mut it = big.iter();
    small.iter().all(|x| it.any(|y| y == x))
}

/// Decides whether `events` (one key's projection) is linearizable.
pub fn check_key(key: &str, events: &[KeyEvent], options: &SearchOptions) -> Verdict {
    let (done, unk) = prepare(events);
    if done.is_empty() {
        return Verdict::Linearizable { steps: 0 };
    }
    let mut s = Search::new(&done, &unk);
    let mut path: Vec<Frame> = Vec::new();
    let mut levels: Vec<Level> = Vec::new();
    let mut state: u32 = 0;
    let mut remaining = done.len();
    let mut best: Vec<Cand> = Vec::new();
    let mut best_placed = 0;
    let mut steps: u64 = 0;
    let mut expand = true;
    s.remember(state);
    loop {
        if remaining == 0 {
            return Verdict::Linearizable { steps };
        }
        if steps > options.max_search_steps {
            return Verdict::Unknown {
                steps,
                linearized: best_placed,
                completed: done.len(),
            };
        }
        if expand {
            let after_unknown = matches!(
                path.last(),
                Some(Frame {
                    cand: Cand::Unk(_),
                    ..
                })
            );
            let (level, n) = s.expand(state, after_unknown);
            steps += n;
            levels.push(level);
            expand = false;
        }
        let level = levels
            .last_mut()
            .expect("a level per configuration on the path");
        if level.next == level.cands.len()
            && let Some((t_min, after_unknown)) = level.unknowns_pending.take()
        {
            let (more, n) = s.unknown_candidates(state, t_min, after_unknown);
            steps += n;
            level.cands.extend(more);
        }
        let Some(&(cand, new_state)) = level.cands.get(level.next) else {
            levels.pop();
            let Some(f) = path.pop() else {
                return Verdict::Violation(Box::new(report(
                    key, events, &done, &unk, &best, steps, options,
                )));
            };
            s.unplace(f.cand);
            if let Cand::Done(j) = f.cand {
                s.list.unlift(j);
                remaining += 1;
            }
            state = f.prev_state;
            s.hi = f.prev_hi;
            continue;
        };
        level.next += 1;
        let prev_hi = s.hi;
        s.place(cand);
        if !s.remember(new_state) {
            s.unplace(cand);
            s.hi = prev_hi;
            continue;
        }
        path.push(Frame {
            cand,
            prev_state: state,
            prev_hi,
        });
        state = new_state;
        if let Cand::Done(j) = cand {
            s.list.lift(j);
            remaining -= 1;
            if done.len() - remaining > best_placed {
                best_placed = done.len() - remaining;
                best.clear();
                best.extend(path.iter().map(|f| f.cand));
            }
        }
        expand = true;
    }
}

/// Builds the violation report from the deepest linearization found.
fn report(
    key: &str,
    events: &[KeyEvent],
    done: &[Done],
    unk: &[Unk],
    best: &[Cand],
    steps: u64,
    options: &SearchOptions,
) -> Violation {
    let mut state: State = None;
    let mut placed_done = vec![false; done.len()];
    let mut placed_unk = vec![false; unk.len()];
    let mut tail: Vec<(KeyEvent, State)> = Vec::new();
    for &c in best {
        let (op, ev) = match c {
            Cand::Done(j) => {
                placed_done[j] = true;
                (&done[j].op, done[j].ev)
            }
            Cand::Unk(u) => {
                placed_unk[u] = true;
                (&unk[u].op, unk[u].ev)
            }
        };
        state = model::step(&state, op).0;
        tail.push((events[ev].clone(), state.clone()));
    }
    let linearized = placed_done.iter().filter(|p| **p).count();
    let skip = tail.len().saturating_sub(options.report_prefix_ops);
    let prefix_tail = tail.split_off(skip);
    let blocking_j = (0..done.len())
        .filter(|&j| !placed_done[j])
        .min_by_key(|&j| (done[j].ret, j))
        .expect("a violation leaves a completed operation unplaced");
    let t_min = done[blocking_j].ret;
    let expected = model::step(&state, &done[blocking_j].op).1;
    let mut concurrent: Vec<(u64, KeyEvent, Reply)> = Vec::new();
    for (j, d) in done.iter().enumerate() {
        if !placed_done[j] && j != blocking_j && d.call < t_min {
            concurrent.push((d.call, events[d.ev].clone(), model::step(&state, &d.op).1));
        }
    }
    for (u, x) in unk.iter().enumerate() {
        if !placed_unk[u] && x.call < t_min {
            concurrent.push((x.call, events[x.ev].clone(), model::step(&state, &x.op).1));
        }
    }
    concurrent.sort_by_key(|(call, e, _)| (*call, e.id));
    let skip = concurrent.len().saturating_sub(REPORT_CONCURRENT_OPS);
    Violation {
        key: key.to_string(),
        steps,
        linearized,
        completed: done.len(),
        prefix_tail,
        state,
        blocking: events[done[blocking_j].ev].clone(),
        expected,
        concurrent: concurrent
            .into_iter()
            .skip(skip)
            .map(|(_, e, r)| (e, r))
            .collect(),
    }
}
