//! Runs the shared conformance suite against both engines.

mod mem {
    keyway_storage::conformance_tests!(keyway_storage::MemEngine::new, cases = 128);
}

mod fjall {
    fn make() -> keyway_storage::FjallEngine {
        keyway_storage::FjallEngine::open_temporary(keyway_storage::FjallOptions::for_tests())
            .expect("open temporary fjall engine")
    }

    keyway_storage::conformance_tests!(make, cases = 24);
}

/// Without the in-memory change tail every log read goes to the log
/// keyspace (the tail answers most reads of the suite above).
mod fjall_no_tail {
    fn make() -> keyway_storage::FjallEngine {
        keyway_storage::FjallEngine::open_temporary(keyway_storage::FjallOptions {
            change_tail_bytes: 0,
            ..keyway_storage::FjallOptions::for_tests()
        })
        .expect("open temporary fjall engine")
    }

    keyway_storage::conformance_tests!(make, cases = 8);
}

/// The fault-injecting wrapper is a correct engine while no fault is set:
/// crashable (live + durable `MemEngine`s) and wrapping another engine.
mod faulty_crashable {
    keyway_storage::conformance_tests!(keyway_storage::FaultyEngine::crashable, cases = 32);
}

mod faulty_wrapped {
    fn make() -> keyway_storage::FaultyEngine {
        keyway_storage::FaultyEngine::wrap(std::sync::Arc::new(keyway_storage::MemEngine::new()))
    }

    keyway_storage::conformance_tests!(make, cases = 32);
}

/// A crashable engine that syncs after every call: the durable state it
/// would restart from equals the live state it served (the replay is exact).
mod faulty_synced_replay {
    use keyway_storage::{Engine, FaultyEngine};

    #[test]
    fn the_durable_state_after_syncs_equals_the_live_state() {
        let e = FaultyEngine::crashable();
        let range = keyway_storage::KeyRange::all();
        for i in 0..200u32 {
            let key = bytes::Bytes::from(format!("k{}", i % 37));
            let m = match i % 5 {
                0 => keyway_storage::Mutation::Delete { key },
                _ => keyway_storage::Mutation::Put {
                    key,
                    kind: keyway_storage::ValueKind::String,
                    expire_at_ms: None,
                    data: bytes::Bytes::from(format!("v{i}")),
                },
            };
            e.apply(&[m]).unwrap();
            if i % 7 == 0 {
                e.sync().unwrap();
            }
            if i == 150 {
                e.truncate_log(100).unwrap();
            }
        }
        e.sync().unwrap();
        let live = e.digest(&range).unwrap();
        let live_log = e.changes_since(e.log_start() - 1, usize::MAX).unwrap();
        let disk = e.crash().unwrap();
        assert_eq!(disk.digest(&range).unwrap(), live);
        assert_eq!(
            disk.changes_since(disk.log_start() - 1, usize::MAX)
                .unwrap(),
            live_log
        );
    }
}
