//! Keeps the webhook's own certificate current (the default install, without
//! cert-manager): the Secret holds the CA and the serving pair
//! ([`super::selfsigned`]); every replica reads it, the first to see it
//! missing or due creates or rotates it (optimistic concurrency: a replica
//! that loses the race re-reads), injects `ca.crt` into the webhook
//! configurations' `caBundle`, and writes `tls.crt`/`tls.key` into the
//! certificate directory, from which the listener reloads them on the next
//! handshake.
//!
//! With cert-manager (`config/overlays/cert-manager`) this is off
//! (`--webhook-cert-secret=""`) and the mounted Secret is served as is.

use super::selfsigned::{Bundle, CertError, Lifetimes, Plan, plan};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// Attempts per check when other replicas write concurrently.
const ATTEMPTS: usize = 5;
/// Next check after an incomplete one.
const RETRY: Duration = Duration::from_secs(5);

/// Where and for what the certificate is provisioned (operator flags).
#[derive(Debug, Clone)]
pub struct SelfSignedConfig {
    /// The operator's namespace (the Secret's and the Service's).
    pub namespace: String,
    /// `--webhook-cert-secret`.
    pub secret: String,
    /// `--webhook-service-name`: the certificate names
    /// `<service>.<namespace>.svc` (and `.cluster.local`).
    pub service: String,
    /// `--validating-webhook-configuration` ("" = none).
    pub validating: String,
    /// `--mutating-webhook-configuration` ("" = none).
    pub mutating: String,
    /// `--webhook-cert-check-interval`.
    pub check_interval: Duration,
    /// Validity and renewal rule.
    pub lifetimes: Lifetimes,
}

impl SelfSignedConfig {
    /// The DNS names the apiserver dials.
    pub fn dns_names(&self) -> Vec<String> {
        let base = format!("{}.{}.svc", self.service, self.namespace);
        vec![base.clone(), format!("{base}.cluster.local")]
    }
}

/// Why provisioning failed.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// The apiserver refused.
    #[error(
        "webhook certificate: kubernetes: {0} (the operator needs get/create/update on Secret {1} and get/update on its webhook configurations; see config/rbac)"
    )]
    Kube(kube::Error, String),
    /// A certificate could not be made.
    #[error("webhook certificate: {0}")]
    Cert(#[from] CertError),
    /// The certificate directory cannot be written.
    #[error("webhook certificate: write {path}: {source} (mount a writable emptyDir there)")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Other replicas kept writing in between.
    #[error("webhook certificate: Secret {0} kept changing under us; retrying at the next check")]
    Contended(String),
}

fn field(s: &Secret, k: &str) -> Option<String> {
    s.data
        .as_ref()?
        .get(k)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

fn bundle_of(s: &Secret) -> Option<Bundle> {
    Some(Bundle {
        ca_crt: field(s, "ca.crt")?,
        ca_key: field(s, "ca.key")?,
        tls_crt: field(s, "tls.crt")?,
        tls_key: field(s, "tls.key")?,
    })
}

fn data_of(b: &Bundle) -> BTreeMap<String, ByteString> {
    BTreeMap::from([
        ("ca.crt".into(), ByteString(b.ca_crt.clone().into_bytes())),
        ("ca.key".into(), ByteString(b.ca_key.clone().into_bytes())),
        ("tls.crt".into(), ByteString(b.tls_crt.clone().into_bytes())),
        ("tls.key".into(), ByteString(b.tls_key.clone().into_bytes())),
    ])
}

/// Reads the Secret, creates or rotates it when due; returns what it now
/// holds.
async fn ensure_secret(
    cfg: &SelfSignedConfig,
    api: &Api<Secret>,
) -> Result<Bundle, ProvisionError> {
    let kube_err = |e| ProvisionError::Kube(e, format!("{}/{}", cfg.namespace, cfg.secret));
    let dns = cfg.dns_names();
    for _ in 0..ATTEMPTS {
        let current = api.get_opt(&cfg.secret).await.map_err(kube_err)?;
        let stored = current.as_ref().and_then(bundle_of);
        let now = SystemTime::now();
        let decision = plan(stored.as_ref(), &dns, now, cfg.lifetimes);
        let Some(next) = Bundle::apply(stored.as_ref(), &decision, &dns, now, cfg.lifetimes)?
        else {
            if let Some(b) = stored {
                return Ok(b);
            }
            continue;
        };
        let why = match &decision {
            Plan::Issue(w) | Plan::RenewLeaf(w) | Plan::RotateCa(w) => w.as_str(),
            Plan::Keep => "",
        };
        let result = match current {
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(cfg.secret.clone()),
                        namespace: Some(cfg.namespace.clone()),
                        labels: Some(BTreeMap::from([(
                            "app.kubernetes.io/managed-by".into(),
                            "inference-cache-controller".into(),
                        )])),
                        ..Default::default()
                    },
                    type_: Some("kubernetes.io/tls".into()),
                    data: Some(data_of(&next)),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &secret).await
            }
            Some(mut secret) => {
                // resourceVersion is kept: a concurrent writer makes this 409.
                secret.data = Some(data_of(&next));
                secret.type_ = Some("kubernetes.io/tls".into());
                api.replace(&cfg.secret, &PostParams::default(), &secret)
                    .await
            }
        };
        match result {
            Ok(_) => {
                tracing::info!(secret = %cfg.secret, reason = why, "webhook certificate written");
                return Ok(next);
            }
            // Another replica won: use what it wrote.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(kube_err(e)),
        }
    }
    Err(ProvisionError::Contended(cfg.secret.clone()))
}

/// Sets every webhook's `caBundle` of one configuration to `ca` (only when
/// it differs). A configuration that does not exist yet is skipped and
/// reported as `false` (the next check, soon, injects it).
async fn inject<K>(client: &Client, name: &str, ca: &[u8]) -> Result<bool, kube::Error>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    if name.is_empty() {
        return Ok(true);
    }
    let api: Api<K> = Api::all(client.clone());
    for _ in 0..ATTEMPTS {
        let Some(obj) = api.get_opt(name).await? else {
            tracing::warn!(configuration = name, kind = %K::kind(&()), "webhook configuration not found; CA not injected yet");
            return Ok(false);
        };
        let mut value = serde_json::to_value(&obj).map_err(kube::Error::SerdeError)?;
        let encoded = {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(ca)
        };
        let mut changed = false;
        if let Some(hooks) = value.get_mut("webhooks").and_then(|w| w.as_array_mut()) {
            for h in hooks {
                let cc = &mut h["clientConfig"];
                if cc.get("caBundle").and_then(|v| v.as_str()) != Some(encoded.as_str()) {
                    cc["caBundle"] = serde_json::Value::String(encoded.clone());
                    changed = true;
                }
            }
        }
        if !changed {
            return Ok(true);
        }
        let obj: K = serde_json::from_value(value).map_err(kube::Error::SerdeError)?;
        match api.replace(name, &PostParams::default(), &obj).await {
            Ok(_) => {
                tracing::info!(configuration = name, kind = %K::kind(&()), "webhook CA bundle injected");
                return Ok(true);
            }
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// Writes a file atomically (rename), only when its content changed.
fn write_if_changed(path: &Path, content: &str) -> Result<bool, ProvisionError> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == content) {
        return Ok(false);
    }
    let err = |source| ProvisionError::Write {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)?;
    Ok(true)
}

/// What one check left in force.
#[derive(Debug, Clone)]
pub struct Provisioned {
    /// The CA bundle (`ca.crt`).
    pub ca_bundle: String,
    /// Whether every named webhook configuration carries it (false while
    /// one does not exist yet).
    pub injected: bool,
}

/// One check: Secret, CA injection, files.
pub async fn ensure(
    client: &Client,
    cfg: &SelfSignedConfig,
    cert_dir: &Path,
) -> Result<Provisioned, ProvisionError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    let bundle = ensure_secret(cfg, &secrets).await?;
    // CA first, files second: the apiserver trusts the new CA before any
    // replica serves a certificate it signed.
    let hook_err = |e| ProvisionError::Kube(e, format!("{}/{}", cfg.namespace, cfg.secret));
    let validating =
        inject::<ValidatingWebhookConfiguration>(client, &cfg.validating, bundle.ca_crt.as_bytes())
            .await
            .map_err(hook_err)?;
    let mutating =
        inject::<MutatingWebhookConfiguration>(client, &cfg.mutating, bundle.ca_crt.as_bytes())
            .await
            .map_err(hook_err)?;
    std::fs::create_dir_all(cert_dir).map_err(|source| ProvisionError::Write {
        path: cert_dir.to_owned(),
        source,
    })?;
    // The key first: the listener reloads when either file changes and
    // keeps the old pair if the new one does not match yet.
    write_if_changed(&cert_dir.join("tls.key"), &bundle.tls_key)?;
    if write_if_changed(&cert_dir.join("tls.crt"), &bundle.tls_crt)? {
        tracing::info!(dir = %cert_dir.display(), "webhook serving certificate updated on disk");
    }
    write_if_changed(&cert_dir.join("ca.crt"), &bundle.ca_crt)?;
    Ok(Provisioned {
        ca_bundle: bundle.ca_crt,
        injected: validating && mutating,
    })
}

/// Re-checks every `check_interval` until `shutdown` (every few seconds
/// while the last check failed or a configuration was missing); a failed
/// check is logged and the current certificate keeps serving.
pub async fn rotate_loop(
    client: Client,
    cfg: SelfSignedConfig,
    cert_dir: PathBuf,
    mut complete: bool,
    shutdown: CancellationToken,
) {
    loop {
        let wait = if complete {
            cfg.check_interval
        } else {
            RETRY.min(cfg.check_interval)
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        complete = match ensure(&client, &cfg, &cert_dir).await {
            Ok(p) => p.injected,
            Err(e) => {
                tracing::warn!(error = %e, "webhook certificate check failed; the current one keeps serving");
                false
            }
        };
    }
}
