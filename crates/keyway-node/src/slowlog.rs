//! `SLOWLOG GET|LEN|RESET|HELP`: the data commands whose storage task (the
//! command's execution and its one apply batch, on the slot's executor
//! thread) took at least `slowlog-log-slower-than` microseconds, newest
//! first, at most `slowlog-max-len` of them, as Redis 7.0 records them
//! (argument lists cut at 32 arguments and 128 bytes per argument).
//!
//! Both settings start from `--slowlog-log-slower-than-us` and
//! `--slowlog-max-len` and change at run time with `CONFIG SET`.

use bytes::Bytes;
use keyway_resp::Frame;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

/// The largest `slowlog-max-len` accepted.
pub const MAX_SLOWLOG_LEN: usize = 1_000_000;
/// Redis's `SLOWLOG_ENTRY_MAX_ARGC`.
const MAX_ARGC: usize = 32;
/// Redis's `SLOWLOG_ENTRY_MAX_STRING`.
const MAX_ARG_BYTES: usize = 128;

struct Entry {
    id: u64,
    at_unix_s: u64,
    duration_us: u64,
    args: Vec<Bytes>,
    peer: String,
    name: Bytes,
}

/// The slow log of one node.
pub struct SlowLog {
    entries: Mutex<(VecDeque<Entry>, u64)>,
    slower_than_us: AtomicI64,
    max_len: AtomicUsize,
}

impl SlowLog {
    pub fn new(slower_than_us: i64, max_len: usize) -> Self {
        assert!(max_len <= MAX_SLOWLOG_LEN);
        SlowLog {
            entries: Mutex::new((VecDeque::new(), 0)),
            slower_than_us: AtomicI64::new(slower_than_us),
            max_len: AtomicUsize::new(max_len),
        }
    }

    pub fn slower_than_us(&self) -> i64 {
        self.slower_than_us.load(Ordering::Relaxed)
    }

    pub fn set_slower_than_us(&self, us: i64) {
        self.slower_than_us.store(us, Ordering::Relaxed);
    }

    pub fn max_len(&self) -> usize {
        self.max_len.load(Ordering::Relaxed)
    }

    pub fn set_max_len(&self, len: usize) {
        assert!(len <= MAX_SLOWLOG_LEN);
        self.max_len.store(len, Ordering::Relaxed);
        let mut guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        guard.0.truncate(len);
    }

    /// Whether a command that took `duration_us` is logged.
    pub fn wants(&self, duration_us: u64) -> bool {
        let t = self.slower_than_us();
        t >= 0 && duration_us >= t as u64
    }

    /// Logs one command (call only when [`Self::wants`] said so).
    pub fn push(
        &self,
        at_unix_s: u64,
        duration_us: u64,
        args: &[Bytes],
        peer: String,
        name: Bytes,
    ) {
        let max = self.max_len();
        let mut kept: Vec<Bytes> = Vec::with_capacity(args.len().min(MAX_ARGC));
        for (i, arg) in args.iter().enumerate() {
            if i == MAX_ARGC - 1 && args.len() > MAX_ARGC {
                kept.push(Bytes::from(format!(
                    "... ({} more arguments)",
                    args.len() - MAX_ARGC + 1
                )));
                break;
            }
            if arg.len() > MAX_ARG_BYTES {
                let mut cut = arg[..MAX_ARG_BYTES].to_vec();
                cut.extend_from_slice(
                    format!("... ({} more bytes)", arg.len() - MAX_ARG_BYTES).as_bytes(),
                );
                kept.push(Bytes::from(cut));
            } else {
                kept.push(arg.clone());
            }
        }
        let mut guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (entries, next_id) = &mut *guard;
        let id = *next_id;
        *next_id += 1;
        if max == 0 {
            return;
        }
        entries.push_front(Entry {
            id,
            at_unix_s,
            duration_us,
            args: kept,
            peer,
            name,
        });
        entries.truncate(max);
    }

    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn reset(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clear();
    }

    /// `SLOWLOG <sub> ...` (`args[0]` is `SLOWLOG`).
    pub fn command(&self, args: &[Bytes]) -> Frame {
        let sub = String::from_utf8_lossy(&args[1]).to_ascii_uppercase();
        match (sub.as_str(), args.len()) {
            ("LEN", 2) => Frame::Integer(self.len() as i64),
            ("RESET", 2) => {
                self.reset();
                Frame::ok()
            }
            ("GET", 2 | 3) => {
                let count = match args.get(2) {
                    None => 10,
                    Some(a) => match crate::cmd::parse_i64(a) {
                        Some(-1) => i64::MAX,
                        Some(n) if n >= 0 => n,
                        _ => {
                            return Frame::Error(
                                "ERR count should be greater than or equal to -1".into(),
                            );
                        }
                    },
                };
                let guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
                Frame::Array(
                    guard
                        .0
                        .iter()
                        .take(usize::try_from(count).unwrap_or(usize::MAX))
                        .map(|e| {
                            Frame::Array(vec![
                                Frame::Integer(e.id as i64),
                                Frame::Integer(e.at_unix_s as i64),
                                Frame::Integer(e.duration_us as i64),
                                Frame::Array(e.args.iter().cloned().map(Frame::Bulk).collect()),
                                Frame::bulk(e.peer.clone()),
                                Frame::Bulk(e.name.clone()),
                            ])
                        })
                        .collect(),
                )
            }
            ("HELP", 2) => Frame::Array(
                [
                    "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                    "GET [<count>]",
                    "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
                    "    Entries are made of:",
                    "    id, timestamp, time in microseconds, arguments array, client IP and port,",
                    "    client name",
                    "LEN",
                    "    Return the length of the slowlog.",
                    "RESET",
                    "    Reset the slowlog.",
                    "HELP",
                    "    Prints this help.",
                ]
                .iter()
                .map(|l| Frame::Simple((*l).into()))
                .collect(),
            ),
            ("LEN" | "RESET" | "GET" | "HELP", _) => Frame::Error(format!(
                "ERR wrong number of arguments for 'slowlog|{}' command",
                sub.to_ascii_lowercase()
            )),
            _ => Frame::Error(format!(
                "ERR unknown subcommand '{}'. Try SLOWLOG HELP.",
                String::from_utf8_lossy(&args[1])
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn keeps_the_newest_max_len_entries_and_cuts_arguments_as_redis() {
        let log = SlowLog::new(0, 2);
        assert!(log.wants(0));
        for i in 0..3 {
            log.push(
                1,
                5,
                &[b("set"), b(&format!("k{i}"))],
                "a:1".into(),
                Bytes::new(),
            );
        }
        assert_eq!(log.len(), 2);
        let Frame::Array(got) = log.command(&[b("slowlog"), b("get"), b("-1")]) else {
            panic!()
        };
        let Frame::Array(first) = &got[0] else {
            panic!()
        };
        assert_eq!(first[0], Frame::Integer(2), "newest first");
        let long = "x".repeat(200);
        let many: Vec<Bytes> = (0..40).map(|_| b(&long)).collect();
        log.push(1, 5, &many, "a:1".into(), Bytes::new());
        let Frame::Array(got) = log.command(&[b("slowlog"), b("get"), b("1")]) else {
            panic!()
        };
        let Frame::Array(entry) = &got[0] else {
            panic!()
        };
        let Frame::Array(args) = &entry[3] else {
            panic!()
        };
        assert_eq!(args.len(), 32);
        assert_eq!(args[31], Frame::bulk("... (9 more arguments)"));
        assert_eq!(
            args[0],
            Frame::Bulk(Bytes::from(format!(
                "{}... (72 more bytes)",
                "x".repeat(128)
            )))
        );
        log.set_slower_than_us(-1);
        assert!(!log.wants(u64::MAX));
        log.set_max_len(0);
        assert_eq!(log.len(), 0);
        assert_eq!(log.command(&[b("slowlog"), b("reset")]), Frame::ok());
        assert_eq!(
            log.command(&[b("slowlog"), b("get"), b("-2")]),
            Frame::error("ERR count should be greater than or equal to -1")
        );
    }
}
