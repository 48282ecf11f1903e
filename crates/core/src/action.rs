//! The one vocabulary of local writes: a verb (create, update, delete) of an object of
//! one of the kinds this controller writes. Every planner (mirrors, federation, MCS
//! imports) says what to write in it; the controller's `LocalWriter` carries it out.

use std::fmt;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use service_mirror_api::mcs::ServiceImport;

/// One write to the local cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create this object.
    Create(Object),
    /// Replace the stored object with this one (carries its resourceVersion).
    Update(Object),
    /// Delete an object, with uid and resourceVersion preconditions so that a recreated
    /// or changed object is not deleted by mistake.
    Delete(ObjectRef),
}

/// An object this controller writes, whole.
// A Service (824 bytes) is larger than a ServiceImport (584): not boxed, as every
// object written is built, planned and sent once; a box would only add an allocation.
#[expect(clippy::large_enum_variant, reason = "each object is written once")]
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// A mirror, federated or derived Service.
    Service(Service),
    /// A mirror's Endpoints.
    Endpoints(Endpoints),
    /// A mirror's, federated Service's or import's EndpointSlice.
    EndpointSlice(EndpointSlice),
    /// An MCS ServiceImport (spec and metadata; its status is written apart).
    ServiceImport(ServiceImport),
}

/// The kinds of [`Object`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    /// `v1` Service.
    Service,
    /// `v1` Endpoints.
    Endpoints,
    /// `discovery.k8s.io/v1` EndpointSlice.
    EndpointSlice,
    /// `multicluster.x-k8s.io` ServiceImport.
    ServiceImport,
}

/// An object to delete: its kind, name and the preconditions it had when planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRef {
    /// Its kind.
    pub kind: ObjectKind,
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
    /// Precondition: the uid the object had when planned.
    pub uid: Option<String>,
    /// Precondition: the resourceVersion the object had when planned.
    pub resource_version: Option<String>,
}

impl ObjectKind {
    /// The kind's name, as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Service => "Service",
            Self::Endpoints => "Endpoints",
            Self::EndpointSlice => "EndpointSlice",
            Self::ServiceImport => "ServiceImport",
        }
    }
}

impl ObjectRef {
    /// A delete of `kind` of exactly the object `meta` describes (as the cache holds it).
    pub fn of(kind: ObjectKind, meta: &ObjectMeta) -> Self {
        Self {
            kind,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
        }
    }
}

impl Object {
    /// Its kind.
    pub fn kind(&self) -> ObjectKind {
        match self {
            Self::Service(_) => ObjectKind::Service,
            Self::Endpoints(_) => ObjectKind::Endpoints,
            Self::EndpointSlice(_) => ObjectKind::EndpointSlice,
            Self::ServiceImport(_) => ObjectKind::ServiceImport,
        }
    }

    /// Its metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Self::Service(o) => &o.metadata,
            Self::Endpoints(o) => &o.metadata,
            Self::EndpointSlice(o) => &o.metadata,
            Self::ServiceImport(o) => &o.metadata,
        }
    }
}

impl From<Service> for Object {
    fn from(o: Service) -> Self {
        Self::Service(o)
    }
}

impl From<Endpoints> for Object {
    fn from(o: Endpoints) -> Self {
        Self::Endpoints(o)
    }
}

impl From<EndpointSlice> for Object {
    fn from(o: EndpointSlice) -> Self {
        Self::EndpointSlice(o)
    }
}

impl From<ServiceImport> for Object {
    fn from(o: ServiceImport) -> Self {
        Self::ServiceImport(o)
    }
}

impl Action {
    /// Whether this action creates an object.
    pub fn is_create(&self) -> bool {
        matches!(self, Action::Create(_))
    }

    /// The kind of the object it writes.
    pub fn kind(&self) -> ObjectKind {
        match self {
            Action::Create(o) | Action::Update(o) => o.kind(),
            Action::Delete(r) => r.kind,
        }
    }

    /// `create`, `update` or `delete`.
    pub fn verb(&self) -> &'static str {
        match self {
            Action::Create(_) => "create",
            Action::Update(_) => "update",
            Action::Delete(_) => "delete",
        }
    }
}

impl fmt::Display for Action {
    /// `<verb> <Kind> <namespace>/<name>`, for logs and events.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ns, name) = match self {
            Action::Create(o) | Action::Update(o) => {
                let meta = o.metadata();
                (
                    meta.namespace.as_deref().unwrap_or_default(),
                    meta.name.as_deref().unwrap_or_default(),
                )
            }
            Action::Delete(r) => (r.namespace.as_str(), r.name.as_str()),
        };
        write!(f, "{} {} {ns}/{name}", self.verb(), self.kind().as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some("shop".into()),
            name: Some(name.into()),
            uid: Some("u1".into()),
            resource_version: Some("7".into()),
            ..Default::default()
        }
    }

    #[test]
    fn an_action_displays_as_verb_kind_and_name() {
        let cases = [
            (
                Action::Create(Object::Service(Service {
                    metadata: meta("web"),
                    ..Default::default()
                })),
                "create Service shop/web",
            ),
            (
                Action::Update(Object::Endpoints(Endpoints {
                    metadata: meta("web"),
                    ..Default::default()
                })),
                "update Endpoints shop/web",
            ),
            (
                Action::Delete(ObjectRef::of(ObjectKind::EndpointSlice, &meta("web-x"))),
                "delete EndpointSlice shop/web-x",
            ),
            (
                Action::Create(Object::ServiceImport(ServiceImport {
                    metadata: meta("web"),
                    ..Default::default()
                })),
                "create ServiceImport shop/web",
            ),
        ];
        for (action, want) in cases {
            assert_eq!(action.to_string(), want);
        }
    }

    #[test]
    fn a_delete_carries_the_preconditions_of_the_object_as_planned() {
        let r = ObjectRef::of(ObjectKind::Service, &meta("web"));
        assert_eq!(
            (r.uid.as_deref(), r.resource_version.as_deref()),
            (Some("u1"), Some("7"))
        );
        assert!(!Action::Delete(r).is_create());
    }
}
