//! The Helm chart `charts/service-mirror` under test: the `helm` binary the project
//! builds (`build-control-plane.sh --node`), `helm template` parsed into objects, and
//! the comparison with what `service-mirror install` prints, object by object.
//!
//! The checker reads the chart's output and install's output as plain JSON; it never
//! calls the code that builds either.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Helm's own labels: the only metadata allowed to differ from `install`'s (the chart
/// says `managed-by: Helm` where install says `service-mirror`).
pub(crate) const HELM_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];
/// Helm's own annotation on the CRDs: `helm uninstall` keeps them.
pub(crate) const KEEP_ANNOTATION: &str = "helm.sh/resource-policy";

/// The repository's root.
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The chart's directory.
pub(crate) fn chart_dir() -> PathBuf {
    repo_root().join("charts/service-mirror")
}

/// The `helm` binary of `build-control-plane.sh --node --print` (or
/// `SERVICE_MIRROR_NODE_DIR`). Absent: under `CI=true` the test fails; otherwise it
/// prints one `skipped:` line and the caller returns.
pub(crate) fn helm() -> Option<Helm> {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/build-control-plane.sh"))
        .args(["--node", "--print"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("run build-control-plane.sh --node --print");
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let bin = Path::new(&dir).join("helm");
    if out.status.success() && bin.is_file() {
        // Helm's caches and settings in a directory of its own, not the user's home.
        let home = std::env::temp_dir().join(format!("service-mirror-helm-{}", std::process::id()));
        return Some(Helm { bin, home });
    }
    let why = format!(
        "helm is not built ({}): run `bash scripts/build-control-plane.sh --node`",
        bin.display()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    eprintln!("skipped: the Helm chart tests: {why}");
    None
}

/// One run of helm.
pub(crate) struct HelmRun {
    pub(crate) ok: bool,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

pub(crate) struct Helm {
    bin: PathBuf,
    home: PathBuf,
}

impl Helm {
    /// `helm <args>`, with no `HELM_*` nor `KUBECONFIG` of the environment.
    pub(crate) fn run(&self, args: &[&str]) -> HelmRun {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args).stdin(Stdio::null());
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("HELM_") || k == "KUBECONFIG" {
                cmd.env_remove(&key);
            }
        }
        for (var, sub) in [
            ("HELM_CACHE_HOME", "cache"),
            ("HELM_CONFIG_HOME", "config"),
            ("HELM_DATA_HOME", "data"),
        ] {
            cmd.env(var, self.home.join(sub));
        }
        let out = cmd.output().expect("run helm");
        HelmRun {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// `helm template service-mirror <chart> -n <namespace> <extra>`: the objects, or
    /// helm's error text.
    pub(crate) fn template(
        &self,
        namespace: &str,
        extra: &[&str],
    ) -> Result<Vec<serde_json::Value>, String> {
        let chart = chart_dir().display().to_string();
        let mut args = vec!["template", "service-mirror", &chart, "-n", namespace];
        args.extend_from_slice(extra);
        let run = self.run(&args);
        if !run.ok {
            return Err(run.stderr);
        }
        Ok(local_cluster::parse_documents(&run.stdout).expect("helm template prints objects"))
    }
}

/// `Kind/namespace/name` (`Kind/name` for a cluster-scoped object).
pub(crate) fn key(obj: &serde_json::Value) -> String {
    let m = &obj["metadata"];
    match m["namespace"].as_str() {
        Some(ns) => format!("{}/{ns}/{}", obj["kind"].as_str().unwrap_or("?"), m["name"]),
        None => format!("{}/{}", obj["kind"].as_str().unwrap_or("?"), m["name"]),
    }
    .replace('"', "")
}

/// `obj` without Helm's own labels and annotation, wherever metadata is (the object's
/// and a pod template's); an emptied map is removed.
pub(crate) fn without_helm_metadata(mut obj: serde_json::Value) -> serde_json::Value {
    fn strip(meta: &mut serde_json::Value) {
        let Some(meta) = meta.as_object_mut() else {
            return;
        };
        for (field, keys) in [
            ("labels", &HELM_LABELS[..]),
            ("annotations", &[KEEP_ANNOTATION][..]),
        ] {
            if let Some(map) = meta.get_mut(field).and_then(|m| m.as_object_mut()) {
                for k in keys {
                    map.remove(*k);
                }
                if map.is_empty() {
                    meta.remove(field);
                }
            }
        }
    }
    strip(&mut obj["metadata"]);
    if obj["spec"]["template"]["metadata"].is_object() {
        strip(&mut obj["spec"]["template"]["metadata"]);
    }
    obj
}

/// Every path where `a` and `b` differ: `path: a-value != b-value` (`<absent>` for a
/// missing field).
pub(crate) fn diff(
    a: &serde_json::Value,
    b: &serde_json::Value,
    path: &str,
    out: &mut Vec<String>,
) {
    use serde_json::Value::{Array, Object};
    match (a, b) {
        (Object(x), Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(v), Some(w)) => diff(v, w, &p, out),
                    (Some(v), None) => out.push(format!("{p}: {v} != <absent>")),
                    (None, Some(w)) => out.push(format!("{p}: <absent> != {w}")),
                    (None, None) => unreachable!(),
                }
            }
        }
        (Array(x), Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                diff(v, w, &format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => out.push(format!("{path}: {a} != {b}")),
        _ => {}
    }
}

/// Compares `install`'s objects with the chart's, by `Kind/namespace/name`, after
/// [`without_helm_metadata`] on both. The install's Namespace is expected absent from
/// the chart (`helm install --create-namespace` makes it; a Namespace in the release
/// would be deleted by `helm uninstall`, link Secrets and all). Returns every
/// difference, each naming the object and the field.
pub(crate) fn compare_with_install(
    install: &[serde_json::Value],
    chart: &[serde_json::Value],
    namespace: &str,
) -> Vec<String> {
    let index = |docs: &[serde_json::Value]| -> BTreeMap<String, serde_json::Value> {
        docs.iter()
            .map(|d| (key(d), without_helm_metadata(d.clone())))
            .collect()
    };
    let (mut want, got) = (index(install), index(chart));
    assert_eq!(want.len(), install.len(), "install: duplicate objects");
    assert_eq!(got.len(), chart.len(), "chart: duplicate objects");
    let namespace_key = format!("Namespace/{namespace}");
    assert!(
        want.remove(&namespace_key).is_some(),
        "install prints {namespace_key}"
    );
    let mut out = Vec::new();
    for (k, w) in &want {
        match got.get(k) {
            None => out.push(format!(
                "{k}: printed by install, not rendered by the chart"
            )),
            Some(g) => {
                let mut fields = Vec::new();
                diff(w, g, "", &mut fields);
                out.extend(
                    fields
                        .into_iter()
                        .map(|f| format!("{k}: {f} (install != chart)")),
                );
            }
        }
    }
    for k in got.keys().filter(|k| !want.contains_key(*k)) {
        out.push(format!(
            "{k}: rendered by the chart, not printed by install"
        ));
    }
    out
}
