//! Differential test of the data commands against a real Redis.
//!
//! Runs the same command scripts on a private `redis-server` (started on a
//! free loopback port, `--save ""`) and on `keyway_node::cmd` over a
//! `MemEngine`, and requires identical replies (compared after a RESP round
//! trip, so RESP3-only shapes are compared as RESP2 and RESP3 clients would
//! see them). Skipped, with a note on stderr, when `redis-server` is not
//! installed (`scripts/setup.sh` installs it).
//!
//! Script syntax: one command per line, arguments split on spaces, `"..."`
//! quotes an argument (`""` is the empty string); `$NOWS+N` / `$NOWMS+N` are
//! replaced by the current unix time (seconds / milliseconds) plus `N`.
//! Replies that depend on the exact millisecond a command ran in (PTTL, TTL
//! of a whole-second deadline, short expiries) are avoided.

mod diff;

use bytes::Bytes;
use diff::{Keyway, Redis, substitute, tokenize};
use keyway_resp::{Frame, Protocol};

const SCRIPTS: &[&str] = &[
    // GET / SET and its options
    "get k\nset k v\nget k\nset k\nget k x\nset k \"\"\nget k",
    "set k 1 xx\nset k 1 nx\nset k 2 nx\nset k 3 xx\nset k 4 get\nset k 5 nx get\nset n 1 xx get\nget n\nset k 6 NX nx",
    "set k v nx xx\nset k v xx nx\nset k v ex\nset k v ex 10 px 100\nset k v keepttl ex 10\nset k v px 10 keepttl\nset k v persist\nset k v foo\nset k v exat 1 pxat 1",
    "set k v ex 0\nset k v px -5\nset k v ex 9223372036854776\nset k v px 9223372036854775807\nset k v ex 1.5\nset k v ex abc\nget k",
    "set k v ex 10 ex 20\nttl k\nset k v ex 100 get\nttl k\nset k w keepttl\nttl k\nset k x\nttl k",
    "set k v exat $NOWS+100\nexpiretime k\nset k v pxat $NOWMS+50000\nttl k\nset k v4\nset k v5 pxat 1 get\nget k\nexists k",
    "set k v px 100000 nx get\nset k v EX 5 XX GET\nset k v exat $NOWS-10 nx",
    // SETNX / SETEX / PSETEX / GETSET / GETDEL
    "setnx k 1\nsetnx k 2\nsetex k 10 3\nttl k\npsetex k 20000 4\nttl k\nsetex k 0 x\npsetex k -1 x\nsetex k x x\nsetex k 9223372036854775807 x\nget k",
    "getset k 5\ngetset k 6\nttl k\ngetdel k\ngetdel k\nsetex k 100 v\ngetset k w\nttl k",
    // GETEX
    "getex k\ngetex k ex 0\nset k v\ngetex k ex 0\ngetex k ex 100\nttl k\ngetex k persist\nttl k\ngetex k exat $NOWS+5\nexpiretime k\ngetex k\nexpiretime k",
    "set k v\ngetex k nx\ngetex k get\ngetex k keepttl\ngetex k persist ex 1\ngetex k ex 1 persist\ngetex k ex\ngetex k px 10 px 20000\nttl k\ngetex k pxat 1\nexists k",
    // MGET / MSET / MSETNX
    "mset a 1 b 2\nmget a nope b\nmset a 1 b\nmsetnx a\nmsetnx c 3 a 9\nget c\nmsetnx c 3 d 4 c 5\nmget c d\nmget",
    // APPEND / STRLEN
    "strlen k\nappend k Hello\nappend k \" World\"\nget k\nstrlen k\nappend k \"\"\nappend e \"\"\nexists e\nstrlen e",
    // GETRANGE / SETRANGE
    "set k \"This is a string\"\ngetrange k 0 3\ngetrange k -3 -1\ngetrange k 0 -1\ngetrange k 10 100\ngetrange k 5 3\ngetrange k -1 -5\ngetrange k -100 2\ngetrange k -9223372036854775808 9223372036854775807\ngetrange k 100 200\ngetrange k a 1\ngetrange nope 0 -1\nset e \"\"\ngetrange e 0 -1\ngetrange k -5 -5\ngetrange k 3 -100",
    "set k \"Hello World\"\nsetrange k 6 Redis\nget k\nsetrange p 3 ab\nget p\nsetrange none 5 \"\"\nexists none\nsetrange k 100 \"\"\nsetrange k -1 x\nsetrange k x x\nsetrange k 536870911 x\nsetrange k 9223372036854775807 x",
    // counters
    "incr n\nincrby n 41\ndecr n\ndecrby n -9\nget n\ndecrby m 5\nincrby n 1.5\nincrby n +1\ndecrby n -9223372036854775808\nincr",
    "set s abc\nincr s\nset s \" 1\"\nincr s\nset s 01\nincr s\nset s -0\nincr s\nset max 9223372036854775807\nincr max\nset min -9223372036854775808\ndecr min\nincrby min 9223372036854775807",
    "set n 1 ex 100\nincr n\nttl n\nincrbyfloat n 0.5\nttl n",
    "set f 10.50\nincrbyfloat f 0.1\nincrbyfloat f -5\nset f 5.0e3\nincrbyfloat f 2.0e2\nincrbyfloat new 5.0e-5\nincrbyfloat x3 3.0e3\nset big 10000000000\nincrbyfloat big 0.1\nincrbyfloat big 1e20",
    "set s abc\nincrbyfloat s 1\nincrbyfloat n x\nincrbyfloat n nan\nincrbyfloat n inf\nincrbyfloat n -infinity\nincrbyfloat n 0x1p-3\nincrbyfloat n \" 1\"\nincrbyfloat n 1e-30\nincrbyfloat n -0.125\nincrbyfloat n 1e308\nincrbyfloat n 1e4000\nincrbyfloat n 1e5000\nincrbyfloat n 123456789.987654321\nincrbyfloat n 0.000000000000000001",
    "incrbyfloat a 0.1\nincrbyfloat a 0.2\nincrbyfloat a 0.3\nincrbyfloat a -0.6\nincrbyfloat a 1.1\nincrbyfloat a 2.2\nincrbyfloat b 3.3333333333333333333\nincrbyfloat b -1e-17\nincrbyfloat c -5e-18\nincrbyfloat d 1.5e-17",
    // DEL / UNLINK / EXISTS / TYPE
    "mset a 1 b 2 c 3\nexists a a b nope\ntype a\ntype nope\ndel a a nope\nunlink b c\nexists a b c\ndel\ntype a b",
    // EXPIRE family
    "ttl k\nexpire k 10\nset k v\nttl k\npttl k\nexpiretime k\npexpiretime k\npersist k\nexpire k 10\nttl k\npersist k\nttl k\npersist k",
    "set k v\nexpireat k $NOWS+100\nexpiretime k\npexpireat k $NOWMS+20000\nttl k\npexpire k 50000\nttl k\nexpire k -1\nexists k\nset k v\npexpire k 0\nexists k\nset k v\nexpireat k 1\nexists k",
    "set k v\nexpire k 100 xx\nexpire k 100 gt\nexpire k 100 lt\nexpire k 200 nx\nexpire k 50 gt\nexpire k 200 GT\nexpire k 300 lt\nexpire k 30 xx lt\nttl k\nset n v\nexpire n 10 nx\nttl n",
    "set k v\nexpire k 10 foo\nexpire k 10 nx xx\nexpire k 10 gt lt\nexpire k 10 nx gt\nexpire k ten\nexpire k ten foo\nexpire k 9223372036854775807\nexpire k -9223372036854775808\npexpire k 9223372036854775807\npexpireat k 9223372036854775807\nttl k\nexpire k\nttl\nexpire nope 10 gt",
    // arity errors of every data command
    "get\nset k\nsetnx k\nsetex k 1\npsetex k 1\ngetset k\ngetdel\ngetex\nmget\nmset k\nmsetnx k\nappend k\nstrlen\ngetrange k 1\nsetrange k 1\nincr\ndecr\nincrby k\ndecrby k\nincrbyfloat k\ndel\nunlink\nexists\ntype\nexpire k\npexpire k\nexpireat k\npexpireat k\nttl\npttl\npersist\nexpiretime\npexpiretime",
    // stream containers' unrouted replies, XREAD's keys
    "xgroup foo\nxgroup create k\nxgroup help\nxgroup help x\nxinfo help\nxinfo stream\nxinfo foo k\nxgroup setid k g 0 entriesread 3 x\nxinfo stream k full count\ncommand getkeys xread count 1 streams a b 0 0\ncommand getkeys xreadgroup group g c streams a 0\ncommand getkeys xread streams a b c",
    // COMMAND (RESP2 shapes)
    "command info get set mget mset msetnx del exists ttl getex incrbyfloat nosuch\ncommand count x\ncommand foo\ncommand getkeys mset a b c d\ncommand getkeys get a b\ncommand getkeys nosuch a\ncommand getkeysandflags set a b get\ncommand getkeysandflags mset a b c d\ncommand help\ncommand list filterby pattern getr*\ncommand list x\ncommand docs nosuch",
];

/// Commands whose INFO must match Redis exactly, also in RESP3.
const INFO_NAMES: &[&str] = &[
    "get",
    "set",
    "setnx",
    "setex",
    "psetex",
    "getset",
    "getdel",
    "getex",
    "mget",
    "mset",
    "msetnx",
    "append",
    "strlen",
    "getrange",
    "setrange",
    "incr",
    "decr",
    "incrby",
    "decrby",
    "incrbyfloat",
    "del",
    "unlink",
    "exists",
    "type",
    "expire",
    "pexpire",
    "expireat",
    "pexpireat",
    "ttl",
    "pttl",
    "persist",
    "expiretime",
    "pexpiretime",
    "ping",
    "echo",
    "hello",
    "auth",
    "info",
    "select",
    "quit",
    "readonly",
    "readwrite",
    "asking",
    "scan",
    "dbsize",
    // keyspace (SORT/SORT_RO: Redis lists two more key specs of type
    // "unknown" for BY/GET and STORE; OBJECT and FUNCTION: Redis lists
    // their subcommands)
    "setbit",
    "getbit",
    "rename",
    "renamenx",
    "copy",
    "touch",
    "lcs",
    "substr",
    "dump",
    "restore",
    "keys",
    "randomkey",
    "hset",
    "hsetnx",
    "hget",
    "hmget",
    "hmset",
    "hdel",
    "hlen",
    "hstrlen",
    "hexists",
    "hkeys",
    "hvals",
    "hgetall",
    "hincrby",
    "hincrbyfloat",
    "hrandfield",
    "hscan",
    "sadd",
    "srem",
    "scard",
    "sismember",
    "smismember",
    "smembers",
    "srandmember",
    "spop",
    "sinter",
    "sunion",
    "sdiff",
    "sscan",
    "smove",
    "sintercard",
    "sinterstore",
    "sunionstore",
    "sdiffstore",
    // streams (XGROUP and XINFO: Redis lists their subcommands)
    "xadd",
    "xlen",
    "xrange",
    "xrevrange",
    "xdel",
    "xtrim",
    "xsetid",
    "xread",
    "xreadgroup",
    "xack",
    "xpending",
    "xclaim",
    "xautoclaim",
];

#[test]
fn replies_match_redis_7() {
    let Some(mut redis) = Redis::start() else {
        eprintln!("cmd_redis_diff: redis-server not available, skipped");
        return;
    };
    let version = redis.call(&[Bytes::from_static(b"INFO"), Bytes::from_static(b"server")]);
    let is_7_0 = version
        .as_bytes()
        .is_some_and(|t| String::from_utf8_lossy(t).contains("redis_version:7.0."));
    let mut failures = Vec::new();
    for script in SCRIPTS {
        redis.call(&[Bytes::from_static(b"FLUSHALL")]);
        let ours = Keyway::new();
        for line in script.lines() {
            let args = tokenize(line);
            if args[0].eq_ignore_ascii_case(b"command") && !is_7_0 {
                continue; // the command table describes Redis 7.0
            }
            let expected = redis.call(&args);
            let got = ours.call(&args, Protocol::Resp2);
            if expected != got {
                failures.push(format!("{line}\n  redis:  {expected:?}\n  keyway: {got:?}"));
            }
        }
    }
    if is_7_0 {
        redis.call(&[Bytes::from_static(b"HELLO"), Bytes::from_static(b"3")]);
        let ours = Keyway::new();
        for name in INFO_NAMES {
            let args = vec![
                Bytes::from_static(b"COMMAND"),
                Bytes::from_static(b"INFO"),
                Bytes::from_static(name.as_bytes()),
            ];
            let expected = redis.call(&args);
            let got = ours.call(&args, Protocol::Resp3);
            if expected != got {
                failures.push(format!(
                    "RESP3 COMMAND INFO {name}\n  redis:  {expected:?}\n  keyway: {got:?}"
                ));
            }
        }
        for name in INFO_NAMES {
            // DOCS without argument docs and history: compare the fields we report.
            let args = vec![
                Bytes::from_static(b"COMMAND"),
                Bytes::from_static(b"DOCS"),
                Bytes::from_static(name.as_bytes()),
            ];
            let (Frame::Map(expected), Frame::Map(got)) =
                (redis.call(&args), ours.call(&args, Protocol::Resp3))
            else {
                failures.push(format!("COMMAND DOCS {name}: not maps"));
                continue;
            };
            let (Some((_, Frame::Map(exp))), Some((_, Frame::Map(got)))) =
                (expected.first(), got.first())
            else {
                failures.push(format!("COMMAND DOCS {name}: empty"));
                continue;
            };
            for field in got {
                if !exp.contains(field) {
                    failures.push(format!("COMMAND DOCS {name}: {field:?} not in {exp:?}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }

    /// A float-ish string: decimals, exponents, hex, signs, junk.
    fn float_text(&mut self) -> String {
        let sign = self.pick(&["", "", "-", "+"]);
        match self.below(8) {
            0 => format!("{sign}{}", self.below(1000)),
            1 => format!(
                "{sign}{}.{}",
                self.below(100_000),
                self.below(1_000_000_000)
            ),
            2 => format!("{sign}{}e{}", self.below(100), self.below(60) as i64 - 30),
            3 => format!(
                "{sign}0.{:0>width$}",
                self.below(1000),
                width = self.below(25) as usize
            ),
            4 => format!(
                "{sign}{}{}",
                self.below(u64::MAX),
                self.pick(&["", ".5", ".25", "e3"])
            ),
            5 => format!(
                "{sign}0x{:x}p{}",
                self.below(1 << 40),
                self.below(40) as i64 - 20
            ),
            6 => self
                .pick(&[
                    "1e4000",
                    "1.5e-4940",
                    "abc",
                    "",
                    " 1",
                    "1e",
                    ".",
                    "inf",
                    "1.",
                    ".1",
                ])
                .to_string(),
            _ => format!(
                "{sign}{}.{}e{}",
                self.below(10),
                self.below(1_000_000),
                self.below(40) as i64 - 20
            ),
        }
    }

    fn int_text(&mut self) -> String {
        match self.below(6) {
            0 => (self.next() as i64).to_string(),
            1 => (self.below(40) as i64 - 20).to_string(),
            2 => self
                .pick(&[
                    "9223372036854775807",
                    "-9223372036854775808",
                    "01",
                    "+1",
                    "1.0",
                    "",
                    "x",
                ])
                .to_string(),
            _ => (self.below(30) as i64 - 10).to_string(),
        }
    }
}

#[test]
fn random_replies_match_redis_7() {
    let Some(mut redis) = Redis::start() else {
        eprintln!("cmd_redis_diff: redis-server not available, skipped");
        return;
    };
    let ours = Keyway::new();
    let seed = std::env::var("KEYWAY_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15);
    let ops = std::env::var("KEYWAY_DIFF_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let mut rng = Rng(seed);
    let mut failures = Vec::new();
    let keys = ["a", "b", "c"];
    let mut history = Vec::new();
    for _ in 0..ops {
        let key = rng.pick(&keys).to_string();
        let args: Vec<String> = match rng.below(16) {
            0 | 1 => vec!["incrbyfloat".into(), key, rng.float_text()],
            2 => vec!["set".into(), key, rng.float_text()],
            3 => vec!["incrby".into(), key, rng.int_text()],
            4 => vec![
                "append".into(),
                key,
                rng.pick(&["", "0", "1", "x", "-", ".5", "e5"]).into(),
            ],
            5 => vec!["getrange".into(), key, rng.int_text(), rng.int_text()],
            6 => vec![
                "setrange".into(),
                key,
                (rng.below(12) as i64 - 1).to_string(),
                rng.pick(&["", "1", "ab", "9e"]).into(),
            ],
            7 => vec!["strlen".into(), key],
            8 => {
                let mut a = vec!["set".to_string(), key, rng.int_text()];
                for _ in 0..rng.below(4) {
                    let opt = rng.pick(&[
                        "nx", "xx", "get", "keepttl", "ex", "px", "exat", "pxat", "persist", "EX",
                    ]);
                    a.push(opt.into());
                    if rng.below(3) > 0 && opt.len() >= 2 && !opt.eq_ignore_ascii_case("nx") {
                        a.push(rng.pick(&["1000000", "0", "-1", "x", "200000"]).into());
                    }
                }
                a
            }
            9 => vec![
                "getex".into(),
                key,
                rng.pick(&["persist", "ex", "px", "nx"]).into(),
                rng.pick(&["1000000", "0", "-1", "x", "200000"]).into(),
            ],
            10 => {
                // Only clock-independent expiries: relative times that are
                // invalid, non-positive or whole seconds far away; absolute
                // times in the past, or a quarter second off any relative one.
                let cmd = rng.pick(&["expire", "pexpire", "expireat", "pexpireat"]);
                let when = match (cmd, rng.below(4)) {
                    (_, 0) => rng
                        .pick(&[
                            "x",
                            "",
                            "01",
                            "1.0",
                            "9223372036854775807",
                            "-9223372036854775808",
                        ])
                        .into(),
                    ("expire", _) => rng.pick(&["-5", "0", "1000", "2000", "100000"]).into(),
                    ("pexpire", _) => rng
                        .pick(&["-5", "0", "1000000", "2000000", "100000000"])
                        .into(),
                    ("expireat", _) => substitute(&format!("$NOWS-{}", rng.below(1000))),
                    _ => substitute(&format!(
                        "$NOWMS{:+}",
                        (rng.below(2000) as i64 - 100) * 1000 + 250
                    )),
                };
                let mut a = vec![cmd.to_string(), key, when];
                // NX/XX/GT/LT only with absolute times: comparing two relative
                // times depends on which millisecond each command ran in.
                let options = if cmd.ends_with("at") { rng.below(3) } else { 0 };
                for _ in 0..options {
                    a.push(rng.pick(&["nx", "xx", "gt", "lt", "GT", "zz"]).into());
                }
                a
            }
            11 => vec![
                rng.pick(&["ttl", "persist", "type", "getdel", "exists"])
                    .into(),
                key,
            ],
            12 => vec![rng.pick(&["getset", "setnx"]).into(), key, rng.int_text()],
            13 => vec![
                rng.pick(&["del", "unlink", "exists", "mget"]).into(),
                key,
                rng.pick(&keys).into(),
            ],
            14 => vec![
                rng.pick(&["mset", "msetnx"]).into(),
                key,
                rng.int_text(),
                rng.pick(&keys).into(),
                rng.float_text(),
            ],
            _ => vec![
                rng.pick(&["setex", "psetex"]).into(),
                key,
                rng.pick(&["1000000", "0", "-1", "x", "200000"]).into(),
                rng.int_text(),
            ],
        };
        let args: Vec<Bytes> = args.into_iter().map(Bytes::from).collect();
        let expected = redis.call(&args);
        let got = ours.call(&args, Protocol::Resp2);
        history.push(format!("{args:?} -> {expected:?}"));
        if expected != got {
            if failures.is_empty() {
                eprintln!("history:\n{}", history.join("\n"));
            }
            failures.push(format!(
                "{args:?}\n  redis:  {expected:?}\n  keyway: {got:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every row of the command table that Redis 7.0 also has: `COMMAND INFO`
/// (RESP3: flags, first/last/step, ACL categories, tips, key specs) exactly
/// as Redis's, except the rows listed with why.
#[test]
fn every_command_table_row_matches_redis_7_0() {
    // Redis lists key specs or subcommands these rows do not describe.
    const KNOWN: &[(&str, &str)] = &[
        (
            "sort",
            "Redis adds key specs of type unknown for BY/GET and STORE",
        ),
        (
            "sort_ro",
            "Redis adds a key spec of type unknown for BY/GET",
        ),
        ("object", "Redis lists its subcommands"),
        ("function", "Redis lists its subcommands"),
        ("script", "Redis lists its subcommands"),
        ("xgroup", "Redis lists its subcommands"),
        ("xinfo", "Redis lists its subcommands"),
        ("config", "Redis lists its subcommands"),
        ("client", "Redis lists its subcommands"),
        ("cluster", "Redis lists its subcommands"),
        ("command", "Redis lists its subcommands"),
        ("slowlog", "Redis lists its subcommands"),
        ("latency", "Redis lists its subcommands"),
        ("memory", "Redis lists its subcommands"),
        // Its subcommands' categories are checked by acl_redis_diff.rs.
        ("acl", "Redis lists its subcommands"),
    ];
    let Some(mut redis) = Redis::start() else {
        eprintln!("cmd_redis_diff: redis-server not available, skipped");
        return;
    };
    let version = redis.call(&[Bytes::from_static(b"INFO"), Bytes::from_static(b"server")]);
    if !matches!(&version, Frame::Bulk(b) if String::from_utf8_lossy(b).contains("redis_version:7.0."))
    {
        eprintln!("cmd_redis_diff: not Redis 7.0, table check skipped");
        return;
    }
    redis.call(&[Bytes::from_static(b"HELLO"), Bytes::from_static(b"3")]);
    let ours = Keyway::new();
    let mut failures = Vec::new();
    let mut checked = 0;
    for spec in keyway_node::cmd::table::commands() {
        if KNOWN.iter().any(|(n, _)| *n == spec.name) {
            continue;
        }
        let args = vec![
            Bytes::from_static(b"COMMAND"),
            Bytes::from_static(b"INFO"),
            Bytes::from_static(spec.name.as_bytes()),
        ];
        let expected = redis.call(&args);
        if expected == Frame::Array(vec![Frame::Null]) {
            continue; // not a Redis command (KW.*)
        }
        checked += 1;
        let got = ours.call(&args, Protocol::Resp3);
        if expected != got {
            failures.push(format!(
                "COMMAND INFO {}\n  redis:  {expected:?}\n  keyway: {got:?}",
                spec.name
            ));
        }
    }
    eprintln!("COMMAND INFO: {checked} table rows checked against Redis");
    assert!(checked > 100, "only {checked} rows checked");
    assert!(
        failures.is_empty(),
        "{} of {checked} rows differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
