//! The CacheIndex poller (B.3): a leader-only timer that reads the server's
//! `/snapshot` and writes the CacheIndex singleton, CacheTenant status and
//! CacheBackend `indexParticipation`.
//!
//! Soft state: a failed scrape changes nothing (the singleton is still
//! created so `kubectl get ci` shows the operator is alive), and each object
//! is written only when its content changed, so an idle cluster sees no
//! status churn.

use crate::client::{ClientError, ServerClient};
use crate::crd::{CACHE_INDEX_NAME, CacheBackend, CacheIndex, CacheIndexSpec, CacheTenant};
use crate::metrics::{Metrics, ResultLabel};
use crate::project;
use inferencecache_control_api::snapshot::SnapshotJson as Snapshot;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Why a poll did not complete.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// The server could not be read.
    #[error("read snapshot: {0}")]
    Snapshot(#[from] ClientError),
    /// The apiserver refused a read or write.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
}

/// One poller.
#[derive(Clone)]
pub struct Poller {
    /// Kubernetes.
    pub client: Client,
    /// The server.
    pub http: ServerClient,
    /// `--server-snapshot-url`.
    pub snapshot_url: String,
    /// The controller-audience token file.
    pub token_file: PathBuf,
    /// Counters.
    pub metrics: Metrics,
}

fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

impl Poller {
    fn poll_result(&self, result: &str) {
        self.metrics
            .snapshot_polls
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// One refresh: ensure the singleton, scrape, project, write changes.
    pub async fn poll_once(&self) -> Result<(), PollError> {
        let indices: Api<CacheIndex> = Api::all(self.client.clone());
        if indices.get_opt(CACHE_INDEX_NAME).await?.is_none() {
            let ci = CacheIndex::new(CACHE_INDEX_NAME, CacheIndexSpec {});
            match indices.create(&PostParams::default(), &ci).await {
                Ok(_) => tracing::info!("created CacheIndex {CACHE_INDEX_NAME}"),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        let snap: Snapshot = match self
            .http
            .get_json(&self.snapshot_url, &self.token_file)
            .await
        {
            Ok(s) => {
                self.poll_result("ok");
                s
            }
            Err(e) => {
                self.poll_result(e.result_label());
                return Err(e.into());
            }
        };
        self.write_index(&indices, &snap).await?;
        self.write_tenants(&snap).await?;
        self.write_backends(&snap).await?;
        Ok(())
    }

    async fn write_index(&self, api: &Api<CacheIndex>, snap: &Snapshot) -> Result<(), PollError> {
        let mut ci = api.get(CACHE_INDEX_NAME).await?;
        let mut status = project::index_status(snap, &self.snapshot_url);
        let old = ci.status.clone().unwrap_or_default();
        let mut old_cmp = old.clone();
        old_cmp.last_updated = None;
        if old_cmp == status {
            self.metrics.status_write("unchanged");
            return Ok(());
        }
        status.last_updated = Some(now_rfc3339());
        ci.status = Some(status);
        match api
            .replace_status(CACHE_INDEX_NAME, &PostParams::default(), &ci)
            .await
        {
            Ok(_) => self.metrics.status_write("changed"),
            // Someone wrote in between: the next poll retries.
            Err(kube::Error::Api(s)) if s.code == 409 => self.metrics.status_write("conflict"),
            Err(e) => {
                self.metrics.status_write("error");
                return Err(e.into());
            }
        }
        Ok(())
    }

    async fn write_tenants(&self, snap: &Snapshot) -> Result<(), PollError> {
        let tenants = match Api::<CacheTenant>::all(self.client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(l) => l.items,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let wanted = project::tenant_statuses(snap, &tenants);
        for t in &tenants {
            let ns = t.namespace().unwrap_or_default();
            let key = format!("{ns}/{}", t.name_any());
            let Some(status) = wanted.get(&key) else {
                continue;
            };
            let old = t.status.clone().unwrap_or_default();
            if !project::tenant_status_changed(&old, status) {
                self.metrics.status_write("unchanged");
                continue;
            }
            let api: Api<CacheTenant> = Api::namespaced(self.client.clone(), &ns);
            let patch = serde_json::json!({"status": status});
            self.write_status(&api, &t.name_any(), &patch, &key).await;
        }
        Ok(())
    }

    async fn write_backends(&self, snap: &Snapshot) -> Result<(), PollError> {
        let backends = match Api::<CacheBackend>::all(self.client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(l) => l.items,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let namespaces: BTreeSet<String> =
            backends.iter().filter_map(ResourceExt::namespace).collect();
        let mut pods: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
        for ns in namespaces {
            match Api::<Pod>::namespaced(self.client.clone(), &ns)
                .list(&ListParams::default())
                .await
            {
                Ok(l) => {
                    pods.insert(ns, l.items);
                }
                // A namespace we cannot read keeps its backends' prior status.
                Err(e) => {
                    tracing::warn!(error = %e, namespace = %ns, "cannot list pods; keeping CacheBackend status")
                }
            }
        }
        let wanted = project::participation(snap, &backends, &pods);
        for b in &backends {
            let ns = b.namespace().unwrap_or_default();
            let key = format!("{ns}/{}", b.name_any());
            let Some(p) = wanted.get(&key) else { continue };
            let matched = pods.get(&ns).map(|list| project::matched_pods(b, list));
            let old = b.status.as_ref();
            if old.and_then(|s| s.index_participation.as_ref()) == Some(p)
                && old.and_then(|s| s.matched_engine_pods) == matched
            {
                self.metrics.status_write("unchanged");
                continue;
            }
            let patch = serde_json::json!({"status": {
                "observedGeneration": b.metadata.generation,
                "matchedEnginePods": matched,
                "indexParticipation": {
                    "prefixCount": p.prefix_count,
                    "lastEventAt": p.last_event_at,
                    "hitRate": p.hit_rate,
                    "t2HitRate": p.t2_hit_rate,
                },
            }});
            let api: Api<CacheBackend> = Api::namespaced(self.client.clone(), &ns);
            self.write_status(&api, &b.name_any(), &patch, &key).await;
        }
        Ok(())
    }

    /// Merge-patches one object's status and counts the outcome. A failed
    /// write is logged and left for the next poll: status is soft state.
    async fn write_status<K>(&self, api: &Api<K>, name: &str, patch: &serde_json::Value, key: &str)
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => self.metrics.status_write("changed"),
            Err(e) => {
                self.metrics.status_write("error");
                tracing::warn!(error = %e, object = %key, kind = %K::kind(&()), "status write failed");
            }
        }
    }
}
