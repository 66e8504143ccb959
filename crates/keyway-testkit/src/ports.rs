//! [`free_ports`]: loopback ports nobody is listening on right now.

use std::net::TcpListener;

/// Lowest port [`free_ports`] picks from.
const POOL_START: u16 = 10_000;

/// `n` distinct TCP ports currently free on 127.0.0.1.
///
/// They are picked at random below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`, 32768.. by default), so an
/// outgoing connection can never be given one of them: not between this
/// call and the caller's bind, and not while a process that owns one is
/// down for a restart. Each is checked by binding it (all at once, then
/// released). Falls back to ports the OS assigns if that range is too small.
///
/// # Panics
/// If the OS cannot bind a loopback listener at all.
pub fn free_ports(n: usize) -> Vec<u16> {
    let below = ephemeral_start().unwrap_or(32_768);
    if below > POOL_START + 1_000 {
        let mut held = Vec::with_capacity(n);
        let mut ports: Vec<u16> = Vec::with_capacity(n);
        for _ in 0..n * 50 {
            if ports.len() == n {
                break;
            }
            let port = rand::random_range(POOL_START..below);
            if ports.contains(&port) {
                continue;
            }
            if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
                held.push(listener);
                ports.push(port);
            }
        }
        if ports.len() == n {
            return ports;
        }
    }
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free port on 127.0.0.1"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("local address").port())
        .collect()
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
    for _ in 0..1_000 {
        let base = rand::random_range(POOL_START..below - count);
        let held: Option<Vec<TcpListener>> = (0..count)
            .map(|i| TcpListener::bind(("127.0.0.1", base + i)).ok())
            .collect();
        if held.is_some() {
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
