//! `ACL LOG`: the most recent denials and authentication failures, newest
//! first, as Redis 7.0 lists them (a repeat of the same denial within 60 s
//! updates its entry's count and age instead of adding one).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Entries kept (Redis's `acllog-max-len` default).
pub const ACL_LOG_MAX_ENTRIES: usize = 128;

#[derive(Debug, Clone)]
pub struct LogEntry {
    pub count: u64,
    /// `command`, `key` or `auth`.
    pub reason: &'static str,
    /// `toplevel` (or `multi` inside a transaction).
    pub context: &'static str,
    /// The command (or the key) denied; `AUTH` for auth failures.
    pub object: String,
    pub username: String,
    pub created_ms: u64,
    pub updated_ms: u64,
    pub client_info: String,
}

/// The log of one process.
#[derive(Debug, Default)]
pub struct AclLog {
    entries: Mutex<VecDeque<LogEntry>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl AclLog {
    /// Records one event.
    pub fn add(
        &self,
        reason: &'static str,
        context: &'static str,
        object: String,
        username: String,
        client_info: String,
    ) {
        let now = now_ms();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pos) = entries.iter().position(|e| {
            e.reason == reason
                && e.context == context
                && e.object == object
                && e.username == username
                && now.saturating_sub(e.updated_ms) < 60_000
        }) {
            let mut e = entries.remove(pos).expect("found");
            e.count += 1;
            e.updated_ms = now;
            e.client_info = client_info;
            entries.push_front(e);
            return;
        }
        entries.push_front(LogEntry {
            count: 1,
            reason,
            context,
            object,
            username,
            created_ms: now,
            updated_ms: now,
            client_info,
        });
        entries.truncate(ACL_LOG_MAX_ENTRIES);
    }

    /// The newest `limit` entries, newest first.
    pub fn entries(&self, limit: usize) -> Vec<LogEntry> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.iter().take(limit).cloned().collect()
    }

    /// `ACL LOG RESET`.
    pub fn reset(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Milliseconds since `entry` was last updated.
    pub fn age_ms(entry: &LogEntry) -> u64 {
        now_ms().saturating_sub(entry.updated_ms)
    }
}
