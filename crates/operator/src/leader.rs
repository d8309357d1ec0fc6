//! Leader election on a `coordination.k8s.io/v1` Lease, so two operator
//! replicas are safe: only the holder pushes policy and writes status
//! (webhooks are served by every replica).
//!
//! The protocol is client-go's: the holder renews `renewTime` every
//! `renew_period`; a candidate takes the Lease over only when the record has
//! not changed for `lease_duration` *as observed on its own clock* (so clock
//! skew between replicas does not matter). Every write is a replace carrying
//! the `resourceVersion` that was read, so two candidates racing for an
//! expired Lease cannot both win: the apiserver answers the loser 409. A
//! holder that cannot renew for `lease_duration` steps down on its own before
//! anyone else may take over. On shutdown the holder releases the Lease
//! (empty holder) so a standby takes over at its next retry instead of after
//! a full lease duration.

use crate::metrics::Metrics;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Lease settings (the controller-runtime flags' meaning).
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name (`inference-cache-controller-leader-lock`).
    pub name: String,
    /// This replica's identity (pod name + a random suffix).
    pub identity: String,
    /// How long a silent holder keeps the Lease.
    pub lease_duration: Duration,
    /// How often the holder renews and candidates retry.
    pub renew_period: Duration,
}

/// The reference's lock name.
pub const DEFAULT_LEASE_NAME: &str = "inference-cache-controller-leader-lock";

/// What one election step saw.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// We hold it (renewed or acquired).
    Leading,
    /// Someone else holds it.
    Following,
}

struct Elector {
    api: Api<Lease>,
    cfg: LeaderConfig,
    /// The last record seen (holder, renewTime, transitions) and when it
    /// last changed on our clock.
    observed: Option<(String, Instant)>,
    /// When we last renewed successfully.
    last_renew: Option<Instant>,
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

fn lease_seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

impl Elector {
    fn fingerprint(lease: &Lease) -> String {
        let spec = lease.spec.clone().unwrap_or_default();
        format!(
            "{:?}|{:?}|{:?}",
            spec.holder_identity,
            spec.renew_time.map(|t| t.0.to_string()),
            spec.lease_transitions
        )
    }

    async fn step(&mut self) -> Result<Seen, kube::Error> {
        let me = self.cfg.identity.clone();
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(lease_seconds(self.cfg.lease_duration)),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            self.api.create(&PostParams::default(), &lease).await?;
            self.last_renew = Some(Instant::now());
            return Ok(Seen::Leading);
        };
        let fp = Self::fingerprint(&lease);
        let changed = self.observed.as_ref().is_none_or(|(old, _)| *old != fp);
        if changed {
            self.observed = Some((fp, Instant::now()));
        }
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if holder == me {
            spec.renew_time = Some(now());
            spec.lease_duration_seconds = Some(lease_seconds(self.cfg.lease_duration));
            self.api
                .replace(&self.cfg.name, &PostParams::default(), &lease)
                .await?;
            self.last_renew = Some(Instant::now());
            return Ok(Seen::Leading);
        }
        let silent_for = self
            .observed
            .as_ref()
            .map_or(Duration::ZERO, |(_, at)| at.elapsed());
        let held_for = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.cfg.lease_duration, Duration::from_secs);
        if !holder.is_empty() && silent_for < held_for {
            return Ok(Seen::Following);
        }
        spec.holder_identity = Some(me);
        spec.acquire_time = Some(now());
        spec.renew_time = Some(now());
        spec.lease_duration_seconds = Some(lease_seconds(self.cfg.lease_duration));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        // resourceVersion from the read: a racing candidate gets 409.
        self.api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await?;
        self.last_renew = Some(Instant::now());
        Ok(Seen::Leading)
    }

    async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.cfg.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now());
        if let Err(e) = self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            tracing::warn!(error = %e, "could not release the leader lease");
        } else {
            tracing::info!(identity = %self.cfg.identity, "released the leader lease");
        }
    }
}

/// Runs the election until `shutdown`, publishing leadership on `tx`.
/// Returns after releasing the Lease if it was held.
pub async fn run(
    api: Api<Lease>,
    cfg: LeaderConfig,
    tx: watch::Sender<bool>,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let mut elector = Elector {
        api,
        cfg,
        observed: None,
        last_renew: None,
    };
    loop {
        let leading = match elector.step().await {
            Ok(Seen::Leading) => true,
            Ok(Seen::Following) => false,
            Err(e) => {
                let conflict = matches!(&e, kube::Error::Api(s) if s.code == 409);
                if !conflict {
                    tracing::warn!(error = %e, "leader election step failed");
                }
                // Keep leading through a transient error only while our last
                // renewal is younger than the lease: after that another
                // replica may take over, so step down first.
                !conflict
                    && *tx.borrow()
                    && elector
                        .last_renew
                        .is_some_and(|t| t.elapsed() < elector.cfg.lease_duration)
            }
        };
        if leading != *tx.borrow() {
            tracing::info!(
                identity = %elector.cfg.identity,
                leading,
                "leadership changed"
            );
            metrics.leader.set(i64::from(leading));
            let _ = tx.send(leading);
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(elector.cfg.renew_period) => {}
        }
    }
    if *tx.borrow() {
        let _ = tx.send(false);
        metrics.leader.set(0);
        elector.release().await;
    }
}
