//! Least privilege proven by removal: for every verb that `service-mirror install`
//! (ClusterRole, Role, Link rules) and `service-mirror allow` (the remote ClusterRole)
//! grant, the install minus that one verb, the real binary running with the
//! ServiceAccount's token, and the lifecycle step that needs the verb failing visibly:
//! the apiserver's refusal of exactly that verb on that resource in the log, and the
//! step's effect missing (a mirror not created, updated or deleted, an Event or a
//! Lease write missing, a Link not served, ...).
//!
//! The startup check only reports a missing permission, the controller runs on
//! (`rbac::each_missing_local_permission_is_named_at_startup`), so each case reaches
//! the step itself: no bypass is needed. [`CASES`] is the table RELIABILITY.md's
//! "Least privilege" section copies; `the_cases_are_exactly_the_granted_verbs` keeps it
//! in step with `permissions.rs` and `allow`.

#[path = "support/rbac.rs"]
mod rbac_support;
mod support;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use local_cluster::{apply_yaml, client_from_yaml, unique_namespace};
use rbac_support::{RunningController, apply_documents, install, install_documents, remove_verb};
use service_mirror_controller::links::LinkResource;
use service_mirror_controller::mcs::resource::ServiceExport as ServiceExportObject;
use service_mirror_controller::mcs::startup::cluster_id_property;
use service_mirror_controller::mcs::{SERVICE_EXPORT_CRD_YAML, SERVICE_IMPORT_CRD_YAML};
use service_mirror_controller::permissions::{
    Permission, is_allowed, link_permissions, local_network_permissions, mcs_permissions,
    missing_link_permissions, missing_local_network_permissions, missing_mcs_permissions,
    missing_permissions, required_permissions,
};
use std::time::{Duration, Instant};
use support::controller::service_mirror;
use support::links::{credentials_secret, link_crd, remote_slice};
use support::*;

const GW: i32 = 4143;
/// The remote ServiceAccount `allow` creates by default.
const REMOTE_SA: &str = "linkerd-service-mirror-remote-access-default";
/// How long a case waits for the refusal to show in the log (the slowest path is a
/// write Lease renewal: 2 s into a 3 s lease, after the link is up).
const REFUSAL_WITHIN: Duration = Duration::from_secs(40);
/// How long the [`LocalNetwork`] step waits for the mirror to point at the gateway
/// address it should have refused (a granted step takes well under a second here).
const POINTED_WITHIN: Duration = Duration::from_secs(8);
/// How long an MCS case waits for a judgement made once an unlisted cluster's 30 s hold
/// ended (mcs/index.rs), on a loaded machine.
const HOLD_WITHIN: Duration = Duration::from_secs(60);
/// Cases run at once: each is one controller process and a few API clients.
const PARALLEL: usize = 6;

/// Where a verb is granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// `install`'s ClusterRole ([`service_mirror_controller::permissions::CLUSTER_RULES`]).
    Cluster,
    /// `install`'s Role in the controller namespace (`NAMESPACE_RULES`).
    Namespace,
    /// `install`'s Role, the Link rules (`LINK_RULES`).
    Link,
    /// `allow`'s ClusterRole on the remote cluster.
    Remote,
    /// `install`'s ClusterRole, the MCS rules (`MCS_RULES`; where MCS runs).
    Mcs,
    /// `install`'s ClusterRole, the local networks' reads (`LOCAL_NETWORK_RULES`).
    LocalNet,
}

/// What a case does once the RBAC minus its verb is installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Export a Service: its mirror's object of the resource is never created.
    Create,
    /// Mirror a Service, then change it (a port for Services, the gateway address for
    /// Endpoints and EndpointSlices): the mirror's object keeps the old content.
    Update,
    /// Mirror a Service, then unexport it: the mirror's object stays.
    Delete,
    /// A foreign object of the resource holds the mirror's name: the create's 409 is
    /// never told apart (ours or foreign), so no `MirrorConflict` Event.
    Conflict,
    /// The local cache of the resource cannot be filled: nothing is mirrored.
    ListLocal,
    /// The local cache is filled once and never again: the mirror the controller
    /// creates is never seen, so a later remote change never reaches it.
    WatchLocal,
    /// A remote Service in a namespace absent locally: the namespace is not created,
    /// nor the mirror.
    CreateNamespace,
    /// Linking: no `Linked` Event on the link Secret.
    EventCreate,
    /// A repeated `MirrorConflict`: the Event is never updated to a series.
    EventPatch,
    /// Link Secrets cannot be listed: nothing is linked.
    ListSecrets,
    /// A link Secret applied after the start is never seen: nothing is linked.
    WatchSecrets,
    /// The leader-election Lease cannot be used (read, made or taken): the replica
    /// never leads, nothing is mirrored.
    LeaderLease,
    /// The write Lease `service-mirror-write-<cluster>` is never renewed.
    RenewWriteLease,
    /// `--shard-links`: the Leases cannot be listed, so no write Lease is taken and
    /// nothing is mirrored.
    ShardLeases,
    /// Unlinking: the write Lease of the cluster stays.
    DeleteWriteLease,
    /// `Link`s cannot be listed: a Link is never served.
    ListLinks,
    /// A `Link` created after the start is never seen.
    WatchLinks,
    /// A Link's status (Ready condition, `mirrorServices`) is never written.
    LinkStatus,
    /// The link is refused at connection (`RemoteForbidden` on the link Secret), no
    /// mirror.
    RemoteServices,
    /// A remote Service without a ready endpoint: its mirror gets the gateway's
    /// endpoints anyway (readiness unknown).
    RemoteSlices,
    /// A local ServiceExport (made before the start; after it, for `watch`): it never
    /// gets its conditions.
    McsLocal,
    /// A remote ServiceExport that conflicts (made before the start for `list`, once
    /// the watch is refused for `watch`): the local one, judged, never says Conflict.
    McsRemote,
    /// A local export's ServiceImport: never made (`list`, `create`), never follows a
    /// port change (`watch`, `update`), never gets `status.clusters` (`patch` on the
    /// status), or outlives the export (`delete`).
    McsImport,
    /// No `--mcs-cluster-name`, the ClusterProperty `id.k8s.io` names the cluster: MCS
    /// stays off, a local export gets no conditions. (Its world has a local apiserver
    /// of its own: a ClusterProperty names the whole cluster.)
    McsClusterName,
    /// A gateway address in a local network of the resource (a ServiceCIDR, a Node's
    /// podCIDRs; for `watch`, one made after the start): not refused, the mirror points
    /// at it.
    LocalNetwork,
}

/// One row of the removal table.
struct Case {
    scope: Scope,
    group: &'static str,
    resource: &'static str,
    verb: &'static str,
    /// The lifecycle step that needs the verb.
    step: Step,
    /// What shows that the step failed.
    failure: &'static str,
}

const fn case(
    scope: Scope,
    group: &'static str,
    resource: &'static str,
    verb: &'static str,
    step: Step,
    failure: &'static str,
) -> Case {
    Case {
        scope,
        group,
        resource,
        verb,
        step,
        failure,
    }
}

use Scope::*;
use Step::*;

/// The removal table: verb → step that needs it → how the step fails without it.
#[rustfmt::skip]
const CASES: &[Case] = &[
    case(Cluster, "", "services", "get", Conflict,
        "no MirrorConflict Event on the foreign Service"),
    case(Cluster, "", "services", "list", ListLocal,
        "no mirror created"),
    case(Cluster, "", "services", "watch", WatchLocal,
        "a new remote port never reaches the mirror Service"),
    case(Cluster, "", "services", "create", Create,
        "mirror Service not created"),
    case(Cluster, "", "services", "update", Update,
        "mirror Service keeps its old ports"),
    case(Cluster, "", "services", "delete", Delete,
        "mirror Service of an unexported Service stays"),
    case(Cluster, "", "endpoints", "get", Conflict,
        "no MirrorConflict Event on the foreign Endpoints"),
    case(Cluster, "", "endpoints", "list", ListLocal,
        "no mirror created"),
    case(Cluster, "", "endpoints", "watch", WatchLocal,
        "a new remote port never reaches the mirror Endpoints"),
    case(Cluster, "", "endpoints", "create", Create,
        "mirror Endpoints not created"),
    case(Cluster, "", "endpoints", "update", Update,
        "mirror Endpoints keep the old gateway address"),
    case(Cluster, "", "endpoints", "delete", Delete,
        "mirror Endpoints of an unexported Service stay"),
    case(Cluster, "discovery.k8s.io", "endpointslices", "get", Conflict,
        "no MirrorConflict Event on the foreign EndpointSlice"),
    case(Cluster, "discovery.k8s.io", "endpointslices", "list", ListLocal,
        "no mirror created"),
    case(Cluster, "discovery.k8s.io", "endpointslices", "watch", WatchLocal,
        "a new remote port never reaches the mirror EndpointSlice"),
    case(Cluster, "discovery.k8s.io", "endpointslices", "create", Create,
        "mirror EndpointSlice not created"),
    case(Cluster, "discovery.k8s.io", "endpointslices", "update", Update,
        "mirror EndpointSlice keeps the old gateway address"),
    case(Cluster, "discovery.k8s.io", "endpointslices", "delete", Delete,
        "mirror EndpointSlice of an unexported Service stays"),
    case(Cluster, "", "namespaces", "create", CreateNamespace,
        "namespace and mirror not created"),
    case(Cluster, "events.k8s.io", "events", "create", EventCreate,
        "no Linked Event on the link Secret"),
    case(Cluster, "events.k8s.io", "events", "patch", EventPatch,
        "the repeated MirrorConflict Event gets no series"),
    case(Namespace, "", "secrets", "list", ListSecrets,
        "not linked: no Linked Event, no mirror"),
    case(Namespace, "", "secrets", "watch", WatchSecrets,
        "a link Secret applied after the start: no Linked Event, no mirror"),
    case(Namespace, "coordination.k8s.io", "leases", "get", LeaderLease,
        "never leader: no mirror"),
    case(Namespace, "coordination.k8s.io", "leases", "list", ShardLeases,
        "sharded: no write Lease taken, no mirror"),
    case(Namespace, "coordination.k8s.io", "leases", "create", LeaderLease,
        "never leader: no mirror"),
    case(Namespace, "coordination.k8s.io", "leases", "update", RenewWriteLease,
        "the write Lease's renewTime never moves"),
    case(Namespace, "coordination.k8s.io", "leases", "patch", LeaderLease,
        "never leader: no mirror"),
    case(Namespace, "coordination.k8s.io", "leases", "delete", DeleteWriteLease,
        "the write Lease of an unlinked cluster stays"),
    case(Link, "multicluster.linkerd.io", "links", "get", LinkStatus,
        "no mirrorServices entry in the Link's status"),
    case(Link, "multicluster.linkerd.io", "links", "list", ListLinks,
        "the Link is not served: no mirror"),
    case(Link, "multicluster.linkerd.io", "links", "watch", WatchLinks,
        "a Link created after the start: no mirror"),
    case(Link, "multicluster.linkerd.io", "links/status", "patch", LinkStatus,
        "no Ready condition in the Link's status"),
    case(Remote, "", "services", "list", RemoteServices,
        "RemoteForbidden on the link Secret, no mirror"),
    case(Remote, "", "services", "watch", RemoteServices,
        "RemoteForbidden on the link Secret, no mirror"),
    case(Remote, "discovery.k8s.io", "endpointslices", "list", RemoteSlices,
        "a mirror of a Service with no ready endpoint gets the gateway's endpoints"),
    case(Remote, "discovery.k8s.io", "endpointslices", "watch", RemoteSlices,
        "a mirror of a Service with no ready endpoint gets the gateway's endpoints"),
    case(Remote, "multicluster.x-k8s.io", "serviceexports", "list", McsRemote,
        "the remote's conflicting export never raises Conflict on the local one"),
    case(Remote, "multicluster.x-k8s.io", "serviceexports", "watch", McsRemote,
        "the remote's conflicting export never raises Conflict on the local one"),
    case(Mcs, "multicluster.x-k8s.io", "serviceexports", "list", McsLocal,
        "a local ServiceExport gets no conditions"),
    case(Mcs, "multicluster.x-k8s.io", "serviceexports", "watch", McsLocal,
        "a ServiceExport made after the start gets no conditions"),
    case(Mcs, "multicluster.x-k8s.io", "serviceexports/status", "patch", McsLocal,
        "a local ServiceExport gets no conditions"),
    case(Mcs, "multicluster.x-k8s.io", "serviceimports", "list", McsImport,
        "a judged export makes no ServiceImport"),
    case(Mcs, "multicluster.x-k8s.io", "serviceimports", "watch", McsImport,
        "the import keeps the old port after the exported Service's changes"),
    case(Mcs, "multicluster.x-k8s.io", "serviceimports", "create", McsImport,
        "a judged export makes no ServiceImport"),
    case(Mcs, "multicluster.x-k8s.io", "serviceimports", "update", McsImport,
        "the import keeps the old port after the exported Service's changes"),
    case(Mcs, "multicluster.x-k8s.io", "serviceimports", "delete", McsImport,
        "the import outlives its only export"),
    case(Mcs, "multicluster.x-k8s.io", "serviceimports/status", "patch", McsImport,
        "the import never lists its exporting cluster"),
    case(Mcs, "about.k8s.io", "clusterproperties", "get", McsClusterName,
        "named only by its ClusterProperty, the cluster runs no MCS: no conditions"),
    case(LocalNet, "networking.k8s.io", "servicecidrs", "list", LocalNetwork,
        "a gateway address in the local service CIDR is mirrored"),
    case(LocalNet, "networking.k8s.io", "servicecidrs", "watch", LocalNetwork,
        "a gateway address in a ServiceCIDR made after the start is mirrored"),
    case(LocalNet, "", "nodes", "list", LocalNetwork,
        "a gateway address in a Node's pod CIDR is mirrored"),
    case(LocalNet, "", "nodes", "watch", LocalNetwork,
        "a gateway address in the pod CIDR of a Node made after the start is mirrored"),
];

impl Case {
    fn name(&self) -> String {
        let scope = match self.scope {
            Cluster => "cluster",
            Namespace => "namespace",
            Link => "link",
            Remote => "remote",
            Mcs => "mcs",
            LocalNet => "local-network",
        };
        let group = if self.group.is_empty() {
            String::new()
        } else {
            format!(".{}", self.group)
        };
        format!("{} {}{group} ({scope})", self.verb, self.resource)
    }

    /// The permission the case removes, for the local ones (`ns`: the controller's).
    fn permission(&self, ns: &str) -> Option<Permission> {
        (self.scope != Remote).then(|| Permission {
            verb: self.verb.into(),
            group: self.group.into(),
            resource: self.resource.into(),
            namespace: (!matches!(self.scope, Cluster | Mcs | LocalNet)).then(|| ns.to_string()),
        })
    }
}

/// One case's world: the remote namespace and cluster name (`env`), the controller's
/// namespace and the token kubeconfig of its ServiceAccount.
struct World {
    env: Env,
    ctl_ns: String,
    kc: local_cluster::Kubeconfig,
    /// The remote credential's kubeconfig (`allow`'s account).
    remote_kubeconfig: String,
}

/// `install` minus the case's local verb, `allow` minus its remote one (`None`: both
/// whole); waits until both apiservers answer exactly that.
async fn world(case: Option<&Case>) -> World {
    let env = Env::new("lp").await;
    world_in(env, case).await
}

/// [`world`] with a local apiserver of its own, where the ClusterProperty `id.k8s.io`
/// names the cluster `here` (on a shared one it would name every test's controller).
async fn world_named_by_property(case: Option<&Case>) -> World {
    let local = local_cluster::LocalCluster::start("lp-about")
        .await
        .unwrap();
    let remote = local_cluster::shared_cluster("remote").await.unwrap();
    let env = Env::on(remote, std::sync::Arc::new(local), "lp").await;
    let w = world_in(env, case).await;
    let id = cluster_id_property("here");
    // `install` applied its CRD: applied once it is served.
    eventually("the ClusterProperty id.k8s.io applied", || async {
        apply_yaml(&w.env.lc, &id.to_string()).await.ok()
    })
    .await;
    // The start asks discovery, which may list the CRD after it serves.
    eventually("discovery lists ServiceExports", || async {
        service_mirror_controller::permissions::service_export_api_served(&w.env.lc)
            .await
            .ok()?
            .then_some(())
    })
    .await;
    w
}

async fn world_in(env: Env, case: Option<&Case>) -> World {
    let ctl_ns = unique_namespace("lp-ctl");
    let mut docs = install_documents(&ctl_ns, &[]);
    let scope = case.map(|c| c.scope);
    let removed = case.and_then(|c| c.permission(&ctl_ns));
    if let Some(p) = &removed {
        let kind = if matches!(scope, Some(Cluster | Mcs | LocalNet)) {
            "ClusterRole"
        } else {
            "Role"
        };
        remove_verb(&mut docs, kind, &p.group, &p.resource, &p.verb);
    }
    let kc = install(&env.local, &ctl_ns, &docs).await;
    link_crd(&env.local).await;
    let client = kc.client().await.unwrap();
    let (want_required, want_link, want_mcs, want_net) = match &removed {
        Some(p) if scope == Some(Link) => (vec![], vec![p.to_string()], vec![], vec![]),
        Some(p) if scope == Some(Mcs) => (vec![], vec![], vec![p.to_string()], vec![]),
        Some(p) if scope == Some(LocalNet) => (vec![], vec![], vec![], vec![p.to_string()]),
        Some(p) => (vec![p.to_string()], vec![], vec![], vec![]),
        None => (vec![], vec![], vec![], vec![]),
    };
    eventually(
        &format!("local RBAC of {ctl_ns} misses {removed:?}"),
        || {
            let (client, ns) = (client.clone(), ctl_ns.clone());
            let (r, l, m) = (want_required.clone(), want_link.clone(), want_mcs.clone());
            let n = want_net.clone();
            async move {
                let required = missing_permissions(&client, &ns).await.ok()?;
                let link = missing_link_permissions(&client, &ns).await.ok()?;
                let mcs = missing_mcs_permissions(&client).await.ok()?;
                let net = missing_local_network_permissions(&client).await.ok()?;
                (required == r && link == l && mcs == m && net == n).then_some(())
            }
        },
    )
    .await;
    let remote_kubeconfig = allow(&env, case).await;
    World {
        env,
        ctl_ns,
        kc,
        remote_kubeconfig,
    }
}

/// `allow` on the remote in a fresh namespace (minus the case's remote verb, if any);
/// returns the kubeconfig `link` builds from its token, once the remote authorizer
/// agrees.
async fn allow(env: &Env, case: Option<&Case>) -> String {
    let removed = case
        .filter(|c| c.scope == Remote)
        .map(|c| (c.group, c.resource, c.verb));
    let rns = unique_namespace("lp-remote");
    let allow = service_mirror(&["allow", "--namespace", &rns, "-o", "json"]);
    assert!(allow.ok, "allow failed: {}", allow.stderr);
    let mut docs = local_cluster::parse_documents(&allow.stdout).unwrap();
    if let Some((group, resource, verb)) = removed {
        remove_verb(&mut docs, "ClusterRole", group, resource, verb);
    }
    apply_documents(&env.remote, &docs).await;
    env.remote
        .fill_token_secret(&rns, &format!("{REMOTE_SA}-token"))
        .await
        .unwrap();
    let kubeconfig = linked_kubeconfig(env, &rns);
    let remote = client_from_yaml(&kubeconfig).await.unwrap();
    for (group, resource) in [
        ("", "services"),
        ("discovery.k8s.io", "endpointslices"),
        ("multicluster.x-k8s.io", "serviceexports"),
    ] {
        for verb in ["list", "watch"] {
            let p = Permission {
                verb: verb.into(),
                group: group.into(),
                resource: resource.into(),
                namespace: None,
            };
            let want = removed.is_none_or(|(_, r, v)| (r, v) != (resource, verb));
            eventually(&format!("remote RBAC: {p} = {want}"), || {
                let (remote, p) = (remote.clone(), p.clone());
                async move { (is_allowed(&remote, &p).await.ok()? == want).then_some(()) }
            })
            .await;
        }
    }
    kubeconfig
}

/// The kubeconfig in the link Secret `service-mirror link` prints for `env`'s cluster
/// (the token of `allow`'s account in `rns`).
fn linked_kubeconfig(env: &Env, rns: &str) -> String {
    let remote_admin = env.remote.admin_kubeconfig().path.display().to_string();
    let run = service_mirror(&[
        "link",
        "--cluster-name",
        &env.cluster,
        "--kubeconfig",
        &remote_admin,
        "--namespace",
        rns,
    ]);
    assert!(run.ok, "link failed: {}", run.stderr);
    let value: serde_json::Value = serde_saphyr::from_str(&run.stdout).unwrap();
    let secret: Secret = serde_json::from_value(value).unwrap();
    String::from_utf8(secret.data.as_ref().unwrap()["kubeconfig"].0.clone())
        .expect("utf-8 kubeconfig")
}

impl World {
    /// Applies the link Secret of this world's cluster into the controller namespace.
    async fn link_secret(&self) -> String {
        let secret = support::controller::link_secret(
            &self.secret_name(),
            Some(&self.env.cluster),
            Some(&self.remote_kubeconfig),
        );
        Api::<Secret>::namespaced(self.env.lc.clone(), &self.ctl_ns)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        self.secret_name()
    }

    fn secret_name(&self) -> String {
        format!("cluster-{}", self.env.cluster)
    }

    /// A `Link` of this world's cluster (its credentials Secret first), selecting
    /// Services labelled `mirror.linkerd.io/exported=true`.
    async fn link_resource(&self) -> String {
        let creds = format!("cluster-credentials-{}", self.env.cluster);
        Api::<Secret>::namespaced(self.env.lc.clone(), &self.ctl_ns)
            .create(
                &PostParams::default(),
                &credentials_secret(&creds, &self.remote_kubeconfig),
            )
            .await
            .unwrap();
        let link = support::links::link(
            &self.env.cluster,
            &self.env.cluster,
            &creds,
            serde_json::json!({}),
        );
        self.links()
            .create(&PostParams::default(), &link)
            .await
            .unwrap();
        self.env.cluster.clone()
    }

    /// The link's key of the remote Service `web` (what every link case exports).
    fn web(&self) -> Subject {
        Subject::link(&self.env.cluster, &self.env.ns, "web")
    }

    fn links(&self) -> Api<LinkResource> {
        Api::namespaced(self.env.lc.clone(), &self.ctl_ns)
    }

    fn controller(&self, extra: &[&str]) -> RunningController {
        let mut args = vec![
            "--namespace-allow",
            &self.env.ns,
            "--endpoint-refresh-period",
            "2s",
        ];
        args.extend_from_slice(extra);
        RunningController::spawn_as(&self.kc.path, &self.ctl_ns, &args, &[])
    }

    /// An exported remote Service `name` through gateway `gw` (Secret links: the
    /// gateway annotations; a Link: the exported label, the gateway is the Link's).
    async fn export(&self, name: &str) {
        let mut svc = exported(name, &self.env.ns, "gw", &[("http", 80)]);
        svc.metadata.labels =
            Some([("mirror.linkerd.io/exported".to_string(), "true".to_string())].into());
        self.env
            .remote_services()
            .create(&PostParams::default(), &svc)
            .await
            .unwrap();
    }

    /// The mirror's object of `resource` (`services`, `endpoints`, `endpointslices`),
    /// as JSON, if it exists.
    async fn mirror_object(&self, remote: &str, resource: &str) -> Option<serde_json::Value> {
        let name = self.env.mirror_name(remote);
        let lc = self.env.lc.clone();
        let ns = &self.env.ns;
        match resource {
            "services" => Api::<Service>::namespaced(lc, ns)
                .get_opt(&name)
                .await
                .unwrap()
                .map(|o| serde_json::to_value(o).unwrap()),
            "endpoints" => Api::<Endpoints>::namespaced(lc, ns)
                .get_opt(&name)
                .await
                .unwrap()
                .map(|o| serde_json::to_value(o).unwrap()),
            "endpointslices" => Api::<EndpointSlice>::namespaced(lc, ns)
                .get_opt(&service_mirror_core::slices::slice_name(&name, "ipv4", 0))
                .await
                .unwrap()
                .map(|o| serde_json::to_value(o).unwrap()),
            other => panic!("no mirror object of {other}"),
        }
    }

    async fn wait_mirror_object(&self, remote: &str, resource: &str) -> serde_json::Value {
        eventually(&format!("mirror {resource} of {remote}"), || {
            self.mirror_object(remote, resource)
        })
        .await
    }

    async fn no_mirror(&self, remote: &str) -> Result<(), String> {
        for r in ["services", "endpoints", "endpointslices"] {
            if let Some(o) = self.mirror_object(remote, r).await {
                return Err(format!("mirror {r} of {remote} exists: {o}"));
            }
        }
        Ok(())
    }

    async fn events(&self, ns: &str, name: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(self.env.lc.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect()
    }

    /// The MCS CRDs served on the remote too (`install` put them on the local one).
    async fn mcs_crds_on_remote(&self) {
        for yaml in [SERVICE_EXPORT_CRD_YAML, SERVICE_IMPORT_CRD_YAML] {
            apply_yaml(&self.env.rc, yaml).await.unwrap();
        }
        let exports: Api<ServiceExportObject> = Api::all(self.env.rc.clone());
        eventually("ServiceExports served on the remote", || async {
            exports.list(&Default::default()).await.ok()
        })
        .await;
    }

    /// A Service `name` with port `port` and its ServiceExport in `client`'s cluster.
    async fn mcs_export(&self, client: &kube::Client, name: &str, port: i32) {
        let svc = serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": self.env.ns},
            "spec": {"selector": {"app": name},
                     "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}});
        let export = serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
            "metadata": {"name": name, "namespace": self.env.ns}});
        apply_yaml(client, &svc.to_string()).await.unwrap();
        apply_yaml(client, &export.to_string()).await.unwrap();
    }

    /// The local ServiceImport `name`, as JSON.
    async fn mcs_import(&self, name: &str) -> Option<serde_json::Value> {
        let resource = kube::api::ApiResource {
            group: "multicluster.x-k8s.io".into(),
            version: "v1beta1".into(),
            api_version: "multicluster.x-k8s.io/v1beta1".into(),
            kind: "ServiceImport".into(),
            plural: "serviceimports".into(),
        };
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(self.env.lc.clone(), &self.env.ns, &resource);
        let o = api.get_opt(name).await.unwrap()?;
        Some(serde_json::to_value(o).unwrap())
    }

    /// Waits (within [`REFUSAL_WITHIN`]) until the local import `name` says `ok`.
    async fn mcs_import_until(
        &self,
        name: &str,
        what: &str,
        ok: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<serde_json::Value, String> {
        let start = Instant::now();
        loop {
            let i = self.mcs_import(name).await;
            if let Some(i) = i.filter(|i| ok(i)) {
                return Ok(i);
            }
            if start.elapsed() > REFUSAL_WITHIN {
                return Err(format!("the import never {what}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// (type, status, reason) of the local export's conditions.
    async fn mcs_conditions(&self, name: &str) -> Vec<(String, String, String)> {
        Api::<ServiceExportObject>::namespaced(self.env.lc.clone(), &self.env.ns)
            .get_opt(name)
            .await
            .unwrap()
            .map(|e| {
                e.conditions()
                    .iter()
                    .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn write_lease(&self) -> Option<Lease> {
        Api::<Lease>::namespaced(self.env.lc.clone(), &self.ctl_ns)
            .get_opt(&format!("service-mirror-write-{}", self.env.cluster))
            .await
            .unwrap()
    }
}

/// The [`LocalNetwork`] step: a local network of `resource` (a ServiceCIDR or a Node,
/// made after the start for `watch`) and a gateway address in it; without the verb the
/// controller does not know the network, so the mirror points at the address.
async fn local_network_step(
    w: &World,
    extra: &[&str],
    verb: &str,
    resource: &str,
) -> Result<String, String> {
    let env = &w.env;
    // A /24 of its own per case (cluster-wide objects on the shared apiserver): this
    // file's /16s are 10.252 (ServiceCIDRs) and 10.253 (Nodes);
    // tests/gateways/policy.rs has 10.254 and 10.255.
    let n = 1 + (std::process::id() as usize + verb.len() * 7) % 250;
    let (cidr, addr) = match resource {
        // The list case uses the cluster's own ServiceCIDR `kubernetes` (the
        // apiserver's --service-cluster-ip-range), away from the ClusterIP `.1`.
        "servicecidrs" if verb == "list" => {
            let range = env.local.service_cidr().to_string();
            let base = range.split('/').next().unwrap().trim_end_matches(".0.0");
            (None, format!("{base}.0.77"))
        }
        "servicecidrs" => (Some(format!("10.252.{n}.0/24")), format!("10.252.{n}.9")),
        _ => (Some(format!("10.253.{n}.0/24")), format!("10.253.{n}.9")),
    };
    let name = unique_namespace("lp-net");
    // Deleted even if the step panics.
    let scoped = ClusterScoped::new(env.local.clone());
    if cidr.is_some() {
        match resource {
            "servicecidrs" => scoped.service_cidr(&name),
            _ => scoped.node(&name),
        }
    }
    let make = || async {
        let Some(cidr) = &cidr else { return };
        let doc = match resource {
            "servicecidrs" => serde_json::json!({"apiVersion": "networking.k8s.io/v1",
                "kind": "ServiceCIDR", "metadata": {"name": name}, "spec": {"cidrs": [cidr]}}),
            _ => serde_json::json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name}, "spec": {"podCIDRs": [cidr]}}),
        };
        apply_yaml(&env.lc, &doc.to_string()).await.unwrap();
    };
    if verb == "list" {
        make().await;
    }
    let ctl = w.controller(extra);
    w.link_secret().await;
    w.export("web").await;
    w.wait_mirror_object("web", "endpoints").await;
    let line = refusal(&ctl, verb, resource).await;
    if verb == "watch" {
        make().await;
    }
    set_ingress(&env.rc, &env.ns, "gw", &[&addr]).await;
    let mut pointed = false;
    let start = Instant::now();
    while !pointed && start.elapsed() < POINTED_WITHIN {
        let ep = w.mirror_object("web", "endpoints").await;
        pointed = ep.is_some_and(|e| e["subsets"].to_string().contains(&format!("\"{addr}\"")));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(scoped);
    let line = line?;
    check(pointed, || format!("{addr} was refused anyway"))?;
    Ok(line)
}

/// Waits for the apiserver's refusal of `verb` on `resource` in the controller's log
/// (Kubernetes' own wording: `cannot <verb> resource "<resource>"`); returns the line.
async fn refusal(ctl: &RunningController, verb: &str, resource: &str) -> Result<String, String> {
    let needle = format!("cannot {verb} resource \"{resource}\"");
    poll(
        REFUSAL_WITHIN,
        Duration::from_millis(100),
        || {
            let text = ctl.log_text().replace('\\', "");
            text.lines()
                .find(|l| l.contains(&needle))
                .map(str::to_string)
        },
        || format!("no log line with {needle:?} within {REFUSAL_WITHIN:?}"),
    )
    .await
}

/// Polls `found` every `every` until it gives a value; after `within`, `Err(why())`:
/// the bounded wait of every log and reconcile check of a case (an error, not a panic,
/// so that the table reports every case).
async fn poll<T>(
    within: Duration,
    every: Duration,
    mut found: impl FnMut() -> Option<T>,
    why: impl FnOnce() -> String,
) -> Result<T, String> {
    let start = Instant::now();
    loop {
        if let Some(t) = found() {
            return Ok(t);
        }
        if start.elapsed() > within {
            return Err(why());
        }
        tokio::time::sleep(every).await;
    }
}

/// What the client library logs once per request the apiserver refuses with `verb` on
/// `resource` (`kube_client`'s debug line `Unsuccessful: Status { .. }`, the message
/// in Kubernetes' wording).
fn refused(verb: &str, resource: &str) -> [String; 2] {
    [
        "Unsuccessful: Status".to_string(),
        format!("cannot {verb} resource \"{resource}\""),
    ]
}

/// The controller's log lines (backslashes dropped, as in [`refusal`]) holding every one
/// of `needles`.
fn lines_with(ctl: &RunningController, needles: &[impl AsRef<str>]) -> usize {
    ctl.log_text()
        .replace('\\', "")
        .lines()
        .filter(|l| needles.iter().all(|n| l.contains(n.as_ref())))
        .count()
}

/// Waits (within [`REFUSAL_WITHIN`]) for one more log line holding every one of
/// `needles` than there is now: the step was tried again (and, for a refusal, refused
/// again) after what the case did last.
async fn logged_again(ctl: &RunningController, needles: &[impl AsRef<str>]) -> Result<(), String> {
    let seen = lines_with(ctl, needles);
    poll(
        REFUSAL_WITHIN,
        Duration::from_millis(100),
        || (lines_with(ctl, needles) > seen).then_some(()),
        || {
            let needles: Vec<&str> = needles.iter().map(AsRef::as_ref).collect();
            format!("no new log line with {needles:?} within {REFUSAL_WITHIN:?} ({seen} before)")
        },
    )
    .await
}

/// Waits (within [`REFUSAL_WITHIN`]) until `subject` has been reconciled more than `seen`
/// times: the key was looked at (and, refused, tried) again after the mark. The
/// witness's [`reconciled_after`] as a case's error instead of a panic, so that the
/// table reports every case.
async fn reconciled_again(
    ctl: &RunningController,
    subject: &Subject,
    seen: u64,
) -> Result<(), String> {
    poll(
        REFUSAL_WITHIN,
        Duration::from_millis(50),
        || (ctl.reconciles(subject) > seen).then_some(()),
        || format!("{subject:?} not reconciled again within {REFUSAL_WITHIN:?} (seen {seen})"),
    )
    .await
}

/// Waits (within `within`) until a reconcile of `subject` is logged after the first log
/// line holding every one of `needles`.
async fn reconciled_after_line(
    ctl: &RunningController,
    needles: &[&str],
    subject: &Subject,
    within: Duration,
) -> Result<(), String> {
    poll(
        within,
        Duration::from_millis(100),
        || {
            let text = ctl.log_text().replace('\\', "");
            let mut lines = text.lines();
            (lines.any(|l| needles.iter().all(|n| l.contains(n)))
                && lines.any(|l| subject.matches_line(l)))
            .then_some(())
        },
        || format!("no reconcile of {subject:?} after a line with {needles:?} within {within:?}"),
    )
    .await
}

/// Waits (within [`REFUSAL_WITHIN`]) for a log line holding every one of `needles`.
async fn logged(ctl: &RunningController, needles: &[&str]) -> Result<(), String> {
    poll(
        REFUSAL_WITHIN,
        Duration::from_millis(100),
        || (lines_with(ctl, needles) > 0).then_some(()),
        || format!("no log line with {needles:?} within {REFUSAL_WITHIN:?}"),
    )
    .await
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what()) }
}

/// Runs one case; `Ok(the refusal's log line)` when the step failed as the table says.
async fn run(case: &Case) -> Result<String, String> {
    let w = if case.step == McsClusterName {
        world_named_by_property(Some(case)).await
    } else {
        world(Some(case)).await
    };
    let env = &w.env;
    let (verb, resource) = (case.verb, case.resource);
    if !matches!(case.step, CreateNamespace) {
        // Mirrors go into a namespace that exists (only one case creates it).
        create_namespace(&env.lc, &env.ns).await;
    }
    env.gateway("gw", GW, &["192.0.2.10"]).await;
    let mut extra: Vec<&str> = Vec::new();
    if case.step == RenewWriteLease {
        // Renewed every 2 s.
        extra.extend(["--lease-duration", "3s"]);
    }
    if case.step == ShardLeases {
        extra.extend(["--shard-links", "true"]);
    }
    let line = match case.step {
        Create | ListLocal | CreateNamespace => {
            let ctl = w.controller(&extra);
            w.link_secret().await;
            w.export("web").await;
            let line = refusal(&ctl, verb, resource).await?;
            match case.step {
                // The key's next reconcile (a retry, refused again) ran.
                Create | CreateNamespace => {
                    reconciled_again(&ctl, &w.web(), ctl.reconciles(&w.web())).await?
                }
                // The link's local watch of the kind refused again, after the export.
                _ => {
                    logged_again(&ctl, &["local watch failed", &refused(verb, resource)[1]]).await?
                }
            }
            match case.step {
                Create => check(w.mirror_object("web", resource).await.is_none(), || {
                    format!("mirror {resource} created")
                })?,
                _ => w.no_mirror("web").await?,
            }
            line
        }
        Update => {
            let ctl = w.controller(&extra);
            w.link_secret().await;
            w.export("web").await;
            let before = w.wait_mirror_object("web", resource).await;
            if resource == "services" {
                env.patch_remote(
                    "web",
                    serde_json::json!({"spec": {"ports": [
                        {"name": "http", "port": 80, "protocol": "TCP"},
                        {"name": "grpc", "port": 9090, "protocol": "TCP"}]}}),
                )
                .await;
            } else {
                set_ingress(&env.rc, &env.ns, "gw", &["192.0.2.20"]).await;
            }
            let line = refusal(&ctl, verb, resource).await?;
            // The key's next reconcile (a retry, refused again) ran.
            reconciled_again(&ctl, &w.web(), ctl.reconciles(&w.web())).await?;
            let after = w.mirror_object("web", resource).await;
            let field = |o: &serde_json::Value| match resource {
                "services" => o["spec"]["ports"].clone(),
                "endpoints" => o["subsets"].clone(),
                _ => o["endpoints"].clone(),
            };
            check(after.as_ref().map(field) == Some(field(&before)), || {
                format!("mirror {resource} changed: {after:?}")
            })?;
            line
        }
        Delete => {
            let ctl = w.controller(&extra);
            w.link_secret().await;
            w.export("web").await;
            w.wait_mirror_object("web", resource).await;
            env.patch_remote(
                "web",
                serde_json::json!({"metadata": {"annotations": {
                    "mirror.linkerd.io/gateway-name": null,
                    "mirror.linkerd.io/gateway-ns": null}}}),
            )
            .await;
            let line = refusal(&ctl, verb, resource).await?;
            // The key's next reconcile (a retry, refused again) ran.
            reconciled_again(&ctl, &w.web(), ctl.reconciles(&w.web())).await?;
            check(w.mirror_object("web", resource).await.is_some(), || {
                format!("mirror {resource} deleted")
            })?;
            line
        }
        Conflict | EventPatch => {
            let name = env.mirror_name("web");
            let conflicting = if case.step == EventPatch {
                "services"
            } else {
                resource
            };
            let foreign = foreign_object(conflicting, &env.ns, &name);
            let created = apply_yaml(&env.lc, &foreign.to_string()).await;
            created.map_err(|e| format!("foreign {conflicting}: {e}"))?;
            let held_by = foreign["metadata"]["name"].as_str().unwrap().to_string();
            let ctl = w.controller(&extra);
            w.link_secret().await;
            w.export("web").await;
            let line = refusal(&ctl, verb, resource).await?;
            // The key's next reconcile ran: the 409 met again, the holder read again
            // (`get` refused) or the conflict reported again (`patch` refused).
            reconciled_again(&ctl, &w.web(), ctl.reconciles(&w.web())).await?;
            let events = w.events(&env.ns, &held_by).await;
            let conflicts: Vec<_> = events
                .iter()
                .filter(|e| e.reason.as_deref() == Some("MirrorConflict"))
                .collect();
            if case.step == Conflict {
                check(conflicts.is_empty(), || {
                    format!("MirrorConflict reported: {conflicts:?}")
                })?;
            } else {
                check(
                    conflicts.len() == 1 && conflicts[0].series.is_none(),
                    || format!("want one MirrorConflict Event without series: {conflicts:?}"),
                )?;
            }
            line
        }
        WatchLocal => {
            let ctl = w.controller(&extra);
            w.link_secret().await;
            w.export("web").await;
            let before = w.wait_mirror_object("web", resource).await;
            let line = refusal(&ctl, verb, resource).await?;
            let seen = ctl.reconciles(&w.web());
            env.patch_remote(
                "web",
                serde_json::json!({"spec": {"ports": [
                    {"name": "http", "port": 80, "protocol": "TCP"},
                    {"name": "grpc", "port": 9090, "protocol": "TCP"}]}}),
            )
            .await;
            // The remote change was reconciled.
            reconciled_again(&ctl, &w.web(), seen).await?;
            let ports = |o: &serde_json::Value| match resource {
                "services" => o["spec"]["ports"].clone(),
                "endpoints" => o["subsets"].clone(),
                _ => o["ports"].clone(),
            };
            let after = w.mirror_object("web", resource).await;
            check(after.as_ref().map(ports) == Some(ports(&before)), || {
                format!("mirror {resource} followed the remote: {after:?}")
            })?;
            line
        }
        LocalNetwork => local_network_step(&w, &extra, verb, resource).await?,
        EventCreate => {
            let ctl = w.controller(&extra);
            let secret = w.link_secret().await;
            let line = refusal(&ctl, verb, resource).await?;
            ctl.wait_log(&[": linked"], CONVERGE).await;
            // The Linked Event's one create was refused (an Event is never retried).
            let name = format!("name=Some(\"{secret}\")");
            logged(
                &ctl,
                &["could not record an event", "reason=\"Linked\"", &name],
            )
            .await?;
            let events = w.events(&w.ctl_ns, &secret).await;
            check(events.is_empty(), || format!("Events recorded: {events:?}"))?;
            line
        }
        ListSecrets | WatchSecrets => {
            let ctl = w.controller(&extra);
            let line = refusal(&ctl, verb, resource).await?;
            let secret = w.link_secret().await;
            w.export("web").await;
            // The link Secrets' watch refused again, after the Secret was applied.
            logged_again(
                &ctl,
                &["watching link Secrets failed", &refused(verb, resource)[1]],
            )
            .await?;
            let events = w.events(&w.ctl_ns, &secret).await;
            check(events.is_empty(), || format!("linked: {events:?}"))?;
            w.no_mirror("web").await?;
            line
        }
        LeaderLease => {
            let ctl = w.controller(&extra);
            w.link_secret().await;
            w.export("web").await;
            let line = refusal(&ctl, verb, resource).await?;
            // The election tried again and was refused again: still not leading.
            logged_again(
                &ctl,
                &["the leader-election Lease", &refused(verb, resource)[1]],
            )
            .await?;
            w.no_mirror("web").await?;
            let metrics = ctl.metrics_text().await;
            check(
                metrics.lines().any(|l| l == "service_mirror_leader 0"),
                || format!("not reported as follower: {metrics}"),
            )?;
            line
        }
        RenewWriteLease => {
            let ctl = w.controller(&extra);
            w.link_secret().await;
            let first = eventually("write Lease taken", || w.write_lease()).await;
            let line = refusal(&ctl, verb, resource).await?;
            // The next write of the Lease (a renewal, then a take) refused again.
            logged_again(&ctl, &refused(verb, resource)).await?;
            let now = w.write_lease().await;
            let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
            check(now.as_ref().map(renewed) == Some(renewed(&first)), || {
                format!("write Lease renewed: {now:?}")
            })?;
            line
        }
        ShardLeases => {
            let ctl = w.controller(&extra);
            w.link_secret().await;
            w.export("web").await;
            let line = refusal(&ctl, verb, resource).await?;
            // The next pass's list, refused again, after the export.
            logged_again(&ctl, &refused(verb, resource)).await?;
            check(w.write_lease().await.is_none(), || {
                "write Lease taken".into()
            })?;
            w.no_mirror("web").await?;
            line
        }
        DeleteWriteLease => {
            let ctl = w.controller(&extra);
            let secret = w.link_secret().await;
            eventually("write Lease taken", || w.write_lease()).await;
            Api::<Secret>::namespaced(env.lc.clone(), &w.ctl_ns)
                .delete(&secret, &DeleteParams::default())
                .await
                .unwrap();
            let line = refusal(&ctl, verb, resource).await?;
            // The delete's outcome: the Lease is forgotten before its one delete, which
            // is never tried again (write_leases.rs, `delete`).
            logged(
                &ctl,
                &["write Lease not deleted", &refused(verb, resource)[1]],
            )
            .await?;
            check(w.write_lease().await.is_some(), || {
                "write Lease deleted".into()
            })?;
            line
        }
        ListLinks | WatchLinks => {
            let ctl = w.controller(&extra);
            let line = refusal(&ctl, verb, resource).await?;
            w.export("web").await;
            w.link_resource().await;
            // The Links' watch refused again, after the Link was created.
            logged_again(&ctl, &refused(verb, resource)).await?;
            w.no_mirror("web").await?;
            line
        }
        LinkStatus => {
            let ctl = w.controller(&extra);
            w.export("web").await;
            let link = w.link_resource().await;
            w.wait_mirror_object("web", "services").await;
            let line = refusal(&ctl, verb, resource).await?;
            // The status writer's next try, after the mirror exists, refused again.
            logged_again(&ctl, &refused(verb, resource)).await?;
            let status =
                serde_json::to_value(w.links().get(&link).await.unwrap()).unwrap()["status"]
                    .clone();
            let field = if verb == "get" {
                "mirrorServices"
            } else {
                "conditions"
            };
            let written = status[field].as_array().is_some_and(|a| !a.is_empty());
            check(!written, || format!("status {field} written: {status}"))?;
            line
        }
        RemoteServices => {
            let ctl = w.controller(&extra);
            let secret = w.link_secret().await;
            w.export("web").await;
            let note = wait_event(&env.lc, &w.ctl_ns, &secret, "RemoteForbidden").await;
            check(note.contains(verb) && note.contains("services"), || {
                format!("the Event names {verb} services: {note}")
            })?;
            // The link tried again, after the export, and was refused again.
            let secret = format!("secret={secret}");
            logged_again(
                &ctl,
                &["link Secret not usable", &secret, "RemoteForbidden"],
            )
            .await?;
            w.no_mirror("web").await?;
            drop(ctl);
            format!("RemoteForbidden: {note}")
        }
        RemoteSlices => {
            // The remote Service has one endpoint, not ready.
            Api::<EndpointSlice>::namespaced(env.rc.clone(), &env.ns)
                .create(
                    &PostParams::default(),
                    &remote_slice(&env.ns, "web", &[false]),
                )
                .await
                .unwrap();
            let ctl = w.controller(&extra);
            w.export("web").await;
            w.link_resource().await;
            let line = refusal(&ctl, verb, resource).await?;
            eventually("mirror Endpoints with the gateway's addresses", || async {
                let ep = w.mirror_object("web", "endpoints").await?;
                ep["subsets"]
                    .as_array()
                    .is_some_and(|s| !s.is_empty())
                    .then_some(())
            })
            .await;
            line
        }
        McsLocal => {
            w.mcs_crds_on_remote().await;
            let early = verb != "watch";
            if early {
                w.mcs_export(&env.lc, "web", 80).await;
            }
            let ctl = w.controller(&["--mcs-cluster-name", "here"]);
            w.link_secret().await;
            let line = refusal(&ctl, verb, resource).await?;
            if !early {
                w.mcs_export(&env.lc, "web", 80).await;
            }
            if resource == "serviceexports" {
                // The local exports' watch refused again, after the export was made.
                logged_again(&ctl, &refused(verb, resource)).await?;
            } else {
                // The export's next reconcile (a retry, refused again) ran.
                let web = Subject::mcs(&env.ns, "web");
                reconciled_again(&ctl, &web, ctl.reconciles(&web)).await?;
            }
            let conditions = w.mcs_conditions("web").await;
            check(conditions.is_empty(), || {
                format!("conditions written: {conditions:?}")
            })?;
            // The startup check named it (MCS permissions are asked only with the flag;
            // the check runs beside the start, so its line may come after the refusal).
            let named = format!("missing permission: {verb} {resource}.multicluster.x-k8s.io");
            let start = Instant::now();
            while ctl.log_lines(&named).is_empty() {
                if start.elapsed() > REFUSAL_WITHIN {
                    return Err(format!("no {named:?} in the log"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            line
        }
        McsImport => {
            w.mcs_crds_on_remote().await;
            w.mcs_export(&env.lc, "web", 80).await;
            let ctl = w.controller(&["--mcs-cluster-name", "here"]);
            w.link_secret().await;
            let port = |i: &serde_json::Value| i["spec"]["ports"][0]["port"].as_i64();
            let web = Subject::mcs(&env.ns, "web");
            match (resource, verb) {
                ("serviceimports", "list" | "create") => {
                    let line = refusal(&ctl, verb, resource).await?;
                    // Judged (conditions written), yet no import.
                    let start = Instant::now();
                    while w.mcs_conditions("web").await.is_empty() {
                        if start.elapsed() > REFUSAL_WITHIN {
                            return Err("the export was never judged".into());
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    if verb == "list" {
                        // The reconcile that wrote the conditions ended: the import
                        // is made in the same reconcile, after them.
                        let status = format!("/namespaces/{}/serviceexports/web/status", env.ns);
                        let patch = ["http.method=PATCH", &status];
                        reconciled_after_line(&ctl, &patch, &web, REFUSAL_WITHIN).await?;
                    } else {
                        // The export's next reconcile (a retry, refused again) ran.
                        reconciled_again(&ctl, &web, ctl.reconciles(&web)).await?;
                    }
                    let i = w.mcs_import("web").await;
                    check(i.is_none(), || format!("an import was made: {i:?}"))?;
                    line
                }
                ("serviceimports", "watch" | "update") => {
                    w.mcs_import_until("web", "showed port 80", |i| port(i) == Some(80))
                        .await?;
                    let seen = ctl.reconciles(&web);
                    w.mcs_export(&env.lc, "web", 81).await;
                    let line = refusal(&ctl, verb, resource).await?;
                    // The port change was reconciled (and refused: a create that finds
                    // the import, whose `get` or `update` is refused).
                    reconciled_again(&ctl, &web, seen).await?;
                    let i = w.mcs_import("web").await;
                    check(i.as_ref().and_then(port) == Some(80), || {
                        format!("the import followed the change: {i:?}")
                    })?;
                    line
                }
                ("serviceimports", "delete") => {
                    w.mcs_import_until("web", "existed", |_| true).await?;
                    Api::<ServiceExportObject>::namespaced(env.lc.clone(), &env.ns)
                        .delete("web", &DeleteParams::default())
                        .await
                        .unwrap();
                    let line = refusal(&ctl, verb, resource).await?;
                    // The key's next reconcile (a retry, refused again) ran.
                    reconciled_again(&ctl, &web, ctl.reconciles(&web)).await?;
                    let i = w.mcs_import("web").await;
                    check(i.is_some(), || "the import was deleted".into())?;
                    line
                }
                _ => {
                    let line = refusal(&ctl, verb, resource).await?;
                    // The key's next reconcile (a retry, refused again) ran.
                    reconciled_again(&ctl, &web, ctl.reconciles(&web)).await?;
                    let i = w.mcs_import("web").await;
                    let clusters = i.as_ref().map(|i| i["status"]["clusters"].clone());
                    check(
                        i.is_some() && clusters.as_ref().is_none_or(|c| c.is_null()),
                        || format!("import {i:?}, clusters {clusters:?}"),
                    )?;
                    line
                }
            }
        }
        McsClusterName => {
            w.mcs_export(&env.lc, "web", 80).await;
            let ctl = w.controller(&[]);
            let line = refusal(&ctl, verb, resource).await?;
            // The start decided, once: MCS off (nothing looks at the property again).
            logged(&ctl, &["MCS off", "cannot be read"]).await?;
            let conditions = w.mcs_conditions("web").await;
            check(conditions.is_empty(), || {
                format!("conditions written: {conditions:?}")
            })?;
            let off = r#"service_mirror_mcs_state{state="off",reason="forbidden"} 1"#;
            let metrics = ctl.metrics().await;
            check(metrics.contains(off), || format!("no {off} in {metrics}"))?;
            line
        }
        McsRemote => {
            w.mcs_crds_on_remote().await;
            // Without `list`: the remote export is there from the start, so every
            // refused list comes after it, and the local one is made once the link's
            // feed is up (the remote's 30 s hold running), so that its first judgement
            // is the one made without the remote when the hold ends. Without `watch`
            // (the list granted): the remote export is made once the watch that
            // follows the list is refused, so only the watch could bring it.
            let early = verb == "list";
            if early {
                w.mcs_export(&env.rc, "web", 81).await;
            } else {
                w.mcs_export(&env.lc, "web", 80).await;
            }
            let ctl = w.controller(&["--mcs-cluster-name", "here"]);
            w.link_secret().await;
            let line = refusal(&ctl, verb, resource).await?;
            if early {
                w.mcs_export(&env.lc, "web", 80).await;
                // The export's reconcile once the MCS judges without the remote
                // (mcs/reconcile.rs, `note_unlisted`).
                let unlisted = format!("\"{}\"", env.cluster);
                let without = ["judging exports without these linked clusters", &unlisted];
                let web = Subject::mcs(&env.ns, "web");
                reconciled_after_line(&ctl, &without, &web, HOLD_WITHIN).await?;
            } else {
                w.mcs_export(&env.rc, "web", 81).await;
                // The remote exports' watch refused again, after the export was made
                // (early in the watch's backoff).
                logged_again(&ctl, &refused(verb, resource)).await?;
            }
            // Judged.
            let judged = Instant::now();
            loop {
                let c = w.mcs_conditions("web").await;
                if c.iter().any(|c| c.0 == "Conflict") {
                    break;
                }
                if judged.elapsed() > REFUSAL_WITHIN {
                    return Err(format!("the local export was never judged: {c:?}"));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let conditions = w.mcs_conditions("web").await;
            check(
                conditions.contains(&("Conflict".into(), "False".into(), "NoConflicts".into())),
                || format!("the remote export counted: {conditions:?}"),
            )?;
            line
        }
    };
    Ok(line)
}

/// A foreign object of `resource` (no mirror labels) named as the mirror `name` (for
/// EndpointSlices: as the mirror's first slice), as JSON.
fn foreign_object(resource: &str, ns: &str, name: &str) -> serde_json::Value {
    let mut o = match resource {
        "services" => serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name},
            "spec": {"ports": [{"name": "http", "port": 80}]}}),
        "endpoints" => serde_json::json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": name}}),
        "endpointslices" => serde_json::json!({"apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": service_mirror_core::slices::slice_name(name, "ipv4", 0)},
            "addressType": "IPv4", "endpoints": []}),
        other => panic!("no foreign {other}"),
    };
    o["metadata"]["namespace"] = ns.into();
    o
}

#[test]
fn the_cases_are_exactly_the_granted_verbs() {
    use service_mirror_controller::cli::allow::remote_access_rules;
    let mut granted: Vec<(Scope, String, String, String)> = required_permissions("ns")
        .into_iter()
        .map(|p| {
            let scope = if p.namespace.is_some() {
                Namespace
            } else {
                Cluster
            };
            (scope, p.group, p.resource, p.verb)
        })
        .chain(
            link_permissions("ns")
                .into_iter()
                .map(|p| (Link, p.group, p.resource, p.verb)),
        )
        .chain(
            mcs_permissions()
                .into_iter()
                .map(|p| (Mcs, p.group, p.resource, p.verb)),
        )
        .chain(
            local_network_permissions()
                .into_iter()
                .map(|p| (LocalNet, p.group, p.resource, p.verb)),
        )
        .collect();
    for rule in remote_access_rules() {
        for group in rule.api_groups.unwrap_or_default() {
            for resource in rule.resources.clone().unwrap_or_default() {
                for verb in &rule.verbs {
                    granted.push((Remote, group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    let key = |(s, g, r, v): &(Scope, String, String, String)| format!("{s:?} {g} {r} {v}");
    granted.sort_by_key(key);
    let mut cases: Vec<_> = CASES
        .iter()
        .map(|c| {
            (
                c.scope,
                c.group.to_string(),
                c.resource.to_string(),
                c.verb.to_string(),
            )
        })
        .collect();
    cases.sort_by_key(key);
    assert_eq!(cases, granted, "one removal case per granted verb, no more");
}

/// Each granted verb removed in turn: the step of its row fails as the row says (one
/// controller per verb, [`PARALLEL`] at once; `LEAST_PRIVILEGE_ONLY=<text>` runs the
/// rows whose name contains it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_granted_verb_is_needed_by_a_lifecycle_step() {
    init_tracing();
    // Shared clusters up before the clock starts.
    let _ = Env::new("lp-warm").await;
    let started = Instant::now();
    let only = std::env::var("LEAST_PRIVILEGE_ONLY").ok();
    let mut cases: Vec<&Case> = CASES
        .iter()
        .filter(|c| only.as_deref().is_none_or(|o| c.name().contains(o)))
        .collect();
    // The cases that may wait out an unlisted cluster's 30 s hold of the MCS
    // judgements (mcs/index.rs) start first: beside the others, not after them.
    cases.sort_by_key(|c| !matches!(c.step, McsRemote | McsImport | McsLocal));
    let results: Vec<(String, Result<String, String>, Duration)> = futures::stream::iter(cases)
        .map(|c| async move {
            let t = Instant::now();
            let r = run(c).await;
            let name = format!("{} | {:?} | {}", c.name(), c.step, c.failure);
            (name, r, t.elapsed())
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let mut failed = Vec::new();
    for (name, r, took) in &results {
        match r {
            Ok(line) => eprintln!("ok   {name} ({took:.1?}): {}", trim(line)),
            Err(e) => {
                eprintln!("FAIL {name} ({took:.1?}): {e}");
                failed.push(name.clone());
            }
        }
    }
    eprintln!("{} cases in {:?}", results.len(), started.elapsed());
    assert!(
        failed.is_empty(),
        "steps that did not fail without their verb: {failed:?}"
    );
}

fn trim(line: &str) -> String {
    line.chars().take(300).collect()
}

/// The steps whose success no other test shows under the installed RBAC, with nothing
/// removed: a repeated Event becomes a series (`patch events`), the write Lease is
/// renewed (`update leases`), a Link's status gets its Ready condition and its
/// `mirrorServices` entry (`patch links/status` after `get links`), a ServiceExport
/// gets its conditions, Conflict from a remote export made after the start, MCS
/// named by the ClusterProperty `id.k8s.io` alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_verb_granted_the_same_steps_succeed() {
    init_tracing();
    let secret_world = async {
        let w = world(None).await;
        create_namespace(&w.env.lc, &w.env.ns).await;
        w.env.gateway("gw", GW, &["192.0.2.10"]).await;
        let name = w.env.mirror_name("web");
        apply_yaml(
            &w.env.lc,
            &foreign_object("services", &w.env.ns, &name).to_string(),
        )
        .await
        .unwrap();
        // The local networks' other reads (`list nodes` before the start; `watch
        // nodes` and `watch servicecidrs` after it): this file's /16s, a /24 each.
        let n = |k: u32| 1 + (std::process::id() + k) % 250;
        let scoped = ClusterScoped::new(w.env.local.clone());
        let (early, late, cidr) = (
            unique_namespace("lp-early"),
            unique_namespace("lp-late"),
            unique_namespace("lp-cidr"),
        );
        let local_net = |kind: &str, name: &str, cidr: String| match kind {
            "Node" => serde_json::json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name}, "spec": {"podCIDRs": [cidr]}}),
            _ => serde_json::json!({"apiVersion": "networking.k8s.io/v1",
                "kind": "ServiceCIDR", "metadata": {"name": name}, "spec": {"cidrs": [cidr]}}),
        };
        scoped.node(&early);
        let doc = local_net("Node", &early, format!("10.253.{}.0/24", n(1)));
        apply_yaml(&w.env.lc, &doc.to_string()).await.unwrap();
        let ctl = w.controller(&["--lease-duration", "3s"]);
        w.link_secret().await;
        w.export("web").await;
        let first = eventually("write Lease taken", || w.write_lease()).await;
        eventually("the MirrorConflict Event becomes a series", || async {
            w.events(&w.env.ns, &name)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("MirrorConflict"))?
                .series
                .filter(|s| s.count >= 2)
        })
        .await;
        eventually("the write Lease is renewed", || async {
            let now = w.write_lease().await?;
            let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
            (renewed(&now) != renewed(&first)).then_some(())
        })
        .await;
        // The remote `watch` is the watcher's, not only the link-time check's: the link's
        // client had watches answered (the controller's own request counter), and it
        // sent no `get` (not granted by `allow`).
        let metrics = ctl.metrics_text().await;
        let requests = |verb: &str| {
            metrics
                .lines()
                .filter(|l| l.starts_with("service_mirror_kube_requests_total{"))
                .filter(|l| l.contains(&format!("client=\"{}\"", w.env.cluster)))
                .filter(|l| l.contains(&format!("verb=\"{verb}\"")))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert!(
            requests("watch").iter().any(|l| l.contains("code=\"200\"")),
            "{metrics}"
        );
        assert!(requests("get").is_empty(), "{:?}", requests("get"));
        // The binary's default address policy (no address flag), under the installed
        // reads of the local networks: a gateway at the local apiserver's ClusterIP and
        // at an address of the local service range (the ServiceCIDR `kubernetes`) keeps
        // only its other address.
        let kubernetes = Api::<Service>::namespaced(w.env.lc.clone(), "default")
            .get("kubernetes")
            .await
            .unwrap();
        let cluster_ip = kubernetes.spec.unwrap().cluster_ip.unwrap();
        let range = w.env.local.service_cidr().to_string();
        let in_range = format!(
            "{}.0.77",
            range.split('/').next().unwrap().trim_end_matches(".0.0")
        );
        w.env
            .gateway("gw-local", GW, &[&cluster_ip, &in_range, "192.0.2.11"])
            .await;
        let mut api = exported("api", &w.env.ns, "gw-local", &[("http", 80)]);
        api.metadata.labels =
            Some([("mirror.linkerd.io/exported".to_string(), "true".to_string())].into());
        w.env
            .remote_services()
            .create(&PostParams::default(), &api)
            .await
            .unwrap();
        let subsets = eventually(
            "the local addresses refused, the other mirrored",
            || async {
                let ep = w.mirror_object("api", "endpoints").await?;
                let subsets = ep["subsets"].to_string();
                subsets.contains("\"192.0.2.11\"").then_some(subsets)
            },
        )
        .await;
        assert!(!subsets.contains(&format!("\"{cluster_ip}\"")), "{subsets}");
        assert!(!subsets.contains(&format!("\"{in_range}\"")), "{subsets}");
        // A Node and a ServiceCIDR made after the start (watched), next to the Node
        // made before it (listed): their addresses refused too.
        scoped.node(&late);
        scoped.service_cidr(&cidr);
        for doc in [
            local_net("Node", &late, format!("10.253.{}.0/24", n(2))),
            local_net("ServiceCIDR", &cidr, format!("10.252.{}.0/24", n(3))),
        ] {
            apply_yaml(&w.env.lc, &doc.to_string()).await.unwrap();
        }
        let refused = [
            format!("10.253.{}.9", n(1)),
            format!("10.253.{}.9", n(2)),
            format!("10.252.{}.9", n(3)),
        ];
        let mut ingress: Vec<&str> = refused.iter().map(String::as_str).collect();
        ingress.push("192.0.2.12");
        w.env.gateway("gw-nets", GW, &ingress).await;
        let mut nets = exported("nets", &w.env.ns, "gw-nets", &[("http", 80)]);
        nets.metadata.labels =
            Some([("mirror.linkerd.io/exported".to_string(), "true".to_string())].into());
        w.env
            .remote_services()
            .create(&PostParams::default(), &nets)
            .await
            .unwrap();
        eventually("the listed and watched local networks refused", || async {
            let ep = w.mirror_object("nets", "endpoints").await?;
            let subsets = ep["subsets"].to_string();
            (subsets.contains("\"192.0.2.12\"")
                && refused
                    .iter()
                    .all(|ip| !subsets.contains(&format!("\"{ip}\""))))
            .then_some(())
        })
        .await;
        drop(scoped);
        let metrics = ctl.metrics_text().await;
        for source in ["service_cidrs", "kubernetes_service", "nodes"] {
            let line =
                format!("service_mirror_local_cidrs{{source=\"{source}\",state=\"read\"}} 1");
            assert!(metrics.contains(&line), "{line} in {metrics}");
        }
    };
    let link_world = async {
        let w = world(None).await;
        create_namespace(&w.env.lc, &w.env.ns).await;
        let ctl = w.controller(&[]);
        w.export("web").await;
        let link = w.link_resource().await;
        eventually(
            "Ready condition and mirrorServices in the Link's status",
            || async {
                let l = w.links().get(&link).await.ok()?;
                let status = serde_json::to_value(l).ok()?["status"].clone();
                let filled = |f: &str| status[f].as_array().is_some_and(|a| !a.is_empty());
                (filled("conditions") && filled("mirrorServices")).then_some(())
            },
        )
        .await;
        // The stale-remote task writes its condition under the same rights (`patch` on
        // links/status, the Link read with `get` on links).
        let reachable = Instant::now();
        loop {
            let l = w.links().get(&link).await.unwrap();
            let conditions = l.status.map(|s| s.conditions).unwrap_or_default();
            if conditions
                .iter()
                .any(|c| c.type_ == "RemoteReachable" && c.status == "True")
            {
                break;
            }
            assert!(
                reachable.elapsed() < Duration::from_secs(20),
                "no RemoteReachable=True in {conditions:?}: {:?}",
                ctl.log_lines("RemoteReachable")
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    // MCS: the local export is judged against the remote's (list, watch on both sides)
    // and its conditions written (`patch serviceexports/status`).
    let mcs_world = async {
        let w = world(None).await;
        create_namespace(&w.env.lc, &w.env.ns).await;
        w.mcs_crds_on_remote().await;
        w.mcs_export(&w.env.lc, "web", 80).await;
        let _ctl = w.controller(&["--mcs-cluster-name", "here"]);
        w.link_secret().await;
        // Within the 30 s hold: a first judgement made while the link's cluster has not
        // listed yet comes back only at the hold's end (mcs/index.rs), past `eventually`.
        let start = Instant::now();
        loop {
            let c = w.mcs_conditions("web").await;
            if c.contains(&("Ready".into(), "True".into(), "Exported".into())) {
                break;
            }
            assert!(start.elapsed() < HOLD_WITHIN, "never Exported: {c:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Made after the start: the remote watch brings it.
        w.mcs_export(&w.env.rc, "web", 81).await;
        eventually("the local export says PortConflict", || async {
            let c = w.mcs_conditions("web").await;
            c.contains(&("Conflict".into(), "True".into(), "PortConflict".into()))
                .then_some(())
        })
        .await;
        // The import: both clusters, the older export's port, a ClusterSetIP.
        let mut both = vec![w.env.cluster.clone(), "here".to_string()];
        both.sort();
        w.mcs_import_until("web", "listed both clusters with a ClusterSetIP", |i| {
            let clusters: Vec<String> = i["status"]["clusters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["cluster"].as_str().map(str::to_string))
                .collect();
            let mut sorted = clusters.clone();
            sorted.sort();
            sorted == both
                && i["spec"]["type"] == "ClusterSetIP"
                && i["spec"]["ips"]
                    .as_array()
                    .is_some_and(|ips| ips.len() == 1)
        })
        .await
        .unwrap();
    };
    // MCS named by the ClusterProperty alone (`get clusterproperties`): on, as `here`.
    let about_world = async {
        let w = world_named_by_property(None).await;
        create_namespace(&w.env.lc, &w.env.ns).await;
        w.mcs_export(&w.env.lc, "web", 80).await;
        let ctl = w.controller(&[]);
        eventually("the local export says Exported", || async {
            let c = w.mcs_conditions("web").await;
            c.contains(&("Ready".into(), "True".into(), "Exported".into()))
                .then_some(())
        })
        .await;
        let on = r#"service_mirror_mcs_state{state="on",reason="cluster_property"} 1"#;
        assert!(ctl.metrics().await.contains(on));
    };
    futures::join!(secret_world, link_world, mcs_world, about_world);
}
