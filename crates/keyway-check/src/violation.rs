//! What a violation report holds and how it reads: the key, the deepest
//! linearization the search reached, the operation it could not place,
//! and the operations concurrent with it (see [`crate::linear`]).

use crate::history::{Outcome, Reply};
use crate::model::State;
use crate::project::KeyEvent;

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
pub(crate) const REPORT_CONCURRENT_OPS: usize = 16;

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
