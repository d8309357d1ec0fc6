//! `/ui/events`: the status page's live feed of index changes as
//! Server-Sent Events.
//!
//! Each client gets a forwarder task between the event hub's broadcast ring
//! and a bounded per-client queue of [`CLIENT_BUFFER`] events. The forwarder
//! drains the ring as fast as the hub fills it and only ever `try_send`s to
//! the client, so a browser that reads slowly (or not at all) loses events
//! (counted in `inferencecache_ui_events_dropped_total` and announced to
//! the client as a `dropped` event once it has room) but never makes ingest
//! wait, and never holds more than its queue.

use super::metrics::UiMetrics;
use crate::events::EventHub;
use crate::events::FeedEvent;
use axum::response::sse::Event;
use inferencecache_proto::v1alpha1::cache_event::Type;
use serde::Serialize;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

/// Events one client may have queued before further events are dropped.
pub(crate) const CLIENT_BUFFER: usize = 256;

/// How often a forwarder checks that the server is still serving (it ends
/// its stream on shutdown so the graceful drain is not held open).
const READY_CHECK: Duration = Duration::from_millis(250);

/// Bytes of a prefix hash shown on the page (enough to tell rows apart).
const PREFIX_SHOWN: usize = 8;

/// What a client's queue carries.
#[derive(Debug)]
enum Item {
    Change(FeedEvent),
    Dropped { dropped: u64, total: u64 },
}

/// One index change as the page reads it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Change<'a> {
    r#type: &'a str,
    replica: &'a str,
    model: &'a str,
    tenant: &'a str,
    adapter: &'a str,
    prefix: String,
    ts_us: i64,
}

/// Keeps the client gauge up while the forwarder lives.
struct ClientGuard(Arc<UiMetrics>);

impl ClientGuard {
    fn new(metrics: Arc<UiMetrics>) -> Self {
        metrics.clients.inc();
        Self(metrics)
    }
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.0.clients.dec();
    }
}

fn hex_prefix(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(PREFIX_SHOWN * 2);
    for b in bytes.iter().take(PREFIX_SHOWN) {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn to_sse(item: &Item) -> Event {
    match item {
        Item::Change(e) => {
            let kind = Type::try_from(e.kind.to_wire()).map_or("UNKNOWN", |t| t.as_str_name());
            let change = Change {
                r#type: kind,
                replica: &e.replica_id,
                model: &e.model,
                tenant: &e.tenant,
                adapter: &e.adapter,
                prefix: hex_prefix(&e.prefix_hash),
                ts_us: e.timestamp_us,
            };
            let data = serde_json::to_string(&change).unwrap_or_default();
            Event::default().event("change").data(data)
        }
        Item::Dropped { dropped, total } => Event::default()
            .event("dropped")
            .data(format!(r#"{{"dropped":{dropped},"total":{total}}}"#)),
    }
}

/// Opens one client's feed: the stream of SSE events for the response body.
/// The first event (`hello`) tells the page its queue size.
pub(crate) fn open(
    hub: &EventHub,
    metrics: Arc<UiMetrics>,
    ready: Arc<AtomicBool>,
) -> impl futures::Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let (tx, rx) = mpsc::channel::<Item>(CLIENT_BUFFER);
    let events = hub.subscribe();
    let guard = ClientGuard::new(metrics);
    tokio::spawn(forward(events, tx, ready, guard));
    let hello = Event::default()
        .event("hello")
        .data(format!(r#"{{"buffer":{CLIENT_BUFFER}}}"#));
    let body = futures::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        Some((Ok(to_sse(&item)), rx))
    });
    futures::StreamExt::chain(futures::stream::once(async { Ok(hello) }), body)
}

/// Moves hub events into one client's queue until the client goes away or
/// the server stops serving.
async fn forward(
    mut events: tokio::sync::broadcast::Receiver<FeedEvent>,
    tx: mpsc::Sender<Item>,
    ready: Arc<AtomicBool>,
    guard: ClientGuard,
) {
    let metrics = Arc::clone(&guard.0);
    // Drops not yet announced to the client, and all of this client's drops.
    let mut unannounced: u64 = 0;
    let mut total: u64 = 0;
    let mut tick = tokio::time::interval(READY_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let next = tokio::select! {
            () = tx.closed() => break,
            _ = tick.tick() => {
                if !ready.load(Ordering::Acquire) {
                    break;
                }
                None
            }
            r = events.recv() => Some(r),
        };
        let change = match next {
            None => None,
            Some(Ok(e)) => Some(e),
            // The forwarder itself fell behind the ring: those are drops too.
            Some(Err(RecvError::Lagged(n))) => {
                metrics.dropped.inc_by(n);
                unannounced += n;
                total += n;
                None
            }
            Some(Err(RecvError::Closed)) => break,
        };
        if unannounced > 0 {
            match tx.try_send(Item::Dropped {
                dropped: unannounced,
                total,
            }) {
                Ok(()) => unannounced = 0,
                Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Closed(_)) => break,
            }
        }
        if let Some(e) = change {
            match tx.try_send(Item::Change(e)) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    metrics.dropped.inc();
                    unannounced += 1;
                    total += 1;
                }
                Err(TrySendError::Closed(_)) => break,
            }
        }
    }
    drop(guard);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_shortened_hex() {
        assert_eq!(hex_prefix(&[0xab, 0x01]), "ab01");
        assert_eq!(hex_prefix(&[0xff; 32]).len(), PREFIX_SHOWN * 2);
    }
}
