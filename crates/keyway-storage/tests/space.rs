//! Disk space comes back after the change log is truncated: overwrites of a
//! few keys, truncated as they go, leave the directory small (the data
//! keyspace's old versions and the log's records are dropped, journals go).

use bytes::Bytes;
use keyway_storage::{Engine, FjallEngine, FjallOptions, Mutation, ValueKind};
use std::path::Path;
use std::time::{Duration, Instant};

/// Allocated bytes under `dir` (what `du` reports: journals are preallocated
/// sparse files, so their length overstates them).
fn du(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                stack.push(e.path());
            } else {
                total += md.blocks() * 512;
            }
        }
    }
    total
}

fn count() -> u64 {
    std::env::var("KEYWAY_TEST_SPACE_WRITES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

const MIB: u64 = 1024 * 1024;

#[test]
fn truncated_overwrites_give_their_space_back() {
    let dir = tempfile::tempdir().unwrap();
    let opts = FjallOptions {
        max_journaling_size_bytes: Some(64 * MIB),
        max_memtable_bytes: Some(4 * MIB),
        journal_rotation_bytes: Some(4 * MIB),
        temporary: false,
        ..FjallOptions::for_tests()
    };
    let e = FjallEngine::open(dir.path(), opts).unwrap();
    let n = count();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut max_du = 0;
    let started = Instant::now();
    for i in 0..n {
        let mut data = vec![0u8; 100];
        for b in data.iter_mut() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            *b = rng as u8;
        }
        e.apply(&[Mutation::Put {
            key: Bytes::from(format!("key{}", i % 3)),
            kind: ValueKind::String,
            expire_at_ms: None,
            data: Bytes::from(data),
        }])
        .unwrap();
        if i % 4096 == 0 {
            e.truncate_log(e.last_seq()).unwrap();
            e.reclaim_space().unwrap();
            max_du = max_du.max(du(dir.path()));
        }
    }
    e.truncate_log(e.last_seq()).unwrap();
    assert!(e.log_bytes() < 1024, "log_bytes {}", e.log_bytes());
    // Settled: at most about one journal and one memtable per keyspace.
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        e.reclaim_space().unwrap();
        let now = du(dir.path());
        if now < 12 * MIB || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!(
        "{n} writes in {:?}: {} KiB max during, {} KiB after",
        started.elapsed(),
        max_du / 1024,
        after / 1024,
    );
    assert!(after < 12 * MIB, "{} KiB after settling", after / 1024);
    assert!(max_du < 24 * MIB, "{} KiB during", max_du / 1024);
}
