//! What the status page shows about the replication bus (issue 13): its
//! address, whether it is connected, and how far this server's index lags
//! behind the stream. Without `--nats-url` there is none and the page says so.

use crate::replicate::BusRelay;
use serde::Serialize;

/// The bus as the page shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BusStatus {
    /// Bus kind and address, e.g. `nats://nats:4222`.
    pub endpoint: String,
    /// Connected right now.
    pub connected: bool,
    /// Seconds between the newest message published and the newest applied
    /// here, when known.
    pub lag_seconds: Option<f64>,
}

/// The bus's state, or `None` when the server runs without a bus. Read from
/// the replication gauges (mirrored from the consumer every second).
pub(crate) fn bus_status(relay: Option<&BusRelay>) -> Option<BusStatus> {
    let relay = relay?;
    let m = relay.metrics();
    Some(BusStatus {
        endpoint: without_credentials(relay.endpoint()),
        connected: m.bus_connected.get() == 1,
        lag_seconds: Some(m.bus_lag_seconds.get()),
    })
}

/// Per-replica bus lag in seconds, or `None` without a bus. Every engine
/// replica's updates travel the same ordered stream, so their lag is this
/// server's lag behind it.
pub(crate) fn replica_bus_lag_seconds(relay: Option<&BusRelay>, _replica_id: &str) -> Option<f64> {
    bus_status(relay).and_then(|b| b.lag_seconds)
}

/// `nats://user:pass@host:4222` → `nats://host:4222`: the page is readable
/// by anyone allowed `/snapshot`, who need not see bus credentials.
fn without_credentials(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn credentials_are_not_shown() {
        assert_eq!(
            super::without_credentials("nats://u:p@h:4222"),
            "nats://h:4222"
        );
        assert_eq!(super::without_credentials("nats://h:4222"), "nats://h:4222");
        assert_eq!(super::without_credentials("h:4222"), "h:4222");
    }
}
