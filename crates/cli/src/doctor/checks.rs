//! The checks, in the order a hint travels: server reachable (and in which
//! TLS mode), its health, metrics and self-test, the tenant's policy and
//! replicas, each sidecar, then one real lookup. A check that cannot run
//! because an earlier one failed is reported as skipped, not failed again.

use super::DoctorArgs;
use super::discover::Found;
use super::http::{Answer, call, samples};
use super::report::{Check, Status};
use super::sniff::{Wire, sniff};
use crate::tools::server::ServerArgs;
use inferencecache_client::{Client, ClientConfig, ClientError};
use inferencecache_proto::v1alpha1::LookupRouteRequest;
use serde_json::Value;
use std::time::Duration;

/// Default ports of `inferencecache serve`'s HTTP listeners.
const PUBLIC_PORT: u16 = 8080;
const CONTROL_PORT: u16 = 8081;

/// Tokens of doctor's lookup: four 16-token blocks and one token more, since
/// the engine always recomputes a prompt's last token (so does the default
/// ranking), and a prompt of exactly four blocks can reuse only three.
const LOOKUP_TOKENS: std::ops::Range<u32> = 0..65;

/// Everything doctor talks to, resolved from the flags.
#[derive(Debug)]
pub(super) struct Target {
    server: String,
    grpc_addr: String,
    wants_tls: bool,
    client: ClientConfig,
    http: String,
    control: String,
    token: Option<String>,
    /// (name in the report, base URL, fix when unreachable) of each
    /// sidecar.
    sidecars: Vec<(String, String, String)>,
    /// Why the server checks cannot run (discovery found no server and no
    /// --server was given).
    server_missing: Option<String>,
    tenant: String,
    model: String,
    hash_scheme: String,
    timeout: Duration,
}

fn with_scheme(url: &str) -> String {
    let url = url.trim().trim_end_matches('/');
    if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    }
}

/// (host, port, TLS?) of a `--server` value.
fn split_server(server: &str) -> Result<(String, u16, bool), String> {
    let (tls, rest) = match server.split_once("://") {
        Some(("https", rest)) => (true, rest),
        Some(("http", rest)) => (false, rest),
        Some((scheme, _)) => {
            return Err(format!(
                "--server {server:?}: unknown scheme {scheme:?}; use http:// or https://"
            ));
        }
        None => (false, server),
    };
    let rest = rest.trim_end_matches('/');
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("--server {server:?}: give HOST:PORT"))?;
    let port = port
        .parse()
        .map_err(|_| format!("--server {server:?}: {port:?} is not a port"))?;
    Ok((host.to_owned(), port, tls))
}

impl Target {
    /// Resolves the flags and what `--kubeconfig` discovery found (flags
    /// win: `server_flag_given` says --server was on the command line);
    /// `Err` explains an unusable flag.
    pub(super) fn new(
        args: &DoctorArgs,
        token: Option<String>,
        found: Option<&Found>,
        server_flag_given: bool,
    ) -> Result<Self, String> {
        let from_kube = found.filter(|_| !server_flag_given);
        let discovered = from_kube.and_then(|f| f.server.as_ref());
        let server_missing = from_kube.filter(|f| f.server.is_none()).map(|f| {
            let cluster_down = f
                .checks
                .iter()
                .any(|c| c.name == "kube.cluster" && c.status == Status::Fail);
            if cluster_down {
                "the cluster was not reachable (see kube.cluster)".to_owned()
            } else {
                "no server was discovered (see kube.server)".to_owned()
            }
        });
        let given = &args.server;
        let tls_flags = given.tls_ca_file.is_some()
            || given.tls_cert_file.is_some()
            || given.tls_server_name.is_some();
        let s = &ServerArgs {
            server: discovered.map_or_else(
                || given.server.clone(),
                |d| {
                    let scheme = if d.tls_name.is_some() || tls_flags {
                        "https"
                    } else {
                        "http"
                    };
                    format!("{scheme}://{}", d.grpc)
                },
            ),
            tls_ca_file: given.tls_ca_file.clone(),
            tls_cert_file: given.tls_cert_file.clone(),
            tls_key_file: given.tls_key_file.clone(),
            tls_server_name: given
                .tls_server_name
                .clone()
                .or_else(|| discovered.and_then(|d| d.tls_name.clone())),
        };
        let (host, port, https) = split_server(&s.server)?;
        let wants_tls = https
            || s.tls_ca_file.is_some()
            || s.tls_cert_file.is_some()
            || s.tls_server_name.is_some();
        let http = args
            .http
            .as_deref()
            .or(discovered.map(|d| d.http.as_str()))
            .map_or_else(|| format!("http://{host}:{PUBLIC_PORT}"), with_scheme);
        let control = args
            .control
            .as_deref()
            .or(discovered.map(|d| d.control.as_str()))
            .map_or_else(|| format!("http://{host}:{CONTROL_PORT}"), with_scheme);
        let sidecars = if args.sidecar.is_empty() {
            found
                .map(|f| {
                    f.sidecars
                        .iter()
                        .map(|s| (s.label.clone(), s.url.clone(), s.unreachable_fix.clone()))
                        .collect()
                })
                .unwrap_or_default()
        } else {
            args.sidecar
                .iter()
                .map(|u| {
                    let fix = "the sidecar is not running or --sidecar is wrong: check the \
                               pod's kvevent-subscriber container and its --http-bind-address";
                    (with_scheme(u), with_scheme(u), fix.to_owned())
                })
                .collect()
        };
        let pick = |flag: &Option<String>, seen: Option<&String>, default: &str| {
            flag.clone()
                .or_else(|| seen.cloned())
                .unwrap_or_else(|| default.to_owned())
        };
        Ok(Self {
            server: s.server.clone(),
            grpc_addr: format!("{host}:{port}"),
            wants_tls,
            client: s.config().lookup_deadline(args.timeout),
            http,
            control,
            token,
            sidecars,
            server_missing,
            tenant: pick(
                &args.tenant,
                found.and_then(|f| f.tenant.as_ref()),
                "default",
            ),
            model: pick(&args.model, found.and_then(|f| f.model.as_ref()), "default"),
            hash_scheme: pick(
                &args.hash_scheme,
                found.and_then(|f| f.hash_scheme.as_ref()),
                inferencecache_client::DEFAULT_HASH_SCHEME,
            ),
            timeout: args.timeout,
        })
    }
}

/// Runs every check.
pub(super) async fn run(t: &Target) -> Vec<Check> {
    let mut out = Vec::new();
    if let Some(why) = &t.server_missing {
        for name in [
            "server.grpc",
            "server.health",
            "server.metrics",
            "server.probe",
            "policy.tenant",
            "tenant.replicas",
        ] {
            out.push(Check::skip(name, why));
        }
        for sidecar in &t.sidecars {
            sidecar_checks(t, sidecar, &mut out).await;
        }
        out.push(Check::skip("lookup", why));
        return out;
    }
    let client = grpc(t, &mut out).await;
    let public_up = health(t, &mut out).await;
    if public_up {
        metrics(t, &mut out).await;
    } else {
        out.push(Check::skip("server.metrics", "the public listener is down"));
    }
    let control_up = probe(t, &mut out).await;
    if control_up {
        policy_and_replicas(t, &mut out).await;
    } else {
        let why = "the control listener is not usable";
        out.push(Check::skip("policy.tenant", why));
        out.push(Check::skip("tenant.replicas", why));
    }
    for sidecar in &t.sidecars {
        sidecar_checks(t, sidecar, &mut out).await;
    }
    match client {
        Some(c) => out.push(lookup(t, &c).await),
        None => out.push(Check::skip(
            "lookup",
            "the server's gRPC port is not usable",
        )),
    }
    out
}

/// `server.grpc`: something answers, in the TLS mode doctor dialled, and a
/// client connects.
async fn grpc(t: &Target, out: &mut Vec<Check>) -> Option<Client> {
    const NAME: &str = "server.grpc";
    let addr = t.grpc_addr.clone();
    let timeout = t.timeout;
    let wire = tokio::task::spawn_blocking(move || sniff(&addr, timeout))
        .await
        .unwrap_or_else(|e| Wire::Unknown(e.to_string()));
    let a = &t.grpc_addr;
    match (&wire, t.wants_tls) {
        (Wire::Refused(e), _) => {
            out.push(Check::fail(
                NAME,
                format!("nothing answers at {a} ({e})"),
                "start the server (`inferencecache serve`; gRPC is --grpc-bind-address, default \
                 :9090) or pass --server with its address; from outside a cluster, \
                 `kubectl -n inference-cache-system port-forward svc/inference-cache-server 9090 \
                 8080 8081` and pass --server 127.0.0.1:9090, or with --kubeconfig \
                 --address-override svc/inference-cache-server=127.0.0.1",
            ));
            return None;
        }
        (Wire::Tls, false) => {
            out.push(Check::fail(
                NAME,
                format!(
                    "{a} speaks TLS but doctor dialled plaintext (--server {})",
                    t.server
                ),
                "TLS mismatch: the server terminates TLS (serve --tls-cert-file); use \
                 --server https://HOST:PORT with --tls-ca-file CA.pem (the CA that signed the \
                 server certificate), and the same for every gateway and sidecar",
            ));
            return None;
        }
        (Wire::PlainH2, true) => {
            out.push(Check::fail(
                NAME,
                format!("{a} serves plaintext gRPC but doctor was asked for TLS"),
                "TLS mismatch: the server does not terminate TLS; use --server http://HOST:PORT \
                 without --tls-* flags, or start serve with --tls-cert-file and --tls-key-file",
            ));
            return None;
        }
        _ => {}
    }
    match Client::connect(t.client.clone()).await {
        Ok(c) => {
            let mode = if t.wants_tls { "TLS" } else { "plaintext" };
            out.push(Check::ok(NAME, format!("{a} answers gRPC ({mode})")));
            Some(c)
        }
        Err(e) => {
            let fix = match &e {
                ClientError::Tls(_) => {
                    "check the --tls-* files exist and are PEM (CA, and client cert/key for mTLS)"
                }
                _ if t.wants_tls => {
                    "TLS handshake failed: --tls-ca-file must be the CA that signed the server \
                     certificate, --tls-server-name a name in it; if the server requires mTLS \
                     pass --tls-cert-file/--tls-key-file"
                }
                _ => "the port answers but not as an inference-cache gRPC server; check --server",
            };
            out.push(Check::fail(
                NAME,
                format!("cannot connect to {a}: {e}"),
                fix,
            ));
            None
        }
    }
}

async fn get(t: &Target, url: &str) -> Result<Answer, String> {
    call(url, t.token.as_deref(), None, t.timeout).await
}

/// `server.health`: /healthz and /readyz.
async fn health(t: &Target, out: &mut Vec<Check>) -> bool {
    const NAME: &str = "server.health";
    let healthz = format!("{}/healthz", t.http);
    match get(t, &healthz).await {
        Err(e) => {
            out.push(Check::fail(
                NAME,
                format!("{healthz}: {e}"),
                "the public listener (serve --http-bind-address, default :8080) is not \
                 reachable; pass --http with its address",
            ));
            return false;
        }
        Ok(a) if a.status != 200 => {
            out.push(Check::fail(
                NAME,
                format!("{healthz} answered {}", a.status),
                "--http must be the server's public listener (/healthz, /readyz, /metrics)",
            ));
            return false;
        }
        Ok(_) => {}
    }
    let readyz = format!("{}/readyz", t.http);
    match get(t, &readyz).await {
        Ok(a) if a.status == 200 => out.push(Check::ok(NAME, "healthy and ready")),
        Ok(a) => out.push(Check::fail(
            NAME,
            format!("not ready ({}: {})", a.status, a.body.trim()),
            "the server is starting, shutting down or waiting for a dependency; read its \
             logs (`kubectl logs deploy/inference-cache`) for the reason",
        )),
        Err(e) => out.push(Check::fail(
            NAME,
            format!("{readyz}: {e}"),
            "the public listener stopped answering; check the server's logs",
        )),
    }
    true
}

/// `server.metrics`: /metrics serves the server's series.
async fn metrics(t: &Target, out: &mut Vec<Check>) {
    const NAME: &str = "server.metrics";
    let url = format!("{}/metrics", t.http);
    match get(t, &url).await {
        Ok(a) if a.status == 200 => {
            let up = samples(&a.body, "inferencecache_server_up").any(|(_, v)| v == 1.0);
            if up {
                out.push(Check::ok(
                    NAME,
                    "/metrics serves inferencecache_server_up 1",
                ));
                out.push(block_size(&a.body));
            } else {
                out.push(Check::fail(
                    NAME,
                    "/metrics has no inferencecache_server_up 1",
                    "--http points at something that is not an inference-cache server, or the \
                     server is shutting down",
                ));
            }
        }
        Ok(a) => out.push(Check::fail(
            NAME,
            format!("{url} answered {}", a.status),
            "--http must be the server's public listener",
        )),
        Err(e) => out.push(Check::fail(
            NAME,
            format!("{url}: {e}"),
            "check the server's public listener",
        )),
    }
}

/// `server.block_size`: the engines' block size (as their producers report
/// it) agrees with `--engine-block-size` and among the replicas of a model.
fn block_size(body: &str) -> Check {
    const NAME: &str = "server.block_size";
    let bad: Vec<String> = samples(body, "inferencecache_engine_block_size_mismatch{")
        .filter(|&(_, v)| v > 0.0)
        .map(|(series, _)| {
            let labels = series
                .split_once('{')
                .map_or(series, |(_, l)| l.trim_end_matches('}'));
            let learned = samples(body, "inferencecache_engine_block_size{")
                .find(|(s, _)| s.ends_with(&format!("{{{labels}}}")))
                .map_or_else(|| "?".to_owned(), |(_, v)| v.to_string());
            format!("{labels}: engines report {learned}")
        })
        .collect();
    if bad.is_empty() {
        return Check::ok(
            NAME,
            "every reported engine block size matches --engine-block-size",
        );
    }
    Check::warn(
        NAME,
        format!(
            "engine block size differs from --engine-block-size ({})",
            bad.join("; ")
        ),
        "lookups by token_ids / prompt_text use the engines' size, but set serve \
         --engine-block-size to the engines' --block-size (and give every replica of a model \
         the same size) so both agree",
    )
}

fn auth_fix(status: u16) -> &'static str {
    match status {
        401 => {
            "the control listener wants a bearer token (serve --allowed-controller-sa): pass \
             --token or --token-file with a token of the controller's service account \
             (`kubectl -n inference-cache-system create token inference-cache-controller \
             --audience inferencecache.io/controller`)"
        }
        403 => {
            "the token belongs to someone else: use the controller service account's token \
             (serve --allowed-controller-sa names it)"
        }
        _ => "--control must be the server's control listener (serve --snapshot-bind-address)",
    }
}

/// `server.probe`: the server's own ingest + routing self-test.
async fn probe(t: &Target, out: &mut Vec<Check>) -> bool {
    const NAME: &str = "server.probe";
    let url = format!("{}/probe", t.control);
    let body = serde_json::json!({
        "backend": "inferencecache-doctor/probe",
        "model": t.model,
        "hashScheme": t.hash_scheme,
    })
    .to_string();
    match call(&url, t.token.as_deref(), Some(body), t.timeout).await {
        Err(e) => {
            out.push(Check::fail(
                NAME,
                format!("{url}: {e}"),
                "the control listener (serve --snapshot-bind-address, default 127.0.0.1:8081, \
                 loopback only unless auth is on) is not reachable; pass --control, or \
                 port-forward 8081",
            ));
            false
        }
        Ok(a) if a.status != 200 => {
            out.push(Check::fail(
                NAME,
                format!("{url} answered {}: {}", a.status, a.body.trim()),
                auth_fix(a.status),
            ));
            false
        }
        Ok(a) => {
            let v: Value = serde_json::from_str(&a.body).unwrap_or(Value::Null);
            if v["ingest"] == "ok" && v["routing"] == "ok" {
                out.push(Check::ok(NAME, "/probe round trip: ingest ok, routing ok"));
            } else {
                out.push(Check::fail(
                    NAME,
                    format!("/probe: {}", a.body.trim()),
                    "the server's index fails its self-test; read the errors above and the \
                     server's logs",
                ));
            }
            true
        }
    }
}

/// `policy.tenant` and `tenant.replicas`, from the status page's document.
async fn policy_and_replicas(t: &Target, out: &mut Vec<Check>) {
    let url = format!("{}/ui/state", t.control);
    let state = match get(t, &url).await {
        Ok(a) if a.status == 200 => serde_json::from_str::<Value>(&a.body).unwrap_or(Value::Null),
        Ok(a) => {
            let why = format!("{url} answered {}", a.status);
            out.push(Check::fail("policy.tenant", &why, auth_fix(a.status)));
            out.push(Check::skip("tenant.replicas", &why));
            return;
        }
        Err(e) => {
            let why = format!("{url}: {e}");
            out.push(Check::fail(
                "policy.tenant",
                &why,
                "check the control listener",
            ));
            out.push(Check::skip("tenant.replicas", &why));
            return;
        }
    };
    let tenant = &t.tenant;
    let version = state["policyVersion"].as_i64().unwrap_or(0);
    let has_policy = state["policyTenants"]
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v == tenant.as_str()));
    out.push(if has_policy {
        Check::ok(
            "policy.tenant",
            format!("a CachePolicy is in force for {tenant} (policy v{version})"),
        )
    } else if version == 0 {
        Check::warn(
            "policy.tenant",
            "no policy has been pushed: every tenant runs on the server's defaults",
            format!(
                "apply a CachePolicy in namespace {tenant} (the operator pushes it to /policy), \
                 or start serve with --policy-file"
            ),
        )
    } else {
        Check::warn(
            "policy.tenant",
            format!("policy v{version} has no CachePolicy for {tenant}: defaults apply"),
            format!(
                "apply a CachePolicy in namespace {tenant}, or pass the --tenant your engines \
                 report under"
            ),
        )
    });
    let now = state["nowMs"].as_i64().unwrap_or(0);
    let replicas: Vec<&Value> = state["replicas"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|r| r["tenant"] == tenant.as_str())
                .collect()
        })
        .unwrap_or_default();
    if replicas.is_empty() {
        out.push(Check::warn(
            "tenant.replicas",
            format!("no replica reports under tenant {tenant}"),
            "check that a sidecar runs next to each engine with --tenant-id equal to this \
             --tenant (by convention the namespace), and that its engine has served a request",
        ));
        return;
    }
    let newest = replicas
        .iter()
        .filter_map(|r| r["lastEventMs"].as_i64().max(r["lastUpdateMs"].as_i64()))
        .max();
    let age = newest.map_or_else(
        || "never".to_owned(),
        |ms| format!("{:.1} s ago", (now - ms) as f64 / 1000.0),
    );
    out.push(Check::ok(
        "tenant.replicas",
        format!(
            "{} replica(s) report under {tenant}; newest change {age}",
            replicas.len()
        ),
    ));
}

/// `sidecar.*` for one sidecar: its engine stream, its server link, events.
async fn sidecar_checks(
    t: &Target,
    (base, at, unreachable_fix): &(String, String, String),
    out: &mut Vec<Check>,
) {
    let url = format!("{at}/metrics");
    let body = match get(t, &url).await {
        Ok(a) if a.status == 200 => a.body,
        Ok(a) => {
            out.push(Check::fail(
                format!("sidecar.reachable {base}"),
                format!("{url} answered {}", a.status),
                "--sidecar must be the sidecar's HTTP address (subscribe --http-bind-address)",
            ));
            return;
        }
        Err(e) => {
            out.push(Check::fail(
                format!("sidecar.reachable {base}"),
                format!("{url}: {e}"),
                unreachable_fix,
            ));
            return;
        }
    };
    let engine: Vec<(&str, f64)> =
        samples(&body, "inferencecache_subscriber_engine_connected").collect();
    let down: Vec<&str> = engine
        .iter()
        .filter(|(_, v)| *v < 1.0)
        .map(|(s, _)| *s)
        .collect();
    let events: f64 = samples(&body, "inferencecache_subscriber_events_total")
        .map(|(_, v)| v)
        .sum();
    if engine.is_empty() || !down.is_empty() {
        out.push(Check::fail(
            format!("sidecar.engine {base}"),
            format!(
                "the engine's KV-event stream is down ({}); nothing reaches the index from this replica",
                if down.is_empty() {
                    "no engine_connected series".to_owned()
                } else {
                    down.join(", ")
                }
            ),
            "the sidecar's --engine-endpoint does not reach the engine's ZMQ publisher: start \
             the engine with KV events on (vLLM: --kv-events-config \
             '{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\"}'; \
             SGLang: --kv-events-config with the same endpoint) and point the sidecar's \
             --engine-endpoint at tcp://ENGINE_HOST:5557 (and --replay-endpoint at the \
             replay port, 5558 by default)",
        ));
    } else if events == 0.0 {
        out.push(Check::warn(
            format!("sidecar.engine {base}"),
            "connected to the engine, but no KV event has arrived yet",
            "send the engine a request; if events stay at 0, the engine publishes on another \
             topic or endpoint than --engine-endpoint/--topic, or runs without \
             enable_kv_cache_events",
        ));
    } else {
        out.push(Check::ok(
            format!("sidecar.engine {base}"),
            format!("engine KV-event stream connected; {events} events received"),
        ));
    }
    let server_up =
        samples(&body, "inferencecache_subscriber_server_connected").any(|(_, v)| v == 1.0);
    if server_up {
        out.push(Check::ok(
            format!("sidecar.server {base}"),
            "connected to the server and resynced",
        ));
    } else {
        out.push(Check::fail(
            format!("sidecar.server {base}"),
            "the sidecar cannot reach the server",
            "check the sidecar's --server (the server's gRPC address) and its TLS flags match \
             the server's (https:// and --tls-ca-file when serve has --tls-cert-file)",
        ));
    }
}

/// `lookup`: one real LookupRoute, as a gateway would ask; a shadow lookup
/// (no request follows it, so it must leave no delivery behind).
async fn lookup(t: &Target, client: &Client) -> Check {
    const NAME: &str = "lookup";
    let req = LookupRouteRequest {
        model_id: t.model.clone(),
        tenant_id: t.tenant.clone(),
        hash_scheme: t.hash_scheme.clone(),
        token_ids: LOOKUP_TOKENS.collect(),
        ..Default::default()
    };
    match client.shadow_lookup_raw(req, t.timeout).await {
        Ok(r) => {
            let detail = format!(
                "LookupRoute {}/{}: {} ({} replica score(s), {} µs)",
                t.tenant,
                t.model,
                r.reason_code,
                r.replica_scores.len(),
                r.lookup_latency_us
            );
            match r.reason_code.as_str() {
                "UNKNOWN_TENANT" | "UNKNOWN_MODEL" | "UNKNOWN_HASH_SCHEME" => Check::warn(
                    NAME,
                    detail,
                    "no replica reports under this tenant/model/hash scheme: pass the --tenant, \
                     --model and --hash-scheme your sidecars use (subscribe --tenant-id, \
                     --model-id, --hash-scheme)",
                ),
                _ => Check::ok(NAME, detail),
            }
        }
        Err(e) => Check::fail(
            NAME,
            format!("LookupRoute failed: {e}"),
            "the server answers gRPC but LookupRoute fails; read the server's logs",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_flag_forms() {
        assert_eq!(
            split_server("http://127.0.0.1:9090").unwrap(),
            ("127.0.0.1".into(), 9090, false)
        );
        assert_eq!(
            split_server("https://ic.svc:443/").unwrap(),
            ("ic.svc".into(), 443, true)
        );
        assert_eq!(
            split_server("localhost:9").unwrap(),
            ("localhost".into(), 9, false)
        );
        assert!(split_server("ftp://x:1").is_err());
        assert!(split_server("x").is_err());
    }

    fn target(argv: &[&str], found: &Found, server_flag_given: bool) -> Target {
        #[derive(clap::Parser)]
        struct Doctor {
            #[command(flatten)]
            args: DoctorArgs,
        }
        let parsed = <Doctor as clap::Parser>::try_parse_from(
            std::iter::once("doctor").chain(argv.iter().copied()),
        )
        .unwrap();
        Target::new(&parsed.args, None, Some(found), server_flag_given).unwrap()
    }

    #[test]
    fn discovery_fills_what_no_flag_says() {
        let found = Found {
            server: Some(super::super::discover::Server {
                grpc: "10.0.0.9:9090".into(),
                http: "10.0.0.9:8080".into(),
                control: "127.0.0.1:18081".into(),
                tls_name: Some("inference-cache-server.ic.svc".into()),
            }),
            sidecars: vec![super::super::discover::Sidecar {
                label: "team-a/vllm-0".into(),
                url: "http://10.1.0.4:8090".into(),
                unreachable_fix: "port-forward".into(),
            }],
            tenant: Some("team-a".into()),
            model: Some("qwen".into()),
            ..Found::default()
        };
        let t = target(&["--kubeconfig", "--tenant", "team-b"], &found, false);
        assert_eq!(t.server, "https://10.0.0.9:9090");
        assert!(t.wants_tls);
        assert_eq!(t.http, "http://10.0.0.9:8080");
        assert_eq!(t.control, "http://127.0.0.1:18081");
        assert_eq!(t.sidecars[0].0, "team-a/vllm-0");
        assert_eq!((t.tenant.as_str(), t.model.as_str()), ("team-b", "qwen"));
        assert_eq!(t.hash_scheme, inferencecache_client::DEFAULT_HASH_SCHEME);
        assert!(t.server_missing.is_none());

        // Typed flags win.
        let argv = [
            "--kubeconfig",
            "--server",
            "127.0.0.1:9090",
            "--sidecar",
            "127.0.0.1:9400",
        ];
        let t = target(&argv, &found, true);
        assert_eq!(t.grpc_addr, "127.0.0.1:9090");
        assert!(!t.wants_tls);
        assert_eq!(t.control, "http://127.0.0.1:8081");
        assert_eq!(t.sidecars[0].1, "http://127.0.0.1:9400");

        // Nothing found and no --server: the server checks are skipped.
        let t = target(&["--kubeconfig"], &Found::default(), false);
        assert!(t.server_missing.is_some());
    }
}
