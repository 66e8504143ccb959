//! How truncation gives the log's space back: whole tables dropped, no
//! tombstones, `log_start` surviving a reopen.

use super::*;
use crate::value::ValueKind;

fn put(e: &FjallEngine, i: u64) {
    e.apply(&[Mutation::Put {
        key: Bytes::from(format!("key{}", i % 7)),
        kind: ValueKind::String,
        expire_at_ms: None,
        data: Bytes::from(vec![b'x'; 64]),
    }])
    .unwrap();
}

/// A directory that outlives the engine (so it can be reopened), with the
/// test options.
fn on_disk() -> (tempfile::TempDir, FjallOptions) {
    let opts = FjallOptions {
        temporary: false,
        ..FjallOptions::for_tests()
    };
    (tempfile::tempdir().unwrap(), opts)
}

#[test]
fn truncation_drops_the_logs_tables_without_tombstones() {
    let (dir, opts) = on_disk();
    let e = FjallEngine::open(dir.path(), opts.clone()).unwrap();
    for i in 0..5_000 {
        put(&e, i);
    }
    e.log.rotate_memtable_and_wait().unwrap();
    assert!(e.log.table_count() > 0, "the log's records are in tables");
    let last = e.last_seq();
    e.truncate_log(last).unwrap();
    // Dropped, not deleted record by record: no table left, and nothing
    // written to the log's memtable (a tombstone per record would be).
    assert_eq!(e.log.table_count(), 0);
    assert_eq!(e.log.tree.active_memtable().len(), 0);
    assert_eq!(e.log_bytes(), 0);
    assert!(matches!(
        e.changes_since(0, 10),
        Err(StorageError::LogTruncated { log_start, .. }) if log_start == last + 1
    ));
    // New records follow; the truncated ones never come back.
    put(&e, 1);
    assert_eq!(e.last_seq(), last + 1);
    let read = e.changes_since(last, 10).unwrap();
    assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), [last + 1]);
    drop(e);
    let e = FjallEngine::open(dir.path(), opts).unwrap();
    assert_eq!(e.log_start(), last + 1);
    assert_eq!(e.last_seq(), last + 1);
    assert!(e.log_bytes() > 0 && e.log_bytes() < 1024);
}

#[test]
fn records_left_below_log_start_are_never_read() {
    // Part of the log still in the memtable at truncation stays on disk
    // (only whole tables are dropped), below `log_start`.
    let (dir, opts) = on_disk();
    let e = FjallEngine::open(dir.path(), opts.clone()).unwrap();
    for i in 0..1_000 {
        put(&e, i);
    }
    e.truncate_log(600).unwrap();
    assert!(
        e.log.tree.active_memtable().len() >= 1_000,
        "the memtable kept them"
    );
    let read = e.changes_since(600, 10_000).unwrap();
    assert_eq!(read.first().map(|r| r.seq), Some(601));
    assert_eq!(read.len(), 400);
    assert!(matches!(
        e.changes_since(599, 1),
        Err(StorageError::LogTruncated { .. })
    ));
    // Truncated whole: the last seq comes from log_start, also on reopen,
    // though records below it are still on disk.
    e.truncate_log(1_000).unwrap();
    drop(e);
    let e = FjallEngine::open(dir.path(), opts).unwrap();
    assert_eq!((e.log_start(), e.last_seq()), (1_001, 1_000));
    assert!(e.changes_since(1_000, 10).unwrap().is_empty());
    assert_eq!(e.log_bytes(), 0);
}

#[test]
fn truncation_counts_what_it_drops_without_reading_the_log_back() {
    let (dir, opts) = on_disk();
    let e = FjallEngine::open(dir.path(), opts.clone()).unwrap();
    const RECORDS: u64 = 20_000;
    for i in 0..RECORDS {
        put(&e, i);
    }
    // Every record has the same size (key `key<d>`, 64-byte value).
    let record = e.log_bytes() / RECORDS;
    assert_eq!(e.log_bytes(), record * RECORDS);
    assert!(
        record * RECORDS > 10 * crate::log_marks::MARK_EVERY_BYTES,
        "the log spans many marks"
    );
    e.log.rotate_memtable_and_wait().unwrap();
    let cache_before = e.db.cache_size();
    let mut cut = 0;
    for upto in [1, 777, 5_000, 5_001, 12_345, 19_999] {
        e.truncate_log(upto).unwrap();
        cut = upto;
        assert_eq!(e.log_bytes(), record * (RECORDS - upto), "after {upto}");
    }
    // What the truncations read back: at most a mark's worth each (plus
    // the blocks they sit in), not the 1.8 MB they dropped.
    let read = e.db.cache_size() - cache_before;
    eprintln!("six truncations loaded {read} bytes into the block cache");
    assert!(
        read < 6 * 2 * crate::log_marks::MARK_EVERY_BYTES,
        "the truncations loaded {read} bytes of log blocks into the cache"
    );
    drop(e);
    let e = FjallEngine::open(dir.path(), opts).unwrap();
    assert_eq!(e.log_bytes(), record * (RECORDS - cut), "after a reopen");
    put(&e, 0);
    e.truncate_log(RECORDS).unwrap();
    assert_eq!(e.log_bytes(), record, "the marks rebuilt at open count on");
}

/// The change tail answers the newest records exactly as the log keyspace
/// does (read back after a reopen, which starts with an empty tail), and
/// sends a reader it no longer covers to the log.
#[test]
fn the_change_tail_answers_as_the_log_does() {
    let dir = tempfile::tempdir().unwrap();
    let one = crate::value::log_record_bytes(&Mutation::Put {
        key: Bytes::from("key0"),
        kind: ValueKind::String,
        expire_at_ms: None,
        data: Bytes::from(vec![b'x'; 64]),
    }) as usize;
    let opts = FjallOptions {
        temporary: false,
        change_tail_bytes: 50 * one,
        ..FjallOptions::for_tests()
    };
    let e = FjallEngine::open(dir.path(), opts.clone()).unwrap();
    // Kept only while read: unread for more than its budget, it disarms.
    for i in 0..60 {
        put(&e, i);
    }
    assert_eq!(e.memory().change_tail_bytes, 0, "nobody read it");
    // A reader that keeps up (as a replication stream does) arms it.
    for i in 0..200 {
        let _ = e.recent_changes(e.last_seq(), 1);
        put(&e, i);
    }
    let last = e.last_seq();
    assert_eq!(e.memory().change_tail_bytes as usize, 50 * one);
    let mut answered = Vec::new();
    for after in 0..=last {
        match e.recent_changes(after, 7) {
            Some(answer) => answered.push((after, answer.unwrap())),
            None => assert!(after < last - 50, "record {} is in the tail", after + 1),
        }
    }
    assert_eq!(answered.len() as u64, 51, "the last 50 records and the end");
    drop(e);
    let e = FjallEngine::open(
        dir.path(),
        FjallOptions {
            change_tail_bytes: 0,
            ..opts
        },
    )
    .unwrap();
    assert!(e.recent_changes(last - 1, 7).is_none(), "no tail kept");
    for (after, recent) in answered {
        assert_eq!(e.changes_since(after, 7).unwrap(), recent, "after {after}");
    }
}

/// Seqs handed out while records were not kept survive a reopen (the
/// reservation in `meta/seq_reserved`): the next write's seq is above every
/// version already stored, and the log starts after them. Records kept
/// again after a switch are read back after a reopen, with no skip.
#[test]
fn seqs_stay_increasing_across_a_reopen_while_records_are_not_kept() {
    let (dir, opts) = on_disk();
    let e = FjallEngine::open(dir.path(), opts.clone()).unwrap();
    for i in 0..10 {
        put(&e, i);
    }
    assert_eq!(e.keep_log(false).unwrap(), 10);
    for i in 10..1_000 {
        put(&e, i);
    }
    assert_eq!(
        (e.last_seq(), e.log_start(), e.log_bytes()),
        (1_000, 1_001, 0)
    );
    assert_eq!(
        e.log.tree.active_memtable().len() + e.log.tree.sealed_memtable_count(),
        10,
        "only the records before the switch were inserted"
    );
    let version = |e: &FjallEngine| e.get(b"key6").unwrap().unwrap().version;
    assert_eq!(version(&e), 994);
    e.sync().unwrap();
    drop(e);

    let e = FjallEngine::open(dir.path(), opts.clone()).unwrap();
    let last = e.last_seq();
    assert!(last >= 1_000, "no seq is handed out twice: {last}");
    assert_eq!(e.log_start(), last + 1, "nothing readable before it");
    assert!(e.log_kept(), "a reopened engine keeps records");
    put(&e, 6);
    assert!(version(&e) > 1_000, "a later write is newer");
    let on = e.last_seq();
    for i in 0..5 {
        put(&e, i);
    }
    e.sync().unwrap();
    drop(e);

    let e = FjallEngine::open(dir.path(), opts).unwrap();
    assert_eq!(e.last_seq(), on + 5, "records kept: no skip on reopen");
    assert_eq!(e.changes_since(on, 100).unwrap().len(), 5);
    assert_eq!(e.keep_log(true).unwrap(), on + 5);
}

/// Local writes skip the marker read only while no marker can exist
/// (`markers_may_exist`): once a foreign delete leaves one, in this process
/// or before a reopen, a local write still finds and removes it.
#[test]
fn a_local_write_finds_a_marker_left_before_it_even_across_a_reopen() {
    let (dir, opts) = on_disk();
    let key = Bytes::from_static(b"k");
    let put = |data: &'static [u8]| Mutation::Put {
        key: key.clone(),
        kind: ValueKind::String,
        expire_at_ms: None,
        data: Bytes::from_static(data),
    };
    let delete = || Mutation::Delete { key: key.clone() };
    let data = |e: &FjallEngine| e.get(&key).unwrap().map(|v| v.data);
    let may_exist = |e: &FjallEngine| e.markers_may_exist.load(Ordering::Acquire);

    let e = FjallEngine::open(dir.path(), opts.clone()).unwrap();
    assert!(!may_exist(&e), "a new engine holds no marker");
    e.apply(&[put(b"local")]).unwrap();
    assert!(!may_exist(&e), "a local write leaves no marker");
    // In this process: a foreign delete leaves a marker, which refuses an
    // older foreign write until a local write removes it.
    e.apply_foreign(&[ChangeRecord::single(5_000, delete())])
        .unwrap();
    assert!(may_exist(&e));
    e.apply_foreign(&[ChangeRecord::single(4_000, put(b"old"))])
        .unwrap();
    assert_eq!(data(&e), None, "the marker refuses an older write");
    e.apply(&[put(b"local again")]).unwrap();
    e.apply_foreign(&[ChangeRecord::single(4_001, put(b"newer than it"))])
        .unwrap();
    assert_eq!(data(&e).as_deref(), Some(&b"newer than it"[..]));
    // Across a reopen: the marker is on disk, so it is read.
    e.apply_foreign(&[ChangeRecord::single(9_000, delete())])
        .unwrap();
    e.sync().unwrap();
    drop(e);
    let e = FjallEngine::open(dir.path(), opts).unwrap();
    assert!(
        may_exist(&e),
        "a reopened engine with a marker reads markers"
    );
    e.apply(&[delete()]).unwrap();
    e.apply_foreign(&[ChangeRecord::single(1, put(b"after the local delete"))])
        .unwrap();
    assert_eq!(
        data(&e).as_deref(),
        Some(&b"after the local delete"[..]),
        "the local delete removed the marker"
    );
}
