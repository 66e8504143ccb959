//! Tests of `rdb.rs`: payloads DUMPed by redis-server 7.0.15 (hex below),
//! hand-built ziplists (which 7.0 no longer writes but still loads), and
//! round trips. The differential test `tests/diff_keyspace.rs` checks the
//! same against a live redis-server in both directions.

use super::*;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn bs(items: &[&str]) -> Vec<Bytes> {
    items
        .iter()
        .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        .collect()
}

/// `body` with the version-10 footer and its CRC.
fn payload(body: &[u8]) -> Vec<u8> {
    let mut p = body.to_vec();
    p.extend_from_slice(&RDB_VERSION.to_le_bytes());
    let crc = CRC64.checksum(&p);
    p.extend_from_slice(&crc.to_le_bytes());
    p
}

fn rdb_string(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_len(&mut out, s.len() as u64);
    out.extend_from_slice(s);
    out
}

#[test]
fn redis_7_0_payloads_restore() {
    let cases: Vec<(&str, Contents)> = vec![
        (
            "000568656c6c6f0a006372df766534200a",
            Contents::String("hello".into()),
        ),
        (
            "00c139300a009d94ea2793fc08b9",
            Contents::String("12345".into()),
        ),
        ("00c0fe0a00b2ab3eeaac598f31", Contents::String("-2".into())),
        (
            "000e31323334353637383930313233340a00afcb8c7b76a08b6a",
            Contents::String("12345678901234".into()),
        ),
        // 100 x 'a', LZF-compressed.
        (
            "00c3094064016161e057000161610a00e8a3b507b06df271",
            Contents::String(Bytes::from(vec![b'a'; 100])),
        ),
        // A quicklist 2 of one listpack node.
        (
            "1201021c1c00000004008161020101ded4028b68656c6c6f20776f726c640cff0a009670b0c4f59b64e5",
            Contents::List(bs(&["a", "1", "-300", "hello world"])),
        ),
        (
            "0b18040000000400000090eefeff0100000002000000030000000a00a8b63c622cbf2c9c",
            Contents::Set(bs(&["-70000", "1", "2", "3"])),
        ),
        (
            "0202017801790a00ac3a8d681184aa31",
            Contents::Set(bs(&["x", "y"])),
        ),
        (
            "10151500000004008266310382763103826632030201ff0a005c5ea813feec1ff5",
            Contents::Hash(vec![("f1".into(), "v1".into()), ("f2".into(), "2".into())]),
        ),
        (
            "111f1f0000000600816202dffe0281610283312e35048163028531652b323006ff0a00bdec2ac6bd8f2d62",
            Contents::ZSet(vec![
                ("b".into(), -2.0),
                ("a".into(), 1.5),
                ("c".into(), 1e20),
            ]),
        ),
    ];
    for (h, want) in cases {
        assert_eq!(restore(&hex(h)), Ok(want.clone()), "{h}");
        // And what Keyway DUMPs of it restores to the same.
        assert_eq!(restore(&dump(&want)), Ok(want), "{h}");
    }
}

#[test]
fn dump_writes_plain_encodings() {
    // Byte for byte what Redis writes for these strings.
    assert_eq!(
        dump(&Contents::String("hello".into())),
        hex("000568656c6c6f0a006372df766534200a")
    );
    assert_eq!(
        dump(&Contents::String("12345".into())),
        hex("00c139300a009d94ea2793fc08b9")
    );
    assert_eq!(
        dump(&Contents::String("-2".into())),
        hex("00c0fe0a00b2ab3eeaac598f31")
    );
    let set = dump(&Contents::Set(bs(&["x", "y"])));
    assert_eq!(set, hex("0202017801790a00ac3a8d681184aa31"));
    let z = dump(&Contents::ZSet(vec![("m".into(), 2.5)]));
    assert_eq!(z[0], 5, "RDB_TYPE_ZSET_2");
    assert_eq!(&z[4..12], &2.5f64.to_le_bytes());
}

#[test]
fn lengths_and_integers_round_trip_at_their_boundaries() {
    for n in [
        0u64,
        63,
        64,
        16383,
        16384,
        u64::from(u32::MAX),
        u64::from(u32::MAX) + 1,
    ] {
        let mut out = Vec::new();
        put_len(&mut out, n);
        let mut r = Reader { buf: &out, pos: 0 };
        assert_eq!(r.len(), Some(n));
        assert_eq!(r.pos, out.len());
    }
    for s in [
        "0",
        "-128",
        "127",
        "128",
        "-32768",
        "32767",
        "32768",
        "2147483647",
        "-2147483648",
        "2147483648",
        "01",
        "+1",
        "-0",
        "",
    ] {
        let mut out = Vec::new();
        put_string(&mut out, s.as_bytes());
        let mut r = Reader { buf: &out, pos: 0 };
        assert_eq!(r.string().as_deref(), Some(s.as_bytes()), "{s:?}");
    }
}

/// A ziplist of `entries` (each `prevlen | encoding | data` already encoded
/// except prevlen).
fn ziplist_of(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut body = Vec::new();
    let mut prev = 0usize;
    let mut tail = 10;
    for e in entries {
        tail = 10 + body.len();
        if prev < 254 {
            body.push(prev as u8);
        } else {
            body.push(0xFE);
            body.extend_from_slice(&(prev as u32).to_le_bytes());
        }
        body.extend_from_slice(e);
        prev = e.len() + if prev < 254 { 1 } else { 5 };
    }
    let total = 10 + body.len() + 1;
    let mut z = Vec::new();
    z.extend_from_slice(&(total as u32).to_le_bytes());
    z.extend_from_slice(&(tail as u32).to_le_bytes());
    z.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    z.extend_from_slice(&body);
    z.push(0xFF);
    z
}

fn zl_entries() -> Vec<Vec<u8>> {
    vec![
        vec![0x01, b'a'],                   // 6-bit string
        vec![0xC0, 0xE8, 0x03],             // int16 1000
        vec![0xF6],                         // immediate 5
        vec![0xFE, 0x9C],                   // int8 -100
        vec![0xF0, 0x00, 0x00, 0x80],       // int24 -8388608
        vec![0xD0, 0x00, 0x00, 0x00, 0x80], // int32 i32::MIN
        {
            let mut e = vec![0xE0];
            e.extend_from_slice(&i64::MAX.to_le_bytes());
            e
        },
        {
            let mut e = vec![0x41, 0x2C]; // 14-bit length 300
            e.extend(std::iter::repeat_n(b'z', 300));
            e
        },
    ]
}

#[test]
fn ziplist_encodings_restore() {
    let z = ziplist_of(&zl_entries());
    let want = vec![
        "a".to_string(),
        "1000".into(),
        "5".into(),
        "-100".into(),
        "-8388608".into(),
        "-2147483648".into(),
        i64::MAX.to_string(),
        "z".repeat(300),
    ];
    let want: Vec<Bytes> = want.into_iter().map(Bytes::from).collect();
    // RDB_TYPE_LIST_ZIPLIST
    let mut body = vec![TYPE_LIST_ZIPLIST];
    body.extend(rdb_string(&z));
    assert_eq!(restore(&payload(&body)), Ok(Contents::List(want.clone())));
    // RDB_TYPE_LIST_QUICKLIST: two ziplist nodes, one of them empty (skipped).
    let mut body = vec![TYPE_LIST_QUICKLIST, 2];
    body.extend(rdb_string(&z));
    body.extend(rdb_string(&ziplist_of(&[])));
    let mut twice = want.clone();
    twice.truncate(8);
    assert_eq!(restore(&payload(&body)), Ok(Contents::List(twice)));
    // RDB_TYPE_HASH_ZIPLIST and RDB_TYPE_ZSET_ZIPLIST: pairs.
    let pairs = ziplist_of(&[
        vec![0x01, b'f'],
        vec![0xF3],
        vec![0x01, b'g'],
        vec![0x03, b'1', b'.', b'5'],
    ]);
    let mut body = vec![TYPE_HASH_ZIPLIST];
    body.extend(rdb_string(&pairs));
    assert_eq!(
        restore(&payload(&body)),
        Ok(Contents::Hash(vec![
            ("f".into(), "2".into()),
            ("g".into(), "1.5".into())
        ]))
    );
    let mut body = vec![TYPE_ZSET_ZIPLIST];
    body.extend(rdb_string(&pairs));
    assert_eq!(
        restore(&payload(&body)),
        Ok(Contents::ZSet(vec![("f".into(), 2.0), ("g".into(), 1.5)]))
    );
}

#[test]
fn quicklist_2_plain_nodes_and_old_zset_text_scores() {
    let mut body = vec![TYPE_LIST_QUICKLIST_2, 1, CONTAINER_PLAIN as u8];
    body.extend(rdb_string(b"a big element"));
    assert_eq!(
        restore(&payload(&body)),
        Ok(Contents::List(bs(&["a big element"])))
    );
    // RDB_TYPE_ZSET: scores as length-prefixed text, 254 = +inf, 255 = -inf.
    let mut body = vec![TYPE_ZSET, 3];
    body.extend(rdb_string(b"a"));
    body.extend([3, b'1', b'.', b'5']);
    body.extend(rdb_string(b"b"));
    body.push(254);
    body.extend(rdb_string(b"c"));
    body.push(255);
    assert_eq!(
        restore(&payload(&body)),
        Ok(Contents::ZSet(vec![
            ("a".into(), 1.5),
            ("b".into(), f64::INFINITY),
            ("c".into(), f64::NEG_INFINITY)
        ]))
    );
    // 253 = NaN: refused.
    let mut body = vec![TYPE_ZSET, 1];
    body.extend(rdb_string(b"a"));
    body.push(253);
    assert_eq!(restore(&payload(&body)), Err(PayloadError::BadFormat));
}

#[test]
fn bad_payloads() {
    let good = hex("000568656c6c6f0a006372df766534200a");
    assert_eq!(restore(&good[..9]), Err(PayloadError::VersionOrChecksum));
    let mut flipped = good.clone();
    flipped[2] ^= 1;
    assert_eq!(restore(&flipped), Err(PayloadError::VersionOrChecksum));
    // Version 11 (Redis 7.2) is newer than 7.0 loads, whatever the CRC.
    let mut v11 = good[..good.len() - 10].to_vec();
    v11.extend_from_slice(&11u16.to_le_bytes());
    let crc = CRC64.checksum(&v11);
    v11.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(restore(&v11), Err(PayloadError::VersionOrChecksum));
    // An older version is fine.
    let mut v9 = good[..good.len() - 10].to_vec();
    v9.extend_from_slice(&9u16.to_le_bytes());
    let crc = CRC64.checksum(&v9);
    v9.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(restore(&v9), Ok(Contents::String("hello".into())));
    for body in [
        vec![TYPE_STRING, 5, b'a'],                       // truncated
        vec![15, 0],                                      // a stream
        vec![TYPE_SET, 0],                                // empty
        vec![TYPE_SET, 2, 1, b'x', 1, b'x'],              // duplicate member
        vec![TYPE_HASH, 2, 1, b'f', 0, 1, b'f', 0],       // duplicate field
        vec![TYPE_LIST, 0],                               // empty
        vec![TYPE_SET_INTSET, 8, 2, 0, 0, 0, 0, 0, 0, 0], // empty intset
        vec![TYPE_STRING, 0xC3, 1, 5, 0x00, b'a'],        // LZF output too short
    ] {
        assert_eq!(
            restore(&payload(&body)),
            Err(PayloadError::BadFormat),
            "{body:?}"
        );
    }
}

#[test]
fn lzf_back_references() {
    // literal "ab", then a back reference of length 4 at distance 2: "ababab".
    assert_eq!(
        lzf_decompress(&[0x01, b'a', b'b', 0x40, 0x01], 6),
        Some(b"ababab".to_vec())
    );
    assert_eq!(
        lzf_decompress(&[0x01, b'a', b'b', 0x40, 0x05], 6),
        None,
        "before the start"
    );
}
