//! Writers that SET until the engine under them crashes, keeping the keys
//! that were acknowledged (the crash tests' workload).

use keyway_client::Client;
use keyway_testkit::eventually;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;

/// `writers` tasks, each setting `key(w, i)` to `value(i)` for i = 0, 1, …
/// until a write fails or [`CrashWriters::stop`].
pub struct CrashWriters {
    acked_count: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<Vec<String>>>,
}

impl CrashWriters {
    pub fn start(
        client: Arc<Client>,
        writers: usize,
        key: impl Fn(usize, u64) -> String + Send + Sync + 'static,
        value: fn(u64) -> String,
    ) -> Self {
        let acked_count = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let key = Arc::new(key);
        let handles = (0..writers)
            .map(|w| {
                let client = client.clone();
                let acked_count = acked_count.clone();
                let stop = stop.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    let mut acked = Vec::new();
                    for i in 0.. {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let key = key(w, i);
                        match client.set(key.as_bytes(), value(i).as_bytes()).await {
                            Ok(()) => {
                                acked.push(key);
                                acked_count.fetch_add(1, Ordering::SeqCst);
                            }
                            // The engine crashed under this write: stop.
                            Err(_) => break,
                        }
                    }
                    acked
                })
            })
            .collect();
        CrashWriters {
            acked_count,
            stop,
            handles,
        }
    }

    /// Waits until `n` writes were acknowledged.
    pub async fn wait_acked(&self, n: usize, within: Duration) {
        eventually("writes acknowledged before the crash", within, || {
            let acked = self.acked_count.load(Ordering::SeqCst);
            async move { (acked >= n).then_some(()) }
        })
        .await;
    }

    /// Every acknowledged key, after each writer's write in flight was
    /// answered: nothing is acknowledged after this returns.
    pub async fn stop(self) -> Vec<String> {
        self.stop.store(true, Ordering::SeqCst);
        self.join().await
    }

    /// Every acknowledged key, once each writer stopped.
    pub async fn join(self) -> Vec<String> {
        let mut acked = Vec::new();
        for h in self.handles {
            acked.extend(h.await.unwrap());
        }
        acked
    }
}
