//! The fault-injecting harness behind `keyway nemesis`.
//!
//! One *run* starts a real cluster as separate `keyway` processes (a
//! metadata store, `nodes` servers, two managers), drives a recorded client
//! workload against it, injects faults from a schedule seeded by the run's
//! seed, heals everything, reads every key once more, stops the cluster and
//! judges the recorded [`keyway_check::History`]. Everything it talks to is
//! on 127.0.0.1, or (with the `partition` fault) in network namespaces it
//! creates itself.
//!
//! The seed fixes every choice the harness makes (the fault schedule, the
//! topology churn's picks, each client's operations), so `--seed S` replays
//! a run's schedule; the interleaving with the cluster's own timing is not
//! reproducible and need not be: the history is the evidence.
//!
//! # Layout
//! - `cluster.rs`: [`Cluster`]: the processes (spawn with each stderr to a
//!   log file in the run's directory, wait for the ready line, `kill -9`,
//!   restart with the same data dir and ports, SIGSTOP/SIGCONT, a new
//!   empty node in a lost one's slot), kill-everything-on-drop; `ctl.rs`:
//!   `keyway ctl` calls; `replication_flags.rs`: the processes'
//!   replication flags.
//! - `resp_client.rs`: [`ClusterClient`]: a plain Redis Cluster client over
//!   the raw RESP codec (`CLUSTER SLOTS`, `-MOVED`), telling "certainly not
//!   applied" apart from "unknown".
//! - `workload.rs`: the key set, the operations, the two client drivers
//!   (the smart client and the plain one) and the recorder that turns each
//!   operation into an [`keyway_check::Event`].
//! - `faults.rs`: [`FaultKind`], [`Fault`], the seeded schedule, the
//!   injectors.
//! - `churn.rs`: the topology churn (live moves, splits, merges).
//! - `permanent_loss.rs`: the `permanent-loss` fault (kill and wipe a node,
//!   wait for re-replication, decommission it, start a new empty node).
//! - `netns.rs`: [`Network`]: the bridge, namespaces and veth pairs the
//!   `partition` fault cuts, removed on drop.
//! - `observe.rs`: the map observer: owner changes and failovers
//!   ([`MapChanges`]) seen by polling the map through the run, and each
//!   restarted node's time back to in sync ([`Rejoin`]).
//! - `judge.rs`: [`judge`]: the boundary where the checker plugs in.
//! - `run.rs`: [`RunConfig`] and [`run_one`]: one whole run.
//! - `summary.rs`: [`RunReport`] (one line per run) and [`Totals`].

mod churn;
mod cluster;
mod ctl;
mod faults;
mod judge;
mod netns;
mod observe;
mod permanent_loss;
mod replication_flags;
mod resp_client;
mod run;
mod summary;
mod workload;

pub use cluster::{Cluster, ClusterSpec, MetaKind, ReplicationFlags};
pub use faults::{ChurnKind, Fault, FaultKind, Step, Timings, schedule};
pub use judge::judge_recoveries;
pub use judge::{Verdict, judge};
pub use netns::Network;
pub use observe::{MapChanges, Rejoin};
pub use permanent_loss::{LossRecord, replicated_without};
pub use resp_client::{ClusterClient, Exec};
pub use run::{Progress, RunConfig, run_one};
pub use summary::{RunReport, Totals};

/// What can stop a run from being carried out (as opposed to a run that
/// was carried out and found a violation, which is a failing [`RunReport`]).
#[derive(Debug, thiserror::Error)]
pub enum NemesisError {
    #[error("harness: {0}")]
    Harness(#[from] keyway_testkit::HarnessError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    /// A fault this machine cannot inject (e.g. `partition` without root).
    #[error("{0}")]
    Unavailable(String),
    #[error("history: {0}")]
    History(#[from] keyway_check::HistoryError),
}

impl NemesisError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        NemesisError::Io {
            what: what.into(),
            source,
        }
    }
}
