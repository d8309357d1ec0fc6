//! The hints this server delivered since the last flush, coalesced per
//! engine replica: what bus mode shares with the other server replicas
//! (`replicate/load_share.rs`) so their load estimates count them too.
//!
//! The lookup path only [`DeliveryLog::record`]s: one uncontended-in-practice
//! mutex around a map keyed by the index's own `Arc<str>` replica names (a
//! refcount, never a copy), updated in place. The publisher swaps the whole
//! map out with an empty one that has kept its capacity, so once every
//! replica has been seen in both maps a lookup allocates nothing, and the
//! map can never hold more than the replicas delivered to in one interval.
//! Nothing here touches the bus: a slow or dead bus only makes the publisher
//! drop what it took (counted there), never a lookup wait.
//! Off (the default, and without a bus) `record` is one relaxed load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

/// One engine replica's deliveries within an interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Coalesced {
    /// Hints delivered.
    pub hints: u32,
    /// Their estimated prefill work, summed, µs.
    pub work_us: f64,
    /// First delivery, Unix ns.
    pub first_ns: i64,
    /// Last delivery, Unix ns.
    pub last_ns: i64,
}

/// Deliveries by replica name.
pub type DeliveryMap = HashMap<Arc<str>, Coalesced>;

#[derive(Default)]
struct Inner {
    enabled: AtomicBool,
    /// Something was recorded since the publisher last took the map.
    dirty: AtomicBool,
    pending: Mutex<DeliveryMap>,
    wake: Notify,
}

/// Shared handle (cheap to clone); disabled until bus mode enables it.
#[derive(Clone, Default)]
pub struct DeliveryLog(Arc<Inner>);

impl std::fmt::Debug for DeliveryLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryLog")
            .field("enabled", &self.is_enabled())
            .finish_non_exhaustive()
    }
}

impl DeliveryLog {
    /// Starts recording (bus mode with load sharing on).
    pub fn enable(&self) {
        self.0.enabled.store(true, Ordering::Release);
    }

    /// Whether deliveries are recorded.
    pub fn is_enabled(&self) -> bool {
        self.0.enabled.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, DeliveryMap> {
        // A poisoned map is still a map of counts: keep going.
        self.0.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A hint for `work_us` of prefill was delivered to `replica` at
    /// `now_ns`. Never blocks on the bus and, in steady state, never
    /// allocates (module docs).
    pub fn record(&self, replica: &Arc<str>, work_us: f64, now_ns: i64) {
        if !self.is_enabled() {
            return;
        }
        let work = if work_us.is_finite() {
            work_us.max(0.0)
        } else {
            0.0
        };
        {
            let mut map = self.lock();
            match map.get_mut(&**replica) {
                Some(c) => {
                    c.hints = c.hints.saturating_add(1);
                    c.work_us += work;
                    c.first_ns = c.first_ns.min(now_ns);
                    c.last_ns = c.last_ns.max(now_ns);
                }
                None => {
                    map.insert(
                        Arc::clone(replica),
                        Coalesced {
                            hints: 1,
                            work_us: work,
                            first_ns: now_ns,
                            last_ns: now_ns,
                        },
                    );
                }
            }
        }
        if !self.0.dirty.swap(true, Ordering::AcqRel) {
            self.0.wake.notify_one();
        }
    }

    /// Waits until something was recorded since the last [`Self::take`].
    pub async fn wait_recorded(&self) {
        loop {
            // `notify_one` stores a permit when nobody waits, so a record
            // between the check and the wait is not missed.
            let woken = self.0.wake.notified();
            if self.0.dirty.load(Ordering::Acquire) {
                return;
            }
            woken.await;
        }
    }

    /// Swaps the recorded deliveries out: `into` (emptied by the caller,
    /// capacity kept) becomes the live map and receives what was recorded.
    pub fn take(&self, into: &mut DeliveryMap) {
        into.clear();
        self.0.dirty.store(false, Ordering::Release);
        std::mem::swap(&mut *self.lock(), into);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_coalesce_per_replica_and_take_swaps_them_out() {
        let log = DeliveryLog::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        log.record(&a, 10.0, 5);
        assert!(
            !log.0.dirty.load(Ordering::Relaxed),
            "off: nothing recorded"
        );
        log.enable();
        log.record(&a, 10.0, 5);
        log.record(&a, 5.0, 3);
        log.record(&b, f64::NAN, 9);
        let mut got = DeliveryMap::new();
        log.take(&mut got);
        assert_eq!(
            got.get("a"),
            Some(&Coalesced {
                hints: 2,
                work_us: 15.0,
                first_ns: 3,
                last_ns: 5
            })
        );
        assert_eq!(got.get("b").map(|c| (c.hints, c.work_us)), Some((1, 0.0)));
        let mut again = got;
        log.take(&mut again);
        assert!(again.is_empty());
    }

    #[tokio::test]
    async fn a_record_wakes_the_publisher() {
        let log = DeliveryLog::default();
        log.enable();
        let waiter = {
            let log = log.clone();
            tokio::spawn(async move { log.wait_recorded().await })
        };
        log.record(&Arc::from("a"), 1.0, 1);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("joined");
    }
}
