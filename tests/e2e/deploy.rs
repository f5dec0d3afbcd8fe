//! What operators install (`deploy/`) agrees with compactor: the Kubernetes manifests with the
//! configuration they ship (ports, probe paths, the drain within the grace period), the dashboard
//! and the alert rules with the metrics `/metrics` exposes.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_yaml::Value;

use crate::common::*;
use crate::operations::described_metric_families;

fn deploy_file(path: &str) -> String {
    std::fs::read_to_string(format!("{}/deploy/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// Every document of every manifest in `deploy/kubernetes`, keyed by `kind/name`.
fn manifests() -> Vec<(String, Value)> {
    let dir = format!("{}/deploy/kubernetes", env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = Value::deserialize(document).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let kind = value["kind"].as_str().unwrap_or_default();
            let name = value["metadata"]["name"].as_str().unwrap_or_default();
            out.push((format!("{kind}/{name}"), value));
        }
    }
    out
}

fn manifest(all: &[(String, Value)], id: &str) -> Value {
    all.iter().find(|(k, _)| k == id).unwrap_or_else(|| panic!("no {id} in deploy/kubernetes")).1.clone()
}

#[test]
fn the_kubernetes_manifests_agree_with_the_configuration_they_ship() {
    let all = manifests();
    let kustomization = manifest(&all, "Kustomization/");
    let listed: Vec<&str> =
        kustomization["resources"].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for file in &listed {
        assert!(std::path::Path::new(&format!("{}/deploy/kubernetes/{file}", env!("CARGO_MANIFEST_DIR"))).exists());
    }

    // The ConfigMap carries the shipped file as it is.
    let config_map = manifest(&all, "ConfigMap/compactor-config");
    let shipped = config_map["data"]["compactor.toml"].as_str().unwrap();
    let file = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/compactor.toml")).unwrap();
    assert!(
        shipped == file,
        "deploy/kubernetes/configmap.yaml differs from config/compactor.toml: run scripts/deploy-configmap"
    );

    let deployment = manifest(&all, "Deployment/compactor");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    // The effective configuration: the ConfigMap's file with the container's literal variables,
    // checked by the binary itself.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("compactor.toml");
    std::fs::write(&file, shipped).unwrap();
    let env: Vec<(String, String)> = container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| Some((v["name"].as_str()?.to_string(), v["value"].as_str()?.to_string())))
        .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (code, effective, err) = run_binary(&["--config", file.to_str().unwrap(), "--check-config"], &env);
    assert_eq!(code, Some(0), "{err}");
    let effective: toml::Table = effective.parse().unwrap();
    let listen: std::net::SocketAddr = effective["listen"].as_str().unwrap().parse().unwrap();
    assert!(listen.ip().is_unspecified(), "listens on every interface in a pod: {listen}");
    assert_eq!(effective["session"]["store"].as_str(), Some("redis"));
    let redis_url = effective["session"]["redis_url"].as_str().unwrap();
    let redis = manifest(&all, "Service/compactor-redis");
    let redis_port = redis["spec"]["ports"][0]["port"].as_u64().unwrap();
    assert_eq!(redis_url, format!("redis://compactor-redis:{redis_port}"));

    // Ports: the container's, the probes', the Service's and the config's agree.
    let port = &container["ports"][0];
    assert_eq!(port["containerPort"].as_u64(), Some(u64::from(listen.port())));
    let port_name = port["name"].as_str().unwrap();
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(container[probe]["httpGet"]["path"].as_str(), Some(path), "{probe}");
        assert_eq!(container[probe]["httpGet"]["port"].as_str(), Some(port_name), "{probe}");
    }
    let service = manifest(&all, "Service/compactor");
    assert_eq!(service["spec"]["ports"][0]["targetPort"].as_str(), Some(port_name));
    assert_eq!(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"]);
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"].as_str(),
        Some(listen.port().to_string().as_str())
    );

    // The config is mounted where the container reads it.
    let mount = container["volumeMounts"][0]["mountPath"].as_str().unwrap();
    let args: Vec<&str> = container["args"].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(args, ["--config", &format!("{mount}/compactor.toml")]);
    assert_eq!(pod["volumes"][0]["configMap"]["name"].as_str(), Some("compactor-config"));

    // preStop, then the whole drain, fit in the grace period.
    let drain_ms = effective["shutdown"]["drain_timeout_ms"].as_integer().unwrap() as u64;
    let pre_stop_s = container["lifecycle"]["preStop"]["sleep"]["seconds"].as_u64().unwrap();
    let grace_s = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(pre_stop_s > 0);
    assert!(
        pre_stop_s * 1000 + drain_ms <= grace_s * 1000,
        "preStop {pre_stop_s} s + drain {drain_ms} ms > {grace_s} s"
    );

    let hpa = manifest(&all, "HorizontalPodAutoscaler/compactor");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"].as_str(), Some("compactor"));
    assert!(container["resources"]["requests"]["memory"].as_str().is_some());
}

/// The `compactor_*` metric families an expression uses (`_bucket`, `_sum`, `_count` folded).
fn metrics_in(expression: &str, into: &mut BTreeSet<String>) {
    let mut rest = expression;
    while let Some(at) = rest.find("compactor_") {
        let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        rest = &rest[at + name.len()..];
        let family = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name);
        into.insert(family.to_string());
    }
}

fn dashboard_expressions(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                match inner {
                    serde_json::Value::String(expr) if key == "expr" => out.push(expr.clone()),
                    _ => dashboard_expressions(inner, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| dashboard_expressions(item, out)),
        _ => {}
    }
}

#[tokio::test]
async fn every_metric_the_dashboard_and_the_alert_rules_use_is_exposed() {
    let dashboard: serde_json::Value = serde_json::from_str(&deploy_file("grafana/compactor-dashboard.json")).unwrap();
    let mut expressions = Vec::new();
    dashboard_expressions(&dashboard, &mut expressions);
    let rules: Value = serde_yaml::from_str(&deploy_file("prometheus/compactor-rules.yaml")).unwrap();
    let mut alerts = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            assert!(rule["alert"].as_str().is_some() && rule["annotations"]["summary"].as_str().is_some());
            alerts.push(rule["alert"].as_str().unwrap().to_string());
            expressions.push(rule["expr"].as_str().unwrap().to_string());
        }
    }
    for needed in ["StoreDegraded", "CompactionFailures", "UpstreamErrors"] {
        assert!(alerts.iter().any(|a| a.contains(needed)), "{needed}: {alerts:?}");
    }
    let mut used = BTreeSet::new();
    for expression in &expressions {
        metrics_in(expression, &mut used);
    }
    assert!(used.len() >= 10, "{used:?}");

    let (_fake, proxy) = ProxyProcess::with_fake("").await;
    let exposed = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    let described = described_metric_families();
    for family in &used {
        assert!(exposed.contains(&format!("# TYPE {family} ")), "{family} is used but not exposed:\n{exposed}");
        assert!(described.contains(family), "{family} is not described in src/telemetry");
    }
}
