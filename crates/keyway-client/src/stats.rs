//! The client's routing counters: one atomic each, so counting never takes
//! a lock and [`crate::Client::stats`] is a handful of loads.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Counters a client keeps about its own routing (see the crate docs,
        /// "Counters"). All count from the client's start; take two snapshots
        /// and [`ClientStats::since`] for what happened in between.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct ClientStats {
            $( $(#[$doc])* pub $name: u64, )*
        }

        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $( pub(crate) $name: AtomicU64, )*
        }

        impl Counters {
            pub(crate) fn snapshot(&self) -> ClientStats {
                ClientStats { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }
    };
}

counters! {
    /// Logical requests: one per routed call (`get`, `set`, `command`,
    /// `kw_*`, each slot group of a salted read), however many sends it took.
    requests,
    /// Data requests sent to nodes: the first send of each request plus
    /// every retry.
    sends,
    /// Rejections of every kind (`kwmoved + kwreads + moved + clusterdown`).
    rejections,
    /// `-KWMOVED`: the partition is not at that epoch on that node; the
    /// reply carries the node's record of it.
    rejections_kwmoved,
    /// `-KWREADS`: the owner sends this partition's reads to its
    /// `reads_from` replica (reads switched ahead of writes).
    rejections_kwreads,
    /// `-MOVED slot host:port` (a request without an epoch sent to a node
    /// that does not own the slot).
    rejections_moved,
    /// `-CLUSTERDOWN` (lease lapsed, slot not served, cutover fence) and any
    /// other rejection the client cannot patch from.
    rejections_clusterdown,
    /// Connection errors and timeouts talking to a node.
    io_errors,
    /// Requests that failed after they were written and are not safe to run
    /// twice: answered with [`crate::ClientError::UnknownOutcome`].
    unknown_outcomes,
    /// Map refreshes that completed (`refreshes_full + refreshes_delta`).
    refreshes,
    /// Refreshes answered with the whole map (`KW.MAP`, or `KW.MAP SINCE`
    /// beyond the node's history).
    refreshes_full,
    /// Refreshes answered with a delta (`KW.MAP SINCE`), empty ones included.
    refreshes_delta,
    /// Callers that needed a refresh but found one that started after they
    /// routed (running or finished) and used it instead (single flight).
    refreshes_coalesced,
    /// Refreshes skipped because the last one began less than
    /// `min_refresh_interval_ms` ago; the rejection was patched in instead.
    refreshes_suppressed,
    /// Cache entries patched from a rejection's record.
    patches,
    /// Round trips beyond one per request: every send after a request's
    /// first, plus every map request sent to a node (refresh round trips).
    extra_round_trips,
    /// Reads sent to a partition's `reads_from` replica (plain, `READONLY`)
    /// instead of its owner.
    reads_from_sends,
    /// Of those, reads the replica refused (`-MOVED`): sent to the owner
    /// instead (plain) and the map refreshed.
    reads_from_fallbacks,
    /// The cached map's version (the last refreshed map's; patches do not
    /// change it).
    map_version,
    /// Map version lag: how many versions the latest refresh advanced the
    /// cache by, i.e. how far behind the cluster the cache was when it found
    /// out (0 for an empty delta).
    version_lag_last,
    /// The largest version lag any refresh closed.
    version_lag_max,
    /// The sum of every refresh's version lag (mean: this / `refreshes`).
    version_lag_total,
}

impl ClientStats {
    /// What happened between `earlier` and `self`: the counters subtracted;
    /// `map_version`, `version_lag_last` and `version_lag_max` are `self`'s.
    pub fn since(&self, earlier: &ClientStats) -> ClientStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        ClientStats {
            requests: d(self.requests, earlier.requests),
            sends: d(self.sends, earlier.sends),
            rejections: d(self.rejections, earlier.rejections),
            rejections_kwmoved: d(self.rejections_kwmoved, earlier.rejections_kwmoved),
            rejections_kwreads: d(self.rejections_kwreads, earlier.rejections_kwreads),
            rejections_moved: d(self.rejections_moved, earlier.rejections_moved),
            rejections_clusterdown: d(self.rejections_clusterdown, earlier.rejections_clusterdown),
            io_errors: d(self.io_errors, earlier.io_errors),
            unknown_outcomes: d(self.unknown_outcomes, earlier.unknown_outcomes),
            refreshes: d(self.refreshes, earlier.refreshes),
            refreshes_full: d(self.refreshes_full, earlier.refreshes_full),
            refreshes_delta: d(self.refreshes_delta, earlier.refreshes_delta),
            refreshes_coalesced: d(self.refreshes_coalesced, earlier.refreshes_coalesced),
            refreshes_suppressed: d(self.refreshes_suppressed, earlier.refreshes_suppressed),
            patches: d(self.patches, earlier.patches),
            extra_round_trips: d(self.extra_round_trips, earlier.extra_round_trips),
            reads_from_sends: d(self.reads_from_sends, earlier.reads_from_sends),
            reads_from_fallbacks: d(self.reads_from_fallbacks, earlier.reads_from_fallbacks),
            map_version: self.map_version,
            version_lag_last: self.version_lag_last,
            version_lag_max: self.version_lag_max,
            version_lag_total: d(self.version_lag_total, earlier.version_lag_total),
        }
    }
}

impl Counters {
    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one rejection of the kind `counter` names.
    pub(crate) fn rejected(&self, counter: &AtomicU64) {
        Self::inc(&self.rejections);
        Self::inc(counter);
    }

    /// A refresh completed, taking the cache from version `from` to `to`.
    pub(crate) fn refreshed(&self, full: bool, from: u64, to: u64) {
        Self::inc(&self.refreshes);
        Self::inc(if full {
            &self.refreshes_full
        } else {
            &self.refreshes_delta
        });
        let lag = to.saturating_sub(from);
        self.version_lag_last.store(lag, Ordering::Relaxed);
        self.version_lag_max.fetch_max(lag, Ordering::Relaxed);
        self.version_lag_total.fetch_add(lag, Ordering::Relaxed);
        self.map_version.store(to, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_subtracts_counters_and_keeps_gauges() {
        let c = Counters::default();
        c.rejected(&c.rejections_kwmoved);
        c.refreshed(false, 3, 10);
        let before = c.snapshot();
        c.rejected(&c.rejections_clusterdown);
        c.refreshed(true, 10, 12);
        Counters::inc(&c.requests);
        let now = c.snapshot();
        assert_eq!((now.rejections, now.refreshes), (2, 2));
        let d = now.since(&before);
        assert_eq!((d.rejections, d.rejections_kwmoved), (1, 0));
        assert_eq!((d.rejections_clusterdown, d.requests), (1, 1));
        assert_eq!((d.refreshes_full, d.refreshes_delta), (1, 0));
        assert_eq!((d.map_version, d.version_lag_last), (12, 2));
        assert_eq!((d.version_lag_max, d.version_lag_total), (7, 2));
    }
}
