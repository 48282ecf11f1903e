//! MCS on by default only where it can run (issue 17): the real binary with no MCS flag
//! on a cluster of its own (a ClusterProperty `id.k8s.io` is cluster-wide: on a shared
//! apiserver it would name every other test's controller). Each step is one start of
//! the process and what it says: the log line, the `service_mirror_mcs_state` series,
//! an Event where a ClusterProperty is wrong, and whether a ServiceExport is served.
//! And docs/operations.md's MCS recipe, read from the document and followed as written
//! on two apiservers of its own.

use crate::support;
use crate::support::controller::{Controller, service_mirror};
use crate::support::mcs::mcs_api;
use crate::support::{create_namespace, events_on, eventually};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use local_cluster::{LocalCluster, apply_yaml};
use serde_json::json;
use service_mirror_controller::mcs::startup::{
    CLUSTER_ID_PROPERTY, CLUSTER_PROPERTY_CRD_YAML, cluster_id_property, cluster_property_resource,
};
use service_mirror_controller::mcs::{SERVICE_EXPORT_CRD_YAML, SERVICE_IMPORT_CRD_YAML};
use service_mirror_controller::permissions::service_export_api_served;
use std::collections::BTreeMap;
use std::time::Duration;

/// Longest wait for a start's verdict (a start asks two questions).
const VERDICT_WITHIN: Duration = Duration::from_secs(30);
const NS: &str = "shop";
const CTL: &str = "mc";

/// A controller with `flags` and no MCS flag from the environment; waits for its
/// verdict series, then for `log` in its log.
async fn started(cluster: &LocalCluster, flags: &[&str], series: &str, log: &[&str]) -> Controller {
    let c = Controller::spawn(cluster, CTL, flags);
    c.wait_log(log, VERDICT_WITHIN).await;
    eventually(&format!("{flags:?}: {series}"), || async {
        c.metrics().await.contains(series).then_some(())
    })
    .await;
    c
}

/// Waits for the process to exit and returns its log: a refused start.
async fn refused(cluster: &LocalCluster, flags: &[&str]) -> String {
    let mut c = Controller::spawn(cluster, CTL, flags);
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = c.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < VERDICT_WITHIN,
            "{flags:?}: still running: {}",
            c.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !status.success(),
        "{flags:?}: a refused start exits with an error"
    );
    c.log_text()
}

fn series(state: &str, reason: &str) -> String {
    format!("service_mirror_mcs_state{{state=\"{state}\",reason=\"{reason}\"}} 1")
}

async fn set_cluster_id(client: &kube::Client, value: &str) {
    let id = cluster_id_property(value);
    apply_yaml(client, &id.to_string()).await.unwrap();
}

/// A Service `name` and its ServiceExport in [`NS`].
async fn export(client: &kube::Client, name: &str) {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let export = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
        "metadata": {"name": name},
    }))
    .unwrap();
    mcs_api(client, NS, "ServiceExport")
        .create(&PostParams::default(), &export)
        .await
        .unwrap();
}

/// The export's condition types (empty: never judged).
async fn conditions(client: &kube::Client, name: &str) -> Vec<String> {
    let e = mcs_api(client, NS, "ServiceExport")
        .get(name)
        .await
        .unwrap();
    e.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["type"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcs_runs_by_default_only_where_the_crd_is_served_and_the_cluster_is_named() {
    support::init_tracing();
    let cluster = LocalCluster::start("mcs-auto").await.unwrap();
    let client = cluster.client().await.unwrap();
    create_namespace(&client, CTL).await;
    create_namespace(&client, NS).await;

    // 1. No ServiceExport CRD: off, quietly; `on` without a name refuses to start, and
    //    so does an unusable --mcs-cluster-name in any mode.
    let mut c = started(
        &cluster,
        &[],
        &series("off", "no_crd"),
        &["MCS off", "no_crd"],
    )
    .await;
    assert!(
        c.log_lines("clusterproperties").is_empty(),
        "the ClusterProperty is not asked where it cannot decide"
    );
    c.terminate();
    let log = refused(&cluster, &["--mcs=on"]).await;
    assert!(log.contains("--mcs=on: this cluster has no name"), "{log}");
    let run = service_mirror(&[
        "run",
        "--kubeconfig",
        cluster.admin_kubeconfig().path.to_str().unwrap(),
        "--namespace",
        CTL,
        "--mcs-cluster-name",
        "West",
    ]);
    assert!(
        !run.ok && run.stderr.contains("--mcs-cluster-name"),
        "{}",
        run.stderr
    );

    // 2. The CRDs (install's three), no name: off, with a warning naming both ways.
    for yaml in [
        SERVICE_EXPORT_CRD_YAML,
        SERVICE_IMPORT_CRD_YAML,
        CLUSTER_PROPERTY_CRD_YAML,
    ] {
        apply_yaml(&client, yaml).await.unwrap();
    }
    eventually(
        "the ServiceExport and ClusterProperty CRDs served",
        || async {
            let exports = mcs_api(&client, NS, "ServiceExport");
            let properties: Api<DynamicObject> =
                Api::all_with(client.clone(), &cluster_property_resource());
            let lp = Default::default();
            (exports.list(&lp).await.is_ok() && properties.list(&lp).await.is_ok()).then_some(())
        },
    )
    .await;
    // The start asks discovery, which may list the CRD after it serves (what it says
    // then is the start's verdict for the process's life).
    eventually("discovery lists ServiceExports", || async {
        service_export_api_served(&client).await.ok()?.then_some(())
    })
    .await;
    export(&client, "web").await;
    // This one runs on (under a Lease of its own, not to hold the others' leadership):
    // once the cluster is named (step 4) its next look says a restart would start MCS.
    let unnamed = started(
        &cluster,
        &["--lease-name", "unnamed"],
        &series("off", "no_cluster_name"),
        &[
            "MCS off",
            "no_cluster_name",
            "--mcs-cluster-name",
            "id.k8s.io",
        ],
    )
    .await;

    // 3. A ClusterProperty value that is no cluster name (KEP-2149 allows dots, our
    //    mirror names do not): off, an error, a Warning Event on the ClusterProperty;
    //    `on` refuses.
    set_cluster_id(&client, "west.zone-1").await;
    let mut c = started(
        &cluster,
        &[],
        &series("off", "invalid_cluster_name"),
        &["ERROR", "MCS off", "west.zone-1"],
    )
    .await;
    let event = eventually(
        "an InvalidClusterName Event on the ClusterProperty",
        || async {
            events_on(&client, "default", CLUSTER_ID_PROPERTY)
                .await
                .into_iter()
                .find(|(reason, _)| reason == "InvalidClusterName")
        },
    )
    .await;
    assert!(event.1.contains("west.zone-1"), "{event:?}");
    c.terminate();
    let log = refused(&cluster, &["--mcs=on"]).await;
    assert!(
        log.contains("--mcs=on: ClusterProperty id.k8s.io value"),
        "{log}"
    );
    assert!(
        conditions(&client, "web").await.is_empty(),
        "nothing judged yet"
    );

    // 4. Named: on as that name; the export is judged and imported under it.
    set_cluster_id(&client, "west").await;
    let mut c = started(
        &cluster,
        &[],
        &series("on", "cluster_property"),
        &["MCS on", "cluster=west"],
    )
    .await;
    eventually("web judged", || async {
        let types = conditions(&client, "web").await;
        ["Valid", "Ready", "Conflict"]
            .iter()
            .all(|t| types.iter().any(|x| x == t))
            .then_some(())
    })
    .await;
    let imports = mcs_api(&client, NS, "ServiceImport");
    eventually("web imported from west", || async {
        imports
            .get_opt("web")
            .await
            .ok()?
            .filter(|i| i.data["status"]["clusters"][0]["cluster"].as_str() == Some("west"))
    })
    .await;
    c.terminate();
    // Its look every 60 s: within 60 s of the name and a little more.
    let asked = std::time::Instant::now();
    loop {
        let text = unnamed.metrics().await;
        if text.contains(&series("off", "restart_needed")) {
            assert!(
                !text.contains(&series("off", "no_cluster_name")),
                "one verdict series: {text}"
            );
            break;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(75),
            "no restart_needed: {}",
            unnamed.log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    unnamed
        .wait_log(&["WARN", "MCS can run now", "west"], VERDICT_WITHIN)
        .await;

    // 5. The flag wins over the ClusterProperty; `--mcs=off` wins over both.
    let mut c = started(
        &cluster,
        &["--mcs-cluster-name", "north"],
        &series("on", "flag"),
        &["MCS on", "cluster=north"],
    )
    .await;
    c.terminate();
    let c = started(
        &cluster,
        &["--mcs=off"],
        &series("off", "disabled"),
        &["MCS off", "disabled"],
    )
    .await;
    c.wait_log(&["service mirror running"], VERDICT_WITHIN)
        .await;
    export(&client, "api").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        conditions(&client, "api").await.is_empty(),
        "--mcs=off: a new export is not judged"
    );
    assert!(
        imports.get_opt("api").await.unwrap().is_none(),
        "--mcs=off: nor imported"
    );
}

/// The marker of the recipe's `sh` block in docs/operations.md.
const RECIPE_MARKER: &str = "<!-- recipe: mcs";

/// One command of the recipe: its text (continuations joined) and the heredoc it
/// feeds to stdin, if any.
#[derive(Debug)]
struct Step {
    line: String,
    heredoc: Option<String>,
}

/// The commands of the recipe block of docs/operations.md, in order: comments and
/// blank lines dropped, `\` continuations joined, `<<EOF` heredocs attached.
fn recipe_steps() -> Vec<Step> {
    let doc = include_str!("../../../../docs/operations.md");
    let at = doc.find(RECIPE_MARKER).expect("the recipe marker");
    let rest = &doc[at..];
    let body = &rest[rest.find("```sh\n").expect("a sh block after the marker") + 6..];
    let body = &body[..body.find("\n```").expect("the block's end")];
    let mut lines = body.lines();
    let mut steps = Vec::new();
    while let Some(line) = lines.next() {
        let mut text = line.trim().to_string();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        while let Some(head) = text.strip_suffix('\\') {
            let next = lines.next().expect("a continued line");
            text = format!("{} {}", head.trim_end(), next.trim());
        }
        let heredoc = text.strip_suffix("<<EOF").map(str::to_owned).map(|head| {
            text = head.trim_end().to_string();
            let mut doc = String::new();
            for l in lines.by_ref().take_while(|l| *l != "EOF") {
                doc.push_str(l);
                doc.push('\n');
            }
            doc
        });
        steps.push(Step {
            line: text,
            heredoc,
        });
    }
    steps
}

/// Two clusters of the recipe's own, their kubeconfig contexts `west` and `east` in one
/// file (as a user's), and the process each cluster's Deployment would run.
struct RecipeWorld {
    clusters: BTreeMap<String, (LocalCluster, kube::Client)>,
    kubeconfig: std::path::PathBuf,
    controllers: BTreeMap<String, Controller>,
    _dir: tempfile::TempDir,
}

impl RecipeWorld {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut clusters = BTreeMap::new();
        let mut merged: Option<kube::config::Kubeconfig> = None;
        for context in ["west", "east"] {
            let cluster = LocalCluster::start(&format!("recipe-{context}"))
                .await
                .unwrap();
            // The admin kubeconfig names its cluster, user and context after the
            // cluster: renamed to the recipe's context names.
            let yaml = cluster
                .admin_kubeconfig()
                .yaml
                .replace(cluster.name(), context);
            let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
            merged = Some(match merged {
                None => kc,
                Some(m) => m.merge(kc).unwrap(),
            });
            let client = cluster.client().await.unwrap();
            clusters.insert(context.to_string(), (cluster, client));
        }
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, serde_json::to_string(&merged).unwrap()).unwrap();
        Self {
            clusters,
            kubeconfig,
            controllers: BTreeMap::new(),
            _dir: dir,
        }
    }

    fn client(&self, context: &str) -> &kube::Client {
        &self.clusters[context].1
    }

    /// Applies `yaml` to `context` as `kubectl apply` would, retried while a CRD just
    /// made is not yet in discovery.
    async fn apply(&self, context: &str, yaml: &str, line: &str) -> Vec<String> {
        let mut last = None;
        for _ in 0..100 {
            match apply_yaml(self.client(context), yaml).await {
                Ok(applied) => return applied,
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("{line}: {last:?}")
    }

    /// Plays the kubelet: starts (again) the process of the Deployment `install`
    /// printed, with its `--namespace`.
    fn start_controller(&mut self, context: &str, namespace: &str) {
        if let Some(mut old) = self.controllers.remove(context) {
            old.terminate();
        }
        let cluster = &self.clusters[context].0;
        let c = Controller::spawn(cluster, namespace, &[]);
        self.controllers.insert(context.to_string(), c);
    }

    /// Follows one line of the recipe; panics on a line it cannot follow.
    async fn follow(&mut self, step: &Step) -> Option<serde_json::Value> {
        let words: Vec<&str> = step.line.split_whitespace().collect();
        let line = step.line.as_str();
        if words[0] == "service-mirror" {
            let bar = words
                .iter()
                .position(|w| *w == "|")
                .expect("piped to kubectl");
            let ["kubectl", "--context", context, "apply", "-f", "-"] = words[bar + 1..] else {
                panic!("cannot follow: {line}");
            };
            let mut args: Vec<&str> = words[1..bar].to_vec();
            let kubeconfig = self.kubeconfig.display().to_string();
            if args.contains(&"--context") {
                args.splice(1..1, ["--kubeconfig", kubeconfig.as_str()]);
            }
            let run = service_mirror(&args);
            assert!(run.ok, "{line}: {}", run.stderr);
            self.apply(context, &run.stdout, line).await;
            let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&run.stdout).unwrap();
            match args[0] {
                "install" => {
                    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
                    let run_args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
                    let ns = run_args
                        .as_array()
                        .unwrap()
                        .windows(2)
                        .find(|w| w[0] == "--namespace")
                        .and_then(|w| w[1].as_str())
                        .unwrap()
                        .to_string();
                    self.start_controller(context, &ns);
                }
                "allow" => {
                    // Plays the token controller.
                    let token = docs
                        .iter()
                        .find(|d| d["type"] == "kubernetes.io/service-account-token")
                        .unwrap();
                    let meta = &token["metadata"];
                    self.clusters[context]
                        .0
                        .fill_token_secret(
                            meta["namespace"].as_str().unwrap(),
                            meta["name"].as_str().unwrap(),
                        )
                        .await
                        .unwrap();
                }
                _ => {}
            }
            return None;
        }
        let ["kubectl", "--context", context, rest @ ..] = words.as_slice() else {
            panic!("cannot follow: {line}");
        };
        let (ns, rest) = match rest {
            ["-n", ns, rest @ ..] => (Some(*ns), rest),
            _ => (None, rest),
        };
        let client = self.client(context).clone();
        match (rest, ns) {
            (["apply", "-f", "-"], None) => {
                let yaml = step.heredoc.as_deref().expect("a heredoc to apply");
                self.apply(context, yaml, line).await;
                None
            }
            (["wait", "--for", "condition=established", "--all", "crd"], None) => {
                let crds: Api<CustomResourceDefinition> = Api::all(client);
                eventually(line, || async {
                    let list = crds.list(&Default::default()).await.ok()?;
                    list.items
                        .iter()
                        .all(|c| {
                            c.status
                                .iter()
                                .flat_map(|s| s.conditions.iter().flatten())
                                .any(|c| c.type_ == "Established" && c.status == "True")
                        })
                        .then_some(None)
                })
                .await
            }
            (["rollout", "restart", "deployment/service-mirror"], Some(ns)) => {
                self.start_controller(context, ns);
                let c = &self.controllers[*context];
                c.wait_log(&["MCS on", &format!("cluster={context}")], VERDICT_WITHIN)
                    .await;
                None
            }
            (["create", "namespace", name], None) => {
                create_namespace(&client, name).await;
                None
            }
            (["get", "serviceimport", name], Some(ns)) => {
                let imports = mcs_api(&client, ns, "ServiceImport");
                eventually(line, || async {
                    let i = imports.get_opt(name).await.ok()??;
                    let ready = i.data["spec"]["ips"]
                        .as_array()
                        .is_some_and(|a| !a.is_empty())
                        && i.data["status"]["clusters"]
                            .as_array()
                            .is_some_and(|a| !a.is_empty());
                    ready.then(|| serde_json::to_value(&i).unwrap())
                })
                .await
                .into()
            }
            (["get", kind @ ("service" | "endpointslices"), "-l", selector], Some(ns)) => {
                let lp = ListParams::default().labels(selector);
                eventually(line, || async {
                    let items: Vec<serde_json::Value> = match *kind {
                        "service" => Api::<Service>::namespaced(client.clone(), ns)
                            .list(&lp)
                            .await
                            .ok()?
                            .items
                            .iter()
                            .map(|s| serde_json::to_value(s).unwrap())
                            .collect(),
                        _ => Api::<EndpointSlice>::namespaced(client.clone(), ns)
                            .list(&lp)
                            .await
                            .ok()?
                            .items
                            .iter()
                            .filter(|s| !s.endpoints.is_empty())
                            .map(|s| serde_json::to_value(s).unwrap())
                            .collect(),
                    };
                    (!items.is_empty()).then_some(serde_json::Value::Array(items))
                })
                .await
                .into()
            }
            _ => panic!("cannot follow: {line}"),
        }
    }
}

/// docs/operations.md's MCS recipe, read from the document and followed line by line
/// on two apiservers of its own (a ClusterProperty names a whole cluster): from
/// nothing to a ServiceImport on west of east's export, its derived Service and east's
/// slice at the gateway the Link names, with east's export judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcs_recipe_in_operations_md_works_as_written() {
    support::init_tracing();
    let started = std::time::Instant::now();
    let steps = recipe_steps();
    assert!(steps.len() >= 10, "the whole recipe: {steps:#?}");
    let mut world = RecipeWorld::new().await;
    let mut shown = Vec::new();
    for step in &steps {
        eprintln!("recipe: {}", step.line);
        if let Some(seen) = world.follow(step).await {
            shown.push(seen);
        }
    }
    let [import, services, slices] = shown.as_slice() else {
        panic!("three objects shown by step 6: {shown:#?}")
    };
    eprintln!(
        "recipe done in {:?}\n{}\n{}\n{}",
        started.elapsed(),
        serde_json::to_string_pretty(import).unwrap(),
        serde_json::to_string_pretty(services).unwrap(),
        serde_json::to_string_pretty(slices).unwrap()
    );
    assert_eq!(import["spec"]["type"], "ClusterSetIP");
    assert_eq!(import["status"]["clusters"], json!([{"cluster": "east"}]));
    let [derived] = services.as_array().unwrap().as_slice() else {
        panic!("one derived Service: {services}")
    };
    assert_eq!(import["spec"]["ips"], derived["spec"]["clusterIPs"]);
    assert!(derived["spec"].get("selector").is_none(), "{derived}");
    assert_eq!(derived["spec"]["ports"][0]["name"], "http");
    assert_eq!(derived["spec"]["ports"][0]["port"], 80);
    let derived_name = derived["metadata"]["name"].as_str().unwrap();
    assert!(derived_name.starts_with("derived-"), "{derived_name}");
    let [slice] = slices.as_array().unwrap().as_slice() else {
        panic!("east's one slice: {slices}")
    };
    assert_eq!(
        slice["metadata"]["name"],
        format!("{derived_name}-east-ipv4-0")
    );
    assert_eq!(
        slice["metadata"]["labels"]["multicluster.kubernetes.io/source-cluster"],
        "east"
    );
    assert_eq!(
        slice["endpoints"],
        json!([{"addresses": ["192.0.2.20"], "conditions": {"ready": true, "serving": true, "terminating": false}}])
    );
    assert_eq!(
        slice["ports"],
        json!([{"name": "http", "port": 4143, "protocol": "TCP"}])
    );
    // East's controller judged its export.
    let exports = mcs_api(world.client("east"), "shop", "ServiceExport");
    eventually("east's export judged", || async {
        let e = exports.get("web").await.ok()?;
        let conditions = e.data["status"]["conditions"].as_array()?.clone();
        let status = |t: &str| {
            conditions
                .iter()
                .find(|c| c["type"] == t)
                .map(|c| (c["status"].clone(), c["reason"].clone()))
        };
        (status("Valid")?.0 == "True"
            && status("Ready")?.0 == "True"
            && status("Conflict")? == (json!("False"), json!("NoConflicts")))
            .then_some(())
    })
    .await;
    eprintln!("recipe checked in {:?}", started.elapsed());
}
