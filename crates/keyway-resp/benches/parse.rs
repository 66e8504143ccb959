//! Micro-benchmarks: decoding a pipelined batch of requests, encoding a reply.
//!
//! Run with `cargo bench -p keyway-resp`.

use bytes::{Bytes, BytesMut};
use divan::Bencher;
use divan::counter::BytesCount;
use keyway_resp::{Frame, Limits, Protocol, RequestParser, encode, encode_command};

fn main() {
    divan::main();
}

const BATCH_LEN: usize = 100;

/// 100 pipelined `SET key:<i> <16-byte value>` multibulk requests.
fn set_batch() -> Bytes {
    let mut out = BytesMut::new();
    for i in 0..BATCH_LEN {
        let key = format!("key:{i}");
        encode_command(
            &[&b"SET"[..], key.as_bytes(), b"0123456789abcdef"],
            &mut out,
        );
    }
    out.freeze()
}

#[divan::bench]
fn parse_pipelined_100_sets(bencher: Bencher) {
    let input = set_batch();
    bencher
        .counter(BytesCount::new(input.len()))
        .with_inputs(|| BytesMut::from(&input[..]))
        .bench_local_values(|mut buf| {
            let mut parser = RequestParser::new(Limits::default());
            let mut requests = 0;
            while let Ok(Some(args)) = parser.parse(&mut buf) {
                assert_eq!(args.len(), 3);
                requests += 1;
            }
            assert_eq!(requests, BATCH_LEN);
            requests
        });
}

#[divan::bench(args = [Protocol::Resp2, Protocol::Resp3])]
fn encode_array_of_100_bulks(bencher: Bencher, proto: Protocol) {
    let frame = Frame::Array(
        (0..BATCH_LEN)
            .map(|i| Frame::bulk(format!("value:{i:08}")))
            .collect(),
    );
    let mut out = BytesMut::with_capacity(4096);
    bencher.bench_local(|| {
        out.clear();
        encode(divan::black_box(&frame), proto, &mut out);
        out.len()
    });
}
