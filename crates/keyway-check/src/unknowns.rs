//! What the search knows about unknown-outcome writes without trying
//! them: which are interchangeable ([`class_key`]), and whether a
//! completed operation may fit after a run of them
//! ([`may_fit_after_chain`]). Both may only ever say "maybe" wrongly,
//! never "no", so the search that uses them stays exact.

use crate::history::Reply;
use crate::model::{self, KeyOp, State};

/// What makes two unknown writes interchangeable (see [`class_key`]).
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) enum ClassKey<'a> {
    Op(&'a KeyOp),
    UnseenSet(usize),
    UnseenAppend(usize),
}

/// Two unknown writes with the same key are interchangeable: swapping
/// them in any linearization changes no reply. The same op trivially; and
/// a SET or an APPEND whose value no read ever shows (not even inside a
/// longer value) and that makes the state a non-integer for good, by the
/// length of its value: every GET that could see either fits neither,
/// INCR fails on both, DEL finds both, APPEND's length is the same.
pub(crate) fn class_key<'a>(op: &'a KeyOp, read_values: &str) -> ClassKey<'a> {
    // A character that is not a digit, and not a leading '-': no string
    // starting with `v` is an integer.
    let never_int = |v: &str| {
        v.char_indices()
            .any(|(i, c)| !(c.is_ascii_digit() || (i == 0 && c == '-')))
    };
    match op {
        KeyOp::Set(v) if never_int(v) && !read_values.contains(v.as_str()) => {
            ClassKey::UnseenSet(v.len())
        }
        // A character other than a digit or '-': the string it is
        // appended to is a non-integer for good.
        KeyOp::Append(v)
            if v.chars().any(|c| !c.is_ascii_digit() && c != '-')
                && !read_values.contains(v.as_str()) =>
        {
            ClassKey::UnseenAppend(v.len())
        }
        _ => ClassKey::Op(op),
    }
}

/// Whether a completed `op` that replied `reply` may fit the state `after`, or a state that
/// unknown APPENDs (if `appends`) and INCRs (if `incrs`) can make from it.
/// May say yes wrongly, never no wrongly: APPENDs only extend the string;
/// INCRs keep an integer an integer and make it larger.
pub(crate) fn may_fit_after_chain(
    after: &State,
    op: &KeyOp,
    reply: &Reply,
    appends: bool,
    incrs: bool,
) -> bool {
    if model::fits(after, op, reply) {
        return true;
    }
    if !appends && !incrs {
        return false;
    }
    let int = |s: &State| match s {
        None => Some(0),
        Some(s) => model::parse_i64(s.as_bytes()),
    };
    if appends {
        // An APPEND can turn anything into anything with it as a prefix,
        // including integers; keep it simple where it could matter.
        return match (op, reply) {
            (KeyOp::Get, Reply::Value(Some(x))) => {
                after.as_ref().is_none_or(|s| x.starts_with(s.as_str())) || incrs
            }
            (KeyOp::Get, Reply::Value(None)) => false,
            (KeyOp::Del, Reply::Int(1)) => true,
            (KeyOp::Append(v), Reply::Int(l)) => {
                incrs
                    || after.as_ref().map_or(0, String::len) + v.len()
                        <= usize::try_from(*l).unwrap_or(0)
            }
            (KeyOp::Incr, _) => true,
            _ => false,
        };
    }
    // INCR chains only: from an integer m, the states m+1, m+2, ...
    let Some(m) = int(after) else {
        // INCR of a non-integer changes nothing.
        return false;
    };
    match (op, reply) {
        (KeyOp::Get, Reply::Value(Some(x))) => {
            model::parse_i64(x.as_bytes()).is_some_and(|x| x > m)
        }
        (KeyOp::Incr, Reply::Int(n)) => *n > m.saturating_add(1),
        // Reached at i64::MAX.
        (KeyOp::Incr, Reply::Error(_)) => true,
        (KeyOp::Del, Reply::Int(1)) => true,
        (KeyOp::Append(_), Reply::Int(_)) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unseen_non_integer_values_share_a_class_by_length() {
        let reads = "ab.\0zz\0";
        let set = |v: &str| KeyOp::Set(v.into());
        let app = |v: &str| KeyOp::Append(v.into());
        assert_eq!(class_key(&set("x1."), reads), ClassKey::UnseenSet(3));
        assert_eq!(class_key(&set("y2."), reads), ClassKey::UnseenSet(3));
        // Seen (even inside a longer value), or an integer, or could become one.
        let ab = set("ab.");
        assert_eq!(class_key(&ab, reads), ClassKey::Op(&ab));
        let b = set("b.");
        assert_eq!(class_key(&b, reads), ClassKey::Op(&b));
        let n = set("-12");
        assert_eq!(class_key(&n, reads), ClassKey::Op(&n));
        assert_eq!(class_key(&set("1-2"), reads), ClassKey::UnseenSet(3));
        assert_eq!(class_key(&app("q."), reads), ClassKey::UnseenAppend(2));
        let digits = app("-5");
        assert_eq!(class_key(&digits, reads), ClassKey::Op(&digits));
    }

    #[test]
    fn a_chain_of_unknowns_can_only_grow_a_string_or_a_counter() {
        let s = |v: &str| Some(v.to_string());
        let get = |v: &str| Reply::Value(s(v));
        // APPEND chains: prefixes only.
        assert!(may_fit_after_chain(
            &s("ab"),
            &KeyOp::Get,
            &get("abcd"),
            true,
            false
        ));
        assert!(!may_fit_after_chain(
            &s("ab"),
            &KeyOp::Get,
            &get("xabcd"),
            true,
            false
        ));
        assert!(!may_fit_after_chain(
            &s("ab"),
            &KeyOp::Get,
            &Reply::Value(None),
            true,
            false
        ));
        assert!(may_fit_after_chain(
            &None,
            &KeyOp::Get,
            &get("q"),
            true,
            false
        ));
        // INCR chains: larger integers only.
        assert!(may_fit_after_chain(
            &s("3"),
            &KeyOp::Get,
            &get("5"),
            false,
            true
        ));
        assert!(!may_fit_after_chain(
            &s("3"),
            &KeyOp::Get,
            &get("2"),
            false,
            true
        ));
        assert!(may_fit_after_chain(
            &s("3"),
            &KeyOp::Incr,
            &Reply::Int(6),
            false,
            true
        ));
        assert!(!may_fit_after_chain(
            &s("3"),
            &KeyOp::Incr,
            &Reply::Int(3),
            false,
            true
        ));
        // No chains: exactly the model.
        assert!(!may_fit_after_chain(
            &s("3"),
            &KeyOp::Get,
            &get("5"),
            false,
            false
        ));
        assert!(may_fit_after_chain(
            &s("3"),
            &KeyOp::Get,
            &get("3"),
            false,
            false
        ));
    }
}
