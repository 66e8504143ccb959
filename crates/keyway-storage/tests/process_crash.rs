//! What a **process** crash (SIGKILL, no machine crash: the page cache
//! survives) loses of batches applied but never synced, with and without
//! [`FjallOptions::flush_journal_each_batch`], and with it deferred to one
//! [`Engine::flush_deferred`] per group of batches (the node's storage
//! threads).
//!
//! The test re-runs its own binary as a child (`KW_PROCESS_CRASH_CHILD`
//! names the data directory): the child applies `BATCHES` one-key batches,
//! never syncs, says so on stdout and waits; the parent kills it with
//! SIGKILL, reopens the directory and counts the keys that survived.

use bytes::Bytes;
use keyway_storage::{
    Engine, FjallEngine, FjallOptions, Mutation, ValueKind, defer_os_flush_on_this_thread,
};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

const BATCHES: u64 = 2_000;
const VALUE_BYTES: usize = 100;
const CHILD_DIR: &str = "KW_PROCESS_CRASH_CHILD";
const CHILD_FLUSH: &str = "KW_PROCESS_CRASH_FLUSH";
/// Batches per group when the hand-over is deferred.
const GROUP_BATCHES: u64 = 16;

/// How the child hands its batches to the OS.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Flush {
    /// Never (fjall's buffer fills and drains on its own).
    Never,
    /// At each apply (`flush_journal_each_batch`).
    EachBatch,
    /// Deferred, then one `flush_deferred` per group of batches.
    PerGroup,
    /// Deferred and never flushed (the control of `PerGroup`).
    DeferredOnly,
}

impl Flush {
    fn name(self) -> &'static str {
        match self {
            Flush::Never => "never",
            Flush::EachBatch => "each",
            Flush::PerGroup => "group",
            Flush::DeferredOnly => "deferred",
        }
    }
    fn from_env() -> Flush {
        match std::env::var(CHILD_FLUSH).as_deref() {
            Ok("each") => Flush::EachBatch,
            Ok("group") => Flush::PerGroup,
            Ok("deferred") => Flush::DeferredOnly,
            _ => Flush::Never,
        }
    }
}

fn options(flush: bool) -> FjallOptions {
    FjallOptions {
        temporary: false,
        flush_journal_each_batch: flush,
        ..FjallOptions::for_tests()
    }
}

fn key(i: u64) -> Bytes {
    Bytes::from(format!("key-{i:06}"))
}

/// The child: apply, never sync, report, wait to be killed.
fn child(dir: &Path, flush: Flush) -> ! {
    let e = FjallEngine::open(dir, options(flush != Flush::Never)).expect("child opens the engine");
    if matches!(flush, Flush::PerGroup | Flush::DeferredOnly) {
        defer_os_flush_on_this_thread();
    }
    for i in 0..BATCHES {
        e.apply(&[Mutation::Put {
            key: key(i),
            kind: ValueKind::String,
            expire_at_ms: None,
            data: Bytes::from(vec![b'v'; VALUE_BYTES]),
        }])
        .expect("child applies");
        if flush == Flush::PerGroup && (i + 1) % GROUP_BATCHES == 0 {
            e.flush_deferred().expect("child hands a group to the OS");
        }
    }
    if flush == Flush::PerGroup {
        e.flush_deferred()
            .expect("child hands the last group to the OS");
    }
    let mut out = std::io::stdout();
    writeln!(out, "applied {}", e.last_seq()).unwrap();
    out.flush().unwrap();
    // Wait for SIGKILL; stdin closing (the parent died) also ends the wait.
    let _ = std::io::stdin().read_line(&mut String::new());
    std::process::exit(3)
}

/// Runs a child with `flush`, kills it, returns how many batches survived.
fn survivors(flush: Flush, test_name: &str) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, dir.path())
        .env(CHILD_FLUSH, flush.name())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    // The child's test harness prints `test <name> ... ` on the same line.
    let applied = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.rsplit_once("applied ").map(|(_, n)| n.to_string()))
        .expect("the child reports its applies");
    assert_eq!(applied, BATCHES.to_string());
    c.kill().unwrap(); // SIGKILL: no destructor, no flush runs
    c.wait().unwrap();
    let e = FjallEngine::open(dir.path(), options(false)).unwrap();
    let found = (0..BATCHES)
        .filter(|&i| e.get(&key(i)).unwrap().is_some())
        .count() as u64;
    // A journal replays a prefix of batches: the survivors are 0..found.
    assert_eq!(e.last_seq(), found, "recovered a prefix");
    eprintln!(
        "process crash, OS hand-over {flush:?}: {found} of {BATCHES} unsynced batches survived"
    );
    found
}

fn run_as_child_if_asked() {
    if let Ok(dir) = std::env::var(CHILD_DIR) {
        child(Path::new(&dir), Flush::from_env());
    }
}

#[test]
fn without_a_flush_a_process_crash_loses_the_journal_buffer() {
    run_as_child_if_asked();
    let found = survivors(
        Flush::Never,
        "without_a_flush_a_process_crash_loses_the_journal_buffer",
    );
    // fjall keeps up to 8 KiB of journal in user space: the tail is lost.
    assert!(
        found < BATCHES,
        "expected a lost tail, all {found} survived"
    );
}

#[test]
fn with_a_flush_per_batch_a_process_crash_loses_nothing_applied() {
    run_as_child_if_asked();
    let found = survivors(
        Flush::EachBatch,
        "with_a_flush_per_batch_a_process_crash_loses_nothing_applied",
    );
    assert_eq!(found, BATCHES);
}

#[test]
fn with_the_flush_deferred_to_each_group_a_process_crash_loses_nothing_flushed() {
    run_as_child_if_asked();
    let found = survivors(
        Flush::PerGroup,
        "with_the_flush_deferred_to_each_group_a_process_crash_loses_nothing_flushed",
    );
    assert_eq!(found, BATCHES);
}

#[test]
fn deferred_and_never_flushed_a_process_crash_loses_the_journal_buffer() {
    run_as_child_if_asked();
    let found = survivors(
        Flush::DeferredOnly,
        "deferred_and_never_flushed_a_process_crash_loses_the_journal_buffer",
    );
    assert!(
        found < BATCHES,
        "deferring must leave the batches in the buffer: all {found} survived"
    );
}
