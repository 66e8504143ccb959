//! The live dashboard on the manager's admin port: `GET /ui` serves one
//! self-contained page (`ui/index.html`, inline CSS and JS, no external
//! assets, so it works with no internet) that polls `GET /ui/state` about
//! once a second and draws the partition map as a heat map (a column per
//! node, a cell per partition coloured by requests/s or bytes, hot keys on
//! hover), the nodes (state, lease, weight, drain), migrations and copies
//! with progress bars and ETAs from observed progress, the latest
//! decisions, and the skew ratio over time as a sparkline.
//!
//! The page fetches only same-origin relative URLs, so whatever guards the
//! admin router (credentials a browser can send) guards the dashboard too.
//!
//! - `ui/state.rs`: the `/ui/state` document (pure, tested).
//! - `ui/skew.rs`: [`SkewHistory`], the bounded ring of skew samples
//!   (`ui_skew_history_samples`), fed by every load round.

pub mod skew;
pub mod state;

use crate::decisions::DecisionLog;
use crate::driver::DriverView;
use crate::metrics::Metrics;
use crate::monitor::LoadReceiver;
use crate::replication::ReplicationStatus;
use crate::seat::SeatView;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use keyway_meta::MetaStore;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
pub use skew::{SkewHistory, SkewSample};
use std::sync::Arc;

/// The page, embedded at build time.
pub const INDEX_HTML: &str = include_str!("ui/index.html");

/// The largest accepted `ui_skew_history_samples`.
pub const MAX_SKEW_HISTORY_SAMPLES: usize = 100_000;

/// Settings of the dashboard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UiConfig {
    /// Skew samples kept for the sparkline (one per load round; the
    /// oldest goes first), 1..=[`MAX_SKEW_HISTORY_SAMPLES`].
    pub skew_history_samples: usize,
}

impl Default for UiConfig {
    fn default() -> Self {
        UiConfig {
            skew_history_samples: 360,
        }
    }
}

impl UiConfig {
    /// Checks every field; the error names the setting.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_SKEW_HISTORY_SAMPLES).contains(&self.skew_history_samples) {
            return Err(format!(
                "ui_skew_history_samples must be 1..={MAX_SKEW_HISTORY_SAMPLES}, got {}",
                self.skew_history_samples
            ));
        }
        Ok(())
    }
}

/// The dashboard's metrics.
#[derive(Clone)]
struct UiMetrics {
    /// `/ui/state` documents served.
    served: Counter,
    /// `/ui/state` requests answered 503 (the map could not be read).
    unavailable: Counter,
    /// Parts left out of a served document because they could not be read.
    partial: Counter,
    /// Samples in the skew ring.
    skew_samples: Gauge,
}

impl UiMetrics {
    fn register(metrics: &Metrics) -> Self {
        let m = UiMetrics {
            served: Counter::default(),
            unavailable: Counter::default(),
            partial: Counter::default(),
            skew_samples: Gauge::default(),
        };
        metrics.register(
            "ui_state_served",
            "Dashboard /ui/state documents served",
            m.served.clone(),
        );
        metrics.register(
            "ui_state_unavailable",
            "Dashboard /ui/state requests answered 503 because the map could not be read",
            m.unavailable.clone(),
        );
        metrics.register(
            "ui_state_partial",
            "Dashboard /ui/state documents served with a part left out (leases or migrations unreadable)",
            m.partial.clone(),
        );
        metrics.register(
            "ui_skew_history_samples",
            "Skew samples kept for the dashboard's sparkline",
            m.skew_samples.clone(),
        );
        m
    }
}

/// Everything the dashboard reads (cheap to clone).
#[derive(Clone)]
pub struct Ui {
    meta: Arc<dyn MetaStore>,
    seat: SeatView,
    migrations: DriverView,
    decisions: DecisionLog,
    load: LoadReceiver,
    replication: ReplicationStatus,
    copies: crate::copies::CopyTracker,
    skew: SkewHistory,
    metrics: UiMetrics,
}

impl Ui {
    /// A dashboard over the manager's read handles; starts the task that
    /// keeps the skew history (it ends when the load monitor stops).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        config: &UiConfig,
        meta: Arc<dyn MetaStore>,
        seat: SeatView,
        migrations: DriverView,
        decisions: DecisionLog,
        load: LoadReceiver,
        replication: ReplicationStatus,
        copies: crate::copies::CopyTracker,
        metrics: &Metrics,
    ) -> (Ui, tokio::task::JoinHandle<()>) {
        let skew = SkewHistory::new(config.skew_history_samples);
        let task = skew.follow(load.clone());
        let ui = Ui {
            meta,
            seat,
            migrations,
            decisions,
            load,
            replication,
            copies,
            skew,
            metrics: UiMetrics::register(metrics),
        };
        (ui, task)
    }

    /// The skew samples kept, oldest first.
    pub fn skew_history(&self) -> Vec<SkewSample> {
        self.skew.samples()
    }

    /// Reads everything and builds the document; `Err` when the map
    /// cannot be read (nothing useful to draw without it).
    pub async fn state(&self) -> Result<state::UiState, keyway_meta::MetaError> {
        let map = self.meta.get_map().await?;
        let mut errors = Vec::new();
        let leases = match self.meta.leases().await {
            Ok(l) => Some(l),
            Err(e) => {
                errors.push(format!("leases: {e}"));
                None
            }
        };
        let migrations = match self.migrations.migrations().await {
            Ok(m) => Some(m),
            Err(e) => {
                errors.push(format!("migrations: {e}"));
                None
            }
        };
        let load = self.load.borrow().clone();
        let copies = self.copies.list();
        let replication = self.replication.get();
        let samples = self.skew.samples();
        self.metrics.skew_samples.set(samples.len() as i64);
        Ok(state::build(state::Inputs {
            now_unix_ms: crate::driver::now_ms(),
            manager: state::ManagerRow {
                name: self.seat.name().to_string(),
                leading: self.seat.leading().is_some(),
                leader: self.seat.leader(),
                lease_remaining_ms: self.seat.lease_remaining().as_millis() as u64,
            },
            map: &map,
            leases: leases.as_deref(),
            load: load.as_deref(),
            migrations: migrations.as_deref(),
            copies: &copies,
            replication: &replication,
            decisions: self.decisions.recent(),
            skew_limit: self.skew.capacity(),
            skew_samples: samples,
            errors,
        }))
    }
}

/// The dashboard's routes: `/ui` (the page) and `/ui/state` (its JSON).
pub fn router(ui: Ui) -> Router {
    Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/state", get(state_json))
        .with_state(ui)
}

async fn index() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        INDEX_HTML,
    )
}

async fn state_json(State(ui): State<Ui>) -> Response {
    match ui.state().await {
        Ok(doc) => {
            ui.metrics.served.inc();
            if !doc.errors.is_empty() {
                ui.metrics.partial.inc();
            }
            ([(header::CACHE_CONTROL, "no-store")], Json(doc)).into_response()
        }
        Err(err) => {
            ui.metrics.unavailable.inc();
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({ "error": format!("the map could not be read: {err}") })),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_length_is_validated_with_the_setting_named() {
        assert!(UiConfig::default().validate().is_ok());
        let bad = UiConfig {
            skew_history_samples: 0,
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .contains("ui_skew_history_samples")
        );
    }

    #[test]
    fn the_page_is_self_contained() {
        // No external assets: nothing is loaded from another origin (the
        // SVG namespace is a name, not a fetch).
        let page = INDEX_HTML.replace("'http://www.w3.org/2000/svg'", "");
        for needle in ["http://", "https://", "<link", "src=", "@import", "url("] {
            assert!(
                !page.contains(needle),
                "index.html must not reference {needle}"
            );
        }
        assert!(page.contains("fetch(STATE_URL"));
    }
}
