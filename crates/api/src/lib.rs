//! The vocabulary of the service mirror: the custom resources it reads and writes, as
//! types derived with kube's `#[derive(CustomResource)]`, and the CRDs it installs.
//!
//! - [`link`]: Linkerd's `Link` (`multicluster.linkerd.io`), every served version
//!   (v1alpha1, v1alpha2, v1alpha3; one schema, v1alpha3 stored and read).
//! - [`mcs`]: the Multi-Cluster Services API's `ServiceExport` and `ServiceImport`
//!   (`multicluster.x-k8s.io`, v1beta1 read and written; v1alpha1 served, same schema).
//! - [`about`]: the About API's `ClusterProperty` (`about.k8s.io/v1alpha1`).
//! - [`clusterprofile`]: the cluster inventory API's `ClusterProfile`
//!   (`multicluster.x-k8s.io/v1alpha1`, KEP-4322), read as a link source; its CRD is
//!   upstream's, unchanged.
//!
//! The CRD YAML files in `crds/` are the one source of truth for what is installed
//! (`service-mirror install` embeds them, the Helm chart holds byte-identical copies):
//! they carry comments, YAML anchors and looser-than-derived spots Linkerd's own CRD
//! has, so they are written by hand and checked against the derived types field by
//! field (the `schema_check` tests), not generated.
//!
//! Types only: kube-core and k8s-openapi, no client, so the pure core can use them.
//! Reading is tolerant where one odd object must not stop a watch of all of them: an
//! absent `spec` decodes as the empty one (`absent_is_default!`).

pub mod about;
pub mod clusterprofile;
pub mod link;
pub mod mcs;

#[cfg(test)]
mod schema_check;

/// Implements `Deserialize` and `Serialize` for a struct declared with
/// `#[serde(remote = "Self")]` (whose derives then generate inherent functions): the
/// serialised form is the derived one, and an absent (or `null`) value decodes as
/// `Default::default()`. For the `spec` of a derived resource: kube-derive's root type
/// requires its `spec` field, and a stored object may have none (a ServiceExport is
/// usually written without one).
macro_rules! absent_is_default {
    ($t:ty) => {
        impl<'de> ::serde::Deserialize<'de> for $t {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Present($t);
                impl<'de> ::serde::Deserialize<'de> for Present {
                    fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                        <$t>::deserialize(d).map(Present)
                    }
                }
                Ok(Option::<Present>::deserialize(d)?
                    .map(|p| p.0)
                    .unwrap_or_default())
            }
        }
        impl ::serde::Serialize for $t {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                <$t>::serialize(self, s)
            }
        }
    };
}
pub(crate) use absent_is_default;
