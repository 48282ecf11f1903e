//! Which remote namespaces may be mirrored into the local cluster.

/// Namespaces never mirrored unless explicitly allowed: mirroring into them would let a
/// remote cluster place Services among the local cluster's system components.
pub const DEFAULT_DENIED: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// An allow list (empty: every namespace) and a deny list; deny wins. A pattern ending in
/// `*` matches by prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceFilter {
    /// Only these namespaces, when not empty.
    pub allow: Vec<String>,
    /// Never these namespaces.
    pub deny: Vec<String>,
}

impl Default for NamespaceFilter {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            deny: DEFAULT_DENIED.iter().map(|s| s.to_string()).collect(),
        }
    }
}

fn matches(pattern: &str, ns: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => ns.starts_with(prefix),
        None => pattern == ns,
    }
}

impl NamespaceFilter {
    /// Only `allow`, with the default deny list.
    pub fn allow_only(allow: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            allow: allow.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Whether Services of namespace `ns` may be mirrored.
    pub fn allows(&self, ns: &str) -> bool {
        let allowed = self.allow.is_empty() || self.allow.iter().any(|p| matches(p, ns));
        allowed && !self.deny.iter().any(|p| matches(p, ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        let default = NamespaceFilter::default();
        let only = NamespaceFilter::allow_only(["team-*", "kube-system"]);
        let open = NamespaceFilter {
            allow: vec![],
            deny: vec![],
        };
        for (filter, ns, want) in [
            (&default, "shop", true),
            (&default, "kube-system", false),
            (&default, "kube-public", false),
            (&default, "default", true),
            (&only, "team-a", true),
            (&only, "shop", false),
            (&only, "kube-system", false),
            (&open, "kube-system", true),
        ] {
            assert_eq!(filter.allows(ns), want, "{filter:?} {ns}");
        }
    }
}
