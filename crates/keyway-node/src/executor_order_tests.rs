//! Order per slot around parked tasks (see the executor's module doc), with
//! the race windows made deterministic: the executor's change counter is
//! the test's own channel, so the test decides when a lifted fence is
//! announced, as `Routing` announces it only after clearing the hold.

use super::*;
use crate::clock::SystemClock;
use crate::routing::{Rejection, Routing};
use bytes::Bytes;
use keyway_map::{DEFAULT_KEYSPACE, NodeId, NodeInfo, PartitionId, PartitionMap};
use keyway_storage::{MemEngine, Mutation, ValueKind};

const FENCED_SLOT: u16 = 0;
const OTHER_SLOT: u16 = 16_383;

/// Runs after a task decided to park, with how many times it parked so far
/// (a hook standing for a routing change made concurrently).
type OnPark = Arc<dyn Fn(&Routing, u32) + Send + Sync>;

struct Rig {
    routing: Arc<Routing>,
    executor: Executor,
    changes: watch::Sender<u64>,
    engine: Arc<MemEngine>,
    /// Values in the order the tasks took effect.
    applied: Arc<Mutex<Vec<&'static str>>>,
    fenced: PartitionId,
}

/// One node owning both partitions; the partition of slot 0 fenced.
fn rig() -> Rig {
    let node = NodeInfo::up(NodeId(1), "127.0.0.1:7001".into());
    let routing = Arc::new(Routing::new(NodeId(1), Arc::new(SystemClock)));
    routing
        .install(PartitionMap::bootstrap(&[node], 2).unwrap())
        .unwrap();
    routing.set_lease_deadline(Instant::now() + Duration::from_secs(60));
    let map = routing.map();
    let fenced = map.locate_slot(DEFAULT_KEYSPACE, FENCED_SLOT).unwrap().id;
    let other = map.locate_slot(DEFAULT_KEYSPACE, OTHER_SLOT).unwrap().id;
    assert_ne!(fenced, other);
    routing.set_fenced(fenced, true);
    let engine = Arc::new(MemEngine::new());
    let (changes, rx) = watch::channel(0);
    let executor = one_thread_executor(engine.clone(), rx);
    Rig {
        routing,
        executor,
        changes,
        engine,
        applied: Arc::default(),
        fenced,
    }
}

/// One executor thread, `none` durability, 30 s hold limit.
pub(super) fn one_thread_executor(
    engine: Arc<dyn Engine>,
    changes: watch::Receiver<u64>,
) -> Executor {
    Executor::start(
        engine,
        ExecutorConfig {
            threads: 1,
            durability: Durability::None,
            periodic_sync_ms: 1_000,
            max_group_commands: 64,
            max_hold: Duration::from_secs(30),
            health: crate::storage_health::StorageHealth::new(),
        },
        changes,
        Arc::new(Metrics::new()),
    )
}

fn key(slot: u16) -> Bytes {
    Bytes::from([&slot.to_be_bytes()[..], b"k"].concat())
}

fn no_hook() -> OnPark {
    Arc::new(|_, _| {})
}

/// `SET k <value>` on `slot` the way a storage task runs it: admit under
/// the routing read guard, park while fenced, else apply and log.
fn set_task(
    routing: Arc<Routing>,
    applied: Arc<Mutex<Vec<&'static str>>>,
    slot: u16,
    value: &'static str,
    on_park: OnPark,
    parks: u32,
) -> Task {
    Box::new(move |engine| {
        let guard = routing.read();
        match guard.admit_slot(DEFAULT_KEYSPACE, slot, None) {
            Err(Rejection::Fenced { .. }) => {
                drop(guard);
                on_park(&routing, parks + 1);
                let again = set_task(routing.clone(), applied, slot, value, on_park, parks + 1);
                TaskOutput {
                    reply: Frame::Null,
                    wrote: false,
                    follow: Follow::Park(again),
                }
            }
            Err(other) => TaskOutput::reply(other.to_frame(), false),
            Ok(_) => {
                engine
                    .apply(&[Mutation::Put {
                        key: key(slot),
                        kind: ValueKind::String,
                        expire_at_ms: None,
                        data: Bytes::from_static(value.as_bytes()),
                    }])
                    .unwrap();
                applied.lock().unwrap().push(value);
                TaskOutput::reply(Frame::ok(), true)
            }
        }
    })
}

impl Rig {
    async fn submit_set(&self, value: &'static str, on_park: OnPark) -> oneshot::Receiver<Frame> {
        let task = set_task(
            self.routing.clone(),
            self.applied.clone(),
            FENCED_SLOT,
            value,
            on_park,
            0,
        );
        self.executor.submit(FENCED_SLOT, task).await.unwrap()
    }

    /// Returns once every job queued before it was handled (the queue is
    /// FIFO, and the probe's slot is never fenced nor parked).
    async fn barrier(&self) {
        let probe: Task = Box::new(|_| TaskOutput::reply(Frame::ok(), false));
        assert_eq!(self.executor.run(OTHER_SLOT, probe).await, Frame::ok());
    }

    /// Announces a routing change, as `Routing` does after making it.
    /// Announces the routing change, then: both SETs answered OK, applied
    /// as `1` then `2`, and `k` is `2`.
    async fn announce_and_expect_in_order(
        self,
        first: oneshot::Receiver<Frame>,
        second: oneshot::Receiver<Frame>,
    ) {
        self.announce();
        assert_eq!(first.await.unwrap(), Frame::ok());
        assert_eq!(second.await.unwrap(), Frame::ok());
        assert_eq!(self.applied(), ["1", "2"]);
        assert_eq!(self.value().as_deref(), Some(&b"2"[..]));
        self.executor.shutdown();
    }

    fn announce(&self) {
        self.changes.send_modify(|n| *n += 1);
        self.executor.wake();
    }

    fn applied(&self) -> Vec<&'static str> {
        self.applied.lock().unwrap().clone()
    }

    fn value(&self) -> Option<Bytes> {
        self.engine.get(&key(FENCED_SLOT)).unwrap().map(|v| v.data)
    }
}

/// Pipeline `SET k 1; SET k 2`, the first parked behind a fence that lifts
/// before the change counter moves: the second must not run first.
#[tokio::test]
async fn a_new_task_never_overtakes_a_parked_one_of_its_slot() {
    let rig = rig();
    let first = rig.submit_set("1", no_hook()).await;
    rig.barrier().await;
    assert!(
        rig.applied().is_empty(),
        "SET k 1 is parked behind the fence"
    );
    // The routing side clears the hold; its change is not announced yet.
    rig.routing.set_fenced(rig.fenced, false);
    let second = rig.submit_set("2", no_hook()).await;
    rig.barrier().await;
    assert!(
        rig.applied().is_empty(),
        "SET k 2 ran before the parked SET k 1: {:?}",
        rig.applied()
    );
    rig.announce_and_expect_in_order(first, second).await;
}

/// Two parked tasks of one slot; the fence lifts while the first is being
/// re-parked (mid-pass): the second must stay behind it.
#[tokio::test]
async fn a_fence_lifting_mid_pass_lets_no_later_task_pass() {
    let rig = rig();
    let fenced = rig.fenced;
    // On its second park (the first re-run), the fence lifts.
    let lift: OnPark = Arc::new(move |routing, parks| {
        if parks == 2 {
            routing.set_fenced(fenced, false);
        }
    });
    let first = rig.submit_set("1", lift).await;
    let second = rig.submit_set("2", no_hook()).await;
    rig.barrier().await;
    rig.executor.wake();
    rig.barrier().await;
    assert!(
        rig.applied().is_empty(),
        "SET k 2 ran while SET k 1 was still parked: {:?}",
        rig.applied()
    );
    rig.announce_and_expect_in_order(first, second).await;
}

/// A parked slot holds back only its own slot.
#[tokio::test]
async fn other_slots_run_past_a_parked_task() {
    let rig = rig();
    let parked = rig.submit_set("1", no_hook()).await;
    rig.barrier().await; // a task of another slot answered meanwhile
    assert!(rig.applied().is_empty());
    rig.routing.set_fenced(rig.fenced, false);
    rig.announce();
    assert_eq!(parked.await.unwrap(), Frame::ok());
    assert_eq!(rig.applied(), ["1"]);
    rig.executor.shutdown();
}
