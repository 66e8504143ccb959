//! The in-sync rules, asserted by the commands they emit.

use super::*;
use bytes::Bytes;

const LAG: Duration = Duration::from_millis(2_000);
const LEASE: Duration = Duration::from_millis(1_000);
const P: PartitionId = PartitionId(7);
const R: NodeId = NodeId(2);
const R2: NodeId = NodeId(3);

fn cfg() -> RulesConfig {
    RulesConfig {
        lag_timeout: LAG,
        read_lease: LEASE,
        retry_backoff: Duration::from_millis(500),
    }
}

fn row(epoch: u64, replicas: &[NodeId], in_sync: &[NodeId]) -> Row {
    Row {
        id: P,
        epoch: Epoch(epoch),
        range: KeyRange::prefix(Bytes::from_static(b"p/")),
        replicas: replicas.to_vec(),
        in_sync: in_sync.to_vec(),
        prior: None,
        replica_applied: None,
    }
}

fn ms(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

fn releases(cmds: &[Command]) -> Vec<(WaiterId, bool)> {
    cmds.iter()
        .filter_map(|c| match c {
            Command::Release { waiter, ok } => Some((*waiter, *ok)),
            _ => None,
        })
        .collect()
}

fn cases(cmds: &[Command]) -> Vec<(Epoch, CasChange)> {
    cmds.iter()
        .filter_map(|c| match c {
            Command::Cas { epoch, change, .. } => Some((*epoch, change.clone())),
            _ => None,
        })
        .collect()
}

/// Rules with replica R in sync at epoch 5, its stream acked at 100 just now.
fn in_sync_rules(t0: Instant) -> Rules {
    let mut rules = Rules::new(cfg(), t0 - Duration::from_secs(60));
    // Reach InSync the way a running node does: copy, join, CAS in.
    let cmds = rules.map_installed(&[row(4, &[R], &[])], t0);
    assert!(cmds.is_empty(), "{cmds:?}");
    let cmds = rules.tick(t0, true);
    assert_eq!(
        cmds,
        vec![Command::StartCopy {
            partition: P,
            replica: R
        }]
    );
    assert!(rules.copy_shipping(P, R));
    assert!(rules.copy_done(P, R, 100).is_empty());
    let cmds = rules.stream_acked(R, 100, t0);
    assert_eq!(
        cases(&cmds),
        vec![(Epoch(4), CasChange::Add { replica: R })]
    );
    let cmds = rules.cas_result(P, Epoch(4), &CasChange::Add { replica: R }, true, t0);
    assert!(cmds.is_empty());
    assert!(rules.map_installed(&[row(5, &[R], &[R])], t0).is_empty());
    assert_eq!(rules.parts()[&P].replicas[&R], ReplicaState::InSync);
    rules
}

#[test]
fn a_write_is_released_once_every_in_sync_replica_acked_it() {
    let t0 = Instant::now();
    let mut rules = in_sync_rules(t0);
    let (w, cmds) = rules.queue(P, 101, &[R], t0);
    assert!(cmds.is_empty(), "waits for R");
    assert!(rules.stream_acked(R, 100, ms(t0, 5)).is_empty());
    assert_eq!(
        releases(&rules.stream_acked(R, 101, ms(t0, 6))),
        vec![(w, true)]
    );
    // A write the stream already acked is released at once.
    let (w2, cmds) = rules.queue(P, 90, &[R], ms(t0, 7));
    assert_eq!(releases(&cmds), vec![(w2, true)]);
}

#[test]
fn lag_timeout_removes_by_cas_and_releases_only_after_commit_and_read_lease() {
    let t0 = Instant::now();
    let mut rules = in_sync_rules(t0);
    // The replica last answered at t0 + 100 ms: its lease may run to t0 + 1100.
    rules.stream_acked(R, 100, ms(t0, 100));
    let (w, _) = rules.queue(P, 101, &[R], ms(t0, 200));
    assert!(
        rules.tick(ms(t0, 2_100), true).is_empty(),
        "not overdue yet"
    );
    let cmds = rules.tick(ms(t0, 2_200), true);
    assert_eq!(
        cmds,
        vec![Command::Cas {
            partition: P,
            epoch: Epoch(5),
            change: CasChange::Remove {
                replicas: vec![R],
                reason: Reason::LagTimeout
            }
        }]
    );
    // No second CAS while one is in flight, and nothing released.
    assert!(rules.tick(ms(t0, 2_300), true).is_empty());
    // Commit at t0 + 2400: the lease (t0 + 1100) already passed.
    let change = CasChange::Remove {
        replicas: vec![R],
        reason: Reason::LagTimeout,
    };
    let cmds = rules.cas_result(P, Epoch(5), &change, true, ms(t0, 2_400));
    assert!(releases(&cmds).is_empty(), "released at the next tick");
    let cmds = rules.tick(ms(t0, 2_401), true);
    assert_eq!(releases(&cmds), vec![(w, true)]);
    assert!(
        !rules.has_waited(P, ms(t0, 2_402)),
        "writes continue without the replica"
    );
}

#[test]
fn a_removed_replica_is_waited_for_until_its_read_lease_passed() {
    let t0 = Instant::now();
    let mut rules = in_sync_rules(t0);
    let (w, _) = rules.queue(P, 101, &[R], t0);
    rules.tick(ms(t0, 2_000), true);
    // A heartbeat answered late (no records acked past 100): lease to t0+3000.
    rules.stream_acked(R, 100, ms(t0, 2_000));
    let change = CasChange::Remove {
        replicas: vec![R],
        reason: Reason::LagTimeout,
    };
    let cmds = rules.cas_result(P, Epoch(5), &change, true, ms(t0, 2_050));
    assert!(releases(&cmds).is_empty());
    assert!(releases(&rules.tick(ms(t0, 2_999), true)).is_empty());
    assert!(rules.has_waited(P, ms(t0, 2_999)));
    assert_eq!(releases(&rules.tick(ms(t0, 3_000), true)), vec![(w, true)]);
}

#[test]
fn a_failed_cas_never_releases_a_reply_as_success() {
    let t0 = Instant::now();
    let mut rules = in_sync_rules(t0);
    let (w, _) = rules.queue(P, 101, &[R], t0);
    let cmds = rules.tick(ms(t0, 2_000), true);
    let change = match &cases(&cmds)[..] {
        [(_, c)] => c.clone(),
        other => panic!("{other:?}"),
    };
    let cmds = rules.cas_result(P, Epoch(5), &change, false, ms(t0, 2_100));
    assert_eq!(releases(&cmds), vec![(w, false)]);
    // Deposed: the next map no longer has the partition here; nothing else waits.
    assert!(releases(&rules.map_installed(&[], ms(t0, 2_200))).is_empty());
}

#[test]
fn a_partition_lost_to_another_owner_fails_its_waiting_replies() {
    let t0 = Instant::now();
    let mut rules = in_sync_rules(t0);
    let (w, _) = rules.queue(P, 101, &[R], t0);
    assert_eq!(
        releases(&rules.map_installed(&[], ms(t0, 10))),
        vec![(w, false)]
    );
}

#[test]
fn a_lapsed_node_lease_fails_every_waiting_reply() {
    let t0 = Instant::now();
    let mut rules = in_sync_rules(t0);
    let (w, _) = rules.queue(P, 101, &[R], t0);
    assert_eq!(releases(&rules.tick(ms(t0, 10), false)), vec![(w, false)]);
}

#[test]
fn a_joining_replica_is_dropped_without_cas_on_lag() {
    let t0 = Instant::now();
    let mut rules = Rules::new(cfg(), t0 - Duration::from_secs(60));
    rules.map_installed(&[row(4, &[R], &[])], t0);
    rules.tick(t0, true);
    rules.copy_shipping(P, R);
    // Not waited for while copying.
    let (w0, cmds) = rules.queue(P, 40, &[], t0);
    assert_eq!(releases(&cmds), vec![(w0, true)]);
    assert!(rules.copy_done(P, R, 50).is_empty());
    // Joining: new writes wait.
    let (w, cmds) = rules.queue(P, 51, &[], ms(t0, 1));
    assert!(cmds.is_empty());
    let cmds = rules.tick(ms(t0, 2_001), true);
    assert!(cases(&cmds).is_empty(), "no CAS for a joining replica");
    assert_eq!(releases(&cmds), vec![(w, true)]);
    assert!(matches!(
        rules.parts()[&P].replicas[&R],
        ReplicaState::Idle { .. }
    ));
    // Retried after the back-off.
    assert!(rules.tick(ms(t0, 2_100), true).is_empty());
    assert_eq!(
        rules.tick(ms(t0, 2_600), true),
        vec![Command::StartCopy {
            partition: P,
            replica: R
        }]
    );
}

#[test]
fn a_replica_is_added_only_after_it_acked_the_seq_recorded_when_joining_began() {
    let t0 = Instant::now();
    let mut rules = Rules::new(cfg(), t0 - Duration::from_secs(60));
    rules.map_installed(&[row(4, &[R], &[])], t0);
    rules.tick(t0, true);
    rules.copy_shipping(P, R);
    assert!(rules.stream_acked(R, 70, t0).is_empty(), "still copying");
    assert!(rules.copy_done(P, R, 80).is_empty());
    assert!(rules.stream_acked(R, 79, t0).is_empty());
    assert_eq!(
        cases(&rules.stream_acked(R, 80, t0)),
        vec![(Epoch(4), CasChange::Add { replica: R })]
    );
}

#[test]
fn no_replica_is_added_while_the_partition_migrates_and_it_is_added_once_that_ends() {
    let t0 = Instant::now();
    let mut rules = Rules::new(cfg(), t0 - Duration::from_secs(60));
    rules.map_installed(&[row(4, &[R], &[])], t0);
    rules.tick(t0, true);
    rules.copy_shipping(P, R);
    assert!(rules.copy_done(P, R, 80).is_empty());
    assert!(rules.set_migrating([P].into()).is_empty());
    // Caught up, but an Add would move the epoch under the migration's flip.
    assert!(cases(&rules.stream_acked(R, 80, t0)).is_empty());
    assert!(cases(&rules.stream_acked(R, 95, t0)).is_empty());
    // Another partition's migration starting changes nothing here.
    assert!(cases(&rules.set_migrating([P, PartitionId(99)].into())).is_empty());
    assert_eq!(
        cases(&rules.set_migrating(BTreeSet::new())),
        vec![(Epoch(4), CasChange::Add { replica: R })]
    );
}

#[test]
fn a_lagging_in_sync_replica_is_removed_even_while_the_partition_migrates() {
    let t0 = Instant::now();
    let mut rules = in_sync_rules(t0);
    rules.set_migrating([P].into());
    let (_w, cmds) = rules.queue(P, 200, &[R], t0);
    assert!(cmds.is_empty());
    assert_eq!(
        cases(&rules.tick(t0 + LAG, true)),
        vec![(
            Epoch(5),
            CasChange::Remove {
                replicas: vec![R],
                reason: Reason::LagTimeout
            }
        )]
    );
}

#[test]
fn a_copy_that_finds_the_stream_past_s0_is_added_at_once() {
    let t0 = Instant::now();
    let mut rules = Rules::new(cfg(), t0 - Duration::from_secs(60));
    rules.map_installed(&[row(4, &[R], &[])], t0);
    rules.tick(t0, true);
    rules.copy_shipping(P, R);
    rules.stream_acked(R, 90, t0);
    assert_eq!(
        cases(&rules.copy_done(P, R, 90)),
        vec![(Epoch(4), CasChange::Add { replica: R })]
    );
}

#[test]
fn restart_removes_every_in_sync_replica_in_one_cas_before_releasing() {
    let t0 = Instant::now();
    // Just started: a lease granted by the previous process may run to t0 + 1 s.
    let mut rules = Rules::new(cfg(), t0);
    // A write admitted before the rules saw the map waits for its in-sync replicas.
    let (w, cmds) = rules.queue(P, 3, &[R, R2], t0);
    assert!(cmds.is_empty());
    let cmds = rules.map_installed(&[row(9, &[R, R2], &[R, R2])], ms(t0, 5));
    assert_eq!(
        cases(&cmds),
        vec![(
            Epoch(9),
            CasChange::Remove {
                replicas: vec![R, R2],
                reason: Reason::PrimaryRestarted
            }
        )]
    );
    assert!(releases(&cmds).is_empty());
    // An ack from a fresh stream does not release it either: positions unknown.
    assert!(releases(&rules.stream_acked(R, 1_000, ms(t0, 10))).is_empty());
    let change = CasChange::Remove {
        replicas: vec![R, R2],
        reason: Reason::PrimaryRestarted,
    };
    assert!(releases(&rules.cas_result(P, Epoch(9), &change, true, ms(t0, 20))).is_empty());
    // R2 may serve on a lease of the previous process until t0 + 1 s; R
    // answered the fresh stream at t0 + 10 ms (lease to t0 + 1010 ms).
    assert!(releases(&rules.tick(ms(t0, 1_009), true)).is_empty());
    assert_eq!(releases(&rules.tick(ms(t0, 1_010), true)), vec![(w, true)]);
}

#[test]
fn vouching_covers_only_in_sync_shipped_partitions() {
    let t0 = Instant::now();
    let mut rules = in_sync_rules(t0);
    let shipped = rules.shipped_to(R);
    assert_eq!(shipped.len(), 1);
    assert_eq!(
        (shipped[0].0, shipped[0].1, shipped[0].3),
        (P, Epoch(5), true)
    );
    rules.queue(P, 101, &[R], t0);
    rules.tick(ms(t0, 2_000), true);
    let shipped = rules.shipped_to(R);
    assert!(!shipped[0].3, "no read lease once its removal began");
}

#[test]
fn a_lost_stream_removes_in_sync_and_restarts_only_when_nothing_waits() {
    let t0 = Instant::now();
    let mut rules = in_sync_rules(t0);
    let (w, _) = rules.queue(P, 101, &[R], t0);
    let cmds = rules.stream_lost(R, t0);
    assert_eq!(cases(&cmds).len(), 1);
    assert!(!rules.may_restart_stream(R, t0));
    // A late ack from the lost stream counts for nothing.
    assert!(releases(&rules.stream_acked(R, 500, ms(t0, 1))).is_empty());
    let change = CasChange::Remove {
        replicas: vec![R],
        reason: Reason::StreamLost,
    };
    rules.cas_result(P, Epoch(5), &change, true, ms(t0, 10));
    assert_eq!(releases(&rules.tick(ms(t0, 1_100), true)), vec![(w, true)]);
    assert!(rules.may_restart_stream(R, ms(t0, 1_100)));
    rules.stream_restarted(R, 600);
    assert_eq!(rules.acked(R), 600);
}

#[test]
fn a_cutover_stops_read_leases_and_waits_for_the_last_one_granted() {
    let t0 = Instant::now();
    let mut rules = in_sync_rules(t0);
    let vouched = |rules: &Rules| rules.shipped_to(R).iter().any(|l| l.0 == P && l.3);
    assert!(vouched(&rules), "an in-sync replica is vouched for");
    rules.stream_acked(R, 100, ms(t0, 300));
    // The last answer arrived at 300 ms: a lease granted on it runs to
    // 300 ms + LEASE at the latest.
    assert_eq!(rules.stop_read_leases(P), Some(ms(t0, 300) + LEASE));
    assert!(
        !vouched(&rules),
        "no more read leases for a partition cut over"
    );
    // Still shipped (its writes must reach the replica), just not vouched.
    assert!(rules.shipped_to(R).iter().any(|l| l.0 == P));
    // A partition without replicas here has no lease to wait for.
    assert_eq!(rules.stop_read_leases(PartitionId(99)), None);
    // Once the push ends, leases resume.
    rules.set_migrating(BTreeSet::new());
    assert!(vouched(&rules));
}

/// The old primary of a switchover to this node.
const OLD: NodeId = NodeId(9);

/// The row of a switchover of P at epoch `epoch` from OLD to this node:
/// OLD's map had it at `prior_epoch` with this node in sync (`in_sync_here`).
fn switched(epoch: u64, prior_epoch: u64, in_sync: &[NodeId], floor: Option<Seq>) -> Row {
    let mut r = row(epoch, &[R, OLD], in_sync);
    r.prior = Some(Prior {
        owner: OLD,
        epoch: Epoch(prior_epoch),
        in_sync_here: true,
        floor,
    });
    r
}

fn copies(cmds: &[Command]) -> usize {
    cmds.iter()
        .filter(|c| matches!(c, Command::StartCopy { .. }))
        .count()
}

#[test]
fn a_switchover_install_keeps_the_old_primary_in_sync_with_no_cas_and_no_copy() {
    let t0 = Instant::now();
    let mut rules = Rules::new(cfg(), t0 - Duration::from_secs(60));
    let cmds = rules.map_installed(&[switched(6, 5, &[OLD], Some(300))], t0);
    assert!(cases(&cmds).is_empty(), "{cmds:?}");
    assert_eq!(copies(&cmds), 0);
    let part = &rules.parts()[&P];
    assert_eq!(part.replicas[&OLD], ReplicaState::InSync);
    assert_eq!(
        part.eras[&OLD],
        Era {
            epoch: Epoch(6),
            floor: 300,
            covered: 300
        }
    );
    assert_eq!(rules.kept_in_sync(), 1);
    // R (dropped from the in-sync set by the switchover) is copied; OLD is not.
    let cmds = rules.tick(ms(t0, 1), true);
    assert_eq!(
        cmds,
        vec![Command::StartCopy {
            partition: P,
            replica: R
        }]
    );
    // Shipped stamped, vouched for.
    assert!(
        rules
            .shipped_to(OLD)
            .iter()
            .any(|(p, _, _, v)| *p == P && *v)
    );
    // A write at 301 waits for OLD until a batch listing the era covers it.
    let (w, cmds) = rules.queue(P, 301, &[OLD], ms(t0, 2));
    assert!(cmds.is_empty());
    // A batch that did not list the era (read before it existed) covers nothing.
    assert!(releases(&rules.stream_batch_acked(OLD, 250, 310, &[], ms(t0, 3))).is_empty());
    assert_eq!(rules.acked_for(P, OLD), 300);
    assert_eq!(
        rules.rewind_to(OLD),
        Some(300),
        "the stream re-reads from covered"
    );
    // A batch listing it but starting above covered leaves a gap: no cover.
    assert!(
        releases(&rules.stream_batch_acked(OLD, 305, 320, &[(P, Epoch(6))], ms(t0, 4))).is_empty()
    );
    assert_eq!(
        releases(&rules.stream_batch_acked(OLD, 300, 320, &[(P, Epoch(6))], ms(t0, 5))),
        vec![(w, true)]
    );
    assert_eq!(rules.acked_for(P, OLD), 320);
    assert_eq!(rules.rewind_to(OLD), None);
    // Later batches from the acked seq keep it covered.
    let (w2, _) = rules.queue(P, 330, &[OLD], ms(t0, 6));
    assert_eq!(
        releases(&rules.stream_batch_acked(OLD, 320, 340, &[(P, Epoch(6))], ms(t0, 7))),
        vec![(w2, true)]
    );
    // Nothing at or below the floor was ever OLD's to wait for.
    let (w3, cmds) = rules.queue(P, 299, &[OLD], ms(t0, 8));
    assert_eq!(releases(&cmds), vec![(w3, true)]);
}

#[test]
fn anything_but_a_switchover_shape_keeps_the_restart_rule() {
    let t0 = Instant::now();
    let restart = |row: Row| {
        let mut rules = Rules::new(cfg(), t0 - Duration::from_secs(60));
        let cmds = rules.map_installed(&[row], t0);
        assert_eq!(
            cases(&cmds),
            vec![(
                Epoch(7),
                CasChange::Remove {
                    replicas: vec![OLD],
                    reason: Reason::PrimaryRestarted
                }
            )],
            "{cmds:?}"
        );
        assert!(rules.parts()[&P].eras.is_empty());
        assert_eq!(rules.kept_in_sync(), 0);
    };
    // An epoch jump e -> e + 2 (something happened in between).
    restart(switched(7, 5, &[OLD], Some(300)));
    // No previous map (this node restarted).
    restart(row(7, &[R, OLD], &[OLD]));
    // Not in sync before.
    let mut r = switched(7, 6, &[OLD], Some(300));
    r.prior.as_mut().unwrap().in_sync_here = false;
    restart(r);
    // Never applied a call listing it (no floor).
    restart(switched(7, 6, &[OLD], None));
    // A seq that cannot be stamped.
    restart(switched(7, 6, &[OLD], Some(ERA_SEQ_LIMIT)));
    // The old owner not in the in-sync set.
    let mut rules = Rules::new(cfg(), t0 - Duration::from_secs(60));
    let cmds = rules.map_installed(&[switched(7, 6, &[R], Some(300))], t0);
    assert_eq!(
        cases(&cmds),
        vec![(
            Epoch(7),
            CasChange::Remove {
                replicas: vec![R],
                reason: Reason::PrimaryRestarted
            }
        )]
    );
}

#[test]
fn a_bystander_the_old_owner_kept_in_sync_stays_in_sync_in_the_same_era() {
    let t0 = Instant::now();
    let mut rules = Rules::new(cfg(), t0 - Duration::from_secs(60));
    let cmds = rules.map_installed(&[switched(7, 6, &[R, OLD], Some(300))], t0);
    assert!(cases(&cmds).is_empty(), "{cmds:?}");
    assert_eq!(copies(&rules.tick(t0, true)), 0, "nothing copied again");
    assert_eq!(rules.kept_in_sync(), 2);
    let part = &rules.parts()[&P];
    assert_eq!(part.replicas[&R], ReplicaState::InSync);
    assert_eq!(part.replicas[&OLD], ReplicaState::InSync);
    assert_eq!(part.eras[&R], part.eras[&OLD], "one era, one floor");
}

#[test]
fn an_era_ends_with_a_copy_and_a_split_child_inherits_it() {
    let t0 = Instant::now();
    let mut rules = Rules::new(cfg(), t0 - Duration::from_secs(60));
    rules.map_installed(&[switched(6, 5, &[OLD], Some(300))], t0);
    // A split child (a new id, a sub-range) inherits OLD's era.
    let mut child = row(7, &[R, OLD], &[OLD]);
    child.id = PartitionId(8);
    child.range = KeyRange::prefix(Bytes::from_static(b"p/a"));
    let mut parent = row(7, &[R, OLD], &[OLD]);
    parent.range = KeyRange::new(Bytes::from_static(b"p/"), Some(Bytes::from_static(b"p/a")));
    let cmds = rules.map_installed(&[parent, child], ms(t0, 1));
    assert!(cases(&cmds).is_empty(), "{cmds:?}");
    assert_eq!(rules.parts()[&PartitionId(8)].eras[&OLD].epoch, Epoch(6));
    // OLD drops out (lag): once its read lease passed it is copied and the era ends.
    let mut out = row(8, &[R, OLD], &[]);
    out.range = KeyRange::new(Bytes::from_static(b"p/"), Some(Bytes::from_static(b"p/a")));
    rules.map_installed(&[out], ms(t0, 2));
    assert!(
        rules.parts()[&P].eras.contains_key(&OLD),
        "still shipped while Removed"
    );
    rules.tick(ms(t0, 5_000), true);
    let cmds = rules.tick(ms(t0, 5_001), true);
    assert!(cmds.contains(&Command::StartCopy {
        partition: P,
        replica: OLD
    }));
    assert!(rules.parts()[&P].eras.is_empty());
}

#[test]
fn a_partition_owned_by_another_node_in_between_is_first_seen_again() {
    // The driver saw this node own P at 5 and at 7, never the map between
    // where OLD owned it and streamed it here (its applied seq moved).
    let t0 = Instant::now();
    let mut rules = Rules::new(cfg(), t0 - Duration::from_secs(60));
    let mut first = switched(6, 5, &[OLD], Some(300));
    first.replica_applied = Some(300);
    rules.map_installed(&[first], t0);
    assert_eq!(rules.parts()[&P].replicas[&OLD], ReplicaState::InSync);
    // Still owned throughout (applied seq unchanged): an epoch jump is kept.
    let mut same = row(8, &[R, OLD], &[OLD]);
    same.replica_applied = Some(300);
    assert!(cases(&rules.map_installed(&[same], ms(t0, 1))).is_empty());
    let (w, _) = rules.queue(P, 400, &[OLD], ms(t0, 2));
    // Lost and back: the restart rule, and what waited is unknown.
    let mut back = row(10, &[R, OLD], &[OLD]);
    back.replica_applied = Some(450);
    let cmds = rules.map_installed(&[back], ms(t0, 3));
    assert_eq!(releases(&cmds), vec![(w, false)]);
    assert_eq!(
        cases(&cmds),
        vec![(
            Epoch(10),
            CasChange::Remove {
                replicas: vec![OLD],
                reason: Reason::PrimaryRestarted
            }
        )]
    );
    assert!(rules.parts()[&P].eras.is_empty());
}

#[test]
fn a_replica_a_new_child_leaves_out_is_waited_for_until_its_read_lease_on_the_parent_passed() {
    // Nemesis seeds 37008 and 40004: a node whose map watch reconnected
    // installed, in one step, the map after a split (or merge) and after the
    // manager's over-replication removal that followed it. The replica left
    // out still answered reads of the parent on the lease this node had
    // granted, while the child's writes were released without it (a stale
    // read). Each child waits for it until that lease passed, as an
    // in-place removal does.
    let t0 = Instant::now();
    let mut rules = in_sync_rules(t0);
    // R's stream answered at t0: its lease on P may run to t0 + 1000.
    let mut left_out = row(6, &[R2], &[]);
    left_out.id = PartitionId(8);
    left_out.range = KeyRange::new(Bytes::from_static(b"p/"), Some(Bytes::from_static(b"p/a")));
    let mut out_of_sync = row(6, &[R], &[]);
    out_of_sync.id = PartitionId(9);
    out_of_sync.range = KeyRange::prefix(Bytes::from_static(b"p/a"));
    let cmds = rules.map_installed(&[left_out, out_of_sync], ms(t0, 10));
    assert!(
        releases(&cmds).is_empty() && cases(&cmds).is_empty(),
        "{cmds:?}"
    );
    for child in [PartitionId(8), PartitionId(9)] {
        assert_eq!(
            rules.parts()[&child].replicas[&R],
            ReplicaState::Removed {
                until: ms(t0, 1_000)
            },
            "{child:?}"
        );
    }
    let (w8, cmds) = rules.queue(PartitionId(8), 101, &[], ms(t0, 20));
    assert!(cmds.is_empty(), "waits for R's lease");
    let (w9, cmds) = rules.queue(PartitionId(9), 102, &[], ms(t0, 20));
    assert!(cmds.is_empty(), "waits for R's lease");
    assert!(releases(&rules.tick(ms(t0, 999), true)).is_empty());
    let mut released = releases(&rules.tick(ms(t0, 1_000), true));
    released.sort();
    assert_eq!(released, vec![(w8, true), (w9, true)]);
    // Then the listed one is copied again; the other is forgotten.
    let cmds = rules.tick(ms(t0, 1_001), true);
    assert!(cmds.contains(&Command::StartCopy {
        partition: PartitionId(9),
        replica: R
    }));
    assert!(!rules.parts()[&PartitionId(8)].replicas.contains_key(&R));
}
