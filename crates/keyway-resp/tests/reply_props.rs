//! Properties of the encoder and the reply parser together.

use bytes::{Bytes, BytesMut};
use keyway_resp::{Frame, Limits, Protocol, ProtocolError, ResponseParser, encode};
use proptest::collection::vec;
use proptest::prelude::*;

/// The replies decoded from a whole input, then how it ended.
type Outcome = (Vec<Frame>, Option<ProtocolError>);

/// Feeds `input` to a fresh parser in chunks cut at `cuts`, draining the
/// parser after each chunk.
fn feed(limits: &Limits, input: &[u8], cuts: &[usize]) -> Outcome {
    let mut ends: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    ends.push(input.len());
    ends.sort_unstable();
    let mut parser = ResponseParser::new(limits.clone());
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut fed = 0;
    for end in ends {
        buf.extend_from_slice(&input[fed..end]);
        fed = end;
        for _ in 0..=input.len() + 1 {
            let before = buf.len();
            match parser.parse(&mut buf) {
                Ok(Some(frame)) => {
                    assert!(buf.len() < before, "a reply consumed nothing");
                    frames.push(frame);
                }
                Ok(None) => break,
                Err(error) => {
                    assert_eq!(parser.parse(&mut buf), Err(error.clone()));
                    return (frames, Some(error));
                }
            }
        }
    }
    (frames, None)
}

/// Equality where doubles compare bitwise and every NaN equals every NaN.
fn same(a: &Frame, b: &Frame) -> bool {
    fn all_same(a: &[Frame], b: &[Frame]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
    }
    match (a, b) {
        (Frame::Double(x), Frame::Double(y)) => {
            (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits()
        }
        (Frame::Array(x), Frame::Array(y))
        | (Frame::Set(x), Frame::Set(y))
        | (Frame::Push(x), Frame::Push(y)) => all_same(x, y),
        (Frame::Map(x), Frame::Map(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((k1, v1), (k2, v2))| same(k1, k2) && same(v1, v2))
        }
        _ => a == b,
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\r', '\n'], " ")
}

/// What a RESP3 round trip yields: `NullArray` reads back as `Null`, and
/// line breaks in simple lines became spaces.
fn expected_resp3(frame: &Frame) -> Frame {
    let all = |items: &[Frame]| items.iter().map(expected_resp3).collect();
    match frame {
        Frame::Simple(s) => Frame::Simple(one_line(s)),
        Frame::Error(s) => Frame::Error(one_line(s)),
        Frame::NullArray => Frame::Null,
        Frame::Array(items) => Frame::Array(all(items)),
        Frame::Set(items) => Frame::Set(all(items)),
        Frame::Push(items) => Frame::Push(all(items)),
        Frame::Map(pairs) => Frame::Map(
            pairs
                .iter()
                .map(|(k, v)| (expected_resp3(k), expected_resp3(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// What a RESP2 round trip yields: Redis's downgrades.
fn expected_resp2(frame: &Frame) -> Frame {
    let all = |items: &[Frame]| Frame::Array(items.iter().map(expected_resp2).collect());
    match frame {
        Frame::Simple(s) => Frame::Simple(one_line(s)),
        Frame::Error(s) => Frame::Error(one_line(s)),
        Frame::Array(items) | Frame::Set(items) | Frame::Push(items) => all(items),
        Frame::Map(pairs) => Frame::Array(
            pairs
                .iter()
                .flat_map(|(k, v)| [expected_resp2(k), expected_resp2(v)])
                .collect(),
        ),
        Frame::Double(d) => Frame::bulk(keyway_resp::format_double_g17(*d)),
        Frame::Boolean(b) => Frame::Integer(i64::from(*b)),
        Frame::Verbatim { text, .. } => Frame::Bulk(text.clone()),
        Frame::BigNumber(n) => Frame::bulk(n.clone()),
        other => other.clone(),
    }
}

fn arb_leaf() -> impl Strategy<Value = Frame> {
    let text = "(?s).{0,16}";
    prop_oneof![
        text.prop_map(Frame::Simple),
        text.prop_map(Frame::Error),
        any::<i64>().prop_map(Frame::Integer),
        vec(any::<u8>(), 0..32).prop_map(|b| Frame::Bulk(Bytes::from(b))),
        Just(Frame::Null),
        Just(Frame::NullArray),
        any::<f64>().prop_map(Frame::Double),
        prop_oneof![
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(-0.0),
            Just(0.0),
            (-1e6f64..1e6).prop_map(f64::trunc)
        ]
        .prop_map(Frame::Double),
        any::<bool>().prop_map(Frame::Boolean),
        (any::<[u8; 3]>(), vec(any::<u8>(), 0..32)).prop_map(|(format, text)| {
            Frame::Verbatim {
                format,
                text: Bytes::from(text),
            }
        }),
        "[+-]?[0-9]{1,40}".prop_map(Frame::BigNumber),
    ]
}

fn arb_frame() -> impl Strategy<Value = Frame> {
    arb_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Frame::Array),
            vec((inner.clone(), inner.clone()), 0..4).prop_map(Frame::Map),
            vec(inner.clone(), 0..6).prop_map(Frame::Set),
            vec(inner, 0..6).prop_map(Frame::Push),
        ]
    })
}

fn encoded(frames: &[Frame], proto: Protocol) -> Vec<u8> {
    let mut out = BytesMut::new();
    for frame in frames {
        encode(frame, proto, &mut out);
    }
    out.to_vec()
}

fn assert_all_same(got: &[Frame], expected: &[Frame]) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(expected) {
        prop_assert!(same(g, e), "got {:?}\nexpected {:?}", g, e);
    }
    Ok(())
}

/// Byte soup biased towards RESP reply syntax.
fn arb_resp_like_bytes() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        prop::sample::select(b"+-:$*_,#!=(%~|>".to_vec()).prop_map(|b| vec![b]),
        Just(b"\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"t".to_vec()),
        Just(b"txt:".to_vec()),
        (0u32..12).prop_map(|n| n.to_string().into_bytes()),
        vec(any::<u8>(), 1..5),
    ];
    vec(token, 0..48).prop_map(|tokens| tokens.concat())
}

proptest! {
    #[test]
    fn resp3_round_trips(frames in vec(arb_frame(), 1..4), cuts in vec(any::<usize>(), 0..8)) {
        let input = encoded(&frames, Protocol::Resp3);
        let expected: Vec<Frame> = frames.iter().map(expected_resp3).collect();
        let (whole, error) = feed(&Limits::default(), &input, &[]);
        prop_assert_eq!(error, None);
        assert_all_same(&whole, &expected)?;
        let (split, error) = feed(&Limits::default(), &input, &cuts);
        prop_assert_eq!(error, None);
        assert_all_same(&split, &expected)?;
    }

    #[test]
    fn resp2_round_trips_as_downgrades(frames in vec(arb_frame(), 1..4), cuts in vec(any::<usize>(), 0..8)) {
        let input = encoded(&frames, Protocol::Resp2);
        let expected: Vec<Frame> = frames.iter().map(expected_resp2).collect();
        let (split, error) = feed(&Limits::default(), &input, &cuts);
        prop_assert_eq!(error, None);
        assert_all_same(&split, &expected)?;
    }

    #[test]
    fn resp3_doubles_round_trip_bitwise(d in any::<f64>()) {
        let input = encoded(&[Frame::Double(d)], Protocol::Resp3);
        let (frames, error) = feed(&Limits::default(), &input, &[]);
        prop_assert_eq!(error, None);
        assert_all_same(&frames, &[Frame::Double(d)])?;
    }

    #[test]
    fn random_bytes_never_panic_or_stall(input in vec(any::<u8>(), 0..512)) {
        feed(&Limits::default(), &input, &[]);
    }

    #[test]
    fn outcome_is_independent_of_splits(
        input in arb_resp_like_bytes(),
        cuts in vec(any::<usize>(), 0..10),
        tight in any::<bool>(),
    ) {
        let limits = if tight {
            Limits {
                max_bulk_len_bytes: 6,
                max_multibulk_len: 3,
                max_inline_len_bytes: 5,
                max_nesting_depth: 2,
            }
        } else {
            Limits::default()
        };
        let (whole_frames, whole_end) = feed(&limits, &input, &[]);
        let (split_frames, split_end) = feed(&limits, &input, &cuts);
        prop_assert_eq!(whole_end, split_end);
        assert_all_same(&split_frames, &whole_frames)?;
    }
}
