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
//! **Pruning** (each keeps the search exact):
//! - Lowe's memoisation: a configuration is (completed operations placed,
//!   unknown operations placed, model state). One already explored, or on
//!   the current path, is not explored again. Because unknown operations
//!   are optional, a configuration is also skipped when one with the same
//!   completed set and state but a *subset* of its unknown operations was
//!   seen: that one has every option this one has.
//! - Completed candidates are tried before unknown ones, so a history that
//!   needs no unknown write never pays for them.
//! - Two unknown operations with the same op (`INCR`, `DEL`, the same
//!   `SET`), both invocable now, are interchangeable: only the earliest is
//!   tried.
//! - An unknown `SET` or `DEL` is never placed right after another unknown
//!   operation: placing it alone gives the same state with fewer unknowns
//!   used (a configuration the previous rule's dominance covers).
//!
//! **Budget.** The search counts candidate attempts; past
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
use std::collections::{BTreeSet, HashMap};

/// The knobs of one key's search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchOptions {
    /// Candidate attempts per key before the search gives up with
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

/// Why a key's history is not linearizable, cut down for a person to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub key: String,
    pub steps: u64,
    /// Completed operations the longest linearization placed, of `completed`.
    pub linearized: usize,
    pub completed: usize,
    /// The last operations of that linearization, oldest first, each with
    /// the state after it.
    pub prefix_tail: Vec<(KeyEvent, State)>,
    /// The state after the whole prefix.
    pub state: State,
    /// The completed operation that returned first among those not placed:
    /// nothing invoked after its return can come before it, and it does not
    /// fit the state.
    pub blocking: KeyEvent,
    /// The reply the model predicts for `blocking` in `state`.
    pub expected: Reply,
    /// The other operations that could have gone next (invoked before
    /// `blocking` returned, not placed), with the reply the model predicts
    /// for each in `state`; the latest-invoked few.
    pub concurrent: Vec<(KeyEvent, Reply)>,
}

/// How many concurrent operations a violation report lists.
const REPORT_CONCURRENT_OPS: usize = 16;

impl Violation {
    /// The time span the report covers: the first prefix operation's (or
    /// the blocking one's) invoke to the blocking operation's return.
    pub fn window_us(&self) -> (u64, u64) {
        let mut start = self.blocking.invoke_us;
        for (e, _) in &self.prefix_tail {
            start = start.min(e.invoke_us);
        }
        for (e, _) in &self.concurrent {
            start = start.min(e.invoke_us);
        }
        (start, self.blocking.complete_us.unwrap_or(u64::MAX))
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "key {:?}: not linearizable: the longest linearization placed {} of {} completed operations ({} search steps)",
            self.key, self.linearized, self.completed, self.steps
        )?;
        writeln!(f, "  last operations placed (state after each):")?;
        for (e, st) in &self.prefix_tail {
            writeln!(f, "    {}  => {}", render_key_event(e), render_state(st))?;
        }
        writeln!(f, "  state reached: {}", render_state(&self.state))?;
        writeln!(
            f,
            "  could not place: {}  (the model says {})",
            render_key_event(&self.blocking),
            render_reply(&self.expected)
        )?;
        if !self.concurrent.is_empty() {
            writeln!(
                f,
                "  concurrent with it, not placed (model's reply in that state):"
            )?;
            for (e, r) in &self.concurrent {
                writeln!(
                    f,
                    "    {}  (model: {})",
                    render_key_event(e),
                    render_reply(r)
                )?;
            }
        }
        Ok(())
    }
}

/// One line for a key event: `#id c3 [invoke..complete] OP -> outcome`.
pub fn render_key_event(e: &KeyEvent) -> String {
    let done = e.complete_us.map_or("?".to_string(), |c| c.to_string());
    let outcome = match &e.outcome {
        Outcome::Ok(r) => render_reply(r),
        Outcome::Failed => "failed".to_string(),
        Outcome::Unknown => "unknown".to_string(),
    };
    format!(
        "#{} c{} [{}..{}] {} -> {}",
        e.id, e.client, e.invoke_us, done, e.op, outcome
    )
}

fn render_state(s: &State) -> String {
    match s {
        Some(v) => format!("{v:?}"),
        None => "(absent)".to_string(),
    }
}

/// A reply as a person reads it.
pub fn render_reply(r: &Reply) -> String {
    match r {
        Reply::Ok => "OK".to_string(),
        Reply::Int(n) => format!("(integer) {n}"),
        Reply::Value(Some(v)) => format!("{v:?}"),
        Reply::Value(None) => "(nil)".to_string(),
        Reply::Values(vs) => {
            let parts: Vec<String> = vs
                .iter()
                .map(|v| v.as_ref().map_or("(nil)".to_string(), |v| format!("{v:?}")))
                .collect();
            format!("[{}]", parts.join(", "))
        }
        Reply::Error(e) => format!("(error) {e}"),
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

#[derive(Debug, Clone, Copy)]
enum Cursor {
    /// Walking the list of entries from this one.
    List(usize),
    /// Walking the unknown operations from `pos`, those invoked before `t_min`.
    Unk { pos: usize, t_min: u64 },
}

struct Frame {
    cand: Cand,
    prev_state: u32,
    prev_hi: usize,
    resume: Cursor,
}

fn prepare(events: &[KeyEvent]) -> (Vec<Done>, Vec<Unk>) {
    let mut done = Vec::new();
    let mut unk = Vec::new();
    let mut classes: HashMap<&KeyOp, usize> = HashMap::new();
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
                let class = *classes.entry(&e.op).or_insert(n);
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
                if e % 2 == 0 {
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

    fn next_candidate(&self, mut cursor: Cursor) -> Option<(Cand, Cursor)> {
        loop {
            match cursor {
                Cursor::List(e) => {
                    if e == self.list.tail {
                        return None;
                    }
                    if e % 2 == 0 {
                        return Some((Cand::Done(e / 2), Cursor::List(self.list.next[e])));
                    }
                    cursor = Cursor::Unk {
                        pos: 0,
                        t_min: self.list.time[e],
                    };
                }
                Cursor::Unk { pos, t_min } => {
                    let mut p = pos;
                    while p < self.unk.len() && self.unk[p].call < t_min {
                        let free = &self.unk_free[self.unk[p].class];
                        if free.first() == Some(&p) {
                            return Some((Cand::Unk(p), Cursor::Unk { pos: p + 1, t_min }));
                        }
                        p += 1;
                    }
                    return None;
                }
            }
        }
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
    let mut stack: Vec<Frame> = Vec::new();
    let mut cursor = Cursor::List(s.list.next[s.list.head]);
    let mut state: u32 = 0;
    let mut remaining = done.len();
    let mut best: Vec<Cand> = Vec::new();
    let mut best_placed = 0;
    let mut steps: u64 = 0;
    s.remember(state);
    loop {
        if remaining == 0 {
            return Verdict::Linearizable { steps };
        }
        let Some((cand, resume)) = s.next_candidate(cursor) else {
            let Some(f) = stack.pop() else {
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
            cursor = f.resume;
            continue;
        };
        steps += 1;
        if steps > options.max_search_steps {
            return Verdict::Unknown {
                steps: options.max_search_steps,
                linearized: best_placed,
                completed: done.len(),
            };
        }
        let new_state = match cand {
            Cand::Done(j) => {
                let d = &done[j];
                let (next, expected) = model::step(&s.states[state as usize], &d.op);
                if !model::matches(&expected, &d.reply) {
                    cursor = resume;
                    continue;
                }
                if d.op.is_write() {
                    s.intern(next)
                } else {
                    state
                }
            }
            Cand::Unk(u) => {
                let after_unknown = matches!(
                    stack.last(),
                    Some(Frame {
                        cand: Cand::Unk(_),
                        ..
                    })
                );
                if unk[u].overwrites && after_unknown {
                    cursor = resume;
                    continue;
                }
                let (next, _) = model::step(&s.states[state as usize], &unk[u].op);
                s.intern(next)
            }
        };
        let prev_hi = s.hi;
        s.place(cand);
        if !s.remember(new_state) {
            s.unplace(cand);
            s.hi = prev_hi;
            cursor = resume;
            continue;
        }
        stack.push(Frame {
            cand,
            prev_state: state,
            prev_hi,
            resume,
        });
        state = new_state;
        if let Cand::Done(j) = cand {
            s.list.lift(j);
            remaining -= 1;
            if done.len() - remaining > best_placed {
                best_placed = done.len() - remaining;
                best.clear();
                best.extend(stack.iter().map(|f| f.cand));
            }
        }
        cursor = Cursor::List(s.list.next[s.list.head]);
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
