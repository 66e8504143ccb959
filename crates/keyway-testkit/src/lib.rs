//! Process harness pieces for Keyway's tests: free loopback ports, child
//! processes that can be paused and killed, and real `etcd` clusters.
//!
//! Everything here runs real processes on 127.0.0.1 only, and every wait is
//! a poll of a condition with a deadline ([`wait_until`]), never a sleep
//! standing in for one. Nothing is left behind: a [`Proc`] kills its process
//! when dropped, an [`EtcdCluster`] kills its members and removes its
//! temporary directory.
//!
//! This crate is not published; it is a dev-dependency of the crates whose
//! tests need it. Its API is blocking (std only): call it from a test
//! thread, or from `tokio::task::spawn_blocking` inside an async test when
//! other tasks must keep running meanwhile.
//!
//! # Layout
//! - `error.rs`: [`HarnessError`]: what can go wrong starting or driving a
//!   process (binary missing, I/O, a wait that timed out with the log tail).
//! - `wait.rs`: [`wait_until`]: poll a probe until it yields, or time out.
//! - `ports.rs`: [`free_ports`]: distinct ports currently free on 127.0.0.1,
//!   outside the kernel's ephemeral range; [`free_port_block`]: consecutive ones.
//! - `proc.rs`: [`Proc`]: a child process with `pause` (SIGSTOP), `resume`
//!   (SIGCONT), `kill9` (SIGKILL) and kill-on-drop; signals are sent with
//!   the `kill` command, so there is no unsafe code and no libc dependency.
//! - `etcd.rs`: [`EtcdCluster`]: 1 or 3 (any n) real `etcd` members on free
//!   ports with test timings, each with its own data directory and log file
//!   in one temporary directory; kill, pause and restart single members.
//!   A tether process kills the members and removes the directory when the
//!   test process ends without dropping the cluster (e.g. one shared through
//!   a `static`), so no etcd outlives its test binary.
//!   [`etcd_binary`] finds `etcd` (or fails naming `scripts/setup.sh`).

mod error;
mod etcd;
mod ports;
mod proc;
mod wait;

pub use error::HarnessError;
pub use etcd::{
    ELECTION_TIMEOUT_MS, EtcdCluster, HEARTBEAT_INTERVAL_MS, START_DEADLINE, etcd_binary,
};
pub use ports::{free_port_block, free_ports};
pub use proc::Proc;
pub use wait::{eventually, wait_until};
