//! [`free_ports`]: loopback ports nobody is listening on right now, and
//! that no other caller in this process was given before.
//!
//! A test that kills a process and restarts it on the same port needs that
//! port to stay its own while the process is down. Other processes on the
//! machine cannot be kept off it, but the tests of the same test binary
//! (which cargo runs in parallel threads) can: every port handed out is
//! remembered in [`HANDED_OUT`] and never handed out again, nor even
//! probed, by this process. Before that, another test's probe or cluster
//! took a down node's port now and then, and its restart failed with
//! "Address already in use".

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::Mutex;

/// Every port [`free_ports`] or [`free_port_block`] returned in this
/// process (the OS-assigned fallback's included).
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The registry, usable even after a test that held the lock panicked
/// (the set is only ever inserted into, so it is never half-updated).
fn handed_out() -> std::sync::MutexGuard<'static, BTreeSet<u16>> {
    HANDED_OUT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Lowest port [`free_ports`] picks from.
const POOL_START: u16 = 10_000;

/// `n` distinct TCP ports currently free on 127.0.0.1.
///
/// They are picked at random below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`, 32768.. by default), so an
/// outgoing connection can never be given one of them: not between this
/// call and the caller's bind, and not while a process that owns one is
/// down for a restart. Each is checked by binding it (all at once, then
/// released), and none was returned before in this process (see the module
/// docs). Falls back to ports the OS assigns if that range is too small.
///
/// # Panics
/// If the OS cannot bind a loopback listener at all.
pub fn free_ports(n: usize) -> Vec<u16> {
    let below = ephemeral_start().unwrap_or(32_768);
    let mut given = handed_out();
    if below > POOL_START + 1_000 {
        let mut held = Vec::with_capacity(n);
        let mut ports: Vec<u16> = Vec::with_capacity(n);
        for _ in 0..n * 50 {
            if ports.len() == n {
                break;
            }
            let port = rand::random_range(POOL_START..below);
            if ports.contains(&port) || given.contains(&port) {
                continue;
            }
            if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
                held.push(listener);
                ports.push(port);
            }
        }
        if ports.len() == n {
            given.extend(&ports);
            return ports;
        }
    }
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free port on 127.0.0.1"))
        .collect();
    let ports: Vec<u16> = listeners
        .iter()
        .map(|l| l.local_addr().expect("local address").port())
        .collect();
    given.extend(&ports);
    ports
}

/// The first of `count` consecutive TCP ports, each free on 127.0.0.1 now
/// (for a process that takes `--port P` and uses P, P+1, …).
///
/// Picked at random below the kernel's ephemeral range, as [`free_ports`]
/// does, so no outgoing connection is given one of them while the caller
/// starts its listeners (a block that reached into the ephemeral range made
/// tests fail with "Address already in use" now and then).
///
/// # Panics
/// If `count` is 0, if the range below the ephemeral ports is too small, or
/// if no free block is found.
pub fn free_port_block(count: usize) -> u16 {
    let count = u16::try_from(count).expect("a block of at most 65535 ports");
    assert!(count > 0, "a block of at least one port");
    let below = ephemeral_start().unwrap_or(32_768);
    assert!(
        below > POOL_START.saturating_add(count).saturating_add(1_000),
        "ports {POOL_START}..{below} (below the ephemeral range) leave no room for a block of {count}"
    );
    let mut given = handed_out();
    for _ in 0..1_000 {
        let base = rand::random_range(POOL_START..below - count);
        if given.range(base..base + count).next().is_some() {
            continue;
        }
        let held: Option<Vec<TcpListener>> = (0..count)
            .map(|i| TcpListener::bind(("127.0.0.1", base + i)).ok())
            .collect();
        if held.is_some() {
            given.extend(base..base + count);
            return base;
        }
    }
    panic!("no block of {count} free ports found below port {below}");
}

/// The first port of the kernel's ephemeral range.
fn ephemeral_start() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    // Whether each is still free when the test binds it again is up to
    // the other processes on the machine: `free_ports` checked it.
    #[test]
    fn ports_are_distinct_and_not_ephemeral() {
        let ports = free_ports(16);
        assert_eq!(ports.iter().collect::<BTreeSet<_>>().len(), 16);
        let below = ephemeral_start().unwrap_or(32_768);
        for p in ports {
            assert!(p >= POOL_START && p < below, "{p}");
        }
        assert!(free_ports(0).is_empty());
    }

    /// A port stays its caller's while nothing listens on it (its process
    /// is down for a restart): no later call in this process returns it.
    /// Without the registry 1,400 draws from ~22,000 ports would
    /// repeat one (birthday bound), so this fails if the registry is gone.
    #[test]
    fn no_port_is_handed_out_twice_in_one_process() {
        let mut seen = BTreeSet::new();
        for _ in 0..200 {
            for p in free_ports(4) {
                assert!(seen.insert(p), "port {p} handed out twice");
            }
            let base = free_port_block(3);
            for p in base..base + 3 {
                assert!(seen.insert(p), "port {p} (in a block) handed out twice");
            }
        }
    }

    #[test]
    fn port_blocks_are_free_and_not_ephemeral() {
        let below = ephemeral_start().unwrap_or(32_768);
        for count in [1, 8] {
            let base = free_port_block(count);
            assert!(
                base >= POOL_START && base + count as u16 <= below,
                "{base}+{count}"
            );
        }
    }
}
