//! A model world for the migration machine: a source and a target node, the
//! metadata store (the migration record and the partition's owner/epoch),
//! clients writing, and the driver that feeds events to [`Migration`] and
//! carries out its commands.
//!
//! The world is honest: every event it produces is a fact at the moment it
//! is produced. Faults are what a real cluster does: events lost, delayed,
//! reordered or delivered twice; the driver crashing (between or inside a
//! batch) and reloading the durable record; the source or target restarting
//! and losing their volatile state (snapshots, streams); the metadata store
//! down, or applying a write whose answer is lost; a foreign epoch bump; a
//! split of the partition at any moment (also right after a flip whose
//! answer was lost: the partition id is gone, and only the map's history
//! tells whose row it was); a target that silently lost a key before the
//! fence; the source or the target unreachable for the drop of its copy.
//!
//! [`World::check`] asserts the protocol's promises after every step,
//! independently of the machine's own assertions.

use keyway_map::{Epoch, KeyspaceId, NodeId, PartitionId, PartitionRecord, PartitionState};
use keyway_migration::{
    Actor, Command, Event, FlipEvidence, Migration, MigrationConfig, MigrationId, MigrationRecord,
    MigrationState, RangeDigest,
};
use std::collections::BTreeMap;

pub const SRC: NodeId = NodeId(1);
pub const TGT: NodeId = NodeId(2);
pub const E: Epoch = Epoch(4);
pub const E1: Epoch = Epoch(5);

/// How the metadata store answers writes (the migration record and the CAS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    Up,
    /// Unreachable: nothing applies, the caller gets "unavailable".
    Down,
    /// Applies the write, but the answer is lost: the caller gets "unavailable".
    Ambiguous,
}

/// Key → (value or tombstone, version). Applying keeps the higher version
/// (last writer wins by version, as the storage engine's foreign apply).
type Data = BTreeMap<u8, (Option<u64>, u64)>;

fn apply(data: &mut Data, key: u8, value: Option<u64>, version: u64) {
    if data.get(&key).is_none_or(|(_, v)| version > *v) {
        data.insert(key, (value, version));
    }
}

fn live(data: &Data, key: u8) -> Option<u64> {
    data.get(&key).and_then(|(v, _)| *v)
}

fn digest(data: &Data) -> RangeDigest {
    let mut d = RangeDigest::default();
    for (k, (v, _)) in data {
        if let Some(v) = v {
            d.keys += 1;
            d.bytes += 9;
            d.digest = (d.digest ^ ((*k as u64) << 56 ^ v)).wrapping_mul(0x100_0000_01b3);
        }
    }
    d
}

#[derive(Debug, Default)]
pub struct Source {
    pub view: Option<(NodeId, Epoch)>,
    pub fenced: bool,
    pub dual: bool,
    pub dropped: bool,
    pub data: Data,
    /// The change log: entry i has seq i + 1.
    pub log: Vec<(u8, Option<u64>, u64)>,
    pub snapshots: BTreeMap<u64, Data>,
    /// Snapshot seq being copied and how many entries went.
    pub copy: Option<(u64, usize)>,
}

impl Source {
    pub fn seq(&self) -> u64 {
        self.log.len() as u64
    }
    pub fn accepts_writes(&self) -> bool {
        !self.fenced && !self.dropped && self.view.is_some_and(|(owner, _)| owner == SRC)
    }
}

#[derive(Debug, Default)]
pub struct Target {
    pub view: Option<(NodeId, Epoch)>,
    pub data: Data,
    pub applied_seq: u64,
    pub catchup: bool,
    pub dropped: bool,
}

impl Target {
    pub fn accepts_writes(&self) -> bool {
        !self.dropped && self.view.is_some_and(|(owner, _)| owner == TGT)
    }
}

pub struct World {
    pub cfg: MigrationConfig,
    pub now: u64,
    /// `None` while the driver is down.
    pub machine: Option<Migration>,
    /// The metadata store's migration record.
    pub durable: MigrationRecord,
    /// The metadata store's (owner, epoch) of the rows covering the range:
    /// the partition's row, or after a split both children's.
    pub map: (NodeId, Epoch),
    /// The partition was split: its id is gone, two children cover the range.
    pub split: bool,
    /// The map's history of the range after (source, e): each change's
    /// resulting (owner, epoch), in order.
    pub map_log: Vec<(NodeId, Epoch)>,
    /// A split happened while the flip was in doubt and had applied.
    pub split_after_lost_flip: bool,
    /// The target (source) cannot be reached for the drop of its copy.
    pub tgt_down: bool,
    pub src_down: bool,
    /// The record ended with a stray copy at least once.
    pub stray_left: bool,
    /// The next flip CAS that applies loses its answer (one shot).
    pub lose_flip_answer: bool,
    pub store: Store,
    pub flips_applied: u32,
    pub first_flip: Option<Command>,
    pub src: Source,
    pub tgt: Target,
    /// Latest acknowledged value (or delete) per key.
    pub acked: BTreeMap<u8, Option<u64>>,
    pub version: u64,
    pub pending: Vec<Event>,
    pub history: Vec<Event>,
    pub timers: Vec<(u64, Event)>,
    pub pauses: Vec<u64>,
    pub finished: bool,
    pub crash_at: Option<usize>,
    /// The store goes down right after the next successful Persist.
    pub down_after_persist: bool,
    pub flip_was_in_doubt: bool,
    pub rejected: usize,
}

pub fn partition() -> PartitionRecord {
    PartitionRecord {
        id: PartitionId(7),
        keyspace: KeyspaceId(0),
        start: bytes::Bytes::from_static(&[0x10, 0x00]),
        end: Some(bytes::Bytes::from_static(&[0x20, 0x00])),
        owner: SRC,
        replicas: vec![],
        in_sync: Vec::new(),
        reads_from: None,
        epoch: E,
        state: PartitionState::Active,
    }
}

pub fn config() -> MigrationConfig {
    MigrationConfig {
        catchup_lag_threshold: 2,
        stuck_timeout_ms: 4_000,
        fence_timeout_ms: 1_000,
        cleanup_grace_ms: 1_500,
        retry_interval_ms: 300,
        cleanup_attempts: 3,
    }
}

impl World {
    pub fn new() -> World {
        let cfg = config();
        let record = MigrationRecord::new(MigrationId(1), partition(), TGT, 0);
        let mut w = World {
            machine: Some(Migration::new(record.clone(), cfg.clone()).unwrap()),
            cfg,
            now: 0,
            durable: record,
            map: (SRC, E),
            split: false,
            map_log: Vec::new(),
            split_after_lost_flip: false,
            tgt_down: false,
            src_down: false,
            stray_left: false,
            lose_flip_answer: false,
            store: Store::Up,
            flips_applied: 0,
            first_flip: None,
            src: Source::default(),
            tgt: Target::default(),
            acked: BTreeMap::new(),
            version: 0,
            pending: Vec::new(),
            history: Vec::new(),
            timers: Vec::new(),
            pauses: Vec::new(),
            finished: false,
            crash_at: None,
            down_after_persist: false,
            flip_was_in_doubt: false,
            rejected: 0,
        };
        w.propagate();
        for key in 0..4 {
            w.write(key, Some(100 + key as u64), false);
        }
        w.deliver(Event::Started { now: 0 });
        w
    }

    pub fn state(&self) -> Option<MigrationState> {
        self.machine.as_ref().map(|m| m.state())
    }

    fn observe(&mut self, event: Event) {
        self.history.push(event.clone());
        self.pending.push(event);
    }

    /// Feeds one event to the driver's machine and executes what it returns.
    pub fn deliver(&mut self, event: Event) {
        let Some(m) = self.machine.as_mut() else {
            return; // the driver is down: the event is lost
        };
        let before = m.record().clone();
        match m.handle(event) {
            Err(_) => {
                assert_eq!(*m.record(), before, "a rejected event changed the record");
                self.rejected += 1;
            }
            Ok(cmds) => {
                let after = m.record().clone();
                check_batch(&before, &after, &cmds);
                self.execute(cmds);
            }
        }
    }

    fn execute(&mut self, cmds: Vec<Command>) {
        let crash_at = self.crash_at.take();
        for (i, cmd) in cmds.into_iter().enumerate() {
            if crash_at == Some(i) {
                return self.crash_driver();
            }
            if !self.run(cmd) {
                // A failed Persist: drop the rest, reload, `Recovered`.
                return self.crash_driver();
            }
        }
    }

    /// Carries out one command; false if it was a Persist that failed.
    fn run(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Persist(record) => {
                if self.store != Store::Down {
                    assert_eq!(
                        record.generation,
                        self.durable.generation + 1,
                        "CAS on generation"
                    );
                    self.durable = record;
                }
                let ok = self.store == Store::Up;
                if ok && self.down_after_persist {
                    self.down_after_persist = false;
                    self.store = Store::Down;
                }
                return ok;
            }
            Command::TakeSnapshot => {
                let seq = self.src.seq();
                self.src.snapshots.insert(seq, self.src.data.clone());
                let total_bytes = self.src.data.len() as u64;
                self.observe(Event::SnapshotTaken { seq, total_bytes });
            }
            Command::StartCopy { from_seq } => {
                if self.src.snapshots.contains_key(&from_seq) {
                    self.src.copy = Some((from_seq, 0));
                } else {
                    let detail = format!("no snapshot {from_seq}");
                    self.observe(Event::ActorFailed {
                        who: Actor::Source,
                        detail,
                    });
                }
            }
            Command::StartCatchup { after_seq } => {
                self.tgt.applied_seq = self.tgt.applied_seq.max(after_seq);
                self.tgt.catchup = true;
                let (applied_seq, source_seq) = (self.tgt.applied_seq, self.src.seq());
                self.observe(Event::CatchupLag {
                    applied_seq,
                    source_seq,
                });
            }
            Command::EnableDual => {
                self.src.dual = true;
                let at_seq = self.src.seq();
                self.observe(Event::DualEnabled { at_seq });
            }
            Command::DisableDual => self.src.dual = false,
            Command::FenceSource => {
                self.src.fenced = true;
                self.observe(Event::SourceFenced { now: self.now });
            }
            Command::ComputeDigests => {
                assert!(self.src.fenced, "digests away from the fence point");
                let (source, target) = (digest(&self.src.data), digest(&self.tgt.data));
                self.observe(Event::Digests { source, target });
            }
            cas @ Command::CommitFlip { .. } => self.commit_flip(cas),
            Command::AwaitTargetServing { epoch } => {
                assert!(
                    self.map.0 == TGT && self.map.1 >= epoch,
                    "target asked to serve without the flip"
                );
                self.tgt.view = Some(self.map);
                self.observe(Event::TargetServing {
                    now: self.now,
                    steps: Default::default(),
                });
            }
            Command::UnfenceSource => {
                assert_eq!(
                    self.flips_applied, 0,
                    "UnfenceSource after the flip applied"
                );
                self.src.fenced = false;
            }
            Command::DropTargetCopy => {
                assert_eq!(
                    self.flips_applied, 0,
                    "DropTargetCopy after the flip applied"
                );
                if self.tgt_down {
                    self.observe(Event::ActorFailed {
                        who: Actor::Target,
                        detail: "unreachable".into(),
                    });
                    return true;
                }
                assert!(
                    !self.src.dual,
                    "target copy dropped while the source forwards to it"
                );
                self.tgt.data.clear();
                self.tgt.dropped = true;
                self.tgt.catchup = false;
                self.src.copy = None;
                self.observe(Event::TargetDropped);
            }
            Command::StartGrace { ms } => self.timers.push((self.now + ms, Event::GraceElapsed)),
            Command::DropSourceRange { moved_to, epoch } => {
                assert!(
                    self.map.0 == moved_to && self.map.1 >= epoch,
                    "source dropped before the flip"
                );
                if self.src_down {
                    self.observe(Event::ActorFailed {
                        who: Actor::Source,
                        detail: "unreachable".into(),
                    });
                    return true;
                }
                self.src.dropped = true;
                self.src.data.clear();
                self.observe(Event::SourceDropped);
            }
            Command::RecordPause { ms } => self.pauses.push(ms),
            Command::Finish => {
                self.finished = true;
                let durable = &self.durable;
                self.stray_left |= durable.stray.is_some();
            }
        }
        true
    }

    fn commit_flip(&mut self, cas: Command) {
        let Command::CommitFlip {
            condition,
            new_record,
        } = &cas
        else {
            unreachable!()
        };
        // Invariant 1 (world side): the flip is asked only when the source
        // is fenced and dual-writing.
        assert!(self.src.fenced, "CommitFlip while the source is not fenced");
        assert!(self.src.dual, "CommitFlip without dual-writing");
        assert_eq!(condition.expected, Some((SRC, E)));
        assert_eq!((new_record.owner, new_record.epoch), (TGT, E1));
        match &self.first_flip {
            None => self.first_flip = Some(cas.clone()),
            Some(first) => assert_eq!(*first, cas, "every CommitFlip is the same CAS"),
        }
        if self.store != Store::Up {
            self.flip_was_in_doubt = true;
        }
        if self.store == Store::Down {
            return self.observe(Event::FlipUnavailable);
        }
        let applied = !self.split && self.map == (SRC, E);
        if applied {
            self.map = (TGT, E1);
            self.map_log.push(self.map);
            self.flips_applied += 1;
            // Invariant 5: every acknowledged write is at the target.
            for (k, v) in &self.acked {
                assert_eq!(
                    live(&self.tgt.data, *k),
                    *v,
                    "acked write to {k} missing at the flip"
                );
            }
        }
        let lost = applied && std::mem::take(&mut self.lose_flip_answer);
        if lost {
            self.flip_was_in_doubt = true;
        }
        match (self.store, applied) {
            (Store::Ambiguous, _) => self.observe(Event::FlipUnavailable),
            (_, true) if lost => self.observe(Event::FlipUnavailable),
            (_, true) => self.observe(Event::FlipCommitted { now: self.now }),
            (_, false) => {
                let evidence = self.flip_evidence();
                self.observe(Event::FlipConflict { evidence })
            }
        }
    }

    /// What a driver finds in the map after a failed flip condition.
    pub fn flip_evidence(&self) -> FlipEvidence {
        FlipEvidence {
            current: (!self.split).then_some(self.map),
            successor: self.map_log.first().copied(),
            covering: vec![self.map; if self.split { 2 } else { 1 }],
        }
    }

    /// An operator splits the partition (metadata only): two children with
    /// the current owner at epoch + 1 replace it, whatever the migration is
    /// doing (a split that raced the manager's check, or bypassed it).
    pub fn split_partition(&mut self) {
        if self.split {
            return;
        }
        self.split_now();
    }

    /// The split of issue 11: only right after a flip that applied while its
    /// answer was lost (the record is still in doubt); otherwise nothing.
    pub fn split_after_lost_flip(&mut self) {
        if !self.split && self.flips_applied == 1 && self.durable.flip_in_doubt() {
            self.split_now();
        }
    }

    fn split_now(&mut self) {
        if self.flips_applied == 1 && self.durable.flip_in_doubt() {
            self.split_after_lost_flip = true;
        }
        self.split = true;
        self.map.1 = Epoch(self.map.1.0 + 1);
        self.map_log.push(self.map);
    }

    /// A client write (or delete) sent to the source or the target.
    pub fn write(&mut self, key: u8, value: Option<u64>, at_target: bool) {
        self.version += 1;
        let version = self.version;
        if at_target {
            if self.tgt.accepts_writes() {
                self.tgt.data.insert(key, (value, version));
                self.acked.insert(key, value);
            }
            return;
        }
        if !self.src.accepts_writes() {
            return;
        }
        if self.src.dual {
            if self.tgt.dropped {
                return; // forwarding failed: not acknowledged
            }
            apply(&mut self.tgt.data, key, value, version);
        }
        self.src.log.push((key, value, version));
        self.src.data.insert(key, (value, version));
        self.acked.insert(key, value);
    }

    /// The nodes stream a little: snapshot entries, then change-log records.
    pub fn stream(&mut self) {
        if let Some((seq, next)) = self.src.copy {
            let snapshot = &self.src.snapshots[&seq];
            let batch: Vec<_> = snapshot
                .iter()
                .skip(next)
                .take(2)
                .map(|(k, v)| (*k, *v))
                .collect();
            for (k, (v, ver)) in &batch {
                apply(&mut self.tgt.data, *k, *v, *ver);
            }
            let next = next + batch.len();
            let total = snapshot.len();
            self.observe(Event::CopyProgress { bytes: next as u64 });
            if next == total {
                self.src.copy = None;
                self.tgt.applied_seq = self.tgt.applied_seq.max(seq);
                self.observe(Event::CopyDone);
            } else {
                self.src.copy = Some((seq, next));
            }
        }
        if self.tgt.catchup && !self.tgt.dropped {
            for _ in 0..2 {
                if let Some(&(k, v, ver)) = self.src.log.get(self.tgt.applied_seq as usize) {
                    apply(&mut self.tgt.data, k, v, ver);
                    self.tgt.applied_seq += 1;
                }
            }
            let (applied_seq, source_seq) = (self.tgt.applied_seq, self.src.seq());
            self.observe(Event::CatchupLag {
                applied_seq,
                source_seq,
            });
        }
    }

    /// Both nodes learn the current map.
    pub fn propagate(&mut self) {
        self.src.view = Some(self.map);
        self.tgt.view = Some(self.map);
    }

    pub fn fire_timers(&mut self) {
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) = self.timers.drain(..).partition(|(at, _)| *at <= now);
        self.timers = later;
        for (_, event) in due {
            self.pending.push(event);
        }
    }

    pub fn tick(&mut self, ms: u64) {
        self.now += ms;
        self.deliver(Event::Tick { now: self.now });
    }

    /// The driver dies: its in-memory state, timers and inbox are gone.
    pub fn crash_driver(&mut self) {
        self.machine = None;
        self.pending.clear();
        self.timers.clear();
    }

    /// The driver restarts from the durable record (needs a readable store).
    pub fn restart_driver(&mut self) {
        if self.machine.is_some() || self.store == Store::Down {
            return;
        }
        let m =
            Migration::new(self.durable.clone(), self.cfg.clone()).expect("durable record valid");
        self.machine = Some(m);
        self.finished = false;
        self.deliver(Event::Recovered { now: self.now });
        if self.state() == Some(MigrationState::Pending) {
            self.deliver(Event::Started { now: self.now });
        }
    }

    pub fn source_fails(&mut self) {
        self.src.snapshots.clear();
        self.src.copy = None;
        self.tgt.catchup = false;
        self.observe(Event::ActorFailed {
            who: Actor::Source,
            detail: "restarted".into(),
        });
    }

    pub fn target_fails(&mut self) {
        self.src.copy = None;
        self.tgt.catchup = false;
        self.observe(Event::ActorFailed {
            who: Actor::Target,
            detail: "restarted".into(),
        });
    }

    /// Someone else changed the partition (e.g. a replica change) before the flip.
    pub fn foreign_bump(&mut self) {
        if self.map.0 == SRC {
            self.map.1 = Epoch(self.map.1.0 + 1);
            self.map_log.push(self.map);
        }
    }

    /// The target silently loses a key (a streaming bug) before the fence.
    pub fn corrupt_target(&mut self, key: u8) {
        if !self.src.fenced && self.flips_applied == 0 {
            self.tgt.data.remove(&key);
        }
    }

    /// The promises that must hold after every step.
    pub fn check(&self) {
        // Invariant 1: at most one node accepts writes.
        assert!(
            !(self.src.accepts_writes() && self.tgt.accepts_writes()),
            "two owners accept writes"
        );
        assert!(self.flips_applied <= 1, "a second flip applied");
        if self.flips_applied == 0 {
            assert_eq!(
                self.map.0, SRC,
                "before the flip the source owns the partition"
            );
            assert!(self.map.1 >= E);
            assert!(!self.src.dropped, "source dropped before the flip");
            for (k, v) in &self.acked {
                assert_eq!(
                    live(&self.src.data, *k),
                    *v,
                    "acked write to {k} lost at the source"
                );
            }
        } else {
            assert!(self.map.0 == TGT && self.map.1 >= E1, "{:?}", self.map);
            // Invariant 5: acknowledged means present at the new owner.
            for (k, v) in &self.acked {
                assert_eq!(
                    live(&self.tgt.data, *k),
                    *v,
                    "acked write to {k} missing at the target"
                );
            }
        }
        if let Some(m) = &self.machine {
            let r = m.record();
            if r.flipped() {
                assert_eq!(
                    self.flips_applied, 1,
                    "the machine believes in a flip that did not apply"
                );
            }
            if r.state == MigrationState::Aborted {
                assert_eq!(self.flips_applied, 0, "aborted although the flip applied");
            }
        }
        if self.durable.state == MigrationState::Aborted {
            assert_eq!(
                self.flips_applied, 0,
                "ABORTED persisted although the flip applied"
            );
        }
        // A record that forgot its stray copy left none behind.
        if self.durable.state.is_terminal() && self.durable.stray.is_none() {
            match self.durable.state {
                MigrationState::Aborted => assert!(
                    self.tgt.dropped && self.tgt.data.is_empty(),
                    "ABORTED without a stray copy, but the target holds one"
                ),
                _ => assert!(
                    self.src.dropped,
                    "DONE without a stray copy, but the source holds one"
                ),
            }
        }
    }

    /// The world stops failing; time passes. Returns the terminal state.
    pub fn settle(&mut self) -> MigrationState {
        self.store = Store::Up;
        self.crash_at = None;
        self.down_after_persist = false;
        self.tgt_down = false;
        self.src_down = false;
        for _ in 0..1_000 {
            if self.finished && self.durable.stray.is_some() {
                // The node is back: a later driver drives the record again.
                self.crash_driver();
            }
            self.restart_driver();
            while !self.pending.is_empty() {
                let event = self.pending.remove(0);
                self.deliver(event);
                self.check();
            }
            if let Some(state) = self.state()
                && state.is_terminal()
                && self.finished
                && self.durable.stray.is_none()
            {
                self.check_end(state);
                return state;
            }
            self.stream();
            self.propagate();
            self.fire_timers();
            self.tick(100);
            self.check();
        }
        panic!(
            "stuck in {:?} (durable {:?})",
            self.state(),
            self.durable.state
        );
    }

    fn check_end(&self, state: MigrationState) {
        self.check();
        match state {
            MigrationState::Done => {
                assert!(self.map.0 == TGT && self.map.1 >= E1 && self.flips_applied == 1);
                assert!(self.src.dropped && !self.tgt.dropped);
                // RecordPause is at most once (a crash may lose it); the
                // durable record always has the measurement.
                assert!(self.pauses.len() <= 1, "the pause is recorded at most once");
                assert!(
                    self.pauses
                        .iter()
                        .all(|p| Some(*p) == self.durable.pause_ms)
                );
                assert!(self.durable.pause_ms.is_some());
            }
            MigrationState::Aborted => {
                assert_eq!(self.flips_applied, 0);
                assert!(
                    !self.src.fenced && !self.src.dual,
                    "the source serves alone again"
                );
                assert!(self.tgt.dropped, "the target's copy is dropped");
                assert!(self.pauses.is_empty());
            }
            other => panic!("not terminal: {other}"),
        }
    }
}

/// The machine's promises about one batch, checked from outside.
fn check_batch(before: &MigrationRecord, after: &MigrationRecord, cmds: &[Command]) {
    let persists = cmds
        .iter()
        .filter(|c| matches!(c, Command::Persist(_)))
        .count();
    if before.state != after.state {
        assert!(
            matches!(cmds.first(), Some(Command::Persist(_))),
            "state change without Persist first"
        );
    }
    if persists > 0 {
        assert_eq!(persists, 1);
        assert!(matches!(&cmds[0], Command::Persist(r) if r == after));
        assert_eq!(after.generation, before.generation + 1);
    } else {
        assert_eq!(after.generation, before.generation);
    }
    if after.state == MigrationState::Aborted && before.state != MigrationState::Aborted {
        assert!(!before.flipped(), "abort after the flip");
        assert!(cmds.contains(&Command::DropTargetCopy));
        assert_eq!(
            after.stray,
            Some(after.target),
            "the target's copy is remembered"
        );
        if before.state == MigrationState::Cutover {
            assert!(cmds.contains(&Command::UnfenceSource));
        }
    }
}
