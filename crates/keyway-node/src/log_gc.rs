//! The change log stays bounded: log holds and background truncation.
//!
//! Everything that reads this node's change log from some seq on registers
//! a **log hold** ([`LogHolds::hold`], a [`HoldGuard`] that releases on
//! drop): a migration push holds the records after its target-acknowledged
//! seq (`crate::migrate::Push`), later a replica will hold what it has not
//! applied. The manager's snapshot of a source (`LastSeq`, the seq a
//! migration's catch-up starts after) takes a short timed hold, a
//! [`LogHolds::lease`], that covers the gap until the push registers.
//!
//! The **truncator** ([`run`], on its own thread: fjall blocks) wakes every
//! `log_truncate_interval_ms` and truncates the log below
//! [`LogHolds::min_needed_seq`] (everything, with no hold), in chunks of
//! `log_truncate_chunk_records` records, each one fjall batch, taking the
//! holds' lock only for one chunk, so neither a foreground write (which
//! never takes that lock) nor a registration waits long. It then lets the
//! engine give the space back ([`Engine::reclaim_space`]).
//!
//! **Retention**: when what the holds keep is more than
//! `log_retention_bytes` ([`Engine::log_bytes`] after truncating up to the
//! oldest hold), the oldest hold is failed: its holder is told
//! [`RETENTION_EXCEEDED`] (a push then fails, and its migration aborts with
//! that reason) and the hold is released at once, so the disk does not fill
//! for a migration that fell behind.
//!
//! **Records not kept while nobody reads**: a log that no hold needs is
//! truncated whole at once, so writing it is wasted (a second LSM insert
//! per write: about 40 % of a `SET -P 16` load's throughput, measured in
//! stop 29). Once no hold has existed for `log_keep_idle_ms`, the
//! truncator switches the engine's records off ([`Engine::keep_log`]):
//! seqs still advance, the log stays truncated whole. Every registration
//! ([`LogHolds::hold`], [`LogHolds::lease`]) and [`LogHolds::arm`]
//! switches them on first, under the registry's lock; a reader that must
//! name its first needed seq from the last seq ([`LogHolds::arm`] then
//! `last_seq`) therefore finds every record after it. A hold asked for
//! records from before the switch is refused, as for records truncated:
//! its holder takes the path it takes for a truncated log (a migration
//! fails and is retried, a replication stream starts lost and copies).
//! The grace period keeps them on between such a refusal and the retry.
//!
//! Ordering argument: a hold registers under the same lock the truncator
//! holds from reading the lowest needed seq to finishing a chunk, and is
//! refused if its first needed record is already gone; holders only move
//! their seq forward. So no record a registered hold needs is ever dropped.

use crate::metrics::Metrics;
use keyway_storage::{Engine, Seq};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The reason a hold (and so a migration) fails when the log it keeps
/// would pass `log_retention_bytes`.
pub const RETENTION_EXCEEDED: &str = "log retention exceeded";

/// Timed holds kept at most (`LastSeq` calls within `log_snapshot_hold_ms`);
/// beyond it the one expiring first is dropped.
const MAX_LEASES: usize = 256;

/// Told when its hold is failed for retention.
pub type OnExceeded = Box<dyn Fn(&str) + Send + Sync>;

struct Entry {
    name: String,
    /// Lowest seq still needed (records `>= needed` are kept).
    needed: Arc<AtomicU64>,
    /// `None` for a hold kept until its guard drops.
    expires: Option<Instant>,
    on_exceeded: Option<OnExceeded>,
}

struct Inner {
    next_id: u64,
    entries: BTreeMap<u64, Entry>,
    /// The last time a hold existed or a reader armed the log.
    active_at: Instant,
}

impl Inner {
    /// Forgets the timed holds that ran out by `now`.
    fn drop_expired(&mut self, now: Instant) {
        self.entries
            .retain(|_, e| e.expires.is_none_or(|t| t > now));
    }
}

/// The registry of log holds (see the module docs). Cheap to share.
pub struct LogHolds {
    engine: Arc<dyn Engine>,
    inner: Mutex<Inner>,
    /// Records are switched off after this long without a hold (`None`:
    /// always kept).
    keep_idle: Option<Duration>,
}

/// A registered hold; dropping it releases the hold.
pub struct HoldGuard {
    holds: Arc<LogHolds>,
    id: u64,
    needed: Arc<AtomicU64>,
    released: AtomicBool,
}

impl HoldGuard {
    /// The holder no longer needs records before `needed` (never moves back).
    pub fn advance(&self, needed: Seq) {
        self.needed.fetch_max(needed, Ordering::AcqRel);
    }

    /// The lowest seq this hold keeps.
    pub fn needed(&self) -> Seq {
        self.needed.load(Ordering::Acquire)
    }

    /// Releases the hold now (also done on drop).
    pub fn release(&self) {
        if !self.released.swap(true, Ordering::AcqRel) {
            self.holds.lock().entries.remove(&self.id);
        }
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        self.release();
    }
}

/// One hold as `/status` shows it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct HoldView {
    pub name: String,
    /// Lowest seq it keeps.
    pub needed_seq: Seq,
    /// Milliseconds left on a timed hold (`None` = until released).
    pub expires_in_ms: Option<u64>,
}

/// Why a hold could not be registered.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[error("the change log starts at {log_start}: records from {needed} are gone")]
pub struct AlreadyTruncated {
    pub needed: Seq,
    pub log_start: Seq,
}

impl LogHolds {
    /// A registry whose truncator never switches records off.
    pub fn new(engine: Arc<dyn Engine>) -> Arc<Self> {
        Self::with_keep_idle(engine, None)
    }

    /// A registry whose truncator switches the engine's records off after
    /// `keep_idle` without a hold (`None`: never).
    pub fn with_keep_idle(engine: Arc<dyn Engine>, keep_idle: Option<Duration>) -> Arc<Self> {
        Arc::new(LogHolds {
            engine,
            inner: Mutex::new(Inner {
                next_id: 0,
                entries: BTreeMap::new(),
                active_at: Instant::now(),
            }),
            keep_idle,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update is one map insert/remove: nothing is left half-done.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records of every write after the last seq read after this call
    /// are kept (until no hold has existed for `log_keep_idle_ms`): what a
    /// reader calls before it reads the last seq it will register a hold
    /// or a lease after. Blocking when it switches records on (one small
    /// engine batch).
    pub fn arm(&self) {
        let mut inner = self.lock();
        self.arm_locked(&mut inner);
    }

    fn arm_locked(&self, inner: &mut Inner) {
        inner.active_at = Instant::now();
        if !self.engine.log_kept()
            && let Err(e) = self.engine.keep_log(true)
        {
            // The hold that follows is refused (its records are not there).
            tracing::warn!(%e, "cannot switch the change log's records on");
        }
    }

    /// Switches the engine's records off when no hold has existed for
    /// `keep_idle`; returns whether it did.
    fn stop_keeping_if_idle(&self) -> Result<bool, keyway_storage::StorageError> {
        let Some(idle) = self.keep_idle else {
            return Ok(false);
        };
        let mut inner = self.lock();
        let now = Instant::now();
        inner.drop_expired(now);
        if !inner.entries.is_empty() {
            inner.active_at = now;
            return Ok(false);
        }
        if !self.engine.log_kept() || now.duration_since(inner.active_at) < idle {
            return Ok(false);
        }
        let at = self.engine.keep_log(false)?;
        tracing::info!(
            last_seq = at,
            "change log: no reader for {idle:?}, records are no longer kept"
        );
        Ok(true)
    }

    /// Holds every record with seq `>= needed` until the guard drops;
    /// `on_exceeded` is called (and the hold released) if keeping them
    /// would pass the retention limit. Refused if the log already starts
    /// after `needed`.
    pub fn hold(
        self: &Arc<Self>,
        name: impl Into<String>,
        needed: Seq,
        on_exceeded: OnExceeded,
    ) -> Result<HoldGuard, AlreadyTruncated> {
        let mut inner = self.lock();
        self.arm_locked(&mut inner);
        let log_start = self.engine.log_start();
        if needed < log_start {
            return Err(AlreadyTruncated { needed, log_start });
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let needed = Arc::new(AtomicU64::new(needed));
        inner.entries.insert(
            id,
            Entry {
                name: name.into(),
                needed: needed.clone(),
                expires: None,
                on_exceeded: Some(on_exceeded),
            },
        );
        Ok(HoldGuard {
            holds: self.clone(),
            id,
            needed,
            released: AtomicBool::new(false),
        })
    }

    /// Holds records with seq `>= needed` for `ttl` (no guard). Best
    /// effort: nothing happens if they are already gone.
    pub fn lease(&self, name: impl Into<String>, needed: Seq, ttl: Duration) {
        let mut inner = self.lock();
        self.arm_locked(&mut inner);
        if needed < self.engine.log_start() {
            return;
        }
        let now = Instant::now();
        inner.drop_expired(now);
        let leases = inner
            .entries
            .values()
            .filter(|e| e.expires.is_some())
            .count();
        if leases >= MAX_LEASES
            && let Some(first) = inner
                .entries
                .iter()
                .filter_map(|(id, e)| e.expires.map(|t| (t, *id)))
                .min()
        {
            inner.entries.remove(&first.1);
        }
        let id = inner.next_id;
        inner.next_id += 1;
        inner.entries.insert(
            id,
            Entry {
                name: name.into(),
                needed: Arc::new(AtomicU64::new(needed)),
                expires: Some(now + ttl),
                on_exceeded: None,
            },
        );
    }

    /// The lowest seq any live hold still needs (`None`: no hold).
    pub fn min_needed_seq(&self) -> Option<Seq> {
        Self::min_of(&self.lock(), Instant::now()).map(|(_, seq)| seq)
    }

    fn min_of(inner: &Inner, now: Instant) -> Option<(u64, Seq)> {
        inner
            .entries
            .iter()
            .filter(|(_, e)| e.expires.is_none_or(|t| t > now))
            .map(|(id, e)| (*id, e.needed.load(Ordering::Acquire)))
            .min_by_key(|(id, seq)| (*seq, *id))
    }

    /// The holds, oldest needed seq first.
    pub fn list(&self) -> Vec<HoldView> {
        let now = Instant::now();
        let mut out: Vec<HoldView> = self
            .lock()
            .entries
            .values()
            .filter(|e| e.expires.is_none_or(|t| t > now))
            .map(|e| HoldView {
                name: e.name.clone(),
                needed_seq: e.needed.load(Ordering::Acquire),
                expires_in_ms: e
                    .expires
                    .map(|t| t.saturating_duration_since(now).as_millis() as u64),
            })
            .collect();
        out.sort_by_key(|h| h.needed_seq);
        out
    }

    /// One chunk of truncation under the lock: drops records below the
    /// lowest needed seq, at most `chunk` of them. Returns whether more
    /// could be dropped now.
    fn truncate_chunk(&self, chunk: u64) -> Result<bool, keyway_storage::StorageError> {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.drop_expired(now);
        let head = self.engine.last_seq();
        let keep_from = Self::min_of(&inner, now).map_or(head + 1, |(_, s)| s.min(head + 1));
        let start = self.engine.log_start();
        if keep_from <= start {
            return Ok(false);
        }
        let upto = (keep_from - 1).min(start - 1 + chunk);
        self.engine.truncate_log(upto)?;
        Ok(upto + 1 < keep_from)
    }

    /// Fails the hold keeping the oldest records if what the log retains
    /// passes `retention_bytes`. Returns whether one was failed.
    fn enforce_retention(&self, retention_bytes: u64) -> bool {
        if self.engine.log_bytes() <= retention_bytes {
            return false;
        }
        let failed = {
            let mut inner = self.lock();
            let Some((id, _)) = Self::min_of(&inner, Instant::now()) else {
                return false;
            };
            inner.entries.remove(&id)
        };
        let Some(entry) = failed else {
            return false;
        };
        tracing::warn!(hold = %entry.name, needed_seq = entry.needed.load(Ordering::Acquire),
            log_bytes = self.engine.log_bytes(), retention_bytes,
            "change log retention exceeded: hold released");
        if let Some(tell) = entry.on_exceeded {
            tell(RETENTION_EXCEEDED);
        }
        true
    }
}

/// Limits of the truncator, from the node configuration.
#[derive(Clone, Copy, Debug)]
pub struct GcLimits {
    pub interval: Duration,
    pub chunk_records: u64,
    pub retention_bytes: u64,
}

/// The truncator's metrics (registered with the node's [`Metrics`]).
#[derive(Clone, Default)]
pub struct GcMetrics {
    pub log_bytes: Gauge,
    pub log_records: Gauge,
    pub first_seq: Gauge,
    pub last_seq: Gauge,
    pub truncated_records: Counter,
    /// Truncation passes completed (each looks at every hold once at least).
    pub passes: Counter,
    pub retention_failures: Counter,
    pub holds: Gauge,
    /// 1 while the engine keeps change records, 0 while it does not.
    pub records_kept: Gauge,
    /// Times the truncator switched records off (no reader).
    pub records_off: Counter,
}

impl GcMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let m = GcMetrics::default();
        metrics.register(
            "change_log_bytes",
            "Bytes of change records retained (seq + encoded mutation)",
            m.log_bytes.clone(),
        );
        metrics.register(
            "change_log_records",
            "Change records retained",
            m.log_records.clone(),
        );
        metrics.register(
            "change_log_first_seq",
            "Oldest change-log seq retained (log_start)",
            m.first_seq.clone(),
        );
        metrics.register(
            "change_log_last_seq",
            "Newest change-log seq",
            m.last_seq.clone(),
        );
        metrics.register(
            "change_log_truncated_records",
            "Change records truncated in the background",
            m.truncated_records.clone(),
        );
        metrics.register(
            "change_log_truncation_passes",
            "Background truncation passes completed",
            m.passes.clone(),
        );
        metrics.register(
            "change_log_retention_failures",
            "Log holds failed because they would keep more than log_retention_bytes",
            m.retention_failures.clone(),
        );
        metrics.register(
            "change_log_records_kept",
            "1 while writes keep change records, 0 while no reader needs them (log_keep_idle_ms)",
            m.records_kept.clone(),
        );
        metrics.register(
            "change_log_records_switched_off",
            "Times the change log's records were switched off after log_keep_idle_ms without a hold",
            m.records_off.clone(),
        );
        metrics.register(
            "change_log_holds",
            "Live log holds (migrations, snapshot leases)",
            m.holds.clone(),
        );
        m
    }

    /// Sets the gauges from the engine's current log.
    pub fn observe(&self, engine: &dyn Engine, holds: usize) {
        let (first, last) = (engine.log_start(), engine.last_seq());
        self.log_bytes.set(engine.log_bytes() as i64);
        self.log_records
            .set((last + 1).saturating_sub(first) as i64);
        self.first_seq.set(first as i64);
        self.last_seq.set(last as i64);
        self.holds.set(holds as i64);
        self.records_kept.set(i64::from(engine.log_kept()));
    }
}

/// The truncator's loop; returns when `stop` is set. Blocking: run it on
/// its own thread.
pub fn run(holds: &LogHolds, limits: GcLimits, metrics: &GcMetrics, stop: &AtomicBool) {
    assert!(limits.chunk_records > 0 && !limits.interval.is_zero());
    while !stop.load(Ordering::Acquire) {
        match pass(holds, limits, metrics, stop) {
            Ok(()) => {
                metrics.passes.inc();
            }
            Err(e) => tracing::warn!(%e, "change log truncation failed; retrying next interval"),
        }
        metrics.observe(&*holds.engine, holds.list().len());
        let until = Instant::now() + limits.interval;
        while !stop.load(Ordering::Acquire) && Instant::now() < until {
            std::thread::sleep(limits.interval.min(Duration::from_millis(50)));
        }
    }
}

/// One pass: truncate what no hold needs (chunk by chunk), enforce the
/// retention limit (which may release holds: truncate again), reclaim space.
pub fn pass(
    holds: &LogHolds,
    limits: GcLimits,
    metrics: &GcMetrics,
    stop: &AtomicBool,
) -> Result<(), keyway_storage::StorageError> {
    loop {
        let before = holds.engine.log_start();
        while holds.truncate_chunk(limits.chunk_records)? {
            if stop.load(Ordering::Acquire) {
                break;
            }
            // Let foreground batches interleave with ours.
            std::thread::yield_now();
        }
        metrics
            .truncated_records
            .inc_by(holds.engine.log_start() - before);
        if !holds.enforce_retention(limits.retention_bytes) {
            break;
        }
        metrics.retention_failures.inc();
    }
    if holds.stop_keeping_if_idle()? {
        metrics.records_off.inc();
    }
    holds.engine.reclaim_space()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use keyway_storage::{MemEngine, Mutation, ValueKind};

    fn write(engine: &dyn Engine, n: usize) {
        for i in 0..n {
            engine
                .apply(&[Mutation::Put {
                    key: Bytes::from(format!("k{}", i % 3)),
                    kind: ValueKind::String,
                    expire_at_ms: None,
                    data: Bytes::from(vec![b'v'; 100]),
                }])
                .unwrap();
        }
    }

    fn limits(retention_bytes: u64) -> GcLimits {
        GcLimits {
            interval: Duration::from_millis(10),
            chunk_records: 7,
            retention_bytes,
        }
    }

    #[test]
    fn truncation_drops_everything_without_holds_and_stops_at_a_hold() {
        let engine: Arc<dyn Engine> = Arc::new(MemEngine::new());
        let holds = LogHolds::new(engine.clone());
        let m = GcMetrics::default();
        let stop = AtomicBool::new(false);
        write(&*engine, 50);
        pass(&holds, limits(u64::MAX), &m, &stop).unwrap();
        assert_eq!(engine.log_start(), 51);
        assert_eq!(engine.log_bytes(), 0);
        assert_eq!(m.truncated_records.get(), 50);

        write(&*engine, 50);
        let guard = holds.hold("migration 1", 60, Box::new(|_| {})).unwrap();
        pass(&holds, limits(u64::MAX), &m, &stop).unwrap();
        assert_eq!(engine.log_start(), 60, "records the hold needs stay");
        assert!(engine.changes_since(59, 100).is_ok());
        guard.advance(90);
        guard.advance(70); // never moves back
        pass(&holds, limits(u64::MAX), &m, &stop).unwrap();
        assert_eq!(engine.log_start(), 90);
        drop(guard);
        pass(&holds, limits(u64::MAX), &m, &stop).unwrap();
        assert_eq!(engine.log_start(), 101);
        assert!(holds.list().is_empty());
    }

    #[test]
    fn records_are_switched_off_without_a_reader_and_on_by_the_next_one() {
        let engine: Arc<dyn Engine> = Arc::new(MemEngine::new());
        let holds = LogHolds::with_keep_idle(engine.clone(), Some(Duration::ZERO));
        let m = GcMetrics::default();
        let stop = AtomicBool::new(false);
        write(&*engine, 10);
        pass(&holds, limits(u64::MAX), &m, &stop).unwrap();
        assert!(!engine.log_kept(), "no reader: switched off");
        assert_eq!(m.records_off.get(), 1);
        write(&*engine, 10);
        assert_eq!((engine.log_start(), engine.log_bytes()), (21, 0));
        assert!(matches!(
            engine.changes_since(15, 10),
            Err(keyway_storage::StorageError::LogTruncated { .. })
        ));

        // A reader arms, then reads the last seq: it finds every record after.
        holds.arm();
        assert!(engine.log_kept());
        let from = engine.last_seq() + 1;
        let guard = holds.hold("replica 2", from, Box::new(|_| {})).unwrap();
        write(&*engine, 5);
        assert_eq!(engine.changes_since(from - 1, 100).unwrap().len(), 5);
        pass(&holds, limits(u64::MAX), &m, &stop).unwrap();
        assert!(engine.log_kept(), "a hold keeps them");
        drop(guard);
        pass(&holds, limits(u64::MAX), &m, &stop).unwrap();
        assert!(!engine.log_kept());
        assert_eq!(m.records_off.get(), 2);

        // A hold on records from before the switch is refused, and arms.
        let stale = engine.last_seq();
        write(&*engine, 3);
        assert!(holds.hold("late", stale + 1, Box::new(|_| {})).is_err());
        assert!(engine.log_kept(), "the refused hold switched them on");
        // A lease arms too.
        assert_eq!(engine.keep_log(false).unwrap(), engine.last_seq());
        holds.lease("snapshot", engine.last_seq() + 1, Duration::from_secs(60));
        assert!(engine.log_kept());
        assert_eq!(holds.list().len(), 1, "registered after the switch");

        // Within the idle time, or with none set, they stay on.
        for idle in [Some(Duration::from_secs(3600)), None] {
            let engine: Arc<dyn Engine> = Arc::new(MemEngine::new());
            let holds = LogHolds::with_keep_idle(engine.clone(), idle);
            write(&*engine, 10);
            pass(&holds, limits(u64::MAX), &m, &stop).unwrap();
            assert!(engine.log_kept(), "{idle:?}");
        }
    }

    #[test]
    fn a_hold_on_truncated_records_is_refused_and_a_lease_holds_for_a_while() {
        let engine: Arc<dyn Engine> = Arc::new(MemEngine::new());
        let holds = LogHolds::new(engine.clone());
        let m = GcMetrics::default();
        let stop = AtomicBool::new(false);
        write(&*engine, 20);
        holds.lease("snapshot", 11, Duration::from_secs(60));
        holds.lease("gone", 1, Duration::ZERO);
        pass(&holds, limits(u64::MAX), &m, &stop).unwrap();
        assert_eq!(engine.log_start(), 11);
        assert_eq!(
            holds.hold("late", 5, Box::new(|_| {})).err(),
            Some(AlreadyTruncated {
                needed: 5,
                log_start: 11
            })
        );
        let names: Vec<String> = holds.list().into_iter().map(|h| h.name).collect();
        assert_eq!(names, vec!["snapshot".to_string()]);
    }

    #[test]
    fn a_hold_keeping_more_than_the_retention_is_failed_and_released() {
        let engine: Arc<dyn Engine> = Arc::new(MemEngine::new());
        let holds = LogHolds::new(engine.clone());
        let m = GcMetrics::default();
        let stop = AtomicBool::new(false);
        let told = Arc::new(Mutex::new(Vec::<String>::new()));
        let t = told.clone();
        let behind = holds
            .hold(
                "migration 7",
                1,
                Box::new(move |why| t.lock().unwrap().push(why.into())),
            )
            .unwrap();
        write(&*engine, 10);
        let per_record = engine.log_bytes() / 10;
        pass(&holds, limits(per_record * 20), &m, &stop).unwrap();
        assert_eq!(engine.log_start(), 1, "within retention: kept");
        assert!(told.lock().unwrap().is_empty());
        write(&*engine, 20);
        pass(&holds, limits(per_record * 20), &m, &stop).unwrap();
        assert_eq!(*told.lock().unwrap(), vec![RETENTION_EXCEEDED.to_string()]);
        assert_eq!(m.retention_failures.get(), 1);
        assert_eq!(engine.log_start(), 31, "released: truncated at once");
        assert!(holds.list().is_empty());
        behind.advance(31);
        drop(behind);
    }
}
