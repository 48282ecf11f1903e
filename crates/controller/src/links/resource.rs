//! Linkerd's `Link` custom resource: the types are derived in the api crate
//! (`service_mirror_api::link`, re-exported here), with the CRD this controller
//! installs. A Link's status is written by `crate::writer::link_status`.

pub use service_mirror_api::link::{
    LINK_CRD_NAME, LINK_CRD_YAML, LINK_GROUP, LINK_KIND, LINK_PLURAL, LINK_VERSION, Link,
    LinkCondition, LinkObjectRef, LinkProbeSpec, LinkResourceSpec, LinkResourceStatus,
    LinkServiceStatus,
};
