//! The bench's command line.

use super::*;

/// Benchmark of the service mirror: cold sync, propagation latency, API cost and
/// memory at scale, each against a baseline writer measured in the same run.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench")]
pub(super) struct Args {
    /// Exported Services per remote cluster (N), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    pub(crate) services: Vec<usize>,
    /// Remote clusters (K), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,5")]
    pub(crate) clusters: Vec<usize>,
    /// Configurations with more than this many services in all (N x K) are skipped.
    /// The default keeps a full run under 15 minutes on 2 cores (see BENCHMARKS.md).
    #[arg(long, default_value_t = 5_000)]
    pub(crate) max_total: usize,
    /// The same cap for configurations of more than one remote cluster.
    #[arg(long, default_value_t = 5_000)]
    pub(crate) max_total_multicluster: usize,
    /// The configuration the goals are judged on: N = 10,000, K = 1 only (in place of
    /// --services, --clusters and the caps); about 13 minutes with 3 repetitions.
    #[arg(long)]
    pub(crate) goals: bool,
    /// Repetitions of each configuration, each on a fresh local cluster.
    #[arg(long, default_value_t = 3)]
    pub(crate) repetitions: usize,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench.json")]
    pub(crate) json: PathBuf,
    /// Single changes timed per repetition (port changes, and as many unexports).
    #[arg(long, default_value_t = 50)]
    pub(crate) samples: usize,
    /// Length of the idle window after the cold sync, in seconds.
    #[arg(long, default_value_t = 15)]
    pub(crate) idle_secs: u64,
    /// Length of the idle window of the first repetition of the first configuration,
    /// in seconds: past every periodic timer of the controller (30 s expectation
    /// expiry, 60 s gateway refresh, kube's 290 s watch timeout, after which each watch
    /// is opened again from its resourceVersion), so that a timer that rewrites
    /// unchanged mirrors shows up as idle writes. 0: every window is `--idle-secs`.
    #[arg(long, default_value_t = 300)]
    pub(crate) long_idle_secs: u64,
    /// Requests in flight the baseline tries; the best (highest throughput, measured on
    /// a calibration cluster first) is used. One value skips the calibration.
    #[arg(long, value_delimiter = ',', default_value = "8,32,64,128")]
    pub(crate) concurrency: Vec<usize>,
    /// Mirrors (Service + Endpoints) the calibration writes per concurrency level.
    #[arg(long, default_value_t = 1000)]
    pub(crate) calibration_services: usize,
    /// The controller: a `service-mirror` executable, or `self` (this executable runs
    /// the same `service_mirror_controller::cli`). Default: built with cargo, else found next to
    /// this executable.
    #[arg(long)]
    pub(crate) controller_bin: Option<String>,
    /// Extra flags for `service-mirror run` (repeatable), e.g. `--controller-arg=--workers=16`.
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) controller_arg: Vec<String>,
    /// Which endpoint objects mirrors carry, for the controller (`--endpoints-mode` of
    /// `service-mirror run`) and the baseline writer alike: endpoints, endpointslices or
    /// both. The report shows writes per service in this mode.
    #[arg(long, default_value = "both", value_parser = |s: &str| s.parse::<EndpointsMode>())]
    pub(crate) endpoints_mode: EndpointsMode,
    /// Where the links come from. `secrets`: link Secrets with the cluster-name
    /// annotation, remote Services exported by the gateway annotations, the gateway from
    /// the remote gateway Service. `links`: the Link CRD applied locally, per remote a
    /// credentials Secret (no annotations, a ServiceAccount with what `allow` grants) and
    /// a `Link` (the same gateway address and port, Linkerd's default selectors), remote
    /// Services exported by the label `mirror.linkerd.io/exported=true`, each with one
    /// ready remote EndpointSlice; the baseline writes Linkerd-style mirrors, and the
    /// report adds the Link status bytes and writes.
    #[arg(long, value_enum, default_value_t = LinkSource::Secrets)]
    pub(crate) link_source: LinkSource,
    /// Only the headless scenario, with this many pods: one remote headless Service
    /// whose slices name a hostname per pod, mirrored with `--enable-headless-services`
    /// (an endpoint mirror per pod), against the baseline writing the same objects.
    #[arg(long)]
    pub(crate) headless_pods: Option<usize>,
    /// Only the Multi-Cluster Services scenario, with this many exports: two clusters
    /// named by their ClusterProperty and linked both ways by Links, west exporting
    /// them; the cold sync of every ServiceImport, derived Service, import EndpointSlice
    /// and export condition in both clusters,
    /// against the reference writer writing the same objects (see `mcs.rs`).
    #[arg(long)]
    pub(crate) mcs_exports: Option<usize>,
    /// Fleet mode: the K remote clusters of `--clusters` are served by this many remote
    /// apiservers (cluster i by apiserver i % M), so that a 2-core machine can host
    /// K = 50 or 200. Each cluster is still a link of its own: its own cluster name,
    /// link Secret (or credentials Secret and Link) and full watch; the Services of one
    /// apiserver are shared by its links, so each link mirrors N, the controller K x N,
    /// and the reference writer writes the same K x N mirrors. Lifts `--max-total` and
    /// `--max-total-multicluster`; adds the RSS of a controller with no link (measured
    /// on the same local cluster just before) and the RSS per mirror and per link.
    #[arg(long)]
    pub(crate) fleet_apiservers: Option<usize>,
    /// Controller replicas sharding the links (`run --shard-links`, leader election on):
    /// CPU and RSS are summed over them (the largest replica's RSS beside), and each
    /// one's RSS with no link is subtracted from the RSS per mirror and per link.
    #[arg(long, default_value_t = 1)]
    pub(crate) replicas: usize,
    /// Extra kube-apiserver flags for the local clusters (both sides and the
    /// calibration; repeatable), e.g. `--local-apiserver-arg=--max-requests-inflight=800`.
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) local_apiserver_arg: Vec<String>,
    /// Only the controller (no baseline, no ratios): for quick tuning runs.
    #[arg(long)]
    pub(crate) skip_baseline: bool,
    /// The reference writer runs with a second set of the observer's watches open (its
    /// label-selected Services, and Endpoints or EndpointSlices as the mode has them),
    /// a part of the watch streams a controller's caches cost the apiserver (a link
    /// watches Services, Endpoints and EndpointSlices): the reference then pays for two
    /// more streams, the controller's run for three; the twin's decoding runs in the
    /// bench's process.
    #[arg(long)]
    pub(crate) baseline_watch: bool,
    /// Smoke test: correctness only. Fails unless every wanted state is reached and
    /// the controller writes nothing while idle. Fewer samples and a short idle window
    /// unless given.
    #[arg(long)]
    pub(crate) smoke: bool,
}

/// A one-scenario run's baseline concurrency: the one `--concurrency` given, else
/// `default`.
pub(super) fn single_concurrency(args: &Args, default: usize) -> usize {
    match args.concurrency.as_slice() {
        [one] => *one,
        _ => default,
    }
}
