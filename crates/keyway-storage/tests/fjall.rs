//! FjallEngine-specific tests: restart recovery, crash recovery (a child
//! process aborts mid-stream), interrupted log truncation, format checks.

use std::path::Path;
use std::process::Command;

use bytes::Bytes;
use keyway_storage::{
    ChangeRecord, Engine, FjallEngine, FjallOptions, KeyRange, MemEngine, Mutation, StorageError,
    Value, ValueKind,
};

fn opts() -> FjallOptions {
    FjallOptions {
        temporary: false,
        ..FjallOptions::for_tests()
    }
}

fn open(dir: &Path) -> FjallEngine {
    FjallEngine::open(dir, opts()).expect("open fjall engine")
}

fn key(i: u64) -> Bytes {
    let mut k = 1u32.to_be_bytes().to_vec();
    k.extend_from_slice(&((i % 7) as u16).to_be_bytes());
    k.extend_from_slice(format!("key-{i}").as_bytes());
    Bytes::from(k)
}

fn put(k: &Bytes, data: &str) -> Mutation {
    Mutation::Put {
        key: k.clone(),
        kind: ValueKind::String,
        expire_at_ms: None,
        data: Bytes::copy_from_slice(data.as_bytes()),
    }
}

fn all(e: &impl Engine) -> Vec<(Bytes, Value)> {
    let mut out = Vec::new();
    let mut after: Option<Bytes> = None;
    loop {
        let c = e.scan(&KeyRange::all(), after.as_deref(), 64).unwrap();
        out.extend(c.entries);
        match c.next {
            Some(n) => after = Some(n),
            None => return out,
        }
    }
}

#[test]
fn restart_restores_data_seq_and_log() {
    let dir = tempfile::tempdir().unwrap();
    let (snapshot, log, digest, log_bytes);
    {
        let e = open(dir.path());
        for i in 0..100 {
            e.apply(&[put(&key(i), &format!("v{i}"))]).unwrap();
        }
        e.apply(&[
            Mutation::Delete { key: key(3) },
            Mutation::SetExpiry {
                key: key(4),
                expire_at_ms: Some(1234),
            },
        ])
        .unwrap();
        // A foreign tombstone marker must survive the restart too.
        e.apply_foreign(&[ChangeRecord {
            batch_continues: false,
            seq: 10_000,
            mutation: Mutation::Delete { key: key(5) },
        }])
        .unwrap();
        e.truncate_log(40).unwrap();
        e.sync().unwrap();
        assert_eq!(e.last_seq(), 103);
        snapshot = all(&e);
        log = e.changes_since(40, usize::MAX).unwrap();
        digest = e.digest(&KeyRange::all()).unwrap();
        log_bytes = e.log_bytes();
        assert!(log_bytes > 0);
    }
    let e = open(dir.path());
    assert_eq!(e.last_seq(), 103);
    assert_eq!(e.log_start(), 41);
    assert_eq!(e.log_bytes(), log_bytes, "log_bytes is recounted at open");
    assert_eq!(all(&e), snapshot);
    assert_eq!(e.changes_since(40, usize::MAX).unwrap(), log);
    assert!(matches!(
        e.changes_since(39, 1),
        Err(StorageError::LogTruncated { .. })
    ));
    assert_eq!(e.digest(&KeyRange::all()).unwrap(), digest);
    assert_eq!(e.get(&key(4)).unwrap().unwrap().expire_at_ms, Some(1234));
    // Marker still protects key 5 against an older foreign put.
    e.apply_foreign(&[ChangeRecord {
        batch_continues: false,
        seq: 9_999,
        mutation: put(&key(5), "resurrected"),
    }])
    .unwrap();
    assert_eq!(e.get(&key(5)).unwrap(), None);
    // The counter continues.
    assert_eq!(e.apply(&[put(&key(1), "after restart")]).unwrap(), 104);
}

#[test]
fn restart_after_full_truncation_keeps_the_counter() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = open(dir.path());
        for i in 0..10 {
            e.apply(&[put(&key(i), "x")]).unwrap();
        }
        e.truncate_log(u64::MAX).unwrap();
        assert_eq!(e.log_start(), 11);
        // No explicit sync: dropping the engine persists the journal.
    }
    let e = open(dir.path());
    assert_eq!(e.last_seq(), 10);
    assert_eq!(e.log_start(), 11);
    assert!(e.changes_since(10, 10).unwrap().is_empty());
    assert_eq!(e.apply(&[put(&key(0), "y")]).unwrap(), 11);
    assert_eq!(all(&e).len(), 10);
}

#[test]
fn interrupted_truncation_is_finished_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let whole_log_bytes = {
        let e = open(dir.path());
        let muts: Vec<_> = (0..5000).map(|i| put(&key(i), "x")).collect();
        e.apply(&muts).unwrap();
        e.log_bytes()
    };
    // Simulate a crash between committing meta/log_start and purging records.
    {
        let db = fjall::Database::builder(dir.path()).open().unwrap();
        let meta = db
            .keyspace("meta", fjall::KeyspaceCreateOptions::default)
            .unwrap();
        meta.insert("log_start", 4001u64.to_be_bytes()).unwrap();
        db.persist(fjall::PersistMode::SyncAll).unwrap();
    }
    {
        let e = open(dir.path());
        assert_eq!(e.log_start(), 4001);
        assert_eq!(e.changes_since(4000, usize::MAX).unwrap().len(), 1000);
        assert!(matches!(
            e.changes_since(3999, 1),
            Err(keyway_storage::StorageError::LogTruncated { .. })
        ));
        // Only what is past log_start counts: about a fifth of the log.
        let kept = e.log_bytes();
        assert!(
            kept > 0 && kept * 4 < whole_log_bytes,
            "{kept} of {whole_log_bytes} bytes"
        );
    }
    // The purge was finished: recorded up to the new log_start. (The
    // records themselves go with their tables: see `purge_log`.)
    let db = fjall::Database::builder(dir.path()).open().unwrap();
    let meta = db
        .keyspace("meta", fjall::KeyspaceCreateOptions::default)
        .unwrap();
    let purged = meta.get("log_purged").unwrap().unwrap();
    assert_eq!(
        u64::from_be_bytes(purged.as_ref().try_into().unwrap()),
        4000
    );
}

#[test]
fn rejects_unknown_format_and_double_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = open(dir.path());
        e.apply(&[put(&key(1), "x")]).unwrap();
        assert!(
            FjallEngine::open(dir.path(), opts()).is_err(),
            "directory is locked while open"
        );
    }
    {
        let db = fjall::Database::builder(dir.path()).open().unwrap();
        let meta = db
            .keyspace("meta", fjall::KeyspaceCreateOptions::default)
            .unwrap();
        meta.insert("format", 99u32.to_be_bytes()).unwrap();
    }
    assert!(matches!(
        FjallEngine::open(dir.path(), opts()),
        Err(StorageError::UnsupportedFormat {
            found: 99,
            expected: 1
        })
    ));
    assert!(matches!(
        FjallEngine::open(
            dir.path(),
            FjallOptions {
                max_journaling_size_bytes: Some(1),
                ..opts()
            }
        ),
        Err(StorageError::InvalidArgument(_))
    ));
}

#[test]
fn temporary_engine_removes_its_directory() {
    let e = FjallEngine::open_temporary(FjallOptions::for_tests()).unwrap();
    let path = e.path().to_path_buf();
    e.apply(&[put(&key(1), "x")]).unwrap();
    assert!(path.exists());
    assert!(e.disk_space().unwrap() > 0);
    drop(e);
    assert!(!path.exists());
}

const CRASH_DIR_ENV: &str = "KEYWAY_STORAGE_CRASH_DIR";
const CRASH_BATCHES: u64 = 400;
const CRASH_SYNCED: u64 = 300;

/// Child side of `crash_recovery`: writes, syncs part way, keeps writing, aborts.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CRASH_DIR_ENV) else {
        return;
    };
    write_then_abort(Path::new(&dir), None);
}

/// The crash children's work: batches of two writes, a sync after
/// `CRASH_SYNCED` of them, more, then an abort; records are switched off
/// before batch `records_off_at` if given.
fn write_then_abort(dir: &Path, records_off_at: Option<u64>) -> ! {
    let e = open(dir);
    for i in 1..=CRASH_BATCHES {
        if Some(i) == records_off_at {
            e.keep_log(false).unwrap();
        }
        // Two mutations per batch; ~1 KiB each so the journal's 8 KiB
        // userspace buffer spills mid-stream and may tear a batch.
        let data = format!("{i:>1000}");
        e.apply(&[
            put(&key(i), &data),
            put(&Bytes::from_static(b"counter"), &i.to_string()),
        ])
        .unwrap();
        if i == CRASH_SYNCED {
            e.sync().unwrap();
        }
    }
    std::process::abort();
}

/// Runs the test `name` of this binary as a child writing to `dir`
/// (passed in `env`), which must abort.
fn run_crash_child(name: &str, env: &str, dir: &Path) {
    let status = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(env, dir)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "child must abort");
}

#[test]
fn crash_recovery() {
    let dir = tempfile::tempdir().unwrap();
    run_crash_child("crash_child", CRASH_DIR_ENV, dir.path());

    let e = open(dir.path());
    let last = e.last_seq();
    assert!(
        last >= 2 * CRASH_SYNCED,
        "synced writes lost: last_seq {last}"
    );
    assert_eq!(last % 2, 0, "a batch was torn: last_seq {last}");
    let counter = e.get(b"counter").unwrap().unwrap();
    assert_eq!(counter.data, (last / 2).to_string());
    assert_eq!(counter.version, last);
    // The data is exactly what replaying the recovered log produces.
    let log = e.changes_since(0, usize::MAX).unwrap();
    assert_eq!(log.len() as u64, last);
    let replay = MemEngine::new();
    for r in &log {
        replay.apply(std::slice::from_ref(&r.mutation)).unwrap();
    }
    assert_eq!(all(&replay), all(&e));
    eprintln!(
        "crash recovery: {} of {} batches survived ({} synced)",
        last / 2,
        CRASH_BATCHES,
        CRASH_SYNCED
    );
}

const UNKEPT_CRASH_DIR_ENV: &str = "KEYWAY_STORAGE_UNKEPT_CRASH_DIR";

/// Child side of `crash_with_records_not_kept`: records are switched off
/// after 50 batches; writes, syncs part way, keeps writing, aborts.
#[test]
fn unkept_crash_child() {
    let Ok(dir) = std::env::var(UNKEPT_CRASH_DIR_ENV) else {
        return;
    };
    write_then_abort(Path::new(&dir), Some(50));
}

/// A process crash while records are not kept: every version the
/// recovered data holds is at or below the recovered last seq (no seq will
/// be handed out twice), and the log reads as truncated whole.
#[test]
fn crash_with_records_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    run_crash_child("unkept_crash_child", UNKEPT_CRASH_DIR_ENV, dir.path());

    let e = open(dir.path());
    let counter = e.get(b"counter").unwrap().unwrap();
    let written: u64 = counter
        .data
        .trim_ascii_start()
        .iter()
        .fold(0, |n, d| n * 10 + u64::from(d - b'0'));
    assert!(written >= CRASH_SYNCED, "synced writes lost: {written}");
    assert_eq!(counter.version, 2 * written, "the counter's seq");
    let last = e.last_seq();
    assert!(
        last >= counter.version,
        "last seq {last} below a stored version"
    );
    assert_eq!(
        e.log_start(),
        last + 1,
        "nothing readable before the last seq"
    );
    assert!(matches!(
        e.changes_since(0, 10),
        Err(StorageError::LogTruncated { .. })
    ));
    e.apply(&[put(&Bytes::from_static(b"counter"), "next")])
        .unwrap();
    assert!(e.get(b"counter").unwrap().unwrap().version > counter.version);
}
