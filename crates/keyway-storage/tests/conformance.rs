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
