//! Tests of the string commands (kept apart from `string.rs` for size),
//! including the model-based proptest of SET/APPEND/INCRBY/DEL/GETRANGE.

use super::super::testing::*;
use crate::db::Db;
use bytes::Bytes;
use keyway_resp::Frame;
use keyway_storage::Engine;

#[test]
fn get_set_basics() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["get", "k"]), Frame::Null);
    assert_eq!(t.run(&["set", "k", "v"]), ok());
    assert_eq!(t.run(&["get", "k"]), bulk("v"));
    assert_eq!(t.run(&["set", "k", ""]), ok());
    assert_eq!(t.run(&["get", "k"]), bulk(""));
    assert_eq!(
        t.run(&["get", "k", "x"]),
        err("ERR wrong number of arguments for 'get' command")
    );
    assert_eq!(
        t.run(&["set", "k"]),
        err("ERR wrong number of arguments for 'set' command")
    );
}

#[test]
fn set_nx_xx_get() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["set", "k", "1", "xx"]), Frame::Null);
    assert_eq!(t.run(&["set", "k", "1", "nx"]), ok());
    assert_eq!(t.run(&["set", "k", "2", "NX"]), Frame::Null);
    assert_eq!(t.run(&["set", "k", "3", "xx"]), ok());
    assert_eq!(t.run(&["set", "k", "4", "get"]), bulk("3"));
    assert_eq!(t.run(&["set", "k", "5", "nx", "get"]), bulk("4"));
    assert_eq!(t.run(&["get", "k"]), bulk("4"));
    assert_eq!(t.run(&["set", "new", "1", "xx", "get"]), Frame::Null);
    assert_eq!(t.run(&["get", "new"]), Frame::Null);
    assert_eq!(t.run(&["set", "new2", "1", "get"]), Frame::Null);
    assert_eq!(t.run(&["set", "k", "6", "nx", "nx"]), Frame::Null);
}

#[test]
fn set_option_validation() {
    let mut t = TestDb::new();
    let syntax = err("ERR syntax error");
    for bad in [
        &["set", "k", "v", "nx", "xx"][..],
        &["set", "k", "v", "xx", "nx"],
        &["set", "k", "v", "ex"],
        &["set", "k", "v", "ex", "10", "px", "100"],
        &["set", "k", "v", "keepttl", "ex", "10"],
        &["set", "k", "v", "px", "10", "keepttl"],
        &["set", "k", "v", "persist"],
        &["set", "k", "v", "foo"],
        &["set", "k", "v", "exat", "1", "pxat", "1"],
    ] {
        assert_eq!(t.run(bad), syntax, "{bad:?}");
    }
    assert_eq!(
        t.run(&["set", "k", "v", "ex", "0"]),
        err("ERR invalid expire time in 'set' command")
    );
    assert_eq!(
        t.run(&["set", "k", "v", "px", "-5"]),
        err("ERR invalid expire time in 'set' command")
    );
    assert_eq!(
        t.run(&["set", "k", "v", "ex", "9223372036854776"]),
        err("ERR invalid expire time in 'set' command")
    );
    assert_eq!(
        t.run(&["set", "k", "v", "px", "9223372036854775807"]),
        err("ERR invalid expire time in 'set' command")
    );
    assert_eq!(
        t.run(&["set", "k", "v", "ex", "1.5"]),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(t.run(&["get", "k"]), Frame::Null, "no error wrote anything");
    // Repeating the same expire option is allowed; the last value wins.
    assert_eq!(t.run(&["set", "k", "v", "ex", "10", "ex", "20"]), ok());
    assert_eq!(t.run(&["ttl", "k"]), int(20));
}

#[test]
fn set_expiry_options() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["set", "k", "v", "ex", "10"]), ok());
    assert_eq!(t.run(&["pttl", "k"]), int(10_000));
    assert_eq!(t.run(&["set", "k", "v", "px", "1500"]), ok());
    assert_eq!(t.run(&["pttl", "k"]), int(1500));
    let exat = (T0 / 1000 + 60).to_string();
    assert_eq!(t.run(&["set", "k", "v", "exat", &exat]), ok());
    assert_eq!(
        t.stored("k").unwrap().expire_at_ms,
        Some((T0 / 1000 + 60) * 1000)
    );
    let pxat = (T0 + 777).to_string();
    assert_eq!(
        t.run(&["set", "k", "v2", "pxat", &pxat, "keepttl"]),
        err("ERR syntax error")
    );
    assert_eq!(t.run(&["set", "k", "v2", "pxat", &pxat]), ok());
    assert_eq!(t.run(&["set", "k", "v3", "keepttl"]), ok());
    assert_eq!(t.run(&["pttl", "k"]), int(777));
    assert_eq!(t.run(&["get", "k"]), bulk("v3"));
    assert_eq!(t.run(&["set", "k", "v4"]), ok());
    assert_eq!(t.run(&["pttl", "k"]), int(-1), "plain SET drops the TTL");
    // An absolute time already passed: OK, and the key is gone.
    assert_eq!(t.run(&["set", "k", "v5", "pxat", "1", "get"]), bulk("v4"));
    assert_eq!(t.run(&["get", "k"]), Frame::Null);
    assert!(t.stored("k").is_none());
}

#[test]
fn setnx_setex_psetex_getset_getdel() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["setnx", "k", "1"]), int(1));
    assert_eq!(t.run(&["setnx", "k", "2"]), int(0));
    assert_eq!(t.run(&["setex", "k", "10", "3"]), ok());
    assert_eq!(t.run(&["ttl", "k"]), int(10));
    assert_eq!(t.run(&["psetex", "k", "2500", "4"]), ok());
    assert_eq!(t.run(&["pttl", "k"]), int(2500));
    assert_eq!(
        t.run(&["setex", "k", "0", "x"]),
        err("ERR invalid expire time in 'setex' command")
    );
    assert_eq!(
        t.run(&["psetex", "k", "-1", "x"]),
        err("ERR invalid expire time in 'psetex' command")
    );
    assert_eq!(
        t.run(&["setex", "k", "x", "x"]),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(t.run(&["getset", "k", "5"]), bulk("4"));
    assert_eq!(t.run(&["pttl", "k"]), int(-1), "GETSET drops the TTL");
    assert_eq!(t.run(&["getset", "new", "1"]), Frame::Null);
    assert_eq!(t.run(&["getdel", "k"]), bulk("5"));
    assert_eq!(t.run(&["getdel", "k"]), Frame::Null);
    assert!(t.stored("k").is_none());
}

#[test]
fn getex_options() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["getex", "k"]), Frame::Null);
    assert_eq!(
        t.run(&["getex", "k", "ex", "0"]),
        Frame::Null,
        "no key: nil before validating the time"
    );
    t.run(&["set", "k", "v"]);
    assert_eq!(
        t.run(&["getex", "k", "ex", "0"]),
        err("ERR invalid expire time in 'getex' command")
    );
    assert_eq!(t.run(&["getex", "k", "ex", "100"]), bulk("v"));
    assert_eq!(t.run(&["ttl", "k"]), int(100));
    assert_eq!(t.run(&["getex", "k", "px", "100"]), bulk("v"));
    assert_eq!(t.run(&["pttl", "k"]), int(100));
    assert_eq!(t.run(&["getex", "k", "persist"]), bulk("v"));
    assert_eq!(t.run(&["pttl", "k"]), int(-1));
    let exat = (T0 / 1000 + 5).to_string();
    assert_eq!(t.run(&["getex", "k", "exat", &exat]), bulk("v"));
    assert_eq!(
        t.run(&["pexpiretime", "k"]),
        int(((T0 / 1000 + 5) * 1000) as i64)
    );
    assert_eq!(t.run(&["getex", "k"]), bulk("v"));
    assert_eq!(t.run(&["ttl", "k"]), int(5), "plain GETEX keeps the TTL");
    for bad in [
        &["getex", "k", "nx"][..],
        &["getex", "k", "get"],
        &["getex", "k", "keepttl"],
        &["getex", "k", "persist", "ex", "1"],
        &["getex", "k", "ex", "1", "persist"],
        &["getex", "k", "ex"],
    ] {
        assert_eq!(t.run(bad), err("ERR syntax error"), "{bad:?}");
    }
    assert_eq!(t.run(&["getex", "k", "pxat", "1"]), bulk("v"));
    assert_eq!(
        t.run(&["exists", "k"]),
        int(0),
        "an absolute time in the past deletes"
    );
}

#[test]
fn mget_mset_msetnx() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["mset", "a", "1", "b", "2"]), ok());
    assert_eq!(
        t.run(&["mget", "a", "nope", "b"]),
        Frame::Array(vec![bulk("1"), Frame::Null, bulk("2")])
    );
    assert_eq!(
        t.run(&["mset", "a", "1", "b"]),
        err("ERR wrong number of arguments for 'mset' command")
    );
    assert_eq!(
        t.run(&["msetnx", "a"]),
        err("ERR wrong number of arguments for 'msetnx' command")
    );
    assert_eq!(t.run(&["msetnx", "c", "3", "a", "9"]), int(0));
    assert_eq!(
        t.run(&["get", "c"]),
        Frame::Null,
        "MSETNX is all-or-nothing"
    );
    assert_eq!(t.run(&["get", "a"]), bulk("1"));
    assert_eq!(t.run(&["msetnx", "c", "3", "d", "4", "c", "5"]), int(1));
    assert_eq!(
        t.run(&["mget", "c", "d"]),
        Frame::Array(vec![bulk("5"), bulk("4")])
    );
    t.run(&["set", "e", "x", "px", "10"]);
    assert_eq!(t.run(&["mset", "e", "y"]), ok());
    assert_eq!(t.run(&["pttl", "e"]), int(-1), "MSET drops the TTL");
}

#[test]
fn msetnx_treats_expired_keys_as_absent() {
    let mut t = TestDb::new();
    t.run(&["set", "a", "old", "px", "5"]);
    t.advance(5);
    assert_eq!(t.run(&["msetnx", "a", "1", "b", "2"]), int(1));
    assert_eq!(
        t.run(&["mget", "a", "b"]),
        Frame::Array(vec![bulk("1"), bulk("2")])
    );
}

#[test]
fn append_and_strlen() {
    let mut t = TestDb::new();
    assert_eq!(t.run(&["strlen", "k"]), int(0));
    assert_eq!(t.run(&["append", "k", "Hello"]), int(5));
    assert_eq!(t.run(&["append", "k", " World"]), int(11));
    assert_eq!(t.run(&["get", "k"]), bulk("Hello World"));
    assert_eq!(t.run(&["strlen", "k"]), int(11));
    t.run(&["pexpire", "k", "1000"]);
    t.run(&["append", "k", "!"]);
    assert_eq!(t.run(&["pttl", "k"]), int(1000), "APPEND keeps the TTL");
}

#[test]
fn size_limits() {
    let mut t = TestDb::new();
    t.limits.max_value_bytes = 10;
    let too_big = err("ERR string exceeds maximum allowed size (proto-max-bulk-len)");
    assert_eq!(t.run(&["append", "k", "12345"]), int(5));
    assert_eq!(t.run(&["append", "k", "67890"]), int(10));
    assert_eq!(t.run(&["append", "k", "x"]), too_big);
    assert_eq!(t.run(&["setrange", "k", "10", "x"]), too_big);
    assert_eq!(t.run(&["setrange", "k", "9", "x"]), int(10));
    assert_eq!(t.run(&["setrange", "n", "8", "abc"]), too_big);
    assert_eq!(
        t.run(&["setrange", "n", "9223372036854775807", "abc"]),
        too_big
    );
    assert_eq!(t.run(&["get", "n"]), Frame::Null);
    assert_eq!(t.run(&["get", "k"]), bulk("123456789x"));
}

#[test]
fn getrange_like_redis() {
    let mut t = TestDb::new();
    t.run(&["set", "k", "This is a string"]);
    let r = |t: &mut TestDb, s: &str, e: &str| t.run(&["getrange", "k", s, e]);
    assert_eq!(r(&mut t, "0", "3"), bulk("This"));
    assert_eq!(r(&mut t, "-3", "-1"), bulk("ing"));
    assert_eq!(r(&mut t, "0", "-1"), bulk("This is a string"));
    assert_eq!(r(&mut t, "10", "100"), bulk("string"));
    assert_eq!(r(&mut t, "5", "3"), bulk(""));
    assert_eq!(r(&mut t, "-1", "-5"), bulk(""));
    assert_eq!(r(&mut t, "-100", "2"), bulk("Thi"));
    assert_eq!(
        r(&mut t, "-9223372036854775808", "9223372036854775807"),
        bulk("This is a string")
    );
    assert_eq!(r(&mut t, "100", "200"), bulk(""));
    assert_eq!(
        r(&mut t, "a", "1"),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(t.run(&["getrange", "nope", "0", "-1"]), bulk(""));
    t.run(&["set", "e", ""]);
    assert_eq!(t.run(&["getrange", "e", "0", "-1"]), bulk(""));
}

#[test]
fn setrange_pads_and_overwrites() {
    let mut t = TestDb::new();
    t.run(&["set", "k", "Hello World"]);
    assert_eq!(t.run(&["setrange", "k", "6", "Redis"]), int(11));
    assert_eq!(t.run(&["get", "k"]), bulk("Hello Redis"));
    assert_eq!(t.run(&["setrange", "p", "3", "ab"]), int(5));
    assert_eq!(
        t.run(&["get", "p"]),
        Frame::Bulk(Bytes::from_static(b"\0\0\0ab"))
    );
    assert_eq!(t.run(&["setrange", "none", "5", ""]), int(0));
    assert_eq!(t.run(&["exists", "none"]), int(0));
    assert_eq!(t.run(&["setrange", "k", "100", ""]), int(11));
    assert_eq!(
        t.run(&["setrange", "k", "-1", "x"]),
        err("ERR offset is out of range")
    );
    assert_eq!(
        t.run(&["setrange", "k", "x", "x"]),
        err("ERR value is not an integer or out of range")
    );
}

#[test]
fn overlay_reads_its_own_writes_within_one_command() {
    let t = TestDb::new();
    let mut db = Db::new(&t.engine, &t.ks, t.now, &t.limits);
    let run = |db: &mut Db<'_>, a: &[&str]| {
        super::super::parse(&args(a))
            .unwrap()
            .unwrap()
            .execute(db)
            .unwrap()
    };
    assert_eq!(run(&mut db, &["set", "k", "1"]), ok());
    assert_eq!(run(&mut db, &["incrby", "k", "5"]), int(6));
    assert_eq!(run(&mut db, &["append", "k", "0"]), int(2));
    assert_eq!(run(&mut db, &["get", "k"]), bulk("60"));
    assert!(
        t.engine.get(&t.ks.storage_key(b"k")).unwrap().is_none(),
        "nothing applied yet"
    );
    let muts = db.into_mutations();
    assert_eq!(muts.len(), 1, "one mutation per key");
    t.engine.apply(&muts).unwrap();
    assert_eq!(t.stored("k").unwrap().data, &b"60"[..]);
}

#[test]
fn non_utf8_and_binary_values_round_trip() {
    let mut t = TestDb::new();
    let key = Bytes::from_static(b"\xff\x00k");
    let val = Bytes::from_static(b"\x00\x01\xfe\xff");
    let set = vec![Bytes::from_static(b"SET"), key.clone(), val.clone()];
    assert_eq!(t.run_args(&set), ok());
    assert_eq!(
        t.run_args(&[Bytes::from_static(b"GET"), key]),
        Frame::Bulk(val)
    );
}

mod model {
    //! SET / APPEND / INCRBY / DEL / GETRANGE against a `HashMap` model.

    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Clone, Debug)]
    enum Op {
        Set(u8, Vec<u8>),
        Append(u8, Vec<u8>),
        IncrBy(u8, i64),
        Del(u8),
        GetRange(u8, i64, i64),
    }

    fn value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(prop::sample::select(b"0123456789-ab ".to_vec()), 0..6),
            any::<i64>().prop_map(|n| n.to_string().into_bytes()),
            Just(b"9223372036854775807".to_vec()),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        let key = 0u8..4;
        let small = -12i64..12;
        prop_oneof![
            (key.clone(), value()).prop_map(|(k, v)| Op::Set(k, v)),
            (key.clone(), value()).prop_map(|(k, v)| Op::Append(k, v)),
            (key.clone(), prop_oneof![small.clone(), any::<i64>()])
                .prop_map(|(k, n)| Op::IncrBy(k, n)),
            key.clone().prop_map(Op::Del),
            (key, prop_oneof![small.clone(), any::<i64>()], small)
                .prop_map(|(k, s, e)| Op::GetRange(k, s, e)),
        ]
    }

    /// Strict i64 parsing, written independently of `parse_i64`.
    fn model_int(v: &[u8]) -> Option<i64> {
        let s = std::str::from_utf8(v).ok()?;
        let n: i64 = s.parse().ok()?;
        (n.to_string() == s).then_some(n)
    }

    fn model_range(v: &[u8], s: i64, e: i64) -> Vec<u8> {
        let len = v.len() as i128;
        let (mut s, mut e) = (s as i128, e as i128);
        if s < 0 && e < 0 && s > e {
            return Vec::new();
        }
        if s < 0 {
            s = (s + len).max(0);
        }
        if e < 0 {
            e = (e + len).max(0);
        }
        e = e.min(len - 1);
        if s > e || len == 0 {
            Vec::new()
        } else {
            v[s as usize..=e as usize].to_vec()
        }
    }

    fn apply(model: &mut HashMap<Vec<u8>, Vec<u8>>, op: &Op) -> (Vec<Bytes>, Frame) {
        let k = |k: &u8| vec![b'k', b'0' + k];
        let b = |v: &[u8]| Bytes::copy_from_slice(v);
        match op {
            Op::Set(key, v) => {
                model.insert(k(key), v.clone());
                (vec![b(b"set"), b(&k(key)), b(v)], ok())
            }
            Op::Append(key, v) => {
                let e = model.entry(k(key)).or_default();
                e.extend_from_slice(v);
                (vec![b(b"append"), b(&k(key)), b(v)], int(e.len() as i64))
            }
            Op::IncrBy(key, n) => {
                let a = vec![b(b"incrby"), b(&k(key)), b(n.to_string().as_bytes())];
                let cur = match model.get(&k(key)) {
                    None => Some(0),
                    Some(v) => model_int(v),
                };
                let reply = match cur {
                    None => err("ERR value is not an integer or out of range"),
                    Some(c) => match c.checked_add(*n) {
                        None => err("ERR increment or decrement would overflow"),
                        Some(r) => {
                            model.insert(k(key), r.to_string().into_bytes());
                            int(r)
                        }
                    },
                };
                (a, reply)
            }
            Op::Del(key) => (
                vec![b(b"del"), b(&k(key))],
                int(i64::from(model.remove(&k(key)).is_some())),
            ),
            Op::GetRange(key, s, e) => {
                let v = model.get(&k(key)).cloned().unwrap_or_default();
                let a = vec![
                    b(b"getrange"),
                    b(&k(key)),
                    b(s.to_string().as_bytes()),
                    b(e.to_string().as_bytes()),
                ];
                (a, Frame::Bulk(Bytes::from(model_range(&v, *s, *e))))
            }
        }
    }

    proptest! {
        #[test]
        fn commands_match_a_hashmap_model(ops in prop::collection::vec(op(), 1..40), batch in 1usize..4) {
            let t = TestDb::new();
            let mut model = HashMap::new();
            // Run `batch` commands per overlay, so read-your-writes across
            // commands in one batch is exercised too.
            for chunk in ops.chunks(batch) {
                let mut db = Db::new(&t.engine, &t.ks, t.now, &t.limits);
                for op in chunk {
                    let (a, expected) = apply(&mut model, op);
                    let cmd = crate::cmd::parse(&a).unwrap().unwrap();
                    prop_assert_eq!(cmd.execute(&mut db).unwrap(), expected, "{:?}", op);
                }
                t.engine.apply(&db.into_mutations()).unwrap();
            }
            for (key, v) in &model {
                prop_assert_eq!(&t.engine.get(&t.ks.storage_key(key)).unwrap().unwrap().data[..], &v[..]);
            }
        }
    }
}
