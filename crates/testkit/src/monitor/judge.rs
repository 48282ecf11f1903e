//! The ownership rule, judged one audited write at a time: a write to an object that is
//! not a mirror of a linked cluster (or a question the controller may ask) is a breach.

use super::*;

/// A broken safety rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Breach {
    /// A successful write to an object the controller does not own.
    NotOwned(AuditWrite),
    /// A write to a namespace outside the controller's filter.
    OutsideRemit(AuditWrite),
    /// A mirror deleted while its remote was exported and unchanged.
    DeletedWhileExported(AuditWrite, String),
    /// A write after a declared convergence point.
    AfterConvergence(AuditWrite),
    /// A write attempt (failed ones too) by a replica while another (named) held the
    /// leader Lease.
    TwoWriters(AuditWrite, String),
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotOwned(w) => write!(f, "write to a non-owned object by {}: {w}", w.user),
            Self::OutsideRemit(w) => {
                write!(f, "write outside the allowed namespaces by {}: {w}", w.user)
            }
            Self::DeletedWhileExported(w, why) => write!(
                f,
                "mirror deleted while its remote is exported by {}: {w}: {why}",
                w.user
            ),
            Self::AfterConvergence(w) => write!(f, "write after convergence by {}: {w}", w.user),
            Self::TwoWriters(w, holder) => {
                write!(f, "write by {} while {holder} leads: {w}", w.user)
            }
        }
    }
}

/// What the controller is allowed to touch.
#[derive(Clone, Debug)]
pub struct Remit {
    /// Each replica's `user.username` (`system:serviceaccount:<ns>:<name>`): all
    /// their writes are judged.
    pub users: Vec<String>,
    /// The leader Lease's name (in the controller's namespace), with several replicas:
    /// while one holds it, another's write is [`Breach::TwoWriters`].
    pub leader_lease: Option<String>,
    /// Its own namespace (Leases).
    pub controller_namespace: String,
    /// Linked cluster names (mirror name suffixes).
    pub clusters: Vec<String>,
    /// Its namespace filter.
    pub namespaces: NamespaceFilter,
}

/// The linked cluster a mirror object name belongs to, and the remote Service name.
pub(super) fn mirror_of<'a>(remit: &'a Remit, name: &str) -> Option<(&'a str, String)> {
    remit
        .clusters
        .iter()
        .filter_map(|c| {
            name.strip_suffix(c.as_str())
                .and_then(|n| n.strip_suffix('-'))
                .filter(|n| !n.is_empty())
                .map(|n| (c.as_str(), n.to_owned()))
        })
        .max_by_key(|(c, _)| c.len())
}

pub(super) fn slice_mirror(name: &str) -> Option<&str> {
    let (rest, index) = name.rsplit_once('-')?;
    index.parse::<usize>().ok()?;
    rest.strip_suffix("-ipv4")
        .or_else(|| rest.strip_suffix("-ipv6"))
}

/// A create that stores nothing: the controller asking what it may do.
pub(super) fn is_question(w: &AuditWrite) -> bool {
    w.group == "authorization.k8s.io"
        && w.verb == "create"
        && matches!(
            w.resource.as_str(),
            "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
        )
}

/// The rule a write of the controller breaks, by kind and name alone (`foreign`: the
/// objects declared not ours, `(resource, namespace, name)`); `None`: allowed.
pub fn judge(
    remit: &Remit,
    foreign: &BTreeSet<(String, String, String)>,
    w: &AuditWrite,
) -> Option<Breach> {
    let object = matches!(
        (w.group.as_str(), w.resource.as_str()),
        ("", "services" | "endpoints" | "namespaces") | ("discovery.k8s.io", "endpointslices")
    );
    if object && w.ok() {
        let ns = if w.resource == "namespaces" {
            &w.name
        } else {
            &w.namespace
        };
        if !remit.namespaces.allows(ns) {
            return Some(Breach::OutsideRemit(w.clone()));
        }
    }
    if !w.ok() {
        return None;
    }
    let writes = matches!(w.verb.as_str(), "create" | "update" | "patch" | "delete");
    let allowed = match (w.group.as_str(), w.resource.as_str()) {
        ("", "services" | "endpoints") => {
            writes
                && w.subresource.is_empty()
                && mirror_of(remit, &w.name).is_some()
                // A create that succeeded found no object under that name: it touched
                // nothing foreign.
                && (w.verb == "create"
                    || !foreign.contains(&(w.resource.clone(), w.namespace.clone(), w.name.clone())))
        }
        ("discovery.k8s.io", "endpointslices") => {
            writes && slice_mirror(&w.name).is_some_and(|m| mirror_of(remit, m).is_some())
        }
        ("", "namespaces") => w.verb == "create",
        // Its leader Lease and per-link write Leases (`write_leases.rs`: deleted with
        // their link).
        ("coordination.k8s.io", "leases") => w.namespace == remit.controller_namespace && writes,
        ("" | "events.k8s.io", "events") => {
            matches!(w.verb.as_str(), "create" | "update" | "patch")
        }
        _ if is_question(w) => true,
        ("multicluster.linkerd.io", "links") => {
            w.subresource == "status" && matches!(w.verb.as_str(), "update" | "patch")
        }
        _ => false,
    };
    (!allowed).then(|| Breach::NotOwned(w.clone()))
}
