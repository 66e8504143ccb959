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

/// 100 bytes that do not compress (xorshift), so table sizes are real.
fn random_value(rng: &mut u64) -> Vec<u8> {
    let mut data = vec![0u8; 100];
    for b in data.iter_mut() {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *b = *rng as u8;
    }
    data
}

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
        let data = random_value(&mut rng);
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

/// Bytes under `dir/keyspaces` (fjall's trees: tables and version files,
/// not the journals).
fn tables_du(dir: &Path) -> u64 {
    du(&dir.join("keyspaces"))
}

#[test]
fn tables_a_compaction_replaced_go_once_writes_stop() {
    // Keys in no order (so compactions merge rather than move tables), no
    // change records (`keep_log(false)`, as a node no one reads the log
    // of). Once writes stop and a compaction rewrote the data,
    // `reclaim_space` must leave about the data's size on disk: fjall
    // deletes the tables a compaction replaced only at the tree's next
    // flush or compaction, which an idle node never has (2.1x the logical
    // bytes here without `free_old_versions`, 1.1x with it).
    let dir = tempfile::tempdir().unwrap();
    let opts = FjallOptions {
        max_memtable_bytes: Some(2 * MIB),
        journal_rotation_bytes: Some(4 * MIB),
        temporary: false,
        ..FjallOptions::for_tests()
    };
    let e = FjallEngine::open(dir.path(), opts).unwrap();
    e.keep_log(false).unwrap();
    let n = count() * 2;
    let mut logical = 0u64;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..n {
        let key = Bytes::from(format!(
            "key:{:016x}",
            i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ));
        let data = random_value(&mut rng);
        logical += (key.len() + data.len()) as u64;
        e.apply(&[Mutation::Put {
            key,
            kind: ValueKind::String,
            expire_at_ms: None,
            data: Bytes::from(data),
        }])
        .unwrap();
    }
    e.compact_data_now().unwrap();
    let compacted = tables_du(dir.path());
    // Compactions still queued on fjall's threads may replace tables again
    // meanwhile; each pass collects what they left.
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        e.reclaim_space().unwrap();
        let now = tables_du(dir.path());
        if now * 2 <= logical * 3 || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!(
        "{n} keys, {} KiB logical: {} KiB of tables after the compaction, {} KiB after reclaim_space",
        logical / 1024,
        compacted / 1024,
        after / 1024
    );
    assert!(
        after * 2 <= logical * 3,
        "{} KiB of tables for {} KiB of data",
        after / 1024,
        logical / 1024
    );
}
