//! [`ReplicationFlags`]: the replication flags of a cluster's processes
//! (moved out of `cluster.rs` unchanged).

/// The replication flags of a cluster's processes, built in one place for
/// the harness and the test fixtures: none at all at replication factor 1
/// (min 1), so an unreplicated cluster runs with no replication flag.
#[derive(Clone, Copy, Debug)]
pub struct ReplicationFlags {
    pub replication_factor: u8,
    pub min_in_sync: u8,
    /// The nodes' `--lease-margin-ms`: the manager promotes once a dead
    /// primary's lease has been gone from the store this long.
    pub node_lease_margin_ms: u64,
    pub replica_lag_timeout_ms: u64,
    pub replica_read_lease_ms: u64,
    /// The nodes' `--replica-stream-window-calls` (calls each stream keeps
    /// in flight).
    pub replica_stream_window_calls: u64,
}

impl ReplicationFlags {
    /// Keyspace 0's bootstrap flags (`keyway meta`, or `keyway server
    /// --bootstrap-nodes` on etcd).
    pub fn bootstrap(&self) -> Vec<String> {
        if self.replication_factor <= 1 && self.min_in_sync <= 1 {
            return Vec::new();
        }
        vec![
            "--replication-factor".into(),
            self.replication_factor.to_string(),
            "--min-in-sync".into(),
            self.min_in_sync.to_string(),
        ]
    }

    /// `keyway manager`'s flags.
    pub fn manager(&self) -> Vec<String> {
        if self.replication_factor <= 1 {
            return Vec::new();
        }
        vec![
            "--failover-margin-ms".into(),
            self.node_lease_margin_ms.to_string(),
        ]
    }

    /// `keyway server`'s flags.
    pub fn node(&self) -> Vec<String> {
        if self.replication_factor <= 1 {
            return Vec::new();
        }
        vec![
            "--replica-lag-timeout-ms".into(),
            self.replica_lag_timeout_ms.to_string(),
            "--replica-read-lease-ms".into(),
            self.replica_read_lease_ms.to_string(),
            "--replica-stream-window-calls".into(),
            self.replica_stream_window_calls.to_string(),
        ]
    }
}
