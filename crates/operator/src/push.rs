//! The push side (B.2): list CachePolicy + CacheTenant, resolve, POST the
//! full document to `/policy`; then the same for PromptTemplates
//! (`/templates`) and PDTopologies (`/pd-topologies`).
//!
//! Every push is the complete state (replace-on-write). A server without the
//! `/templates` or `/pd-topologies` endpoint (404) is logged once and
//! skipped: those pushes never hold up the policy push.

use crate::client::{ClientError, ServerClient};
use crate::crd::{CachePolicy, CacheTenant};
use crate::metrics::{Metrics, SkippedLabels};
use crate::resolve;
use kube::Client;
use kube::api::{Api, ListParams};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Why a push did not reach the server.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// Listing the objects failed.
    #[error("list {kind}: {source}")]
    List {
        /// The kind.
        kind: &'static str,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The server refused or could not be reached.
    #[error("push: {0}")]
    Server(#[from] ClientError),
}

/// Push targets and credentials.
#[derive(Clone)]
pub struct Pusher {
    /// Kubernetes.
    pub client: Client,
    /// The server.
    pub http: ServerClient,
    /// `--server-policy-url`.
    pub policy_url: String,
    /// `--server-templates-url` ("" disables).
    pub templates_url: String,
    /// `--server-pd-topologies-url` ("" disables).
    pub pd_url: String,
    /// The policy-audience token file.
    pub policy_token_file: PathBuf,
    /// Counters.
    pub metrics: Metrics,
    /// Set once a 404 from `/templates` has been logged.
    pub templates_unsupported: Arc<AtomicBool>,
    /// Set once a 404 from `/pd-topologies` has been logged.
    pub pd_unsupported: Arc<AtomicBool>,
}

/// Lists every object of a namespaced kind across namespaces; a kind whose
/// CRD is not installed (404) lists as empty.
pub async fn list_all<K>(client: &Client, kind: &'static str) -> Result<Vec<K>, PushError>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(l) => Ok(l.items),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(source) => Err(PushError::List { kind, source }),
    }
}

impl Pusher {
    /// Pushes the policy document; the other targets are best effort.
    pub async fn push_all(&self) -> Result<(), PushError> {
        let result = self.push_policy().await;
        if !self.templates_url.is_empty() {
            self.push_optional(
                "templates",
                &self.templates_url,
                &self.templates_unsupported,
                crate::templates::templates_document(&self.client).await,
            )
            .await;
        }
        if !self.pd_url.is_empty() {
            self.push_optional(
                "pd-topologies",
                &self.pd_url,
                &self.pd_unsupported,
                crate::templates::pd_document(&self.client).await,
            )
            .await;
        }
        result
    }

    /// Lists, resolves and pushes the policy document.
    pub async fn push_policy(&self) -> Result<(), PushError> {
        let policies: Vec<CachePolicy> = list_all(&self.client, "CachePolicy").await?;
        let tenants: Vec<CacheTenant> = list_all(&self.client, "CacheTenant").await?;
        let resolved = resolve::policy_snapshot(&policies, &tenants);
        for s in &resolved.skipped {
            tracing::warn!(kind = s.kind, object = %s.object, reason = s.reason, detail = %s.detail, "left out of the policy push");
            self.metrics
                .push_skipped
                .get_or_create(&SkippedLabels {
                    kind: s.kind.into(),
                    reason: s.reason.into(),
                })
                .inc();
        }
        match self
            .http
            .push(
                &self.policy_url,
                &self.policy_token_file,
                &resolved.snapshot,
            )
            .await
        {
            Ok(()) => {
                self.metrics.push("policy", "ok");
                #[allow(clippy::cast_precision_loss)]
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                self.metrics.last_policy_push.set(now);
                tracing::debug!(
                    policies = resolved.snapshot.policies.as_ref().map_or(0, Vec::len),
                    tenants = resolved.snapshot.tenants.as_ref().map_or(0, Vec::len),
                    "policy pushed"
                );
                Ok(())
            }
            Err(e) => {
                self.metrics.push("policy", e.result_label());
                Err(e.into())
            }
        }
    }

    async fn push_optional<T: serde::Serialize>(
        &self,
        target: &'static str,
        url: &str,
        unsupported: &AtomicBool,
        doc: Result<T, PushError>,
    ) {
        let doc = match doc {
            Ok(d) => d,
            Err(e) => {
                self.metrics.push(target, "error");
                tracing::warn!(error = %e, target, "cannot build the push document");
                return;
            }
        };
        match self.http.push(url, &self.policy_token_file, &doc).await {
            Ok(()) => {
                self.metrics.push(target, "ok");
                unsupported.store(false, Ordering::Relaxed);
            }
            Err(e) if e.status() == Some(404) => {
                self.metrics.push(target, "unsupported");
                if !unsupported.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        url,
                        target,
                        "the server does not serve this endpoint; skipping these pushes until it does"
                    );
                }
            }
            Err(e) => {
                self.metrics.push(target, e.result_label());
                tracing::warn!(error = %e, target, "push failed");
            }
        }
    }
}
