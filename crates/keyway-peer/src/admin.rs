//! The admin port's listener, shared by the node (which serves the `Peer`
//! service there) and the manager.

/// `listener` with `TCP_NODELAY` on every accepted connection. HTTP/2 (the
/// `Peer` gRPC service) writes a reply as several small frames; with Nagle's
/// algorithm the second waits for the peer's delayed ACK, up to 40 ms, on
/// every call — measured here as 40 ms added to each migration's cutover
/// pause (the wait for the target's view) before this was set.
pub fn nodelay(
    listener: tokio::net::TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = std::net::SocketAddr> {
    use axum::serve::ListenerExt;
    listener.tap_io(|tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(%err, "cannot set TCP_NODELAY");
        }
    })
}
