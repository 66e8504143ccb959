//! Client histories and the checkers that judge them.
//!
//! A nemesis run records every operation its clients issue as an
//! [`Event`]: what was asked, when it was invoked, when (if ever) it
//! completed, and its [`Outcome`]. The checkers in this crate decide from
//! that record alone whether the store behaved like one copy of a map of
//! registers, with no knowledge of how the store is built.
//!
//! - [`history`]: the record and its JSON-lines form.
//! - [`model`]: one key as a Redis string register (SET/GET/DEL/INCR/APPEND).
//! - [`project`]: a history split per key (MSET/MGET to SET/GET), and why
//!   checking each key is sound.
//! - [`linear`]: the per-key Wing–Gong/Lowe linearizability search, with a
//!   step budget.
//! - [`violation`]: a violation report and its text.
//! - [`totals`]: lost acknowledged writes, double-applied INCRs, stale
//!   reads, torn MGETs.
//! - [`report`]: [`check`] (all of the above), the one-line summary, the
//!   small failing-history file, [`check_file`].

pub mod history;
pub mod linear;
pub mod model;
pub mod project;
pub mod report;
pub mod totals;
mod unknowns;
pub mod violation;

pub use history::{Event, History, HistoryError, Op, Outcome, Reply};
pub use linear::{SearchOptions, Verdict, Violation};
pub use report::{
    CheckOptions, CheckReport, FailureFiles, KeyResult, OptionsError, OutcomeCounts, check,
    check_file,
};
pub use totals::{Finding, FindingKind, Totals};
