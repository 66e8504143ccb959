//! Micro-benchmarks of the storage engines: single-put apply, apply + sync
//! (one fsync per write, the worst case of group commit) and point get.
//!
//! Run with `cargo bench -p keyway-storage`.

use bytes::Bytes;
use divan::Bencher;
use keyway_storage::{Engine, FjallEngine, FjallOptions, MemEngine, Mutation, ValueKind};

fn main() {
    divan::main();
}

fn key(i: u64) -> Bytes {
    let mut k = Vec::with_capacity(14);
    k.extend_from_slice(&1u32.to_be_bytes());
    k.extend_from_slice(&((i % 16384) as u16).to_be_bytes());
    k.extend_from_slice(&i.to_be_bytes());
    Bytes::from(k)
}

fn put(i: u64) -> Mutation {
    Mutation::Put {
        key: key(i),
        kind: ValueKind::String,
        expire_at_ms: None,
        data: Bytes::from_static(&[0x5a; 100]),
    }
}

fn fjall() -> FjallEngine {
    FjallEngine::open_temporary(FjallOptions {
        temporary: true,
        ..FjallOptions::default()
    })
    .expect("open fjall")
}

fn bench_apply<E: Engine>(bencher: Bencher, e: E) {
    let mut i = 0u64;
    bencher.bench_local(|| {
        i += 1;
        e.apply(&[put(i)]).expect("apply")
    });
}

fn bench_get<E: Engine>(bencher: Bencher, e: E) {
    const N: u64 = 10_000;
    let muts: Vec<_> = (0..N).map(put).collect();
    for chunk in muts.chunks(1000) {
        e.apply(chunk).expect("apply");
    }
    let mut i = 0u64;
    bencher.bench_local(|| {
        i = (i + 7919) % N;
        e.get(&key(i)).expect("get")
    });
}

#[divan::bench]
fn apply_put_mem(bencher: Bencher) {
    bench_apply(bencher, MemEngine::new());
}

#[divan::bench]
fn apply_put_fjall(bencher: Bencher) {
    bench_apply(bencher, fjall());
}

#[divan::bench(sample_count = 20, sample_size = 10)]
fn apply_sync_fjall(bencher: Bencher) {
    let e = fjall();
    let mut i = 0u64;
    bencher.bench_local(|| {
        i += 1;
        e.apply(&[put(i)]).expect("apply");
        e.sync().expect("sync");
    });
}

#[divan::bench]
fn get_mem(bencher: Bencher) {
    bench_get(bencher, MemEngine::new());
}

#[divan::bench]
fn get_fjall(bencher: Bencher) {
    bench_get(bencher, fjall());
}
