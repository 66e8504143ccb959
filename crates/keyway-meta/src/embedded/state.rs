//! The embedded store's state and its durable file.
//!
//! State = the map, a bounded history of recent `(version, changes)` for
//! deltas, the node-id counter, the lease table, the election queues
//! (`election.rs`; absent in files written before elections existed) and
//! the migration records with their id counter (`migration.rs`; likewise
//! absent in older files). All of it is encoded as one JSON document after
//! every mutation and made durable by `journal.rs`: appended to
//! `<dir>/meta.journal` (one `fdatasync`), and now and then written as the
//! checkpoint `<dir>/meta.state` (by writing `<dir>/meta.state.tmp`,
//! fsyncing it, renaming it over `meta.state`, and fsyncing the directory).
//! Each document carries its `write_seq`; the newest of the checkpoint and
//! the journal's last whole frame is loaded. That is O(map size + retained
//! history) per commit, which is fine at the rate maps change (moves,
//! splits and merges, not data commands). A crash at any point leaves the
//! last answered state loadable.

use super::election::{CandidacyRecord, Elections, Standing};
use super::journal::{JOURNAL_FILE, Journal};
use super::lease::{LeaseRecord, LeaseTable};
use super::migration::{MigrationRecord, Migrations};
use crate::{Leadership, LeaseId, MapUpdate, MetaError};
use keyway_map::{MapChange, MapVersion, PartitionMap};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::Path;
use std::sync::Arc;
use tokio::time::Instant;

/// The state file's name inside the store directory.
pub const STATE_FILE: &str = "meta.state";
const TMP_FILE: &str = "meta.state.tmp";
const FORMAT: u32 = 1;

/// The changes stamped with one map version: a history entry, and what
/// watchers are sent.
#[derive(Debug)]
pub(crate) struct Entry {
    pub version: MapVersion,
    pub changes: Vec<MapChange>,
}

/// Everything the embedded store holds; guarded by the store's one lock.
#[derive(Debug)]
pub(crate) struct State {
    pub map: PartitionMap,
    /// Contiguous versions ending at `map.version`, at most `history_limit`.
    pub history: VecDeque<Arc<Entry>>,
    pub history_limit: usize,
    /// Next node id to hand out; starts at 1, never reused.
    pub next_node_id: u64,
    pub leases: LeaseTable,
    pub elections: Elections,
    pub migrations: Migrations,
    /// ACL user records by name (`rules` as `keyway-acl` wrote them).
    pub acl_users: BTreeMap<String, String>,
    /// Set when a write to disk failed: memory may be ahead of the disk, so
    /// the store refuses everything until it is reopened.
    pub failed: Option<String>,
    /// The `write_seq` of the last state encoded (see the module docs).
    pub write_seq: u64,
}

#[derive(Serialize)]
struct PersistedRef<'a> {
    format: u32,
    write_seq: u64,
    map: &'a PartitionMap,
    history: Vec<(MapVersion, &'a [MapChange])>,
    next_node_id: u64,
    next_lease_id: u64,
    leases: Vec<LeaseRecord>,
    next_candidacy_id: u64,
    elections: BTreeMap<String, Vec<CandidacyRecord>>,
    next_migration_id: u64,
    migrations: Vec<MigrationRecord>,
    acl_users: &'a BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Persisted {
    format: u32,
    /// One more per durable write (0 in files written before the journal).
    #[serde(default)]
    write_seq: u64,
    map: PartitionMap,
    history: Vec<(MapVersion, Vec<MapChange>)>,
    next_node_id: u64,
    next_lease_id: u64,
    leases: Vec<LeaseRecord>,
    #[serde(default)]
    next_candidacy_id: u64,
    #[serde(default)]
    elections: BTreeMap<String, Vec<CandidacyRecord>>,
    #[serde(default)]
    next_migration_id: u64,
    #[serde(default)]
    migrations: Vec<MigrationRecord>,
    #[serde(default)]
    acl_users: BTreeMap<String, String>,
}

impl State {
    /// An empty store: map version 0, no history, no nodes, no leases.
    pub fn new(history_limit: usize) -> Self {
        State {
            map: PartitionMap::new(),
            history: VecDeque::new(),
            history_limit,
            next_node_id: 1,
            leases: LeaseTable::default(),
            elections: Elections::default(),
            migrations: Migrations::default(),
            acl_users: BTreeMap::new(),
            failed: None,
            write_seq: 0,
        }
    }

    /// Loads the newest of `<dir>/meta.state` and the journal's last whole
    /// frame, or a new state if there is neither, with the journal the next
    /// writes go to. Restored leases get their full TTL from `now`.
    pub fn load(
        dir: &Path,
        history_limit: usize,
        now: Instant,
    ) -> Result<(Self, Journal), MetaError> {
        let path = dir.join(STATE_FILE);
        let checkpoint = match fs::read(&path) {
            Ok(bytes) => Some(decode(&path, &bytes)?),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(internal(&path, e)),
        };
        let journal_path = dir.join(JOURNAL_FILE);
        let (journal, last) = Journal::open(dir).map_err(|e| internal(&journal_path, e))?;
        let last = last.map(|b| decode(&journal_path, &b)).transpose()?;
        let newest = match (checkpoint, last) {
            (Some(c), Some(j)) if j.write_seq > c.write_seq => Some((j, journal_path)),
            (Some(c), _) => Some((c, path)),
            (None, Some(j)) => Some((j, journal_path)),
            (None, None) => None,
        };
        let state = match newest {
            Some((p, from)) => Self::restore(p, &from, history_limit, now)?,
            None => State::new(history_limit),
        };
        Ok((state, journal))
    }

    fn restore(
        p: Persisted,
        path: &Path,
        history_limit: usize,
        now: Instant,
    ) -> Result<Self, MetaError> {
        let mut map = p.map;
        map.reindex();
        map.validate()
            .map_err(|e| internal(path, format!("stored map is invalid: {e}")))?;
        let mut history: VecDeque<Arc<Entry>> = p
            .history
            .into_iter()
            .map(|(version, changes)| Arc::new(Entry { version, changes }))
            .collect();
        let contiguous = history
            .iter()
            .zip(history.iter().skip(1))
            .all(|(a, b)| b.version.0 == a.version.0 + 1)
            && history.back().is_none_or(|e| e.version == map.version);
        if !contiguous {
            tracing::warn!(path = %path.display(), "history in state file is not contiguous; dropping it");
            history.clear();
        }
        let mut state = State {
            map,
            history,
            history_limit,
            next_node_id: p.next_node_id.max(1),
            leases: LeaseTable::restore(p.leases, p.next_lease_id, now),
            elections: Elections::restore(p.elections, p.next_candidacy_id),
            migrations: Migrations::restore(p.migrations, p.next_migration_id),
            acl_users: p.acl_users,
            failed: None,
            write_seq: p.write_seq,
        };
        state.trim_history();
        Ok(state)
    }

    /// The state file's bytes for the current state.
    pub fn encode(&self, now: Instant) -> Result<Vec<u8>, MetaError> {
        let view = PersistedRef {
            format: FORMAT,
            write_seq: self.write_seq,
            map: &self.map,
            history: self
                .history
                .iter()
                .map(|e| (e.version, &e.changes[..]))
                .collect(),
            next_node_id: self.next_node_id,
            next_lease_id: self.leases.next_id(),
            leases: self.leases.records(now),
            next_candidacy_id: self.elections.next_id(),
            elections: self.elections.records(),
            next_migration_id: self.migrations.next_id(),
            migrations: self.migrations.records(),
            acl_users: &self.acl_users,
        };
        serde_json::to_vec(&view).map_err(|e| MetaError::Internal(format!("encode state: {e}")))
    }

    /// Refuses everything once a write failed.
    pub fn check_healthy(&self) -> Result<(), MetaError> {
        match &self.failed {
            Some(why) => Err(MetaError::Internal(format!(
                "metadata store stopped after a failed write ({why}); reopen it"
            ))),
            None => Ok(()),
        }
    }

    /// Installs a new (validated) map and records its changes in the history.
    pub fn install(&mut self, map: PartitionMap, entry: Arc<Entry>) {
        debug_assert_eq!(map.version, entry.version);
        self.map = map;
        self.history.push_back(entry);
        self.trim_history();
    }

    fn trim_history(&mut self) {
        while self.history.len() > self.history_limit {
            self.history.pop_front();
        }
    }

    /// `election`'s leader at `now` (candidacies with dead leases skipped).
    pub fn leader(&self, election: &str, now: Instant) -> Option<Leadership> {
        self.elections
            .leader(election, |l| self.leases.is_live(l, now))
    }

    /// Where candidacy `id` of `election` stands at `now`.
    pub fn standing(&self, election: &str, id: u64, now: Instant) -> Standing {
        self.elections
            .standing(election, id, |l| self.leases.is_live(l, now))
    }

    /// Drops the candidacies whose lease is not live at `now`; returns
    /// whether any was (the caller persists and wakes election waiters).
    pub fn drop_dead_candidacies(&mut self, now: Instant) -> bool {
        let leases = &self.leases;
        self.elections.retain_live(|l| leases.is_live(l, now))
    }

    /// Whether `lease` is live at `now`.
    pub fn lease_live(&self, lease: LeaseId, now: Instant) -> bool {
        self.leases.is_live(lease, now)
    }

    /// What changed after `since` (see [`crate::MetaStore::changes_since`]).
    pub fn changes_since(&self, since: MapVersion) -> MapUpdate {
        let current = self.map.version;
        if since == current {
            return MapUpdate::Delta(Vec::new());
        }
        if since > current {
            return MapUpdate::Full(self.map.clone());
        }
        match self.history.front() {
            Some(first) if first.version.0 <= since.0 + 1 => MapUpdate::Delta(
                self.history
                    .iter()
                    .filter(|e| e.version > since)
                    .map(|e| (e.version, e.changes.clone()))
                    .collect(),
            ),
            _ => MapUpdate::Full(self.map.clone()),
        }
    }
}

/// A stored state document.
fn decode(path: &Path, bytes: &[u8]) -> Result<Persisted, MetaError> {
    let p: Persisted = serde_json::from_slice(bytes).map_err(|e| internal(path, e))?;
    if p.format != FORMAT {
        return Err(internal(path, format!("unknown format {}", p.format)));
    }
    Ok(p)
}

/// Durably replaces `<dir>/meta.state` with `bytes`: write a temp file,
/// fsync it, rename it over the state file, fsync the directory. Blocking:
/// call it on a blocking thread.
pub(crate) fn write_state(dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(TMP_FILE);
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, dir.join(STATE_FILE))?;
    File::open(dir)?.sync_all()
}

fn internal(path: &Path, e: impl std::fmt::Display) -> MetaError {
    MetaError::Internal(format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{NodeId, NodeInfo, NodeState};

    fn node_change(id: u64) -> MapChange {
        MapChange::UpsertNode(NodeInfo {
            id: NodeId(id),
            resp_addr: format!("127.0.0.1:{}", 7000 + id),
            admin_addr: format!("127.0.0.1:{}", 8000 + id),
            state: NodeState::Up,
            weight: keyway_map::DEFAULT_NODE_WEIGHT,
            draining: false,
            zone: None,
            replica_addr: None,
        })
    }

    fn commit(state: &mut State, changes: Vec<MapChange>) {
        let version = MapVersion(state.map.version.0 + 1);
        let mut map = state.map.clone();
        map.apply(version, &changes).unwrap();
        state.install(map, Arc::new(Entry { version, changes }));
    }

    #[tokio::test(start_paused = true)]
    async fn state_file_round_trips_map_history_and_counters() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = State::new(3);
        for id in 1..=5 {
            commit(&mut state, vec![node_change(id)]);
        }
        state.next_node_id = 6;
        let now = Instant::now();
        state.leases.grant(Some(NodeId(2)), 500, now);
        let m = state.migrations.allocate();
        state.migrations.allocate();
        state.migrations.put(m, None, 4, b"rec".to_vec()).unwrap();
        assert_eq!(state.history.len(), 3, "history is bounded");
        write_state(dir.path(), &state.encode(now).unwrap()).unwrap();

        let back = State::load(dir.path(), 3, now).unwrap().0;
        assert_eq!(back.map, state.map);
        assert_eq!(back.next_node_id, 6);
        assert_eq!(back.leases.next_id(), 2);
        assert_eq!(back.migrations.next_id(), 3, "migration ids never reused");
        assert_eq!(back.migrations.list(), state.migrations.list());
        assert_eq!(back.leases.live(now), state.leases.live(now));
        assert_eq!(
            back.changes_since(MapVersion(2)),
            state.changes_since(MapVersion(2))
        );
        assert!(matches!(back.changes_since(MapVersion(2)), MapUpdate::Delta(d) if d.len() == 3));
        assert!(matches!(
            back.changes_since(MapVersion(1)),
            MapUpdate::Full(_)
        ));
        assert_eq!(back.changes_since(MapVersion(5)), MapUpdate::Delta(vec![]));
        assert!(matches!(
            back.changes_since(MapVersion(9)),
            MapUpdate::Full(_)
        ));

        // A smaller history limit on reopen trims.
        let small = State::load(dir.path(), 1, now).unwrap().0;
        assert_eq!(small.history.len(), 1);
    }

    /// The newest of the checkpoint and the journal's last frame wins, by
    /// `write_seq`: frames after a checkpoint, and frames a crash left
    /// behind a newer checkpoint (before the journal was emptied).
    #[tokio::test(start_paused = true)]
    async fn the_newest_of_checkpoint_and_journal_is_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let now = Instant::now();
        let (mut state, mut journal) = State::load(dir.path(), 8, now).unwrap();
        let write = |state: &mut State, journal: &mut Journal, node: u64| {
            commit(state, vec![node_change(node)]);
            state.write_seq += 1;
            journal.write(&state.encode(now).unwrap()).unwrap();
        };
        write(&mut state, &mut journal, 1);
        write(&mut state, &mut journal, 2);
        let back = State::load(dir.path(), 8, now).unwrap().0;
        assert_eq!(
            (back.map.nodes.len(), back.write_seq),
            (2, 2),
            "from the journal"
        );
        // A checkpoint newer than the journal (a crash before emptying it).
        commit(&mut state, vec![node_change(3)]);
        state.write_seq += 1;
        write_state(dir.path(), &state.encode(now).unwrap()).unwrap();
        let (back, mut journal) = State::load(dir.path(), 8, now).unwrap();
        assert_eq!(
            (back.map.nodes.len(), back.write_seq),
            (3, 3),
            "the checkpoint"
        );
        // Frames appended after it win again.
        let mut state = back;
        write(&mut state, &mut journal, 4);
        let back = State::load(dir.path(), 8, now).unwrap().0;
        assert_eq!(
            (back.map.nodes.len(), back.write_seq),
            (4, 4),
            "the journal again"
        );
    }

    #[tokio::test]
    async fn corrupt_state_file_is_refused_not_ignored() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(STATE_FILE), b"{not json").unwrap();
        let err = State::load(dir.path(), 8, Instant::now())
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(err, MetaError::Internal(_)), "{err:?}");
    }

    #[tokio::test]
    async fn missing_state_file_is_a_new_store() {
        let dir = tempfile::tempdir().unwrap();
        let state = State::load(dir.path(), 8, Instant::now()).unwrap().0;
        assert_eq!(state.map.version, MapVersion(0));
        assert_eq!(state.next_node_id, 1);
    }

    #[tokio::test]
    async fn a_state_file_from_before_migrations_loads_with_none() {
        let dir = tempfile::tempdir().unwrap();
        let now = Instant::now();
        let mut v: serde_json::Value =
            serde_json::from_slice(&State::new(8).encode(now).unwrap()).unwrap();
        let obj = v.as_object_mut().unwrap();
        obj.remove("migrations").unwrap();
        obj.remove("next_migration_id").unwrap();
        write_state(dir.path(), &serde_json::to_vec(&v).unwrap()).unwrap();
        let state = State::load(dir.path(), 8, now).unwrap().0;
        assert!(state.migrations.list().is_empty());
        assert_eq!(state.migrations.next_id(), 1);
    }
}
