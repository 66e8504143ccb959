//! The conformance suite against [`EmbeddedMeta`] directly, and its restart
//! behaviour (drop + reopen the same directory).

use keyway_meta::conformance::{self, Fixture};
use keyway_meta::{EmbeddedMeta, EmbeddedOptions, MetaStore};
use std::sync::Arc;

/// History kept small so the "history too short" case is cheap to reach.
const HISTORY: usize = 16;

fn options() -> EmbeddedOptions {
    EmbeddedOptions {
        history_versions: HISTORY,
        ..EmbeddedOptions::default()
    }
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedMeta::open(dir.path(), options()).unwrap();
    Fixture {
        store: Arc::new(store),
        history_versions: HISTORY,
        keep: Box::new(dir),
    }
}

keyway_meta::meta_conformance_tests!(crate::fixture());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    conformance::survives_restart(|| {
        let path = path.clone();
        async move {
            let store: Arc<dyn MetaStore> = Arc::new(EmbeddedMeta::open(&path, options()).unwrap());
            store
        }
    })
    .await;
}
