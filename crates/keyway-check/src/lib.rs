//! Client histories and the checkers that judge them.
//!
//! A nemesis run records every operation its clients issue as an
//! [`Event`]: what was asked, when it was invoked, when (if ever) it
//! completed, and its [`Outcome`]. The checkers in this crate decide from
//! that record alone whether the store behaved like one copy of a map of
//! registers, with no knowledge of how the store is built.

pub mod history;

pub use history::{Event, History, HistoryError, Op, Outcome, Reply};
