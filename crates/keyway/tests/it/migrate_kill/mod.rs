//! Issue 4, "Done when" item 2: kill -9 of the manager, then of the source,
//! then of the target, each at a randomly chosen state of a live move under
//! write load. No acknowledged write is lost, and every move ends DONE or
//! ABORTED (never stuck) within a bound.
//!
//! Real processes: `keyway meta`, three `keyway server`s and a `keyway
//! manager`, each logging at `info` into the test's temp dir (the tails are
//! printed, and the dir kept, if the test fails). One partition (the "hot"
//! one) is preloaded with ~30 MB and moved three times around the nodes while
//! load threads write new keys `load:N` everywhere (half of them into the hot
//! partition) and overwrite or delete some they wrote before; at the end
//! every key whose last write was acknowledged must read as that write left
//! it. The copy is throttled so COPYING lasts a few seconds. The
//! seed is printed; `KEYWAY_TEST_SEED=N` replays the same choices, and
//! `KEYWAY_TEST_KEEP=1` keeps the logs and data even when the test passes.
//!
//! The test and its rounds are here; `procs` starts, kills and restarts the
//! processes and keeps their logs, `client` is the `-MOVED`-following RESP
//! client, `load` the write load and its bookkeeping, `verify` the final
//! checks.

mod client;
mod load;
mod procs;
mod verify;

use keyway_map::{NodeId, PartitionId, PartitionMap};
use keyway_meta::MetaStore;
use keyway_migration::{MigrationRecord, MigrationState};
use load::{Load, preload};
use procs::Cluster;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verify::{assert_acknowledged_writes, assert_cluster_settled, assert_map_sane};

const LEASE_TTL_MS: u64 = 2000;
const STUCK_TIMEOUT_MS: u64 = 10_000;
const FENCE_TIMEOUT_MS: u64 = 3_000;
const CLEANUP_GRACE_MS: u64 = 500;
/// Copy cap: ~30 MB of preload copies in about four seconds.
const COPY_BYTES_PER_SEC: u64 = 8_000_000;
const PRELOAD_KEYS: usize = 30_000;
const PRELOAD_VALUE_LEN: usize = 1024;
/// How long a move may take to end after the kill: the stuck timeout (no
/// progress → abort), plus a fence timeout, plus two lease TTLs (a dead
/// manager's seat, a restarted node's lease), plus slack for restarts on a
/// busy machine.
const TERMINAL_BOUND: Duration =
    Duration::from_millis(STUCK_TIMEOUT_MS + FENCE_TIMEOUT_MS + 2 * LEASE_TTL_MS + 15_000);
const WAIT: Duration = Duration::from_secs(30);
/// How long a client follows `-MOVED` redirects for one request.
const REDIRECT_PATIENCE: Duration = Duration::from_secs(2);
const LOAD_THREADS_ANY: usize = 2;
const LOAD_THREADS_HOT: usize = 2;
/// A load thread's pause between writes (keeps the number of keys to verify modest).
const LOAD_PAUSE: Duration = Duration::from_micros(500);

/// The states a victim may be killed in, in protocol order.
const KILL_STATES: [MigrationState; 5] = [
    MigrationState::Copying,
    MigrationState::Catchup,
    MigrationState::Dual,
    MigrationState::Cutover,
    MigrationState::Cleanup,
];

fn order(s: MigrationState) -> usize {
    MigrationState::ALL.iter().position(|x| *x == s).unwrap()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Victim {
    Manager,
    Source,
    Target,
}

struct Round {
    victim: Victim,
    wanted: MigrationState,
    killed_in: MigrationState,
    outcome: MigrationState,
    abort_reason: Option<String>,
    kill_to_end: Duration,
    move_took: Duration,
}

// ---------------------------------------------------------------- the test

#[test]
fn kill_9_of_manager_source_or_target_mid_move_loses_no_acknowledged_write() {
    let seed: u64 = std::env::var("KEYWAY_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {seed} (KEYWAY_TEST_SEED={seed} replays the choices)");
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();

    let mut cluster = Cluster::start();
    eprintln!(
        "cluster up in {:?}; logs in {}",
        started.elapsed(),
        cluster.logs.display()
    );
    cluster.manager.wait_line("manager mgr leading", WAIT);
    cluster.wait_cluster_ok(WAIT);
    let rt = runtime();
    let meta = rt
        .block_on(keyway_meta::connect(&cluster.meta_url))
        .unwrap();
    let map = get_map(&rt, &meta);
    let ours: Vec<NodeId> = map.nodes.keys().copied().collect();
    assert_eq!(ours.len(), 3);

    // The hot partition: chosen at random, moved in every round.
    let pids: Vec<PartitionId> = map.partitions.keys().copied().collect();
    let hot = pids[rng.random_range(0..pids.len())];
    let hot_span = map.partitions[&hot].slot_span();
    let t = Instant::now();
    let preloaded = preload(&map, hot);
    eprintln!(
        "preloaded partition {hot} (slots {}-{}) with {} keys of {} bytes in {:?}",
        hot_span.0,
        hot_span.1,
        preloaded.len(),
        PRELOAD_VALUE_LEN,
        t.elapsed()
    );

    // The load.
    let load = Load::start(&map, hot_span, seed);
    std::thread::sleep(Duration::from_millis(500));

    let mut rounds = Vec::new();
    for victim in [Victim::Manager, Victim::Source, Victim::Target] {
        let round = run_round(&mut cluster, &rt, &meta, &ours, hot, victim, &mut rng);
        rounds.push(round);
        std::thread::sleep(Duration::from_millis(300));
    }

    // Stop the load and check every acknowledged write.
    let load = load.stop();
    cluster.assert_all_alive();
    let map = get_map(&rt, &meta);
    assert_map_sane(&map, &ours);
    assert_acknowledged_writes(&map, &load, &preloaded, hot_span);
    assert_cluster_settled(&cluster, &rt, &meta, &map, &ours);

    eprintln!("summary (seed {seed}):");
    for r in &rounds {
        eprintln!(
            "  kill {:?}: wanted {}, killed in {}, outcome {} ({}), ended {:?} after the kill, move took {:?}",
            r.victim,
            r.wanted,
            r.killed_in,
            r.outcome,
            r.abort_reason.as_deref().unwrap_or("-"),
            r.kill_to_end,
            r.move_took
        );
    }
    eprintln!("total {:?}", started.elapsed());
}

/// One round: moves `hot` from its owner to another node picked at random,
/// kills `victim` -9 once the move reaches a randomly chosen state (or any
/// later one), restarts it, and waits for the move to end DONE or ABORTED
/// within `TERMINAL_BOUND`, with the map agreeing with the outcome.
fn run_round(
    cluster: &mut Cluster,
    rt: &tokio::runtime::Runtime,
    meta: &Arc<dyn MetaStore>,
    ours: &[NodeId],
    hot: PartitionId,
    victim: Victim,
    rng: &mut StdRng,
) -> Round {
    cluster.assert_all_alive();
    let map = get_map(rt, meta);
    let source = map.partitions[&hot].owner;
    let others: Vec<NodeId> = ours.iter().copied().filter(|n| *n != source).collect();
    let target = others[rng.random_range(0..others.len())];
    let wanted = KILL_STATES[rng.random_range(0..KILL_STATES.len())];
    let (si, ti) = (
        cluster.server_index(&map, source),
        cluster.server_index(&map, target),
    );
    let out = cluster.ctl(&[
        "--json",
        "move",
        &hot.to_string(),
        "--to",
        &format!("127.0.0.1:{}", cluster.ports[ti]),
        "--detach",
    ]);
    let ids: Vec<u64> = serde_json::from_str(&out).expect("move --json prints ids");
    assert_eq!(ids.len(), 1, "{out}");
    let id = ids[0];
    let requested = Instant::now();
    eprintln!(
        "round {victim:?}: migration {id} partition {hot} server{si} -> server{ti}; kill the {victim:?} in {wanted}"
    );

    // Wait for the chosen state (or any later one).
    let mut seen = Vec::new();
    let killed_in = loop {
        let rec = migration(rt, meta, id);
        if seen.last() != Some(&rec.state) {
            seen.push(rec.state);
        }
        if order(rec.state) >= order(wanted) || rec.state.is_terminal() {
            break rec.state;
        }
        assert!(
            requested.elapsed() < TERMINAL_BOUND,
            "migration {id} never reached {wanted}: states seen {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    let daemon = match victim {
        Victim::Manager => &mut cluster.manager,
        Victim::Source => &mut cluster.servers[si],
        Victim::Target => &mut cluster.servers[ti],
    };
    daemon.kill9();
    let killed = Instant::now();
    let just_after = migration(rt, meta, id).state;
    eprintln!(
        "round {victim:?}: killed {} in {killed_in} (record in {just_after} right after; {:?} after the request; states seen {seen:?})",
        daemon.label,
        killed.duration_since(requested)
    );
    daemon.restart();
    eprintln!(
        "round {victim:?}: {} restarted in {:?}",
        daemon.label,
        killed.elapsed()
    );

    // The move must end, one way or the other.
    let rec = loop {
        let rec = migration(rt, meta, id);
        if seen.last() != Some(&rec.state) {
            seen.push(rec.state);
        }
        if rec.state.is_terminal() {
            break rec;
        }
        assert!(
            killed.elapsed() < TERMINAL_BOUND,
            "round {victim:?}: migration {id} stuck in {} {:?} after the kill (killed in {killed_in}; states seen {seen:?}; record {rec:?})",
            rec.state,
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let round = Round {
        victim,
        wanted,
        killed_in,
        outcome: rec.state,
        abort_reason: rec.abort_reason.as_ref().map(|r| format!("{r:?}")),
        kill_to_end: killed.elapsed(),
        move_took: requested.elapsed(),
    };
    eprintln!(
        "round {victim:?}: migration {id} {} ({}) {:?} after the kill, {:?} after the request; states seen {seen:?}; pause {:?} ms",
        round.outcome,
        round.abort_reason.as_deref().unwrap_or("-"),
        round.kill_to_end,
        round.move_took,
        rec.pause_ms
    );
    // The map agrees with the outcome.
    let map = get_map(rt, meta);
    let owner = map.partitions[&hot].owner;
    match rec.state {
        MigrationState::Done => assert_eq!(owner, target, "DONE: the target owns it"),
        _ => assert_eq!(owner, source, "ABORTED: the source still owns it"),
    }
    assert_map_sane(&map, ours);
    cluster.wait_cluster_ok(WAIT);
    round
}

// ---------------------------------------------------------------- meta store

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn get_map(rt: &tokio::runtime::Runtime, meta: &Arc<dyn MetaStore>) -> PartitionMap {
    let deadline = Instant::now() + WAIT;
    loop {
        match rt.block_on(meta.get_map()) {
            Ok(map) if !map.partitions.is_empty() => return map,
            Ok(_) => {}
            Err(e) => assert!(Instant::now() < deadline, "get_map: {e}"),
        }
        assert!(Instant::now() < deadline, "no map");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn migration(rt: &tokio::runtime::Runtime, meta: &Arc<dyn MetaStore>, id: u64) -> MigrationRecord {
    let stored = rt
        .block_on(meta.get_migration(id))
        .expect("get_migration")
        .unwrap_or_else(|| panic!("migration {id} vanished"));
    MigrationRecord::decode(&stored.record).expect("decode migration")
}
