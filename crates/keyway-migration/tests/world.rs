//! The migration machine driven through a model world (`world/model.rs`):
//! scenarios for the failure modes seed 003 names, and a proptest over random
//! schedules of deliveries, losses, duplicates, stale replays, invalid
//! events, crashes, node restarts and metadata-store outages. After every
//! step: at most one node accepts writes, the map owner is the source until
//! the flip, every acknowledged write is at the target once the flip
//! applied, at most one flip ever applies and every `CommitFlip` is the same
//! CAS. After the schedule the world heals: every run must end in `DONE` or
//! `ABORTED` (never stuck), with the end state's promises checked.

#[path = "world/model.rs"]
mod model;

use keyway_map::Epoch;
use keyway_migration::{AbortReason, Event, MigrationState, RangeDigest};
use model::{E, E1, SRC, Store, TGT, World};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
enum Step {
    /// Deliver one pending event, chosen out of order.
    Deliver(usize),
    /// Deliver an event from the whole history again (duplicate or stale).
    Replay(usize),
    /// Lose one pending event.
    Lose(usize),
    Stream,
    Propagate,
    Timers,
    Tick(u16),
    Write {
        key: u8,
        value: Option<u8>,
        at_target: bool,
    },
    CrashDriver,
    /// The driver dies after executing this many commands of its next batch.
    CrashMidBatch(u8),
    RestartDriver,
    SourceFails,
    TargetFails,
    Store(Store),
    DownAfterPersist,
    ForeignBump,
    /// An operator split of the partition, at any moment.
    Split,
    /// The split of issue 11: right after a flip that applied while its
    /// answer was lost (nothing otherwise).
    SplitAfterLostFlip,
    /// The next flip CAS that applies loses its answer.
    LoseFlipAnswer,
    /// The target (or the source) unreachable for the drop of its copy.
    TargetDown(bool),
    SourceDown(bool),
    CorruptTarget(u8),
    Abort,
    Invalid(u8),
}

fn step() -> impl Strategy<Value = Step> {
    // Weights per mille-ish: the routine steps dominate, each fault is rare
    // enough that a schedule of ~100 steps sees a few of them.
    prop_oneof![
        120 => any::<usize>().prop_map(Step::Deliver),
        20 => any::<usize>().prop_map(Step::Replay),
        10 => any::<usize>().prop_map(Step::Lose),
        60 => Just(Step::Stream),
        20 => Just(Step::Propagate),
        10 => Just(Step::Timers),
        30 => (0u16..800).prop_map(Step::Tick),
        60 => (0u8..6, proptest::option::weighted(0.85, any::<u8>()), any::<bool>())
            .prop_map(|(key, value, at_target)| Step::Write { key, value, at_target }),
        4 => Just(Step::CrashDriver),
        4 => (0u8..4).prop_map(Step::CrashMidBatch),
        10 => Just(Step::RestartDriver),
        1 => Just(Step::SourceFails),
        1 => Just(Step::TargetFails),
        8 => prop_oneof![Just(Store::Up), Just(Store::Down), Just(Store::Ambiguous)]
            .prop_map(Step::Store),
        6 => Just(Step::DownAfterPersist),
        1 => Just(Step::ForeignBump),
        2 => Just(Step::Split),
        6 => Just(Step::SplitAfterLostFlip),
        6 => Just(Step::LoseFlipAnswer),
        3 => any::<bool>().prop_map(Step::TargetDown),
        3 => any::<bool>().prop_map(Step::SourceDown),
        1 => (0u8..6).prop_map(Step::CorruptTarget),
        1 => Just(Step::Abort),
        20 => any::<u8>().prop_map(Step::Invalid),
    ]
}

fn run(w: &mut World, step: Step) {
    match step {
        Step::Deliver(i) if !w.pending.is_empty() => {
            let event = w.pending.remove(i % w.pending.len());
            w.deliver(event);
        }
        Step::Replay(i) if !w.history.is_empty() => {
            let event = w.history[i % w.history.len()].clone();
            w.deliver(event);
        }
        Step::Lose(i) if !w.pending.is_empty() => {
            w.pending.remove(i % w.pending.len());
        }
        Step::Deliver(_) | Step::Replay(_) | Step::Lose(_) => {}
        Step::Stream => w.stream(),
        Step::Propagate => w.propagate(),
        Step::Timers => w.fire_timers(),
        Step::Tick(ms) => w.tick(ms as u64),
        Step::Write {
            key,
            value,
            at_target,
        } => w.write(key, value.map(u64::from), at_target),
        Step::CrashDriver => w.crash_driver(),
        Step::CrashMidBatch(k) => w.crash_at = Some(k as usize),
        Step::RestartDriver => w.restart_driver(),
        Step::SourceFails => w.source_fails(),
        Step::TargetFails => w.target_fails(),
        Step::Store(mode) => w.store = mode,
        Step::DownAfterPersist => w.down_after_persist = true,
        Step::ForeignBump => w.foreign_bump(),
        Step::Split => w.split_partition(),
        Step::SplitAfterLostFlip => w.split_after_lost_flip(),
        Step::LoseFlipAnswer => w.lose_flip_answer = true,
        Step::TargetDown(down) => w.tgt_down = down,
        Step::SourceDown(down) => w.src_down = down,
        Step::CorruptTarget(key) => w.corrupt_target(key),
        Step::Abort => w.deliver(Event::AbortRequested {
            reason: "operator".into(),
        }),
        Step::Invalid(kind) => invalid(w, kind),
    }
}

/// Delivers an event the machine must reject in its current state (if one
/// of the kinds applies) and checks that it does, changing nothing.
fn invalid(w: &mut World, kind: u8) {
    use MigrationState::*;
    let Some(m) = w.machine.as_mut() else { return };
    let r = m.record().clone();
    let now = w.now;
    let event = match kind % 6 {
        0 if r.state != Pending => Event::Started { now },
        1 if r.state != Cleanup => Event::GraceElapsed,
        2 if !(r.state == Cutover && r.flipped()) => Event::TargetServing {
            now,
            steps: Default::default(),
        },
        3 if !(r.state == Cutover && r.flip_in_doubt()) => Event::FlipCommitted { now },
        4 if r.state != Copying => Event::CopyDone,
        5 if r.state != Cutover => Event::Digests {
            source: RangeDigest::default(),
            target: RangeDigest::default(),
        },
        _ => return,
    };
    let rejected = m.handle(event.clone());
    assert!(rejected.is_err(), "{event:?} accepted in {}", r.state);
    assert_eq!(*m.record(), r);
}

fn drive(steps: Vec<Step>) -> World {
    let mut w = World::new();
    w.check();
    for s in steps {
        run(&mut w, s);
        w.check();
    }
    w
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn random_schedules_keep_every_promise_and_always_end(steps in proptest::collection::vec(step(), 1..160)) {
        let mut w = drive(steps);
        let end = w.settle();
        prop_assert!(end.is_terminal());
    }
}

/// The random schedules reach every interesting ending (so the proptest is
/// not passing by never getting anywhere).
#[test]
fn random_schedules_cover_both_endings_and_the_hard_paths() {
    let mut runner = TestRunner::deterministic();
    let schedules = proptest::collection::vec(step(), 1..160);
    let mut endings: BTreeMap<&str, usize> = BTreeMap::new();
    for _ in 0..400 {
        let steps = schedules.new_tree(&mut runner).unwrap().current();
        let mut w = drive(steps);
        let end = w.settle();
        if w.split_after_lost_flip {
            *endings.entry("split after a lost flip").or_default() += 1;
        }
        if w.stray_left {
            *endings.entry("ended with a stray copy").or_default() += 1;
        }
        let label = match (&end, &w.durable.abort_reason) {
            (MigrationState::Done, _) if w.flip_was_in_doubt => "done after an in-doubt flip",
            (MigrationState::Done, _) => "done",
            (_, Some(AbortReason::DigestMismatch { .. })) => "aborted: digests",
            (_, Some(AbortReason::FlipConflict { .. })) => "aborted: conflict",
            (_, Some(AbortReason::StuckTimeout { .. })) => "aborted: stuck",
            (_, Some(AbortReason::FenceTimeout { .. })) => "aborted: fence timeout",
            (_, Some(AbortReason::ActorFailed { .. })) => "aborted: actor failed",
            (_, Some(AbortReason::NotResumable { .. })) => "aborted: not resumable",
            (_, Some(AbortReason::Requested { .. })) => "aborted: requested",
            _ => unreachable!(),
        };
        *endings.entry(label).or_default() += 1;
    }
    println!("{endings:#?}");
    for label in [
        "done",
        "done after an in-doubt flip",
        "aborted: digests",
        "aborted: conflict",
        "aborted: stuck",
        "aborted: actor failed",
        "aborted: requested",
        "split after a lost flip",
        "ended with a stray copy",
    ] {
        assert!(
            endings.contains_key(label),
            "never reached {label:?}: {endings:#?}"
        );
    }
    assert!(
        endings["done"] >= 40,
        "too few completed moves: {endings:#?}"
    );
}

/// Runs the world with no faults, writing as it goes, until it ends.
fn calm(w: &mut World, rounds: usize) {
    for i in 0..rounds {
        w.restart_driver();
        while !w.pending.is_empty() {
            let e = w.pending.remove(0);
            w.deliver(e);
            w.check();
        }
        w.write((i % 6) as u8, Some(i as u64), false);
        w.write((i % 5) as u8, Some(1_000 + i as u64), true);
        w.stream();
        w.propagate();
        w.fire_timers();
        w.tick(50);
        w.check();
    }
}

#[test]
fn a_calm_move_finishes_with_every_write_at_the_target_and_a_measured_pause() {
    let mut w = World::new();
    calm(&mut w, 200);
    assert_eq!(w.state(), Some(MigrationState::Done));
    assert_eq!(w.settle(), MigrationState::Done);
    assert_eq!(w.map, (TGT, E1));
    assert_eq!(w.pauses.len(), 1);
    assert!(w.pauses[0] <= 200, "pause {} ms", w.pauses[0]);
    assert_eq!(w.durable.generation, 8);
}

/// Drives a calm world, one event at a time, until the machine's record
/// satisfies `until`.
fn calm_until(w: &mut World, until: impl Fn(&keyway_migration::MigrationRecord) -> bool) {
    for i in 0..400 {
        w.restart_driver();
        loop {
            if w.machine.as_ref().is_some_and(|m| until(m.record())) {
                return;
            }
            if w.pending.is_empty() {
                break;
            }
            let e = w.pending.remove(0);
            w.deliver(e);
            w.check();
        }
        w.write((i % 6) as u8, Some(i as u64), false);
        w.stream();
        w.propagate();
        w.fire_timers();
        w.tick(50);
        w.check();
    }
    panic!(
        "never reached the wanted point: {:?}",
        w.machine.as_ref().map(|m| m.record())
    );
}

/// A point in a calm run, named by a predicate on the record.
type Point = fn(&keyway_migration::MigrationRecord) -> bool;

#[test]
fn a_driver_crash_in_every_state_resumes_or_aborts_per_the_recovery_rule() {
    use MigrationState::*;
    let points: [(&str, Point, MigrationState); 7] = [
        (
            "copying",
            |r| r.state == Copying && r.snapshot_seq.is_some(),
            Done,
        ),
        ("catchup", |r| r.state == Catchup, Done),
        ("dual", |r| r.state == Dual, Done),
        (
            "cutover, fencing",
            |r| r.state == Cutover && !r.flip_requested(),
            Aborted,
        ),
        ("cutover, flip requested", |r| r.flip_in_doubt(), Done),
        (
            "cutover, flipped",
            |r| r.state == Cutover && r.flipped(),
            Done,
        ),
        ("cleanup", |r| r.state == Cleanup, Done),
    ];
    for (name, until, expected) in points {
        let mut w = World::new();
        calm_until(&mut w, until);
        w.crash_driver();
        w.restart_driver();
        assert_eq!(w.settle(), expected, "crash in {name}");
    }
}

#[test]
fn an_unreachable_store_at_the_flip_holds_the_fence_then_the_retry_finishes() {
    let mut w = World::new();
    calm_until(&mut w, |r| r.state == MigrationState::Cutover);
    // The flip request is persisted, then the store is gone for the CAS.
    w.down_after_persist = true;
    calm_until(&mut w, |r| r.flip_in_doubt());
    calm(&mut w, 400); // 20 s, far past every timeout
    let r = w.machine.as_ref().unwrap().record();
    assert!(
        r.flip_in_doubt(),
        "still in doubt, not aborted: {:?}",
        r.state
    );
    assert!(w.src.fenced && w.flips_applied == 0);
    assert!(
        w.history
            .iter()
            .filter(|e| **e == Event::FlipUnavailable)
            .count()
            > 10,
        "the CAS is re-sent"
    );
    assert_eq!(w.settle(), MigrationState::Done);
}

#[test]
fn a_store_down_before_the_flip_request_holds_the_fence_then_aborts_on_reload() {
    let mut w = World::new();
    calm_until(&mut w, |r| r.state == MigrationState::Cutover);
    w.store = Store::Down;
    calm(&mut w, 100);
    // The Persist of the flip request failed: the driver is down and cannot
    // reload; the fence holds (two owners are impossible), no CAS was sent.
    assert!(w.machine.is_none() && w.src.fenced && w.first_flip.is_none());
    assert_eq!(w.settle(), MigrationState::Aborted);
    assert_eq!(
        w.durable.abort_reason,
        Some(AbortReason::NotResumable {
            state: MigrationState::Cutover
        })
    );
}

#[test]
fn a_flip_whose_answer_is_lost_is_recognised_as_ours() {
    let mut w = World::new();
    calm_until(&mut w, |r| r.state == MigrationState::Cutover);
    w.store = Store::Ambiguous;
    calm_until(&mut w, |r| r.flip_in_doubt());
    calm(&mut w, 3);
    assert_eq!(w.flips_applied, 1, "the CAS applied; its answer was lost");
    w.crash_driver();
    w.store = Store::Up;
    assert_eq!(w.settle(), MigrationState::Done);
    assert!(w.history.iter().any(|e| matches!(
        e,
        Event::FlipConflict { evidence } if evidence.current == Some((TGT, E1))
    )));
}

/// Issue 11: the flip applies, its answer is lost, then the (now the
/// target's) partition is split. The re-sent CAS conflicts showing the
/// partition gone; the history says whose row the split removed.
#[test]
fn a_split_after_a_lost_flip_finishes_the_move_instead_of_aborting() {
    let mut w = World::new();
    calm_until(&mut w, |r| r.state == MigrationState::Cutover);
    w.store = Store::Ambiguous;
    calm_until(&mut w, |r| r.flip_in_doubt());
    calm(&mut w, 3);
    assert_eq!(w.flips_applied, 1, "the CAS applied; its answer was lost");
    w.split_partition();
    assert!(w.split_after_lost_flip);
    w.store = Store::Up;
    assert_eq!(w.settle(), MigrationState::Done);
    assert!(w.history.iter().any(|e| matches!(
        e,
        Event::FlipConflict { evidence } if evidence.current.is_none()
    )));
    assert_eq!(w.map, (TGT, Epoch(E1.0 + 1)));
    assert!(w.tgt.accepts_writes() && !w.src.accepts_writes());
}

#[test]
fn a_split_before_the_flip_makes_it_conflict_and_the_source_serve_again() {
    let mut w = World::new();
    calm_until(&mut w, |r| r.state == MigrationState::Dual);
    w.split_partition();
    assert_eq!(w.settle(), MigrationState::Aborted);
    assert_eq!(
        w.durable.abort_reason,
        Some(AbortReason::FlipConflict { current: None })
    );
    w.propagate();
    assert!(w.src.accepts_writes() && !w.tgt.accepts_writes());
}

#[test]
fn a_dead_target_during_an_abort_ends_it_and_its_copy_goes_when_it_is_back() {
    let mut w = World::new();
    calm_until(&mut w, |r| r.state == MigrationState::Catchup);
    w.tgt_down = true;
    w.deliver(Event::AbortRequested {
        reason: "operator".into(),
    });
    for _ in 0..40 {
        w.tick(300);
        while !w.pending.is_empty() {
            let e = w.pending.remove(0);
            w.deliver(e);
        }
        w.check();
    }
    assert!(w.finished, "the record ended although the target is down");
    assert_eq!(w.durable.state, MigrationState::Aborted);
    assert_eq!(w.durable.stray, Some(TGT));
    assert!(!w.tgt.dropped && w.src.accepts_writes());
    assert_eq!(w.settle(), MigrationState::Aborted);
    assert_eq!(w.durable.stray, None);
    assert!(w.tgt.dropped && w.tgt.data.is_empty());
}

#[test]
fn a_dead_old_source_in_cleanup_ends_done_and_its_copy_goes_when_it_is_back() {
    let mut w = World::new();
    calm_until(&mut w, |r| r.state == MigrationState::Cleanup);
    w.src_down = true;
    for _ in 0..60 {
        w.fire_timers();
        w.tick(300);
        while !w.pending.is_empty() {
            let e = w.pending.remove(0);
            w.deliver(e);
        }
        w.check();
    }
    assert!(w.finished);
    assert_eq!(
        (w.durable.state, w.durable.stray),
        (MigrationState::Done, Some(SRC))
    );
    assert!(!w.src.dropped && !w.src.accepts_writes());
    assert_eq!(w.settle(), MigrationState::Done);
    assert_eq!(w.durable.stray, None);
    assert!(w.src.dropped);
}

#[test]
fn a_foreign_epoch_bump_makes_the_flip_conflict_and_the_source_serve_again() {
    let mut w = World::new();
    calm_until(&mut w, |r| r.state == MigrationState::Dual);
    w.foreign_bump();
    assert_eq!(w.settle(), MigrationState::Aborted);
    assert_eq!(
        w.durable.abort_reason,
        Some(AbortReason::FlipConflict {
            current: Some((SRC, Epoch(E.0 + 1)))
        })
    );
    w.propagate();
    assert!(w.src.accepts_writes() && !w.tgt.accepts_writes());
}

#[test]
fn a_target_that_lost_a_key_fails_the_digests_and_aborts() {
    let mut w = World::new();
    calm_until(&mut w, |r| r.state == MigrationState::Dual);
    // Let the catch-up apply everything, so nothing will repair the loss.
    while w.tgt.applied_seq < w.src.seq() {
        w.stream();
    }
    w.corrupt_target(0);
    assert_eq!(w.settle(), MigrationState::Aborted);
    assert!(matches!(
        w.durable.abort_reason,
        Some(AbortReason::DigestMismatch { .. })
    ));
    assert_eq!(w.durable.aborted_from, Some(MigrationState::Cutover));
}

#[test]
fn a_dual_that_is_never_confirmed_times_out_back_to_the_source() {
    let mut w = World::new();
    calm_until(&mut w, |r| r.state == MigrationState::Dual);
    w.pending
        .retain(|e| !matches!(e, Event::DualEnabled { .. }));
    w.crash_at = None;
    for _ in 0..100 {
        w.tick(100);
        w.check();
    }
    assert_eq!(w.state(), Some(MigrationState::Aborted));
    assert!(!w.src.dual && w.tgt.dropped);
}
