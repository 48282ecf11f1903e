//! Fixtures shared by the MCS table tests (`mcs_derived_tests.rs`, `mcs_import_tests.rs`).

use crate::ServiceKey;
use crate::mcs::ImportPort;

/// The controller namespace of the tests.
pub(crate) const CTL: &str = "linkerd-multicluster";

/// The import every table is about.
pub(crate) fn key() -> ServiceKey {
    ServiceKey::new("shop", "hello")
}

/// An import port without `appProtocol`.
pub(crate) fn port(name: &str, protocol: &str, port: i32) -> ImportPort {
    ImportPort {
        name: name.into(),
        protocol: protocol.into(),
        port,
        app_protocol: None,
    }
}
