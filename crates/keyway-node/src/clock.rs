//! Time, behind a trait so a simulated cluster can run on a virtual clock.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Wall time for expiry (unix milliseconds) and monotonic time for leases.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the unix epoch (used for key expiry, like Redis).
    fn unix_ms(&self) -> u64;
    /// A monotonic instant (used for lease deadlines; never goes back).
    fn now(&self) -> Instant;
}

/// The operating system's clocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn unix_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
    fn now(&self) -> Instant {
        Instant::now()
    }
}
