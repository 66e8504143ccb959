//! Feeds arbitrary bytes to `ResponseParser`, whole and in chunks.
//!
//! Checks: no panic; every call consumes, asks for more, or fails for good;
//! the outcome does not depend on how the input was split.
//! Input: byte 0 picks the limits (bit 0) and the chunk size (bits 1..8);
//! the rest is the stream.

#![no_main]

use bytes::BytesMut;
use keyway_resp::{Limits, ResponseParser};
use libfuzzer_sys::fuzz_target;

/// Debug text of the replies and the final error, so NaN doubles compare
/// equal.
fn run(limits: &Limits, stream: &[u8], chunk_len_bytes: usize) -> String {
    assert!(chunk_len_bytes > 0);
    let mut parser = ResponseParser::new(limits.clone());
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for chunk in stream.chunks(chunk_len_bytes) {
        buf.extend_from_slice(chunk);
        for _ in 0..=stream.len() + 1 {
            let before = buf.len();
            match parser.parse(&mut buf) {
                Ok(Some(frame)) => {
                    assert!(buf.len() < before);
                    frames.push(frame);
                }
                Ok(None) => break,
                Err(error) => {
                    assert_eq!(parser.parse(&mut buf), Err(error.clone()));
                    return format!("{frames:?} {error:?}");
                }
            }
        }
    }
    format!("{frames:?}")
}

fuzz_target!(|data: &[u8]| {
    let Some((&config, stream)) = data.split_first() else {
        return;
    };
    let limits = if config & 1 == 1 {
        Limits {
            max_bulk_len_bytes: 16,
            max_multibulk_len: 8,
            max_inline_len_bytes: 12,
            max_nesting_depth: 4,
        }
    } else {
        Limits::default()
    };
    let chunk_len_bytes = usize::from(config >> 1) + 1;
    let whole = run(&limits, stream, stream.len().max(1));
    let split = run(&limits, stream, chunk_len_bytes);
    assert_eq!(whole, split);
});
