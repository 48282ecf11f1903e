//! `service-mirror run`: the controller.

use crate::admin::{self, AdminState};
use crate::events::EventRecorder;
use crate::leader::{LeaderOptions, default_identity, elect};
use crate::link_controller::{LinkConfig, LinkDeps};
use crate::links::{LinkManager, LinkManagerOptions, LinkSources};
use crate::logging::{LogFormat, init_logging};
use crate::mcs::enable::McsMode;
use crate::metrics::Metrics;
use crate::write_leases::{self, WriteLeaseOptions};
use service_mirror_core::{
    AddressPolicy, Cidr, CidrError, EndpointsMode, NamespaceFilter, StalePolicy,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Arguments of `run`. Every flag can also be set through its environment variable.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Kubeconfig of the local cluster (default: in-cluster config, then $KUBECONFIG or ~/.kube/config).
    #[arg(long, env = "SERVICE_MIRROR_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Namespace of the link Secrets (the controller's own namespace).
    #[arg(long, env = "SERVICE_MIRROR_NAMESPACE")]
    namespace: String,
    /// Fast retries of a failing object before it falls back to slow periodic retries.
    #[arg(long, env = "SERVICE_MIRROR_EVENT_REQUEUE_LIMIT", default_value_t = 3)]
    event_requeue_limit: u32,
    /// How often gateway hostnames are resolved again (e.g. 30s, 1m).
    #[arg(long, env = "SERVICE_MIRROR_ENDPOINT_REFRESH_PERIOD", default_value = "1m", value_parser = humantime::parse_duration)]
    endpoint_refresh_period: Duration,
    /// Address of the admin server (/metrics, /ping, /ready, /live).
    #[arg(long, env = "SERVICE_MIRROR_METRICS_ADDR", default_value = ":9999")]
    metrics_addr: String,
    /// Log filter: a level (info, debug) or tracing directives (service_mirror_controller=debug,kube=warn).
    #[arg(long, env = "SERVICE_MIRROR_LOG_LEVEL", default_value = "info")]
    log_level: String,
    /// Log line format.
    #[arg(long, env = "SERVICE_MIRROR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    log_format: LogFormat,
    /// Reconcile workers per linked cluster.
    #[arg(long, env = "SERVICE_MIRROR_WORKERS", default_value_t = 32)]
    workers: usize,
    /// Most mirrors one link may create (0: no limit). A remote exporting more is
    /// reported (Event on the link Secret, metric); existing mirrors are always kept.
    #[arg(
        long,
        env = "SERVICE_MIRROR_MAX_MIRRORS_PER_LINK",
        default_value_t = 10_000
    )]
    max_mirrors_per_link: usize,
    /// Most bytes a response of a remote apiserver may carry without a line break (a
    /// list page is one line, a watch event one line): past it the response is dropped
    /// and the link reports `RemoteResponseTooLarge` (0: no limit).
    #[arg(long, env = "SERVICE_MIRROR_MAX_REMOTE_RESPONSE_BYTES", default_value_t = crate::frame_limit::DEFAULT_MAX_RESPONSE_BYTES)]
    max_remote_response_bytes: usize,
    /// Most bytes of remote Services one link caches, a relist in progress included:
    /// past it the list is dropped, mirrors stay as they are, the link reports
    /// `RemoteTooLarge` and lists again after a backoff (1 min doubling to 10 min)
    /// (0: no limit).
    #[arg(long, env = "SERVICE_MIRROR_MAX_REMOTE_CACHE_BYTES", default_value_t = crate::link_controller::DEFAULT_MAX_REMOTE_CACHE_BYTES)]
    max_remote_cache_bytes: usize,
    /// Which endpoint objects mirrors carry: `endpoints` (kube-controller-manager mirrors
    /// them into EndpointSlices), `endpointslices` (ours only), or `both` (our slices, and
    /// Endpoints labelled skip-mirror for tools that read them).
    #[arg(
        long,
        env = "SERVICE_MIRROR_ENDPOINTS_MODE",
        default_value = "both",
        value_parser = mode_parser()
    )]
    endpoints_mode: EndpointsMode,
    /// Mirror remote headless Services whose EndpointSlices carry hostnames as headless
    /// mirrors with one endpoint mirror per pod (`<hostname>.<svc>-<cluster>.<ns>...`
    /// resolves); off: a headless remote gets a ClusterIP mirror, as any other.
    #[arg(
        long,
        env = "SERVICE_MIRROR_ENABLE_HEADLESS_SERVICES",
        default_value_t = false
    )]
    enable_headless_services: bool,
    /// With --enable-headless-services: an address without `hostname` takes its
    /// `targetRef.name` (a headless Service that is not its StatefulSet's serviceName).
    #[arg(
        long,
        env = "SERVICE_MIRROR_HEADLESS_HOSTNAME_FROM_TARGET_REF",
        default_value_t = false
    )]
    headless_hostname_from_target_ref: bool,
    /// Only mirror these remote namespaces (comma-separated; `prefix*` patterns). Empty: all.
    #[arg(long, env = "SERVICE_MIRROR_NAMESPACE_ALLOW", value_delimiter = ',')]
    namespace_allow: Vec<String>,
    /// Never mirror these remote namespaces (comma-separated; `prefix*` patterns).
    #[arg(
        long,
        env = "SERVICE_MIRROR_NAMESPACE_DENY",
        value_delimiter = ',',
        default_value = "kube-system,kube-public,kube-node-lease"
    )]
    namespace_deny: Vec<String>,
    /// How long a gateway probe may take before it counts as failed.
    #[arg(long, env = "SERVICE_MIRROR_PROBE_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    probe_timeout: Duration,
    /// Consecutive failed probes before a gateway's mirrors turn not ready.
    #[arg(long, env = "SERVICE_MIRROR_PROBE_FAILURE_THRESHOLD", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    probe_failure_threshold: u32,
    /// How long rotated credentials may take to sync before the old ones are kept.
    #[arg(long, env = "SERVICE_MIRROR_ROTATION_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    rotation_timeout: Duration,
    /// Delete, at start, mirrors of clusters that no link Secret names (links removed
    /// while no controller ran). Turn off when several controllers share a cluster.
    #[arg(long, env = "SERVICE_MIRROR_COLLECT_UNLINKED_MIRRORS", default_value_t = true, action = clap::ArgAction::Set)]
    collect_unlinked_mirrors: bool,
    /// Elect a leader through a Lease in --namespace; only the leader writes.
    #[arg(long, env = "SERVICE_MIRROR_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// Spread the links over the replicas: each writes the links whose write Lease it
    /// holds (ceil(links / replicas) each, rebalanced as replicas come and go); the
    /// leader alone writes federated Services, MCS imports and collects unlinked
    /// mirrors. Off: the leader writes every link. Needs `list` on Leases.
    #[arg(long, env = "SERVICE_MIRROR_SHARD_LINKS", default_value_t = false, action = clap::ArgAction::Set)]
    shard_links: bool,
    /// With --shard-links, what a replica keeps of the links it does not hold: `cold`,
    /// nothing (a link runs, watching its remote, only on the replica holding its
    /// write Lease, so memory is divided; a hand-over relists the link), or `warm`,
    /// every link watched on every replica (a hand-over writes at once; each replica
    /// holds the whole fleet's caches). Cold leaves links warm where the leader's
    /// federation (a Link's members: on the leader) or MCS (every link) needs them.
    #[arg(
        long,
        env = "SERVICE_MIRROR_SHARD_STANDBY",
        value_enum,
        default_value = "cold"
    )]
    shard_standby: ShardStandby,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "SERVICE_MIRROR_LEASE_NAME",
        default_value = "service-mirror"
    )]
    lease_name: String,
    /// Where links come from: `secrets` (link Secrets with a cluster-name annotation,
    /// the 2020 contract), `links` (Linkerd's `Link` resources), `both`,
    /// `cluster-profiles` (ClusterProfiles of KEP-4322 with the `kubeconfig-secretreader`
    /// access provider) or `all` (the three). ClusterProfiles link nothing by default.
    #[arg(long, env = "SERVICE_MIRROR_LINK_SOURCE", value_enum, default_value_t = LinkSources::Both)]
    link_source: LinkSources,
    /// How long a deleted ClusterProfile must stay absent before its mirrors are
    /// deleted (its link stops at once; a profile of the same name back within it
    /// resumes the link, nothing deleted). 0s: as soon as it is confirmed gone.
    #[arg(long, env = "SERVICE_MIRROR_CLUSTER_PROFILE_DELETION_GRACE", default_value = "30s", value_parser = humantime::parse_duration)]
    cluster_profile_deletion_grace: Duration,
    /// Create a missing namespace for the mirrors of a `Link` (Linkerd's
    /// `-enable-namespace-creation`); without it such a Service is skipped, with an
    /// Event. Secret links always create it, as the 2020 mirror did.
    #[arg(long, env = "SERVICE_MIRROR_ENABLE_NAMESPACE_CREATION", default_value_t = false, action = clap::ArgAction::Set)]
    enable_namespace_creation: bool,
    /// How long a Lease lasts without renewal, in whole seconds, 1 s to 1 h. The leader
    /// Lease is renewed every third of it and the leader writes for at most four fifths
    /// of it after each renewal; each per-link write Lease is renewed every half of it
    /// and its link writes for at most 90 % of it after each renewal.
    #[arg(long, env = "SERVICE_MIRROR_LEASE_DURATION", default_value = "15s", value_parser = parse_lease_duration)]
    lease_duration: Duration,
    /// Gateway addresses never used, whatever `--gateway-address-allow` says
    /// (comma-separated CIDRs). The local service and pod CIDRs are refused with no
    /// flag where ServiceCIDRs and Nodes can be read; add those that cannot.
    #[arg(long, env = "SERVICE_MIRROR_GATEWAY_ADDRESS_DENY", value_parser = parse_cidrs)]
    gateway_address_deny: Vec<Vec<Cidr>>,
    /// Gateway addresses used although a built-in denial or the local networks refuse
    /// them (comma-separated CIDRs; never what the apiserver refuses in Endpoints).
    #[arg(long, env = "SERVICE_MIRROR_GATEWAY_ADDRESS_ALLOW", value_parser = parse_cidrs)]
    gateway_address_allow: Vec<Vec<Cidr>>,
    /// How long a remote's watch may fail before its link is Disconnected (a metric and
    /// a condition only: mirrors untouched).
    #[arg(long, env = "SERVICE_MIRROR_REMOTE_GRACE", default_value = "30s", value_parser = humantime::parse_duration)]
    remote_grace: Duration,
    /// How long after the remote last answered its mirrors' endpoints turn not ready
    /// (unless the gateway probe says alive), with a `RemoteStale` Event. 0: never.
    #[arg(long, env = "SERVICE_MIRROR_STALE_AFTER", default_value = "0s", value_parser = humantime::parse_duration)]
    stale_after: Duration,
    /// How long after the remote last answered its mirrors' endpoints are emptied (the
    /// Services stay, so ClusterIPs and DNS do). 0: never.
    #[arg(long, env = "SERVICE_MIRROR_STALE_DELETE_AFTER", default_value = "0s", value_parser = humantime::parse_duration)]
    stale_delete_after: Duration,
    /// Local Services that are members of federated Services (`key=value[,...]`;
    /// empty: none). Remote members are chosen by each Link's `federatedServiceSelector`.
    #[arg(
        long,
        env = "SERVICE_MIRROR_FEDERATED_SERVICE_SELECTOR",
        default_value = service_mirror_core::labels::DEFAULT_FEDERATED_SELECTOR
    )]
    federated_service_selector: String,
    /// Where a ServiceImport's and a federated Service's traffic goes by default:
    /// `local-first` (this cluster's own ready endpoints while it has at least the
    /// minimum, 1 unless the local ServiceExport's or local member's
    /// `service-mirror.io/local-minimum` says more; remote clusters only below it, by
    /// --cluster-priority) or `spread` (every cluster's endpoints alike). Their
    /// `service-mirror.io/locality` annotation overrides it; see docs/operations.md,
    /// "Traffic: local-first and priority failover".
    #[arg(long, env = "SERVICE_MIRROR_TRAFFIC_LOCALITY", default_value = "local-first", value_parser = parse_locality)]
    traffic_locality: service_mirror_core::traffic::Locality,
    /// Remote clusters in failover order (`east,north`): below the local minimum, the
    /// first of them whose gateway is alive takes the traffic, the next when it dies;
    /// unlisted clusters come last, together. Empty: every remote cluster together.
    #[arg(long, env = "SERVICE_MIRROR_CLUSTER_PRIORITY", default_value = "", value_parser = parse_cluster_priority)]
    cluster_priority: ClusterPriority,
    /// When the Multi-Cluster Services component runs (ServiceExports of this cluster
    /// and of every linked one read, the local exports' conditions, ServiceImports,
    /// derived Services and EndpointSlices written): `auto` with --mcs-cluster-name, or
    /// where the ServiceExport CRD is served and the ClusterProperty `id.k8s.io` names
    /// the cluster; `on` always (no name refuses the start); `off` never. Decided once
    /// at the start.
    #[arg(long, env = "SERVICE_MIRROR_MCS", value_enum, default_value_t = McsMode::Auto)]
    mcs: McsMode,
    /// This cluster's name in the Multi-Cluster Services cluster set (the name its
    /// peers' links give it); empty: the value of the ClusterProperty `id.k8s.io`
    /// (KEP-2149), if there is one.
    #[arg(long, env = "SERVICE_MIRROR_MCS_CLUSTER_NAME", default_value = "")]
    mcs_cluster_name: String,
    /// Address of the `clusterset.local` DNS server (UDP and TCP; `:5353`: every
    /// interface), answering from the ServiceImports: a cluster's CoreDNS forwards the
    /// zone to it. Empty: off. Needs MCS: `--mcs=off` refuses the start; MCS off for
    /// another reason (no cluster name yet): a warning, and the zone answers SERVFAIL.
    #[arg(long, env = "SERVICE_MIRROR_CLUSTERSET_DNS_ADDR", default_value = "")]
    clusterset_dns_addr: String,
}

/// One `--gateway-address-deny/allow` value: comma-separated CIDRs, blanks and empty
/// entries ignored (an empty environment variable is no CIDR, not an error).
fn parse_cidrs(s: &str) -> Result<Vec<Cidr>, CidrError> {
    Cidr::parse_list(s)
}

/// `--endpoints-mode`: the core's names, listed in `--help`.
fn mode_parser() -> impl clap::builder::TypedValueParser<Value = EndpointsMode> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(EndpointsMode::ALL.map(EndpointsMode::as_str)).map(
        |s| {
            s.parse::<EndpointsMode>()
                .expect("one of the possible values")
        },
    )
}

/// What a sharding replica keeps of the links it does not hold (`--shard-standby`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ShardStandby {
    /// Nothing: a link's watches run only where its write Lease is held.
    Cold,
    /// Every link watched on every replica.
    Warm,
}

/// A lease duration: 0 s would renew in a tight loop and never lead, and the Lease
/// stores whole seconds in an i32. A fraction is refused, not dropped: the other
/// replicas and Linkerd's controller count the whole seconds stored, so a holder timing
/// its writes on 1.5 s while the Lease says 1 s would write past the moment another
/// may take it.
fn parse_lease_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&d) {
        Err(format!("{s} is outside 1s..1h"))
    } else if d.subsec_nanos() != 0 {
        Err(format!(
            "{s} is not a whole number of seconds (Leases store leaseDurationSeconds)"
        ))
    } else {
        Ok(d)
    }
}

/// Runs the controller until SIGTERM or SIGINT.
pub(crate) async fn run(args: RunArgs) -> anyhow::Result<()> {
    init_logging(&args.log_level, args.log_format)?;
    // Taken first: a SIGTERM during the start (a rollout, a node drain) ends the
    // process the same graceful way once the start is done, instead of killing it
    // with a Lease held.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stale_policy =
        StalePolicy::new(args.remote_grace, args.stale_after, args.stale_delete_after)?;
    let dns_addr = crate::clusterset_dns::parse_addr(&args.clusterset_dns_addr)?;
    if dns_addr.is_some() && args.mcs == McsMode::Off {
        anyhow::bail!(
            "--clusterset-dns-addr serves the ServiceImports of the MCS component, which --mcs=off turns off"
        );
    }
    if args.shard_links && !args.leader_election {
        anyhow::bail!(
            "--shard-links needs --leader-election: the leader alone writes federated Services and MCS imports and collects unlinked mirrors"
        );
    }
    let metrics = Metrics::new();
    let mut config = super::client::config_from(args.kubeconfig.as_ref(), None).await?;
    // No resends inside a request: kube's default retries a 429/503/504 up to 15 times
    // for minutes, after the leadership check that let the write go (a write could land
    // after the term ended, under the next leader). A failed write is retried by its
    // key's requeue, which checks the term again. Bounded like the remote clients.
    config.default_retry = false;
    config.read_timeout = Some(Duration::from_secs(295));
    let local = crate::kube_client::build(config, "local", &metrics.client)?;
    // Read once: the leader identity and the Events' reporting instance.
    let pod_name = std::env::var("POD_NAME").ok();
    let recorder = EventRecorder::new(local.clone(), pod_name.clone());
    // Where imports' and federated Services' traffic goes (`core::traffic`).
    let traffic = service_mirror_core::traffic::TrafficDefaults {
        locality: args.traffic_locality,
        priority: args.cluster_priority.0.clone(),
    };
    let local_selector = crate::federation::local_selector(&args.federated_service_selector)
        .map_err(|e| anyhow::anyhow!("--federated-service-selector: {e}"))?;
    // At most 20 s (`startup::START_BUDGET`), before anything else asks the apiserver.
    let mcs_start = crate::mcs::startup::resolve(
        &local,
        &recorder,
        &metrics,
        args.mcs,
        &args.mcs_cluster_name,
    );
    let mcs_name = tokio::select! {
        name = mcs_start => name?,
        _ = term.recv() => {
            tracing::info!("stopped during the start");
            return Ok(());
        }
    };
    crate::permissions::spawn_startup_check(
        &local,
        &args.namespace,
        mcs_name.is_some(),
        args.link_source.cluster_profiles(),
    );
    // This cluster's name for the remote Services' `service-mirror.io/export-to`: the
    // MCS name, else the flag (`--mcs=off` with a name). Decided once, like MCS.
    let local_cluster_name = local_cluster_name(mcs_name.as_deref(), &args.mcs_cluster_name);
    let shutdown = CancellationToken::new();
    let identity = default_identity(pod_name.as_deref());
    let (leader, election) = if args.leader_election {
        let opts = LeaderOptions {
            namespace: args.namespace.clone(),
            lease_name: args.lease_name.clone(),
            identity: identity.clone(),
            duration: args.lease_duration,
        };
        let (rx, task) = elect(local.clone(), opts, metrics.clone(), shutdown.clone());
        (Some(rx), Some(task))
    } else {
        metrics.leader.leading.set(1);
        (None, None)
    };
    let namespaces = NamespaceFilter {
        allow: args
            .namespace_allow
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect(),
        deny: args
            .namespace_deny
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect(),
    };
    // Each link writes only while its write Lease is ours (see write_leases.rs); its
    // federation messages wait for its gate too.
    // Cold, a link not held here stops after one Lease duration (a handed-over link
    // is gone for good; a late renewal lapses for less).
    let write_gates = match (args.shard_links, args.shard_standby) {
        (true, ShardStandby::Cold) => {
            write_leases::WriteGates::sharded().with_cold_standby(args.lease_duration)
        }
        (true, ShardStandby::Warm) => write_leases::WriteGates::sharded(),
        (false, _) => write_leases::WriteGates::default(),
    };
    let (federation, federation_tasks) = crate::federation::Federation::start(
        local.clone(),
        recorder.clone(),
        metrics.clone(),
        crate::federation::FederationOptions {
            controller_namespace: args.namespace.clone(),
            local_selector,
            leader: leader.clone(),
            write_gates: Some(write_gates.clone()),
            traffic: traffic.clone(),
        },
        shutdown.clone(),
    );
    let (mcs, mcs_tasks) = match mcs_name {
        None => {
            let recheck = crate::mcs::startup::spawn_recheck(
                local.clone(),
                metrics.clone(),
                args.mcs,
                args.mcs_cluster_name.clone(),
                shutdown.clone(),
            );
            (None, recheck.into_iter().collect())
        }
        Some(name) => {
            let (mcs, tasks) = crate::mcs::Mcs::start(
                local.clone(),
                recorder.clone(),
                metrics.clone(),
                crate::mcs::McsOptions {
                    cluster_name: name,
                    leader: leader.clone(),
                    namespaces: namespaces.clone(),
                    controller_namespace: args.namespace.clone(),
                    traffic: traffic.clone(),
                },
                shutdown.clone(),
            );
            (Some(mcs), tasks)
        }
    };
    let dns_tasks = match dns_addr {
        None => Vec::new(),
        Some(addr) => {
            let zone = crate::clusterset_dns::zone_of(mcs.as_ref());
            crate::clusterset_dns::serve(addr, zone, metrics.clone(), shutdown.clone())
                .await?
                .1
        }
    };
    // The local service and pod CIDRs, refused as gateway addresses with no flag.
    let (local_networks, local_network_tasks) = crate::local_networks::spawn(
        local.clone(),
        Some(recorder.clone()),
        metrics.clone(),
        shutdown.clone(),
    );
    let opts = LinkManagerOptions {
        namespace: args.namespace.clone(),
        workers: 4,
        rotation_timeout: args.rotation_timeout,
        collect_unlinked: args.collect_unlinked_mirrors,
        config: LinkConfig {
            workers: args.workers,
            requeue_limit: args.event_requeue_limit,
            endpoint_refresh_period: args.endpoint_refresh_period,
            namespaces,
            probe_timeout: args.probe_timeout,
            probe_failure_threshold: args.probe_failure_threshold,
            max_mirrors: (args.max_mirrors_per_link > 0).then_some(args.max_mirrors_per_link),
            max_remote_response_bytes: args.max_remote_response_bytes,
            max_remote_cache_bytes: (args.max_remote_cache_bytes > 0)
                .then_some(args.max_remote_cache_bytes),
            endpoints_mode: args.endpoints_mode,
            enable_headless_services: args.enable_headless_services,
            headless_hostname_from_target_ref: args.headless_hostname_from_target_ref,
            gateway_address_policy: AddressPolicy {
                deny: args.gateway_address_deny.concat(),
                allow: args.gateway_address_allow.concat(),
            },
            stale_policy,
            local_cluster_name,
            ..LinkConfig::default()
        },
        sources: args.link_source,
        cluster_profile_deletion_grace: args.cluster_profile_deletion_grace,
        link_namespace_creation: args.enable_namespace_creation,
        deps: LinkDeps {
            metrics: metrics.clone(),
            leader: leader.clone(),
            write_gates: Some(write_gates.clone()),
            federation: Some(federation),
            mcs,
            local_networks,
            ..LinkDeps::default()
        },
    };
    let event_recorder = recorder.clone();
    let manager = Arc::new(LinkManager::start(local.clone(), recorder, opts));
    let write_leases = {
        let manager = manager.clone();
        write_leases::spawn(
            local,
            WriteLeaseOptions {
                namespace: args.namespace.clone(),
                identity,
                duration: args.lease_duration,
            },
            // Sharded, the write Leases are held whoever leads (the leader alone tells of
            // a foreign holder).
            leader.clone(),
            Arc::new(move || manager.link_set()),
            write_gates,
            Some(event_recorder),
            metrics.clone(),
            shutdown.clone(),
        )
    };
    let ready = {
        let manager = manager.clone();
        Arc::new(move || manager.ready()) as Arc<dyn Fn() -> bool + Send + Sync>
    };
    let gateways = {
        let manager = manager.clone();
        Arc::new(move || manager.gateways()) as Arc<dyn Fn() -> Vec<_> + Send + Sync>
    };
    let (addr, admin_task) = admin::serve(
        admin::parse_addr(&args.metrics_addr)?,
        AdminState {
            metrics,
            ready,
            gateways,
        },
        shutdown.clone(),
    )
    .await?;
    tracing::info!(namespace = %args.namespace, admin = %addr, endpoints_mode = %args.endpoints_mode, "service mirror running");

    wait_for_signal(term).await?;
    tracing::info!("shutting down: stopping link controllers, mirrors stay in place");
    shutdown.cancel();
    // The admin server and the write Leases hold the manager: let them finish first.
    let _ = admin_task.await;
    // Releasing needs the API: an unreachable one must not hold the exit up.
    let mut write_leases = write_leases;
    if tokio::time::timeout(Duration::from_secs(5), &mut write_leases)
        .await
        .is_err()
    {
        write_leases.abort();
        let _ = write_leases.await;
    }
    let manager =
        Arc::try_unwrap(manager).map_err(|_| anyhow::anyhow!("link manager still in use"))?;
    tokio::time::timeout(Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| anyhow::anyhow!("shutdown took longer than 10 s"))?;
    for task in federation_tasks
        .into_iter()
        .chain(mcs_tasks)
        .chain(dns_tasks)
        .chain(local_network_tasks)
    {
        let _ = task.await;
    }
    if let Some(election) = election {
        // Released, so another replica takes over without waiting for expiry.
        let _ = election.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// This cluster's name in the cluster set as the link controllers know it: the one MCS
/// runs as (`--mcs-cluster-name`, or the ClusterProperty `id.k8s.io` the start read),
/// else a `--mcs-cluster-name` MCS does not use (`--mcs=off`; the start checked it).
/// `None`: unknown, so a remote Service narrowed by `service-mirror.io/export-to` is not
/// mirrored (each link says so once).
fn local_cluster_name(mcs_name: Option<&str>, flag: &str) -> Option<String> {
    let name = mcs_name.or(Some(flag.trim()).filter(|f| !f.is_empty()));
    match name {
        Some(name) => {
            tracing::info!(cluster = %name, "remote Services narrowed by service-mirror.io/export-to are mirrored here when they list {name}")
        }
        None => tracing::info!(
            "this cluster has no name in the cluster set (--mcs-cluster-name, ClusterProperty id.k8s.io): remote Services narrowed by service-mirror.io/export-to are not mirrored"
        ),
    }
    name.map(str::to_owned)
}

async fn wait_for_signal(mut term: tokio::signal::unix::Signal) -> anyhow::Result<()> {
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    Ok(())
}

fn parse_locality(value: &str) -> Result<service_mirror_core::traffic::Locality, String> {
    service_mirror_core::traffic::Locality::parse(value)
        .ok_or_else(|| format!("{value:?}: expected local-first or spread"))
}

/// `--cluster-priority`, parsed (a newtype: clap reads a `Vec` field as many values).
#[derive(Clone, Debug, Default)]
struct ClusterPriority(Vec<String>);

fn parse_cluster_priority(value: &str) -> Result<ClusterPriority, String> {
    service_mirror_core::traffic::parse_priority(value).map(ClusterPriority)
}

#[cfg(test)]
mod tests {
    use super::super::Command;

    fn policy(argv: &[&str]) -> Result<(Vec<String>, Vec<String>), String> {
        let base = ["service-mirror", "run", "--namespace", "mc"];
        match Command::try_parse_from(base.iter().chain(argv)) {
            Ok(Command::Run(a)) => Ok((
                a.gateway_address_deny
                    .iter()
                    .flatten()
                    .map(ToString::to_string)
                    .collect(),
                a.gateway_address_allow
                    .iter()
                    .flatten()
                    .map(ToString::to_string)
                    .collect(),
            )),
            Ok(_) => unreachable!(),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn the_links_know_this_cluster_by_its_mcs_name_else_the_flag() {
        use super::local_cluster_name as name;
        assert_eq!(name(Some("east"), "east"), Some("east".into()));
        // The ClusterProperty's name MCS runs as (no flag).
        assert_eq!(name(Some("east"), ""), Some("east".into()));
        // `--mcs=off` with a name: the flag.
        assert_eq!(name(None, " west "), Some("west".into()));
        assert_eq!(name(None, ""), None);
        assert_eq!(name(None, "  "), None);
    }

    #[test]
    fn a_lease_duration_is_whole_seconds_within_1s_and_1h() {
        use super::parse_lease_duration as p;
        use std::time::Duration;
        assert_eq!(p("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(p("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["1500ms", "2.5s", "500ms", "0s", "2h"] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert!(p("1500ms").unwrap_err().contains("whole number of seconds"));
    }

    #[test]
    fn gateway_address_flags_parse_comma_separated_cidrs() {
        assert_eq!(policy(&[]), Ok((vec![], vec![])));
        assert_eq!(
            policy(&[
                "--gateway-address-deny=10.96.0.0/12, 10.244.0.0/16",
                "--gateway-address-allow",
                "fd00:ec2::254",
                "--gateway-address-deny=,",
                "--gateway-address-deny=",
                "--gateway-address-deny=198.18.0.0/15",
            ]),
            Ok((
                vec![
                    "10.96.0.0/12".into(),
                    "10.244.0.0/16".into(),
                    "198.18.0.0/15".into()
                ],
                vec!["fd00:ec2::254/128".into()]
            ))
        );
    }

    #[test]
    fn an_invalid_gateway_address_cidr_refuses_to_start() {
        for (argv, named) in [
            ("--gateway-address-deny=10.96.0.0/33", "\"10.96.0.0/33\""),
            (
                "--gateway-address-allow=10.0.0.0/8,example.com",
                "\"example.com\"",
            ),
        ] {
            let err = policy(&[argv]).unwrap_err();
            assert!(err.contains("invalid CIDR"), "{argv}: {err}");
            assert!(err.contains(named), "{argv}: {err}");
        }
    }

    #[test]
    fn the_cluster_profile_deletion_grace_defaults_to_its_constant() {
        let grace = |argv: &[&str]| {
            let base = ["service-mirror", "run", "--namespace", "mc"];
            match Command::try_parse_from(base.iter().chain(argv)) {
                Ok(Command::Run(a)) => a.cluster_profile_deletion_grace,
                other => panic!("{:?}", other.err()),
            }
        };
        assert_eq!(grace(&[]), crate::links::CLUSTER_PROFILE_DELETION_GRACE);
        assert_eq!(
            grace(&["--cluster-profile-deletion-grace", "4s"]),
            std::time::Duration::from_secs(4)
        );
    }
}
