//! [`wait_until`] (blocking) and [`eventually`] (async): the two ways
//! Keyway's tests wait for a condition.

use crate::HarnessError;
use std::time::{Duration, Instant};

/// How long [`wait_until`] pauses between two probes.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Polls `probe` until it returns `Some`, or fails with
/// [`HarnessError::Timeout`] naming `what` once `within` has passed. The
/// probe runs at least once, and once more at the deadline.
pub fn wait_until<T>(
    what: &str,
    within: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Result<T, HarnessError> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe() {
            return Ok(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(HarnessError::Timeout {
                what: what.to_string(),
                after: within,
                log_tail: String::new(),
            });
        }
        std::thread::sleep(POLL_INTERVAL.min(deadline - now));
    }
}

/// Polls the async `probe` every 10 ms until it returns `Some`, and panics
/// naming `what` once `within` has passed: the async tests' one way to wait.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
