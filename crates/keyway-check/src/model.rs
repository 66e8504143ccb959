//! The sequential model of one key: a register of bytes (held as a
//! `String`) with Redis's string semantics.
//!
//! The state is `Option<String>`: `None` when the key does not exist. A
//! history starts on an empty store, so every key starts at `None`.
//!
//! | op | reply | new state |
//! |---|---|---|
//! | `SET v` | `+OK` | `Some(v)` |
//! | `GET` | the state (bulk or nil) | unchanged |
//! | `DEL` | `1` if the key existed, else `0` | `None` |
//! | `INCR` | `n + 1`, where `n` is the state read as a strict i64 (absent = 0) | `Some((n + 1).to_string())` |
//! | `INCR` of a non-integer, or at `i64::MAX` | an error | unchanged |
//! | `APPEND v` | the new length in bytes | `Some(old ++ v)` |
//!
//! The integer rule is Redis's `string2ll` (the one `keyway-node` uses):
//! base 10, an optional leading `-`, no `+`, no spaces, no leading zeros
//! (`"0"` itself is fine, `"-0"` is not), and the value fits in i64.
//!
//! The model is deterministic: [`step`] returns the one reply the store
//! must have given. Only the *kind* of an error is predicted, never its
//! text: [`matches`] accepts any observed [`Reply::Error`] where the model
//! expects one.

use crate::history::Reply;

/// The state of one key.
pub type State = Option<String>;

/// One operation on one key: a whole-history [`crate::Op`] projected on a
/// key (see [`crate::project`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyOp {
    Set(String),
    Get,
    Del,
    Incr,
    Append(String),
}

impl KeyOp {
    /// True if the operation can change the state.
    pub fn is_write(&self) -> bool {
        !matches!(self, KeyOp::Get)
    }

    /// A short name for reports: `SET`, `GET`, ...
    pub fn name(&self) -> &'static str {
        match self {
            KeyOp::Set(_) => "SET",
            KeyOp::Get => "GET",
            KeyOp::Del => "DEL",
            KeyOp::Incr => "INCR",
            KeyOp::Append(_) => "APPEND",
        }
    }
}

impl std::fmt::Display for KeyOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyOp::Set(v) => write!(f, "SET {v:?}"),
            KeyOp::Append(v) => write!(f, "APPEND {v:?}"),
            other => f.write_str(other.name()),
        }
    }
}

/// The error text the model uses for INCR of a non-integer; observed
/// errors match it whatever their text.
pub const INCR_ERROR: &str = "ERR value is not an integer or out of range";

/// Runs `op` on `state`: the new state and the reply the store must give.
pub fn step(state: &State, op: &KeyOp) -> (State, Reply) {
    match op {
        KeyOp::Set(v) => (Some(v.clone()), Reply::Ok),
        KeyOp::Get => (state.clone(), Reply::Value(state.clone())),
        KeyOp::Del => (None, Reply::Int(i64::from(state.is_some()))),
        KeyOp::Incr => {
            let current = match state {
                None => Some(0),
                Some(s) => parse_i64(s.as_bytes()),
            };
            match current.and_then(|n| n.checked_add(1)) {
                Some(n) => (Some(n.to_string()), Reply::Int(n)),
                None => (state.clone(), Reply::Error(INCR_ERROR.to_string())),
            }
        }
        KeyOp::Append(v) => {
            let mut s = state.clone().unwrap_or_default();
            s.push_str(v);
            let len = i64::try_from(s.len()).expect("a value longer than i64::MAX bytes");
            (Some(s), Reply::Int(len))
        }
    }
}

/// True if `op` run on `state` replies `observed` ([`step`] then
/// [`matches`], without building the new state).
pub fn fits(state: &State, op: &KeyOp, observed: &Reply) -> bool {
    match (op, observed) {
        (KeyOp::Set(_), r) => *r == Reply::Ok,
        (KeyOp::Get, Reply::Value(v)) => v == state,
        (KeyOp::Get, _) => false,
        (KeyOp::Del, r) => *r == Reply::Int(i64::from(state.is_some())),
        (KeyOp::Append(v), r) => {
            let len = state.as_ref().map_or(0, String::len) + v.len();
            i64::try_from(len).is_ok_and(|len| *r == Reply::Int(len))
        }
        (KeyOp::Incr, r) => matches(&step(state, op).1, r),
    }
}

/// True if `op` with reply `observed` leaves unchanged every state it
/// fits: GET; DEL that found nothing (`0`); INCR that failed. (A SET of
/// the value already there, or an APPEND of `""`, changes nothing only in
/// some of the states they fit.)
pub fn preserves_state(op: &KeyOp, observed: &Reply) -> bool {
    matches!(
        (op, observed),
        (KeyOp::Get, _) | (KeyOp::Del, Reply::Int(0)) | (KeyOp::Incr, Reply::Error(_))
    )
}

/// True if `observed` is what the model `expected`: equal, or both errors
/// (the model predicts that an error happens, not its text).
pub fn matches(expected: &Reply, observed: &Reply) -> bool {
    match (expected, observed) {
        (Reply::Error(_), Reply::Error(_)) => true,
        (e, o) => e == o,
    }
}

/// Redis's `string2ll`: a strict base-10 i64 (no `+`, no leading zeros,
/// no spaces, at most 20 bytes).
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    if s == b"0" {
        return Some(0);
    }
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if !matches!(digits.first(), Some(b'1'..=b'9')) {
        return None;
    }
    let mut v: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if neg {
        if v > i64::MAX as u64 + 1 {
            None
        } else {
            Some((v as i64).wrapping_neg())
        }
    } else {
        i64::try_from(v).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> State {
        Some(v.to_string())
    }

    #[test]
    fn set_get_del() {
        let (st, r) = step(&None, &KeyOp::Set("a".into()));
        assert_eq!((st.clone(), r), (s("a"), Reply::Ok));
        assert_eq!(step(&st, &KeyOp::Get), (s("a"), Reply::Value(s("a"))));
        assert_eq!(step(&st, &KeyOp::Del), (None, Reply::Int(1)));
        assert_eq!(step(&None, &KeyOp::Del), (None, Reply::Int(0)));
        assert_eq!(step(&None, &KeyOp::Get), (None, Reply::Value(None)));
    }

    #[test]
    fn incr_follows_redis_integer_rules() {
        assert_eq!(step(&None, &KeyOp::Incr), (s("1"), Reply::Int(1)));
        assert_eq!(step(&s("41"), &KeyOp::Incr), (s("42"), Reply::Int(42)));
        assert_eq!(step(&s("-1"), &KeyOp::Incr), (s("0"), Reply::Int(0)));
        assert_eq!(step(&s("0"), &KeyOp::Incr), (s("1"), Reply::Int(1)));
        for bad in [
            "x",
            "",
            " 1",
            "1 ",
            "+1",
            "01",
            "-0",
            "1.5",
            "-",
            "99999999999999999999",
        ] {
            let (st, r) = step(&s(bad), &KeyOp::Incr);
            assert_eq!(st, s(bad), "{bad:?} must not change");
            assert!(matches!(r, Reply::Error(_)), "{bad:?} must be an error");
        }
        let max = i64::MAX.to_string();
        let (st, r) = step(&s(&max), &KeyOp::Incr);
        assert_eq!(st, s(&max));
        assert!(matches!(r, Reply::Error(_)));
        let min = i64::MIN.to_string();
        assert_eq!(step(&s(&min), &KeyOp::Incr).1, Reply::Int(i64::MIN + 1));
    }

    #[test]
    fn append_returns_the_new_length_in_bytes() {
        let (st, r) = step(&None, &KeyOp::Append("ab".into()));
        assert_eq!((st.clone(), r), (s("ab"), Reply::Int(2)));
        let (st, r) = step(&st, &KeyOp::Append("é".into()));
        assert_eq!((st, r), (s("abé"), Reply::Int(4)));
    }

    #[test]
    fn fits_agrees_with_step_and_matches() {
        let states = [None, s(""), s("7"), s("x"), s(&i64::MAX.to_string())];
        let ops = [
            KeyOp::Set("a".into()),
            KeyOp::Get,
            KeyOp::Del,
            KeyOp::Incr,
            KeyOp::Append("bc".into()),
        ];
        let replies = [
            Reply::Ok,
            Reply::Int(0),
            Reply::Int(1),
            Reply::Int(2),
            Reply::Int(3),
            Reply::Int(8),
            Reply::Value(None),
            Reply::Value(s("7")),
            Reply::Value(s("")),
            Reply::Error("e".into()),
        ];
        for st in &states {
            for op in &ops {
                for r in &replies {
                    assert_eq!(
                        fits(st, op, r),
                        matches(&step(st, op).1, r),
                        "{st:?} {op} {r:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn preserves_state_means_no_change_wherever_it_fits() {
        let states = [None, s(""), s("7"), s("x")];
        let ops = [
            KeyOp::Set("x".into()),
            KeyOp::Get,
            KeyOp::Del,
            KeyOp::Incr,
            KeyOp::Append("".into()),
        ];
        let replies = [
            Reply::Ok,
            Reply::Int(0),
            Reply::Int(1),
            Reply::Int(8),
            Reply::Value(s("x")),
            Reply::Error("e".into()),
        ];
        for op in &ops {
            for r in &replies {
                if preserves_state(op, r) {
                    for st in states.iter().filter(|st| fits(st, op, r)) {
                        assert_eq!(&step(st, op).0, st, "{op} {r:?} on {st:?}");
                    }
                }
            }
        }
        assert!(!preserves_state(&KeyOp::Set("x".into()), &Reply::Ok));
        assert!(!preserves_state(&KeyOp::Append("".into()), &Reply::Int(0)));
    }

    #[test]
    fn any_error_text_matches_an_expected_error() {
        let e = Reply::Error(INCR_ERROR.into());
        assert!(matches(&e, &Reply::Error("ERR something else".into())));
        assert!(!matches(&e, &Reply::Int(1)));
        assert!(!matches(&Reply::Int(1), &Reply::Error("x".into())));
        assert!(matches(&Reply::Int(3), &Reply::Int(3)));
        assert!(!matches(&Reply::Value(None), &Reply::Value(s(""))));
    }
}
