//! The skew ratio over time, for the dashboard's sparkline: one sample per
//! load round (busiest over mean, by requests/s and by bytes, as
//! [`crate::monitor::Skew`] computes it), kept in a bounded ring of
//! `ui_skew_history_samples` (the oldest sample goes first). Memory only:
//! a manager that starts leading starts an empty history.

use crate::monitor::{LoadReceiver, Skew, node_loads};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// One load round's skew.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SkewSample {
    /// When the round was taken, wall-clock ms since the Unix epoch.
    pub at_unix_ms: u64,
    pub map_version: u64,
    pub requests_ratio: f64,
    pub bytes_ratio: f64,
}

/// The bounded ring (cheap to clone).
#[derive(Clone)]
pub struct SkewHistory {
    inner: Arc<Mutex<VecDeque<SkewSample>>>,
    capacity: usize,
}

impl SkewHistory {
    /// An empty ring keeping at most `capacity` samples (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        SkewHistory {
            inner: Arc::new(Mutex::new(VecDeque::with_capacity(capacity.min(4096)))),
            capacity,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Adds a sample, dropping the oldest one when full.
    pub fn push(&self, sample: SkewSample) {
        let mut ring = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        while ring.len() >= self.capacity {
            ring.pop_front();
        }
        ring.push_back(sample);
    }

    /// The kept samples, oldest first.
    pub fn samples(&self) -> Vec<SkewSample> {
        let ring = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        ring.iter().copied().collect()
    }

    /// Follows the load monitor: one sample per published round (a cleared
    /// round, when this manager stops leading, adds nothing).
    pub fn follow(&self, mut rx: LoadReceiver) -> tokio::task::JoinHandle<()> {
        let history = self.clone();
        tokio::spawn(async move {
            loop {
                let round = rx.borrow_and_update().clone();
                if let Some(snapshot) = round {
                    let skew = Skew::of(&node_loads(&snapshot.map, &snapshot.load));
                    let now_ms = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    let age_ms = snapshot.taken_at.elapsed().as_millis() as u64;
                    history.push(SkewSample {
                        at_unix_ms: now_ms.saturating_sub(age_ms),
                        map_version: snapshot.map.version.0,
                        requests_ratio: skew.requests_ratio,
                        bytes_ratio: skew.bytes_ratio,
                    });
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: u64) -> SkewSample {
        SkewSample {
            at_unix_ms: at,
            map_version: at,
            requests_ratio: 1.0,
            bytes_ratio: 1.5,
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_samples_up_to_its_capacity() {
        let h = SkewHistory::new(3);
        for at in 1..=5 {
            h.push(sample(at));
        }
        let kept: Vec<u64> = h.samples().iter().map(|s| s.at_unix_ms).collect();
        assert_eq!(kept, vec![3, 4, 5]);
        assert_eq!(h.capacity(), 3);
    }
}
