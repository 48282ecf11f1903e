//! The one error type of the controller, with a label for the errors metric.

/// Why a reconcile or a link failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to a Kubernetes API failed.
    #[error("kubernetes api: {0}")]
    Kube(#[from] kube::Error),
    /// A local object of the mirror's name exists and is not ours: never touched.
    #[error(
        "{kind} {namespace}/{name} exists and is not a mirror of cluster {cluster}; leaving it alone"
    )]
    OwnershipConflict {
        /// `Service` or `Endpoints`.
        kind: String,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its uid, as read (an Event on it names it).
        uid: Option<String>,
        /// The cluster whose mirror wanted that name.
        cluster: String,
    },
    /// The link's parameters are invalid.
    #[error("invalid link: {0}")]
    InvalidLink(String),
    /// A mirror's namespace does not exist locally and the link may not create it
    /// (a `Link` without `--enable-namespace-creation`, as Linkerd): the Service is
    /// skipped until the namespace exists.
    #[error("namespace {0} does not exist locally; the mirror is skipped until it does")]
    MissingNamespace(String),
    /// A write this replica may not make: another replica leads (it makes it).
    #[error("this replica does not lead; the leader writes")]
    NotLeader,
}

impl Error {
    /// A short, bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) => match s.code {
                403 => "forbidden",
                404 => "not_found",
                409 => "conflict",
                422 => "invalid",
                429 => "throttled",
                c if c >= 500 => "server_error",
                _ => "api_error",
            },
            Error::Kube(_) => "connection",
            Error::OwnershipConflict { .. } => "ownership_conflict",
            Error::InvalidLink(_) => "invalid_link",
            Error::MissingNamespace(_) => "missing_namespace",
            Error::NotLeader => "not_leader",
        }
    }
}

/// Result alias of the controller.
pub type Result<T, E = Error> = std::result::Result<T, E>;
