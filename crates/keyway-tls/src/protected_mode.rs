//! Protected mode, Redis's rule: while `protected_mode` is on and the
//! default user has no password, only loopback clients are served.
//!
//! A client connecting from any other address (not 127.0.0.0/8, not `::1`,
//! nor an IPv4-mapped loopback address on a dual-stack socket) is sent
//! Redis 7.0.15's exact `-DENIED` error ([`DENIED`], captured from a real
//! `redis-server --protected-mode yes --bind 0.0.0.0` reached from a
//! network namespace) and the connection is closed before any request is
//! read. The node (its client and replica endpoint listeners, plain and
//! TLS) and the proxy share this file; each has one
//! `protected_mode_refuses(peer)` that says whether "the default user has
//! no password" holds for it, so that condition lives in one place.

use std::net::{IpAddr, SocketAddr};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Redis 7.0.15's reply to a refused connection, byte for byte (its typo
/// "Setup a an" included).
pub const DENIED: &str = "-DENIED Redis is running in protected mode because protected mode is enabled and no password is set for the default user. In this mode connections are only accepted from the loopback interface. If you want to connect from external computers to Redis you may adopt one of the following solutions: 1) Just disable protected mode sending the command 'CONFIG SET protected-mode no' from the loopback interface by connecting to Redis from the same host the server is running, however MAKE SURE Redis is not publicly accessible from internet if you do so. Use CONFIG REWRITE to make this change permanent. 2) Alternatively you can just disable the protected mode by editing the Redis configuration file, and setting the protected mode option to 'no', and then restarting the server. 3) If you started the server manually just for testing, restart it with the '--protected-mode no' option. 4) Setup a an authentication password for the default user. NOTE: You only need to do one of the above things in order for the server to start accepting connections from the outside.\r\n";

/// Whether `peer` is a loopback client: 127.0.0.0/8, `::1`, or an
/// IPv4-mapped loopback address (`::ffff:127.x.y.z`, a dual-stack listener).
pub fn is_loopback(peer: SocketAddr) -> bool {
    match peer.ip() {
        IpAddr::V4(ip) => ip.is_loopback(),
        IpAddr::V6(ip) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Redis's rule: refused when protected mode is on, the default user has
/// no password, and the client is not on the loopback interface.
pub fn refuses(protected_mode: bool, default_user_has_password: bool, peer: SocketAddr) -> bool {
    protected_mode && !default_user_has_password && !is_loopback(peer)
}

/// Sends [`DENIED`] and closes the connection.
pub async fn deny<S: AsyncWrite + Unpin>(stream: &mut S) {
    let _ = stream.write_all(DENIED.as_bytes()).await;
    let _ = stream.flush().await;
    let _ = stream.shutdown().await;
}

/// Parses Redis's `yes` / `no` (the `--protected-mode` flag).
pub fn parse_yes_no(s: &str) -> Result<bool, String> {
    match s {
        "yes" => Ok(true),
        "no" => Ok(false),
        other => Err(format!("expected yes or no, got '{other}'")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_non_loopback_clients_without_a_password_are_refused() {
        for local in [
            "127.0.0.1:1",
            "127.9.8.7:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(!refuses(true, false, addr(local)), "{local}");
        }
        for remote in [
            "10.0.0.1:1",
            "192.168.1.2:1",
            "[fe80::1]:1",
            "[::ffff:10.0.0.1]:1",
        ] {
            assert!(refuses(true, false, addr(remote)), "{remote}");
            assert!(
                !refuses(true, true, addr(remote)),
                "{remote} with a password"
            );
            assert!(
                !refuses(false, false, addr(remote)),
                "{remote} protected mode off"
            );
        }
    }

    #[test]
    fn the_reply_is_one_resp_error_line() {
        assert!(DENIED.starts_with("-DENIED Redis is running in protected mode"));
        assert!(DENIED.ends_with("from the outside.\r\n"));
        assert_eq!(DENIED.matches("\r\n").count(), 1);
        assert_eq!(parse_yes_no("yes"), Ok(true));
        assert_eq!(parse_yes_no("no"), Ok(false));
        assert!(parse_yes_no("maybe").is_err());
    }
}
