use super::*;

#[test]
fn timeouts_parse_like_redis() {
    assert_eq!(parse_timeout(b"0"), Ok(0));
    assert_eq!(parse_timeout(b"1"), Ok(1000));
    assert_eq!(parse_timeout(b"0.5"), Ok(500));
    assert_eq!(parse_timeout(b"0.0001"), Ok(0));
    assert_eq!(parse_timeout(b"-0.0001"), Ok(0));
    let neg = Err(Frame::Error("ERR timeout is negative".into()));
    assert_eq!(parse_timeout(b"-1"), neg);
    assert_eq!(parse_timeout(b"inf"), neg);
    assert_eq!(parse_timeout(b"1e300"), neg);
    let bad = Err(Frame::Error(
        "ERR timeout is not a float or out of range".into(),
    ));
    for t in ["", "abc", " 1", "1 ", "nan", "1x"] {
        assert_eq!(parse_timeout(t.as_bytes()), bad, "{t:?}");
    }
    assert_eq!(
        parse_timeout(b"9223372036854775"),
        Ok(9_223_372_036_854_775_000)
    );
    assert_eq!(parse_timeout(b"1e20"), neg);
    assert_eq!(parse_timeout(b"1e-400"), Ok(0));
    assert_eq!(parse_timeout(b"0x10"), Ok(16_000));
}
