//! Conformance suite every [`Engine`] implementation must pass.
//!
//! Each check is a public generic function taking a factory of fresh, empty
//! engines. [`run_all`] runs them all; [`conformance_tests!`](crate::conformance_tests)
//! expands to one `#[test]` per check (better reporting and parallelism):
//!
//! ```ignore
//! mod mem {
//!     keyway_storage::conformance_tests!(keyway_storage::MemEngine::new, cases = 128);
//! }
//! ```
//!
//! Property checks use proptest with a random seed per run (a failure prints
//! the minimal failing input); `PROPTEST_CASES` overrides the case count.

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestCaseError, TestRunner};

use crate::digest::{Digester, RangeDigest};
use crate::engine::Engine;
use crate::error::StorageError;
use crate::range::KeyRange;
use crate::value::{ChangeRecord, Mutation, Seq, Value, ValueKind};

/// Default number of proptest cases per property in [`run_all`].
pub const DEFAULT_CASES: u32 = 64;

/// Expands to one `#[test]` per conformance check for the engine built by
/// `$make` (an expression usable as `&dyn Fn() -> E`), e.g. a closure or a
/// function path. `cases` = proptest cases per property (default 64).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!($make, cases = $crate::conformance::DEFAULT_CASES);
    };
    ($make:expr, cases = $cases:expr) => {
        $crate::conformance_tests!(@tests $make, $cases;
            empty_engine, put_get_delete, batch_semantics, set_expiry, invalid_input,
            scan_paging, scan_rev_paging, change_log, change_log_batches, recent_changes_agree, log_not_kept, delete_range_chunk, digest_and_stats, written_digests, foreign_basics,
            foreign_pending_expiry, foreign_effects_logged, concurrent_apply,
            concurrent_scan_consistency;
            prop_model, prop_foreign_permutation, prop_replica_follow);
    };
    (@tests $make:expr, $cases:expr; $($plain:ident),*; $($prop:ident),*) => {
        $(
            #[test]
            fn $plain() {
                $crate::conformance::$plain(&$make);
            }
        )*
        $(
            #[test]
            fn $prop() {
                $crate::conformance::$prop(&$make, $cases);
            }
        )*
    };
}

/// Runs every check with `cases` proptest cases per property.
pub fn run_all<E: Engine>(make: impl Fn() -> E, cases: u32) {
    let make: &dyn Fn() -> E = &make;
    empty_engine(make);
    put_get_delete(make);
    batch_semantics(make);
    set_expiry(make);
    invalid_input(make);
    scan_paging(make);
    scan_rev_paging(make);
    change_log(make);
    change_log_batches(make);
    recent_changes_agree(make);
    log_not_kept(make);
    delete_range_chunk(make);
    digest_and_stats(make);
    written_digests(make);
    foreign_basics(make);
    foreign_pending_expiry(make);
    foreign_effects_logged(make);
    concurrent_apply(make);
    concurrent_scan_consistency(make);
    prop_model(make, cases);
    prop_foreign_permutation(make, cases);
    prop_replica_follow(make, cases);
}

// ---------------------------------------------------------------------------
// helpers

fn ok<T>(r: Result<T, StorageError>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("engine call failed: {e}"),
    }
}

/// A routing key: `keyspace u32 BE | slot u16 BE | user key`.
fn rk(slot: u16, user: &str) -> Bytes {
    let mut k = Vec::with_capacity(6 + user.len());
    k.extend_from_slice(&7u32.to_be_bytes());
    k.extend_from_slice(&slot.to_be_bytes());
    k.extend_from_slice(user.as_bytes());
    Bytes::from(k)
}

fn slot_range(slot: u16) -> KeyRange {
    KeyRange::prefix(rk(slot, ""))
}

fn put(key: &Bytes, data: &str) -> Mutation {
    put_exp(key, data, None)
}

fn put_exp(key: &Bytes, data: &str, expire_at_ms: Option<u64>) -> Mutation {
    Mutation::Put {
        key: key.clone(),
        kind: ValueKind::String,
        expire_at_ms,
        data: Bytes::copy_from_slice(data.as_bytes()),
    }
}

fn del(key: &Bytes) -> Mutation {
    Mutation::Delete { key: key.clone() }
}

fn expire(key: &Bytes, expire_at_ms: Option<u64>) -> Mutation {
    Mutation::SetExpiry {
        key: key.clone(),
        expire_at_ms,
    }
}

fn rec(seq: Seq, mutation: Mutation) -> ChangeRecord {
    ChangeRecord {
        batch_continues: false,
        seq,
        mutation,
    }
}

fn val(data: &str, expire_at_ms: Option<u64>, version: Seq) -> Value {
    Value {
        kind: ValueKind::String,
        expire_at_ms,
        version,
        data: Bytes::copy_from_slice(data.as_bytes()),
    }
}

/// Pages through `range` with chunks of `chunk`, checking the paging contract.
fn scan_all<E: Engine + ?Sized>(e: &E, range: &KeyRange, chunk: usize) -> Vec<(Bytes, Value)> {
    let mut out: Vec<(Bytes, Value)> = Vec::new();
    let mut after: Option<Bytes> = None;
    loop {
        let c = ok(e.scan(range, after.as_deref(), chunk));
        assert!(c.entries.len() <= chunk, "chunk larger than limit");
        for (k, _) in &c.entries {
            assert!(range.contains(k), "scan returned key outside range");
            if let Some((prev, _)) = out.last() {
                assert!(prev < k, "scan keys not strictly ascending");
            }
            if let Some(a) = &after {
                assert!(k > a, "scan returned key not after cursor");
            }
        }
        out.extend(c.entries.iter().cloned());
        match c.next {
            Some(n) => {
                assert_eq!(c.entries.len(), chunk, "next set on a short chunk");
                assert_eq!(
                    Some(&n),
                    c.entries.last().map(|(k, _)| k),
                    "next must be the last key returned"
                );
                after = Some(n);
            }
            None => return out,
        }
    }
}

fn log_all<E: Engine + ?Sized>(e: &E) -> Vec<ChangeRecord> {
    ok(e.changes_since(e.log_start() - 1, usize::MAX))
}

fn strip_versions(entries: Vec<(Bytes, Value)>) -> Vec<(Bytes, Value)> {
    entries
        .into_iter()
        .map(|(k, mut v)| {
            v.version = 0;
            (k, v)
        })
        .collect()
}

fn digest_of(entries: &[(Bytes, Value)]) -> RangeDigest {
    let mut d = Digester::new();
    for (k, v) in entries {
        d.add(k, v);
    }
    d.finish()
}

fn prop_runner(cases: u32) -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(cases);
    TestRunner::new(PropConfig {
        cases,
        failure_persistence: None,
        ..PropConfig::default()
    })
}

fn run_prop<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let mut runner = prop_runner(cases);
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{name}: {e}");
    }
}

mod basic;
mod concurrent;
mod foreign;
mod log;
mod model;
mod props;
mod range;

pub use basic::{batch_semantics, empty_engine, invalid_input, put_get_delete, set_expiry};
pub use concurrent::{concurrent_apply, concurrent_scan_consistency};
pub use foreign::{foreign_basics, foreign_effects_logged, foreign_pending_expiry};
pub use log::{change_log, change_log_batches, log_not_kept, recent_changes_agree};
pub use props::{prop_foreign_permutation, prop_model, prop_replica_follow};
pub use range::{
    delete_range_chunk, digest_and_stats, scan_paging, scan_rev_paging, written_digests,
};
