//! Limits: over-limit input fails with Redis's exact text, and declared
//! sizes never turn into allocations.
//!
//! This binary installs a counting global allocator (the only `unsafe` in the
//! crate, test-only) to prove that declared lengths are not pre-allocated.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::BytesMut;
use keyway_resp::{Limits, RequestParser, ResponseParser};
use proptest::prelude::*;

struct CountingAllocator;

thread_local! {
    /// Bytes requested by this thread (allocations and reallocations).
    static REQUESTED_BYTES: Cell<usize> = const { Cell::new(0) };
}

fn record(size_bytes: usize) {
    let _ = REQUESTED_BYTES.try_with(|c| c.set(c.get().saturating_add(size_bytes)));
}

// SAFETY: delegates every call to `System` unchanged; only counts sizes.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Runs `f` and returns what it returned and how many bytes it asked the
/// allocator for on this thread.
fn requested_bytes_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = REQUESTED_BYTES.with(Cell::get);
    let result = f();
    (result, REQUESTED_BYTES.with(Cell::get) - before)
}

/// Far below any declared size in these tests, above fixed overheads
/// (argument slots and aggregate element slots are capped at 1024).
const SMALL_BYTES: usize = 256 * 1024;

/// Parses all of `input` at once; returns the error text, if any.
fn request_error(limits: Limits, input: &[u8]) -> Option<String> {
    let mut parser = RequestParser::new(limits);
    let mut buf = BytesMut::from(input);
    loop {
        match parser.parse(&mut buf) {
            Ok(Some(_)) => continue,
            Ok(None) => return None,
            Err(e) => return Some(e.to_string()),
        }
    }
}

/// Feeds `input` one byte at a time; returns the error text, if any.
fn request_error_byte_by_byte(limits: Limits, input: &[u8]) -> Option<String> {
    let mut parser = RequestParser::new(limits);
    let mut buf = BytesMut::new();
    for &b in input {
        buf.extend_from_slice(&[b]);
        loop {
            match parser.parse(&mut buf) {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(e) => return Some(e.to_string()),
            }
        }
    }
    None
}

/// Counts limited to `max`, lines as long as Redis allows.
fn counts(max: usize) -> Limits {
    Limits {
        max_bulk_len_bytes: max,
        max_multibulk_len: max,
        ..Limits::default()
    }
}

fn small(max_bytes: usize) -> Limits {
    Limits {
        max_bulk_len_bytes: max_bytes,
        max_multibulk_len: max_bytes,
        max_inline_len_bytes: max_bytes,
        max_nesting_depth: 4,
    }
}

#[test]
fn default_bulk_limit_is_512_mib() {
    let at_limit = b"*1\r\n$536870912\r\n";
    assert_eq!(request_error(Limits::default(), at_limit), None);
    let over = b"*1\r\n$536870913\r\n";
    assert_eq!(
        request_error(Limits::default(), over).as_deref(),
        Some("Protocol error: invalid bulk length")
    );
}

#[test]
fn default_multibulk_limit_is_1_mi() {
    assert_eq!(request_error(Limits::default(), b"*1048576\r\n"), None);
    assert_eq!(
        request_error(Limits::default(), b"*1048577\r\n").as_deref(),
        Some("Protocol error: invalid multibulk length")
    );
}

#[test]
fn default_inline_limit_is_64_kib_even_without_newline() {
    let mut line = vec![b'a'; 64 * 1024];
    assert_eq!(request_error(Limits::default(), &line), None);
    line.push(b'a');
    assert_eq!(
        request_error(Limits::default(), &line).as_deref(),
        Some("Protocol error: too big inline request")
    );
    line.extend_from_slice(b"\r\n");
    assert_eq!(
        request_error(Limits::default(), &line).as_deref(),
        Some("Protocol error: too big inline request")
    );
}

#[test]
fn header_lines_are_limited_too() {
    let mut count = b"*".to_vec();
    count.extend(std::iter::repeat_n(b'1', 64 * 1024 + 1));
    assert_eq!(
        request_error(Limits::default(), &count).as_deref(),
        Some("Protocol error: too big mbulk count string")
    );
    let mut bulk = b"*1\r\n$".to_vec();
    bulk.extend(std::iter::repeat_n(b'1', 64 * 1024 + 1));
    assert_eq!(
        request_error(Limits::default(), &bulk).as_deref(),
        Some("Protocol error: too big bulk count string")
    );
}

#[test]
fn declared_sizes_are_not_preallocated_by_the_request_parser() {
    let (buf, requested) = requested_bytes_during(|| {
        let mut parser = RequestParser::new(Limits::default());
        let mut buf = BytesMut::from(&b"*1048576\r\n$536870912\r\nabc"[..]);
        assert_eq!(parser.parse(&mut buf), Ok(None));
        buf.extend_from_slice(b"def");
        assert_eq!(parser.parse(&mut buf), Ok(None));
        buf
    });
    assert!(requested < SMALL_BYTES, "requested {requested} bytes");
    assert!(buf.capacity() < SMALL_BYTES, "capacity {}", buf.capacity());
}

#[test]
fn declared_sizes_are_not_preallocated_by_the_reply_parser() {
    let ((), requested) = requested_bytes_during(|| {
        let mut parser = ResponseParser::new(Limits::default());
        let mut buf = BytesMut::from(&b"%1048576\r\n*1048576\r\n~1048576\r\n$536870912\r\nabc"[..]);
        assert_eq!(parser.parse(&mut buf), Ok(None));
        assert!(buf.capacity() < SMALL_BYTES);
    });
    assert!(requested < SMALL_BYTES, "requested {requested} bytes");
}

#[test]
fn reply_parser_limits() {
    let limits = small(4);
    let cases: &[(&[u8], &str)] = &[
        (b"$5\r\n", "Protocol error: invalid bulk length"),
        (b"=5\r\n", "Protocol error: invalid bulk length"),
        (b"*5\r\n", "Protocol error: invalid multibulk length"),
        (b"%5\r\n", "Protocol error: invalid multibulk length"),
        (b"+12345", "Protocol error: too big reply line"),
        (
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n",
            "Protocol error: nesting too deep",
        ),
    ];
    for (input, text) in cases {
        let mut parser = ResponseParser::new(limits.clone());
        let mut buf = BytesMut::from(*input);
        let error = parser.parse(&mut buf).unwrap_err();
        assert_eq!(
            error.to_string(),
            *text,
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}

proptest! {
    #[test]
    fn bulk_over_limit_errors(max in 1usize..10_000, over in 1usize..10_000) {
        let input = format!("*1\r\n${}\r\n", max + over);
        let error = request_error(counts(max), input.as_bytes());
        prop_assert_eq!(error.as_deref(), Some("Protocol error: invalid bulk length"));
        let at_limit = format!("*1\r\n${max}\r\n");
        prop_assert_eq!(request_error(counts(max), at_limit.as_bytes()), None);
        prop_assert_eq!(request_error_byte_by_byte(counts(max), at_limit.as_bytes()), None);
    }

    #[test]
    fn multibulk_over_limit_errors(max in 1usize..10_000, over in 1usize..10_000) {
        let input = format!("*{}\r\n", max + over);
        let error = request_error(counts(max), input.as_bytes());
        prop_assert_eq!(error.as_deref(), Some("Protocol error: invalid multibulk length"));
    }

    #[test]
    fn inline_over_limit_errors_with_or_without_newline(
        max in 1usize..2_000,
        over in 1usize..100,
        newline in any::<bool>(),
    ) {
        let mut line = vec![b'x'; max + over];
        if newline {
            line.extend_from_slice(b"\r\n");
        }
        let error = request_error(small(max), &line);
        prop_assert_eq!(error.as_deref(), Some("Protocol error: too big inline request"));
        let error = request_error_byte_by_byte(small(max), &line);
        prop_assert_eq!(error.as_deref(), Some("Protocol error: too big inline request"));
        let mut at_limit = vec![b'x'; max];
        at_limit.extend_from_slice(if newline { b"\r\n" } else { b"\n" });
        prop_assert_eq!(request_error(small(max), &at_limit), None);
        prop_assert_eq!(request_error_byte_by_byte(small(max), &at_limit), None);
    }
}
