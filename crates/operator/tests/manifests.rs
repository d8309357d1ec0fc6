//! The CRDs and `config/` against a real kube-apiserver 1.20: `config/crd/`
//! equals `inferencecache crds`, the CRDs install (structural schemas the
//! 1.20 apiserver accepts) and validate and default as documented, and
//! `kubectl apply --dry-run=server -k` passes for the base, every overlay and
//! the samples. Also the alert rules: `promtool test rules` and the
//! PrometheusRule carrying exactly the rule file's groups.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use inferencecache_operator::crd::{self, CachePolicy, CacheTenant};
use inferencecache_operator::testing::{Cluster, apiserver_binary, require, which};
use kube::api::{Api, PostParams};
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn config_crd_bases_equal_the_generated_crds() {
    let bases = repo().join("config/crd/bases");
    let mut expected: Vec<String> = Vec::new();
    for c in crd::all() {
        let name = crd::file_name(&c);
        let want = crd::to_yaml(&c).unwrap();
        let got = std::fs::read_to_string(bases.join(&name)).unwrap_or_default();
        assert!(
            got == want,
            "config/crd/bases/{name} is stale: regenerate with\n  \
             inferencecache crds --output-dir config/crd/bases"
        );
        expected.push(name);
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(&bases)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    expected.sort();
    assert_eq!(on_disk, expected, "config/crd/bases holds exactly the CRDs");
    let kustomization =
        std::fs::read_to_string(repo().join("config/crd/kustomization.yaml")).unwrap();
    for name in &expected {
        assert!(
            kustomization.contains(&format!("bases/{name}")),
            "{name} not in kustomization"
        );
    }
}

#[test]
fn prometheus_rule_carries_the_rule_file_groups() {
    let dir = repo().join("config/overlays/observability");
    let rules: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dir.join("alerts.rules.yaml")).unwrap())
            .unwrap();
    let cr: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dir.join("prometheusrule.yaml")).unwrap())
            .unwrap();
    assert_eq!(cr["spec"]["groups"], rules["groups"]);
    assert_eq!(cr["kind"], "PrometheusRule");
}

#[test]
fn promtool_unit_tests_cover_every_alert() {
    if !require(which("promtool"), "promtool (apt-get install prometheus)") {
        return;
    }
    let dir = repo().join("config/overlays/observability");
    let out = Command::new("promtool")
        .args(["test", "rules", "alerts_test.yaml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rules = std::fs::read_to_string(dir.join("alerts.rules.yaml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("alerts_test.yaml")).unwrap();
    for line in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
    {
        assert!(
            tests.contains(&format!(
                "alertname: {line}\n    exp_alerts:\n    - exp_labels"
            )),
            "alert {line} has no firing test case"
        );
    }
}

#[tokio::test]
async fn crds_install_default_and_validate_on_a_real_apiserver() {
    let Some(bin) = apiserver_binary() else {
        return;
    };
    let cluster = Cluster::start(&bin).await;
    cluster.install_crds(&crd::all()).await;
    cluster.namespace("team").await;
    let client = cluster.client().await;

    // Schema defaults materialise on an empty spec.
    let policies: Api<CachePolicy> = Api::namespaced(client.clone(), "team");
    // Raw JSON, so client-side serde defaults cannot hide the apiserver's
    // defaulting.
    let raw = serde_json::json!({
        "apiVersion": "inferencecache.io/v1alpha1", "kind": "CachePolicy",
        "metadata": {"name": "p"}, "spec": {"strategy": {}}
    });
    let dynamic: Api<kube::core::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "team",
        &kube::core::ApiResource::erase::<CachePolicy>(&()),
    );
    dynamic
        .create(
            &PostParams::default(),
            &serde_json::from_value(raw).unwrap(),
        )
        .await
        .unwrap();
    let got = dynamic.get("p").await.unwrap();
    let spec = &got.data["spec"];
    assert_eq!(spec["eviction"], "LRU");
    assert_eq!(spec["minimumMatchedTokens"], 64);
    assert_eq!(spec["routingFloorScore"], "0.1");
    assert_eq!(spec["affinityRouting"], "Enabled");
    assert_eq!(spec["strategy"]["enableChainMatching"], true);
    assert_eq!(spec["strategy"]["requireChain"], false);
    // And our type reads it back.
    let typed = policies.get("p").await.unwrap();
    assert_eq!(typed.spec.minimum_matched_tokens, Some(64));
    // `routing` has no default: a policy that does not set it must not turn
    // every push into version 8.
    assert!(spec.get("routing").is_none(), "{spec}");

    // Schema validation rejects what it can express.
    for (name, spec, why) in [
        (
            "bad-enum",
            serde_json::json!({"eviction": "FIFO"}),
            "eviction",
        ),
        (
            "bad-floor",
            serde_json::json!({"routingFloorScore": "abc"}),
            "routingFloorScore",
        ),
        (
            "bad-min",
            serde_json::json!({"minimumMatchedTokens": -1}),
            "minimumMatchedTokens",
        ),
        (
            "bad-ranking",
            serde_json::json!({"routing": {"ranking": "ttft"}}),
            "spec.routing.ranking",
        ),
        (
            "bad-reload",
            serde_json::json!({"routing": {"t2ReloadCost": 2}}),
            "spec.routing.t2ReloadCost",
        ),
        (
            "bad-weight",
            serde_json::json!({"routing": {"prefillMicrosPerToken": -1}}),
            "spec.routing.prefillMicrosPerToken",
        ),
        (
            "bad-ttl",
            serde_json::json!({"routing": {"tentativeTTLSeconds": 86401}}),
            "spec.routing.tentativeTTLSeconds",
        ),
    ] {
        let obj = serde_json::json!({
            "apiVersion": "inferencecache.io/v1alpha1", "kind": "CachePolicy",
            "metadata": {"name": name}, "spec": spec
        });
        let err = dynamic
            .create(
                &PostParams::default(),
                &serde_json::from_value(obj).unwrap(),
            )
            .await
            .expect_err(name);
        assert!(err.to_string().contains(why), "{name}: {err}");
    }
    let tenants: Api<kube::core::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "team",
        &kube::core::ApiResource::erase::<CacheTenant>(&()),
    );
    for (name, spec, why) in [
        ("empty-id", serde_json::json!({"tenantID": ""}), "tenantID"),
        (
            "crypto",
            serde_json::json!({"tenantID": "t", "crypto": {"k": 1}}),
            "crypto",
        ),
        (
            "quota",
            serde_json::json!({"tenantID": "t", "quota": {"maxIndexEntries": -5}}),
            "maxIndexEntries",
        ),
    ] {
        let obj = serde_json::json!({
            "apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheTenant",
            "metadata": {"name": name}, "spec": spec
        });
        let err = tenants
            .create(
                &PostParams::default(),
                &serde_json::from_value(obj).unwrap(),
            )
            .await
            .expect_err(name);
        assert!(err.to_string().contains(why), "{name}: {err}");
    }

    // The print columns are served.
    let out = cluster.kubectl(&["get", "cpol", "-n", "team"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("EVICTION") && text.contains("LRU"), "{text}");
}

#[tokio::test]
async fn kustomize_base_overlays_and_samples_pass_server_dry_run() {
    let Some(bin) = apiserver_binary() else {
        return;
    };
    if !require(which("kubectl"), "kubectl") {
        return;
    }
    let cluster = Cluster::start(&bin).await;
    let run = |args: &[&str]| {
        let out = cluster.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/third_party_crds.yaml");
    run(&["apply", "-f", data.to_str().unwrap()]);
    // Our CRDs for real (the samples need them served), the rest dry-run.
    let config = repo().join("config");
    run(&["apply", "-k", config.join("crd").to_str().unwrap()]);
    run(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=30s",
    ]);
    // Server-side dry-run does not create namespaces, so the objects in them
    // need the namespaces to exist.
    cluster.namespace("inference-cache-system").await;
    cluster.namespace("team-a").await;
    for dir in [
        "default",
        "overlays/cert-manager",
        "overlays/server-tls",
        "overlays/observability",
        "samples",
    ] {
        let out = run(&[
            "apply",
            "--dry-run=server",
            "-k",
            config.join(dir).to_str().unwrap(),
        ]);
        assert!(out.contains("(server dry run)"), "{dir}: {out}");
    }

    // Least privilege, checked by the apiserver's own authorizer: the base
    // applied for real, then `kubectl auth can-i` as each service account.
    run(&["apply", "-k", config.join("default").to_str().unwrap()]);
    let sa = |name: &str| format!("--as=system:serviceaccount:inference-cache-system:{name}");
    let can = |who: &str, args: &[&str]| {
        let mut a = vec!["auth", "can-i"];
        a.extend_from_slice(args);
        let who = sa(who);
        a.push(&who);
        let out = cluster.kubectl(&a);
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    let controller = "inference-cache-controller";
    let status = "--subresource=status";
    for allowed in [
        &["list", "cachepolicies.inferencecache.io", "-A"][..],
        &["watch", "cachetenants.inferencecache.io", "-A"],
        &["create", "cacheindices.inferencecache.io", "-A"],
        &["update", "cacheindices.inferencecache.io", status, "-A"],
        &["patch", "cachetenants.inferencecache.io", status, "-A"],
        &["patch", "cachebackends.inferencecache.io", status, "-A"],
        &["list", "pods", "-A"],
        &[
            "update",
            "leases.coordination.k8s.io",
            "-n=inference-cache-system",
        ],
        // Its own webhook certificate and CA injection, by name.
        &[
            "update",
            "secret/inference-cache-webhook-cert",
            "-n=inference-cache-system",
        ],
        &["create", "secrets", "-n=inference-cache-system"],
        &[
            "update",
            "validatingwebhookconfigurations/inference-cache-validating-webhook-configuration",
        ],
        &[
            "update",
            "mutatingwebhookconfigurations/inference-cache-mutating-webhook-configuration",
        ],
    ] {
        assert!(can(controller, allowed), "operator needs {allowed:?}");
    }
    for denied in [
        &["update", "cachepolicies.inferencecache.io", "-A"][..],
        &["update", "cachepolicies.inferencecache.io", status, "-A"],
        &["delete", "pods", "-A"],
        &["get", "secrets", "-A"],
        &["get", "secret/other", "-n=inference-cache-system"],
        &["create", "secrets", "-n=default"],
        &["update", "validatingwebhookconfigurations/someone-elses"],
        &["update", "leases.coordination.k8s.io", "-n=default"],
    ] {
        assert!(!can(controller, denied), "operator must not {denied:?}");
    }
    assert!(can(
        "inference-cache-server",
        &["create", "tokenreviews.authentication.k8s.io", "-A"]
    ));
    assert!(!can("inference-cache-server", &["list", "pods", "-A"]));
}

/// The Dockerfile's base images come from registries these machines cannot
/// reach, so its structure is checked here (two stages, a non-root minimal
/// runtime holding only the binary, build inputs that exist, the builder at
/// the workspace's rust-version); the same image without a registry is
/// built by `.ci/build-image` and run on a real node by the CLI's
/// `node_e2e` suite.
#[test]
fn dockerfile_is_multi_stage_with_a_non_root_runtime() {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let froms: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "builder + runtime: {froms:?}");
    assert!(froms[0].ends_with(" AS builder"), "{}", froms[0]);
    assert!(
        froms[1].contains("distroless") && froms[1].contains("nonroot"),
        "minimal non-root runtime base: {}",
        froms[1]
    );
    let runtime: Vec<&str> = lines
        .iter()
        .copied()
        .skip_while(|l| *l != froms[1])
        .collect();
    assert!(
        runtime.iter().all(|l| !l.starts_with("RUN ")),
        "the runtime stage runs nothing (no shell there)"
    );
    let copies: Vec<&&str> = runtime.iter().filter(|l| l.starts_with("COPY ")).collect();
    assert_eq!(copies.len(), 1, "only the binary: {copies:?}");
    assert!(copies[0].starts_with("COPY --from=builder /inferencecache "));
    let user = runtime
        .iter()
        .find(|l| l.starts_with("USER "))
        .expect("USER");
    assert!(!user.contains("root") && !user.contains(" 0"), "{user}");
    assert!(
        runtime
            .iter()
            .any(|l| l.starts_with("ENTRYPOINT [\"/usr/local/bin/inferencecache\"]"))
    );
    assert!(text.contains("--locked -p inferencecache-cli --bin inferencecache"));
    // The builder is the Rust the workspace declares (the oldest that
    // builds Cargo.lock), so `--locked` works.
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let msrv = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("workspace rust-version");
    assert!(
        froms[0].contains(&format!("rust:{msrv}-")),
        "builder {} is not Rust {msrv}",
        froms[0]
    );
    for l in lines
        .iter()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let parts: Vec<&str> = l.split_whitespace().collect();
        for src in &parts[1..parts.len() - 1] {
            assert!(repo().join(src).exists(), "COPY source {src} missing");
        }
    }
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    assert!(
        ignore.lines().any(|l| l.trim() == "target"),
        "target/ stays out of the context"
    );
}
