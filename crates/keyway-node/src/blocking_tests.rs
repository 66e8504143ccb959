use super::*;

#[test]
fn timeouts_parse_like_redis() {
    assert_eq!(parse_timeout(b"0"), Ok(0));
    assert_eq!(parse_timeout(b"1"), Ok(1000));
    assert_eq!(parse_timeout(b"0.5"), Ok(500));
    // ceill: a positive timeout under a millisecond is 1 ms, not forever
    // (list.tcl: "with 0.001 timeout should not block indefinitely").
    assert_eq!(parse_timeout(b"0.0001"), Ok(1));
    assert_eq!(parse_timeout(b"0.001"), Ok(1));
    assert_eq!(parse_timeout(b"0.0015"), Ok(2));
    assert_eq!(parse_timeout(b"0.007"), Ok(7));
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
    assert_eq!(parse_timeout(b"1e-400"), Ok(1));
    assert_eq!(parse_timeout(b"0x10"), Ok(16_000));
}

fn gate(b: &Arc<Blocking>, id: u64, keys: &[&str]) -> Gate {
    b.start(id, false);
    Gate {
        blocking: b.clone(),
        id,
        keys: keys
            .iter()
            .map(|k| Bytes::from(format!("sk:{k}")))
            .collect(),
        user_keys: keys.iter().map(|k| Bytes::from(k.to_string())).collect(),
        wake: Arc::new(Notify::new()),
        waiting: AtomicBool::new(false),
        slot: 0,
        attempt: Arc::new(|_gate: Arc<Gate>| -> crate::executor::Task {
            Box::new(|_engine: &dyn keyway_storage::Engine| {
                crate::executor::TaskOutput::reply(Frame::Null, false)
            })
        }),
        routing: tokio::sync::watch::channel(0).1,
        routing_seen: AtomicU64::new(0),
        next: Mutex::new(None),
    }
}

fn served(key: &str) -> Frame {
    Frame::Array(vec![Frame::bulk(key.to_string()), Frame::bulk("v")])
}

fn put(key: &str, kind: ValueKind) -> Mutation {
    Mutation::Put {
        key: Bytes::from(format!("sk:{key}")),
        kind,
        expire_at_ms: None,
        data: Bytes::new(),
    }
}

/// Whether `g`'s client has a wake-up pending (consumes it).
fn woken(g: &Gate) -> bool {
    use std::future::Future;
    let notified = g.wake.notified();
    let mut notified = std::pin::pin!(notified);
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    notified.as_mut().poll(&mut cx).is_ready()
}

#[test]
fn nothing_to_pop_registers_a_waiter_that_a_push_wakes() {
    let b = Arc::new(Blocking::new(&Metrics::default()));
    let g = gate(&b, 1, &["a", "b"]);
    assert_eq!(g.decide(&Frame::NullArray), Decision::Wait);
    assert_eq!(b.status().blocked_clients, 1);
    assert_eq!(b.status().keys_waited_on, 2);
    // A string write or a delete does not wake; a list put does.
    b.notify(&[
        put("b", ValueKind::String),
        Mutation::Delete {
            key: Bytes::from("sk:a"),
        },
    ]);
    assert!(!woken(&g));
    b.notify(&[put("b", ValueKind::List)]);
    assert!(woken(&g));
    // Served: the waiter is gone.
    assert_eq!(g.decide(&served("b")), Decision::Reply);
    assert_eq!(b.status().blocked_clients, 0);
    assert_eq!(b.status().keys_waited_on, 0);
    b.notify(&[put("b", ValueKind::List)]);
    assert!(!woken(&g));
}

#[test]
fn an_any_write_waiter_is_woken_by_a_delete_or_a_put_of_any_type() {
    let b = Arc::new(Blocking::new(&Metrics::default()));
    let g = gate(&b, 7, &["s"]);
    b.start(7, true);
    assert_eq!(g.decide(&Frame::NullArray), Decision::Wait);
    b.notify(&[Mutation::Delete {
        key: Bytes::from("sk:s"),
    }]);
    assert!(woken(&g));
    b.notify(&[put("s", ValueKind::String)]);
    assert!(woken(&g));
    b.notify(&[put("other", ValueKind::String)]);
    assert!(!woken(&g));
}

#[test]
fn a_later_waiter_yields_a_key_to_an_earlier_one_until_it_leaves() {
    let b = Arc::new(Blocking::new(&Metrics::default()));
    let first = gate(&b, 1, &["k"]);
    let second = gate(&b, 2, &["x", "k"]);
    assert_eq!(first.decide(&Frame::NullArray), Decision::Wait);
    assert_eq!(second.decide(&Frame::NullArray), Decision::Wait);
    b.notify(&[put("k", ValueKind::List)]);
    assert!(woken(&first) && woken(&second));
    // The second's attempt runs first and could pop `k`: it yields.
    assert_eq!(second.decide(&served("k")), Decision::Wait);
    // But it may serve from a key nobody earlier waits on.
    // (A newcomer that finds `k` non-empty yields too.)
    let newcomer = gate(&b, 3, &["k"]);
    assert_eq!(newcomer.decide(&served("k")), Decision::Wait);
    assert_eq!(b.status().blocked_clients, 3);
    // The first is served: those that yielded to it are woken again.
    assert_eq!(first.decide(&served("k")), Decision::Reply);
    assert!(woken(&second) && woken(&newcomer));
    // The newcomer's attempt (it was woken) may run before the second's:
    // it yields again, and is woken when the second is served.
    assert_eq!(newcomer.decide(&served("k")), Decision::Wait);
    assert_eq!(second.decide(&served("k")), Decision::Reply);
    assert!(woken(&newcomer));
    assert_eq!(newcomer.decide(&served("k")), Decision::Reply);
    assert_eq!(b.status().blocked_clients, 0);
}

#[test]
fn a_waiter_serves_from_a_key_no_earlier_waiter_wants_and_leaves_on_errors() {
    let b = Arc::new(Blocking::new(&Metrics::default()));
    let first = gate(&b, 1, &["k"]);
    let second = gate(&b, 2, &["x", "k"]);
    assert_eq!(first.decide(&Frame::NullArray), Decision::Wait);
    assert_eq!(second.decide(&Frame::NullArray), Decision::Wait);
    assert_eq!(second.decide(&served("x")), Decision::Reply);
    assert_eq!(
        first.decide(&Frame::Error("WRONGTYPE x".into())),
        Decision::Reply
    );
    assert_eq!(b.status().blocked_clients, 0);
    // A removal (timeout, disconnect) wakes those that yielded to it.
    let first = gate(&b, 3, &["k"]);
    let second = gate(&b, 4, &["k"]);
    assert_eq!(first.decide(&Frame::NullArray), Decision::Wait);
    assert_eq!(second.decide(&served("k")), Decision::Wait);
    b.remove(3);
    assert!(woken(&second));
    assert_eq!(second.decide(&served("k")), Decision::Reply);
}

#[test]
fn an_attempt_that_runs_after_its_client_left_leaves_no_ghost_waiter() {
    let b = Arc::new(Blocking::new(&Metrics::default()));
    let ghost = gate(&b, 1, &["k"]);
    // The client disconnected while its attempt was queued...
    b.end(1);
    // ...then the attempt runs and finds nothing.
    assert_eq!(ghost.decide(&Frame::NullArray), Decision::Wait);
    assert_eq!(b.status().blocked_clients, 0);
    // So a later waiter is not held behind it.
    let next = gate(&b, 2, &["k"]);
    assert_eq!(next.decide(&Frame::NullArray), Decision::Wait);
    assert_eq!(next.decide(&served("k")), Decision::Reply);
}
