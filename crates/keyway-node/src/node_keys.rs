//! KEYS and RANDOMKEY over the keys this node owns.
//!
//! Both are node-wide reads, like SCAN and DBSIZE (see [`crate::scan`]):
//! each runs as one task on a storage thread under the routing read guard,
//! is refused when the lease lapsed, covers only the partitions this node
//! owns at that moment (in Redis Cluster the client sends KEYS to every
//! primary), parks while a partition it would read is fenced, and its reply
//! waits for an fsync. Expired keys not yet removed are left out, as Redis
//! leaves them out, and so are the sub-entries of collections (fields,
//! members, elements: `ValueKind::Sub`), which are not keys.
//!
//! KEYS walks the whole default keyspace in chunks of [`KEYS_CHUNK`] entries
//! and replies every live key whose name matches the glob, in key order
//! (Redis's order is its hash table's; clients must not rely on either).
//! RANDOMKEY starts the walk at a random position of the keyspace (a random
//! slot and a random key suffix) and replies the first live owned key at or
//! after it, wrapping around once; nil when the node owns no live key. Keys
//! are not equally likely (a key after a long gap is picked more often), as
//! with Redis's bucket sampling.

use crate::executor::Task;
use crate::node_cmd::{Reply, storage_failure};
use crate::routing::Rejection;
use crate::scan::{
    SlotVerdict, default_keyspace_range, node_wide, park, submit_node_wide, verdict,
};
use crate::server::Shared;
use bytes::{BufMut, Bytes, BytesMut};
use keyway_map::DEFAULT_KEYSPACE;
use keyway_resp::Frame;
use keyway_storage::{Engine, KeyRange, StorageError, Value};
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;

/// What KEYS and RANDOMKEY cost the node (`/metrics`, `/status`): KEYS walks
/// every entry the node stores, which an operator wants to see.
#[derive(Clone, Default)]
pub struct KeyWalks {
    /// `keyway_keys_commands`: KEYS walks finished.
    pub keys: Counter,
    /// `keyway_randomkey_commands`: RANDOMKEY walks finished.
    pub randomkeys: Counter,
    /// `keyway_key_walk_entries`: stored entries they examined.
    pub entries: Counter,
}

/// The `key_walks` field of `/status`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KeyWalksStatus {
    pub keys_commands: u64,
    pub randomkey_commands: u64,
    pub entries_examined: u64,
}

impl KeyWalks {
    /// Counters registered with `metrics`.
    pub fn new(metrics: &crate::metrics::Metrics) -> Self {
        let w = KeyWalks::default();
        metrics.register(
            "keys_commands",
            "KEYS commands answered (each walks every stored entry)",
            w.keys.clone(),
        );
        metrics.register(
            "randomkey_commands",
            "RANDOMKEY commands answered",
            w.randomkeys.clone(),
        );
        metrics.register(
            "key_walk_entries",
            "Stored entries examined by KEYS and RANDOMKEY",
            w.entries.clone(),
        );
        w
    }

    /// For `/status`.
    pub fn status(&self) -> KeyWalksStatus {
        KeyWalksStatus {
            keys_commands: self.keys.get(),
            randomkey_commands: self.randomkeys.get(),
            entries_examined: self.entries.get(),
        }
    }
}

/// Entries one engine read of KEYS or RANDOMKEY takes.
pub const KEYS_CHUNK: usize = 1_000;

/// What a walk does with one live, owned key.
enum Step {
    /// Go on.
    More,
    /// The walk is done.
    Stop,
}

/// Why a walk stopped early.
enum Stopped {
    /// A partition to read is fenced: park and re-run.
    Hold,
    /// The read is refused (a lapsed lease).
    Refused(Rejection),
    Storage(StorageError),
}

/// Walks the live keys of `range` this node owns and serves, in key order,
/// handing each user key to `visit`. Runs under the routing read guard.
fn walk(
    shared: &Shared,
    engine: &dyn Engine,
    range: &KeyRange,
    mut visit: impl FnMut(&[u8]) -> Step,
) -> Result<(), Stopped> {
    let guard = shared.routing.read();
    if !shared.routing.lease_valid() {
        shared.metrics.rejected("lease_lapsed");
        return Err(Stopped::Refused(Rejection::LeaseLapsed));
    }
    let now_ms = shared.clock.unix_ms();
    let mut after: Option<Bytes> = None;
    let mut judged: Option<(u16, SlotVerdict)> = None;
    loop {
        let chunk = engine
            .scan(range, after.as_deref(), KEYS_CHUNK)
            .map_err(Stopped::Storage)?;
        shared.key_walks.entries.inc_by(chunk.entries.len() as u64);
        for (k, v) in &chunk.entries {
            let Some(slot) = k.get(4..6).map(|s| u16::from_be_bytes([s[0], s[1]])) else {
                continue;
            };
            if judged.as_ref().is_none_or(|(s, _)| *s != slot) {
                judged = Some((
                    slot,
                    verdict(&guard, shared.me, slot).map_err(Stopped::Refused)?,
                ));
            }
            match judged.as_ref().map(|(_, v)| v) {
                Some(SlotVerdict::Serve) => {}
                Some(SlotVerdict::Hold) => return Err(Stopped::Hold),
                _ => continue,
            }
            if !is_live_user_key(v, now_ms) {
                continue;
            }
            if let Step::Stop = visit(&k[6..]) {
                return Ok(());
            }
        }
        if chunk.entries.len() < KEYS_CHUNK || chunk.next.is_none() {
            return Ok(());
        }
        after = chunk.next;
    }
}

/// Whether a stored entry is a user key (not a collection's sub-entry)
/// that is live at `now_ms`.
fn is_live_user_key(v: &Value, now_ms: u64) -> bool {
    v.kind.is_user_key() && v.expire_at_ms.is_none_or(|at| at > now_ms)
}

fn finish(
    result: Result<(), Stopped>,
    retry: impl FnOnce() -> Task,
    reply: Frame,
) -> crate::executor::TaskOutput {
    match result {
        Ok(()) => node_wide(reply),
        Err(Stopped::Hold) => park(retry()),
        Err(Stopped::Refused(r)) => crate::executor::TaskOutput::reply(r.to_frame(), false),
        Err(Stopped::Storage(e)) => storage_failure(e),
    }
}

fn keys_task(shared: Arc<Shared>, pattern: Bytes) -> Task {
    Box::new(move |engine| {
        let mut keys = Vec::new();
        let all = &pattern[..] == b"*";
        let result = walk(&shared, engine, &default_keyspace_range(), |user| {
            if all || crate::cmd::table::glob_match(&pattern, user) {
                keys.push(Frame::Bulk(Bytes::copy_from_slice(user)));
            }
            Step::More
        });
        if result.is_ok() {
            shared.key_walks.keys.inc();
        }
        let retry = || keys_task(shared.clone(), pattern.clone());
        finish(result, retry, Frame::Array(keys))
    })
}

/// `KEYS pattern`.
pub async fn keys(shared: &Arc<Shared>, args: &[Bytes]) -> Reply {
    if args.len() != 2 {
        return crate::cmd::table::arity_error("keys").into();
    }
    submit_node_wide(shared, keys_task(shared.clone(), args[1].clone())).await
}

/// A random storage key inside the default keyspace.
fn random_position() -> Bytes {
    let mut b = BytesMut::with_capacity(14);
    b.put_u32(DEFAULT_KEYSPACE.0);
    b.put_u16(rand::random::<u16>() % keyway_map::SLOT_COUNT);
    b.put_u64(rand::random::<u64>());
    b.freeze()
}

fn randomkey_task(shared: Arc<Shared>, from: Bytes) -> Task {
    Box::new(move |engine| {
        let whole = default_keyspace_range();
        let tail = KeyRange {
            start: from.clone(),
            end: whole.end.clone(),
        };
        let head = KeyRange {
            start: whole.start.clone(),
            end: Some(from.clone()),
        };
        let mut found: Option<Bytes> = None;
        let pick = |found: &mut Option<Bytes>, user: &[u8]| {
            *found = Some(Bytes::copy_from_slice(user));
            Step::Stop
        };
        let mut result = walk(&shared, engine, &tail, |u| pick(&mut found, u));
        if result.is_ok() && found.is_none() {
            result = walk(&shared, engine, &head, |u| pick(&mut found, u));
        }
        if result.is_ok() {
            shared.key_walks.randomkeys.inc();
        }
        let retry = || randomkey_task(shared.clone(), from.clone());
        finish(result, retry, found.map_or(Frame::Null, Frame::Bulk))
    })
}

/// `RANDOMKEY`.
pub async fn randomkey(shared: &Arc<Shared>, args: &[Bytes]) -> Reply {
    if args.len() != 1 {
        return crate::cmd::table::arity_error("randomkey").into();
    }
    submit_node_wide(shared, randomkey_task(shared.clone(), random_position())).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_positions_stay_inside_the_default_keyspace() {
        let range = default_keyspace_range();
        for _ in 0..1000 {
            let p = random_position();
            assert!(p >= range.start);
            assert!(range.end.as_ref().is_none_or(|end| p < end));
            let slot = u16::from_be_bytes([p[4], p[5]]);
            assert!(slot < keyway_map::SLOT_COUNT);
        }
    }
}
