//! The recorded history of a run: one [`Event`] per client operation.
//!
//! Times are microseconds on one monotonic clock shared by every client of
//! the run (the recorder's), so `invoke_us`/`complete_us` of different
//! clients compare. An operation whose outcome is [`Outcome::Unknown`] has
//! no completion: it may have taken effect at any moment after its invoke,
//! or never. An operation that [`Outcome::Failed`] certainly had no effect
//! (the store refused it before running it: a redirect, `CLUSTERDOWN`, a
//! connection that failed before the request was written).
//!
//! On disk a history is JSON lines, one event a line, so a failing history
//! can be read, cut down by hand and fed back to the checker.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};

/// A key or a value: bytes, shown as text in JSON when they are UTF-8.
pub type Bytes = Vec<u8>;

/// What a client asked for. Multi-key operations (`MSet`, `MGet`) keep all
/// their keys under one hash tag, so the store runs each atomically.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum Op {
    Set { key: String, value: String },
    Get { key: String },
    Del { key: String },
    Incr { key: String },
    Append { key: String, value: String },
    MSet { pairs: Vec<(String, String)> },
    MGet { keys: Vec<String> },
}

impl Op {
    /// Every key the operation touches, in its argument order.
    pub fn keys(&self) -> Vec<&str> {
        match self {
            Op::Set { key, .. }
            | Op::Get { key }
            | Op::Del { key }
            | Op::Incr { key }
            | Op::Append { key, .. } => vec![key.as_str()],
            Op::MSet { pairs } => pairs.iter().map(|(k, _)| k.as_str()).collect(),
            Op::MGet { keys } => keys.iter().map(String::as_str).collect(),
        }
    }

    /// True if the operation can change the store.
    pub fn is_write(&self) -> bool {
        !matches!(self, Op::Get { .. } | Op::MGet { .. })
    }
}

/// The store's answer to an operation that completed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "reply", content = "v")]
pub enum Reply {
    /// `+OK` (SET, MSET).
    Ok,
    /// An integer (DEL's count, INCR's new value, APPEND's new length).
    Int(i64),
    /// A bulk string or nil (GET).
    Value(Option<String>),
    /// One bulk string or nil per key (MGET).
    Values(Vec<Option<String>>),
    /// An error reply that the command itself produced, having run (for
    /// example INCR of a value that is not an integer): the model must
    /// predict it. Routing and availability errors are not this: they are
    /// [`Outcome::Failed`] or [`Outcome::Unknown`].
    Error(String),
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "reply")]
pub enum Outcome {
    /// Completed with this reply; it took effect exactly once.
    Ok(Reply),
    /// Certainly had no effect.
    Failed,
    /// Timed out or lost its connection after the request was sent: it
    /// took effect once or not at all.
    Unknown,
}

/// One client operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Unique within the history.
    pub id: u64,
    /// The client (one sequential process) that issued it. An operation
    /// with an unknown outcome stays open for ever, so a client that meets
    /// one goes on under a fresh id (Jepsen's convention).
    pub client: u32,
    pub op: Op,
    pub invoke_us: u64,
    /// `None` exactly when the outcome is [`Outcome::Unknown`].
    pub complete_us: Option<u64>,
    pub outcome: Outcome,
}

impl Event {
    /// An operation that completed at `complete_us` with `reply`.
    pub fn ok(
        id: u64,
        client: u32,
        op: Op,
        invoke_us: u64,
        complete_us: u64,
        reply: Reply,
    ) -> Self {
        Event {
            id,
            client,
            op,
            invoke_us,
            complete_us: Some(complete_us),
            outcome: Outcome::Ok(reply),
        }
    }

    /// An operation that certainly had no effect, known at `complete_us`.
    pub fn failed(id: u64, client: u32, op: Op, invoke_us: u64, complete_us: u64) -> Self {
        Event {
            id,
            client,
            op,
            invoke_us,
            complete_us: Some(complete_us),
            outcome: Outcome::Failed,
        }
    }

    /// An operation whose outcome is unknown (no completion time).
    pub fn unknown(id: u64, client: u32, op: Op, invoke_us: u64) -> Self {
        Event {
            id,
            client,
            op,
            invoke_us,
            complete_us: None,
            outcome: Outcome::Unknown,
        }
    }
}

/// A whole run's events, in any order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    pub events: Vec<Event>,
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("history I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("history line {line}: {source}")]
    Parse {
        line: usize,
        source: serde_json::Error,
    },
    #[error("history event {id}: {reason}")]
    Invalid { id: u64, reason: String },
}

impl History {
    pub fn new(events: Vec<Event>) -> Self {
        History { events }
    }

    /// Checks the shape every checker relies on: unique ids, completion
    /// after invoke, a completion time exactly for non-unknown outcomes,
    /// and each client's operations not overlapping (a client is sequential).
    pub fn validate(&self) -> Result<(), HistoryError> {
        let invalid = |id, reason: &str| HistoryError::Invalid {
            id,
            reason: reason.to_string(),
        };
        let mut ids = std::collections::HashSet::new();
        let mut by_client: std::collections::BTreeMap<u32, Vec<&Event>> = Default::default();
        for e in &self.events {
            if !ids.insert(e.id) {
                return Err(invalid(e.id, "duplicate id"));
            }
            match (&e.outcome, e.complete_us) {
                (Outcome::Unknown, Some(_)) => {
                    return Err(invalid(e.id, "unknown outcome with a completion time"));
                }
                (Outcome::Ok(_) | Outcome::Failed, None) => {
                    return Err(invalid(e.id, "completed outcome without a completion time"));
                }
                (_, Some(c)) if c < e.invoke_us => {
                    return Err(invalid(e.id, "completes before it is invoked"));
                }
                _ => {}
            }
            by_client.entry(e.client).or_default().push(e);
        }
        for events in by_client.values_mut() {
            events.sort_by_key(|e| e.invoke_us);
            for pair in events.windows(2) {
                match pair[0].complete_us {
                    Some(c) if c <= pair[1].invoke_us => {}
                    _ => {
                        return Err(invalid(
                            pair[1].id,
                            "overlaps its client's previous operation",
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes the history as JSON lines.
    pub fn write_jsonl(&self, mut out: impl Write) -> Result<(), HistoryError> {
        for e in &self.events {
            serde_json::to_writer(&mut out, e).map_err(std::io::Error::other)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        Ok(())
    }

    /// Reads a history written by [`History::write_jsonl`] (blank lines skipped).
    pub fn read_jsonl(input: impl BufRead) -> Result<Self, HistoryError> {
        let mut events = Vec::new();
        for (i, line) in input.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let event = serde_json::from_str(&line).map_err(|source| HistoryError::Parse {
                line: i + 1,
                source,
            })?;
            events.push(event);
        }
        Ok(History { events })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: u64, client: u32, invoke: u64, complete: Option<u64>, outcome: Outcome) -> Event {
        Event {
            id,
            client,
            op: Op::Get { key: "k".into() },
            invoke_us: invoke,
            complete_us: complete,
            outcome,
        }
    }

    #[test]
    fn a_history_round_trips_through_json_lines() {
        let h = History::new(vec![
            Event {
                id: 1,
                client: 0,
                op: Op::MSet {
                    pairs: vec![("{t}a".into(), "1".into()), ("{t}b".into(), "2".into())],
                },
                invoke_us: 10,
                complete_us: Some(20),
                outcome: Outcome::Ok(Reply::Ok),
            },
            ev(2, 1, 15, None, Outcome::Unknown),
            ev(3, 1, 30, Some(31), Outcome::Ok(Reply::Value(None))),
        ]);
        let mut buf = Vec::new();
        h.write_jsonl(&mut buf).unwrap();
        assert_eq!(History::read_jsonl(&buf[..]).unwrap(), h);
    }

    #[test]
    fn validate_refuses_malformed_histories() {
        let ok = History::new(vec![
            ev(1, 0, 0, Some(5), Outcome::Failed),
            ev(2, 0, 5, None, Outcome::Unknown),
        ]);
        ok.validate().unwrap();
        let dup = History::new(vec![
            ev(1, 0, 0, Some(1), Outcome::Failed),
            ev(1, 1, 0, Some(1), Outcome::Failed),
        ]);
        assert!(dup.validate().is_err());
        let unknown_done = History::new(vec![ev(1, 0, 0, Some(1), Outcome::Unknown)]);
        assert!(unknown_done.validate().is_err());
        let overlapping = History::new(vec![
            ev(1, 0, 0, Some(10), Outcome::Failed),
            ev(2, 0, 5, Some(12), Outcome::Failed),
        ]);
        assert!(overlapping.validate().is_err());
        let after_unknown = History::new(vec![
            ev(1, 0, 0, None, Outcome::Unknown),
            ev(2, 0, 5, Some(12), Outcome::Failed),
        ]);
        assert!(after_unknown.validate().is_err());
    }
}
