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

#[test]
fn a_flush_keeps_one_version_of_an_overwritten_key_with_no_snapshot_open() {
    // One key overwritten 60,000 times (6 MB of versions, past the 2 MiB
    // memtable three times over), no snapshot ever opened: each flush may
    // keep only the newest version (fjall moves its collection watermark
    // up at every memtable rotation when no snapshot is open). A hot key's
    // tables stay a few KiB, not the 6 MB its versions were.
    let dir = tempfile::tempdir().unwrap();
    let opts = FjallOptions {
        max_memtable_bytes: Some(2 * MIB),
        temporary: false,
        ..FjallOptions::for_tests()
    };
    let e = FjallEngine::open(dir.path(), opts).unwrap();
    e.keep_log(false).unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut last = Vec::new();
    for _ in 0..60_000 {
        last = random_value(&mut rng);
        e.apply(&[Mutation::Put {
            key: Bytes::from_static(b"hot"),
            kind: ValueKind::String,
            expire_at_ms: None,
            data: Bytes::from(last.clone()),
        }])
        .unwrap();
    }
    e.flush_now().unwrap();
    let tables = e.data_table_bytes();
    eprintln!(
        "60000 versions of one key: {} KiB of data tables",
        tables / 1024
    );
    assert_eq!(e.get(b"hot").unwrap().unwrap().data, Bytes::from(last));
    assert!(tables < 256 * 1024, "{} KiB of data tables", tables / 1024);
}

#[test]
fn the_log_is_never_compacted_and_truncation_still_frees_it() {
    // The log's keys are seqs, written in order and dropped whole tables
    // at a time: FIFO (no limit, no age) never rewrites them. Records stay
    // readable across many flushed tables, and truncation drops them.
    let dir = tempfile::tempdir().unwrap();
    let opts = FjallOptions {
        max_memtable_bytes: Some(MIB),
        temporary: false,
        ..FjallOptions::for_tests()
    };
    let e = FjallEngine::open(dir.path(), opts).unwrap();
    assert_eq!(e.log_compaction_strategy(), "FifoCompaction");
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let n = 40_000u64;
    for i in 0..n {
        e.apply(&[Mutation::Put {
            key: Bytes::from(format!("key{}", i % 7)),
            kind: ValueKind::String,
            expire_at_ms: None,
            data: Bytes::from(random_value(&mut rng)),
        }])
        .unwrap();
    }
    e.flush_now().unwrap();
    let mut seen = 0u64;
    let mut after = 0;
    loop {
        let batch = e.changes_since(after, 4096).unwrap();
        let Some(last) = batch.last() else { break };
        for r in &batch {
            assert_eq!(r.seq, after + 1, "records in order, none missing");
            after = r.seq;
        }
        seen += batch.len() as u64;
        assert_eq!(after, last.seq);
    }
    assert_eq!(seen, n);
    let before = e.log_table_bytes();
    assert!(before > 2 * MIB, "{} KiB of log tables", before / 1024);
    e.truncate_log(e.last_seq()).unwrap();
    assert!(
        e.log_table_bytes() < 64 * 1024,
        "{} KiB of log tables after truncation (of {} KiB)",
        e.log_table_bytes() / 1024,
        before / 1024
    );
    // Reopened, the log is still FIFO and starts after the truncation.
    drop(e);
    let e = FjallEngine::open(
        dir.path(),
        FjallOptions {
            temporary: false,
            ..FjallOptions::for_tests()
        },
    )
    .unwrap();
    assert_eq!(e.log_compaction_strategy(), "FifoCompaction");
    assert_eq!(e.log_start(), n + 1);
}
