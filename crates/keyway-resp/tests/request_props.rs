//! Properties of the request decoder.

use bytes::{Bytes, BytesMut};
use keyway_resp::{Limits, ProtocolError, RequestParser, encode_command};
use proptest::collection::vec;
use proptest::prelude::*;

/// What feeding a whole input produced: the requests, then how it ended
/// (`None`: waiting for more bytes).
type Outcome = (Vec<Vec<Bytes>>, Option<ProtocolError>);

/// Feeds `input` to a fresh parser in chunks cut at `cuts` (positions taken
/// modulo the input length), draining the parser after each chunk.
fn feed(limits: &Limits, input: &[u8], cuts: &[usize]) -> Outcome {
    let mut ends: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    ends.push(input.len());
    ends.sort_unstable();
    let mut parser = RequestParser::new(limits.clone());
    let mut buf = BytesMut::new();
    let mut requests = Vec::new();
    let mut fed = 0;
    for end in ends {
        buf.extend_from_slice(&input[fed..end]);
        fed = end;
        // Every successful call consumes at least one byte, so this loop
        // runs at most len + 1 times.
        for _ in 0..=input.len() + 1 {
            let before = buf.len();
            match parser.parse(&mut buf) {
                Ok(Some(args)) => {
                    assert!(!args.is_empty(), "empty requests are skipped");
                    assert!(buf.len() < before, "a request consumed nothing");
                    requests.push(args);
                }
                Ok(None) => break,
                Err(error) => {
                    // Failure is final.
                    assert_eq!(parser.parse(&mut buf), Err(error.clone()));
                    return (requests, Some(error));
                }
            }
        }
    }
    (requests, None)
}

fn multibulk(commands: &[Vec<Vec<u8>>]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for args in commands {
        encode_command(args, &mut out);
    }
    out.to_vec()
}

fn as_bytes(commands: &[Vec<Vec<u8>>]) -> Vec<Vec<Bytes>> {
    commands
        .iter()
        .map(|args| args.iter().map(|a| Bytes::copy_from_slice(a)).collect())
        .collect()
}

fn arb_command() -> impl Strategy<Value = Vec<Vec<u8>>> {
    vec(vec(any::<u8>(), 0..48), 1..8)
}

/// Byte soup biased towards RESP syntax, so the decoder gets deep into
/// multibulk and inline states rather than failing on the first byte.
fn arb_resp_like_bytes() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"*".to_vec()),
        Just(b"$".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\n".to_vec()),
        Just(b" ".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"'".to_vec()),
        Just(b"\\".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"0".to_vec()),
        (0u32..20).prop_map(|n| n.to_string().into_bytes()),
        vec(any::<u8>(), 1..6),
        "[a-z]{1,5}".prop_map(String::into_bytes),
    ];
    vec(token, 0..40).prop_map(|tokens| tokens.concat())
}

/// Quotes `arg` for an inline line: `"..."` with every byte as `\xHH`, or as
/// a plain word when it is one.
fn quote_inline(arg: &[u8], plain_when_possible: bool) -> String {
    let plain = !arg.is_empty()
        && arg
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_:.".contains(b));
    if plain && plain_when_possible {
        return String::from_utf8(arg.to_vec()).unwrap();
    }
    let mut quoted = String::from("\"");
    for b in arg {
        quoted.push_str(&format!("\\x{b:02x}"));
    }
    quoted.push('"');
    quoted
}

proptest! {
    #[test]
    fn multibulk_round_trips(commands in vec(arb_command(), 1..6)) {
        let input = multibulk(&commands);
        let (requests, error) = feed(&Limits::default(), &input, &[]);
        prop_assert_eq!(error, None);
        prop_assert_eq!(requests, as_bytes(&commands));
    }

    #[test]
    fn multibulk_round_trips_across_any_split(
        commands in vec(arb_command(), 1..6),
        cuts in vec(any::<usize>(), 0..12),
    ) {
        let input = multibulk(&commands);
        let (requests, error) = feed(&Limits::default(), &input, &cuts);
        prop_assert_eq!(error, None);
        prop_assert_eq!(requests, as_bytes(&commands));
    }

    #[test]
    fn multibulk_round_trips_byte_by_byte(command in arb_command()) {
        let input = multibulk(std::slice::from_ref(&command));
        let cuts: Vec<usize> = (0..input.len()).collect();
        let (requests, error) = feed(&Limits::default(), &input, &cuts);
        prop_assert_eq!(error, None);
        prop_assert_eq!(requests, as_bytes(&[command]));
    }

    #[test]
    fn inline_round_trips(
        command in vec(vec(any::<u8>(), 0..16), 1..6),
        plain in any::<bool>(),
        separator in prop_oneof![Just(" "), Just("  "), Just("\t")],
        terminator in prop_oneof![Just("\r\n"), Just("\n")],
        cuts in vec(any::<usize>(), 0..4),
    ) {
        let words: Vec<String> = command.iter().map(|a| quote_inline(a, plain)).collect();
        let line = format!("{}{terminator}", words.join(separator));
        let (requests, error) = feed(&Limits::default(), line.as_bytes(), &cuts);
        prop_assert_eq!(error, None);
        prop_assert_eq!(requests, as_bytes(&[command]));
    }

    #[test]
    fn random_bytes_never_panic_or_stall(input in vec(any::<u8>(), 0..512)) {
        feed(&Limits::default(), &input, &[]);
    }

    /// The outcome never depends on how the input was split into reads,
    /// even for garbage and even with tight limits.
    #[test]
    fn outcome_is_independent_of_splits(
        input in arb_resp_like_bytes(),
        cuts in vec(any::<usize>(), 0..10),
        tight in any::<bool>(),
    ) {
        let limits = if tight {
            Limits {
                max_bulk_len_bytes: 8,
                max_multibulk_len: 4,
                max_inline_len_bytes: 6,
                max_nesting_depth: 2,
            }
        } else {
            Limits::default()
        };
        let whole = feed(&limits, &input, &[]);
        let split = feed(&limits, &input, &cuts);
        prop_assert_eq!(whole, split);
    }
}

#[test]
fn redis_protocol_test_suite_cases() {
    // Adapted from Redis's tests/unit/protocol.tcl, plus the 1 Mi multibulk limit.
    let cases: &[(&[u8], &str)] = &[
        (b"*20000000\r\n", "Protocol error: invalid multibulk length"),
        (
            b"*3000000000\r\n",
            "Protocol error: invalid multibulk length",
        ),
        (
            b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n",
            "Protocol error: expected '$', got 'f'",
        ),
        (
            b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$-10\r\n",
            "Protocol error: invalid bulk length",
        ),
        (
            b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$2000000000\r\n",
            "Protocol error: invalid bulk length",
        ),
        (
            b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$blabla\r\n",
            "Protocol error: invalid bulk length",
        ),
        (b"*1\r\nfoo\r\n", "Protocol error: expected '$', got 'f'"),
        (
            b"set \"\"\"test-key\"\"\" test-value\r\nping\r\n",
            "Protocol error: unbalanced quotes in request",
        ),
    ];
    for (input, text) in cases {
        let (_, error) = feed(&Limits::default(), input, &[]);
        assert_eq!(
            error.map(|e| e.to_string()).as_deref(),
            Some(*text),
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}
