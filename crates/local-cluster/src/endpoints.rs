//! Endpoints written by hand: what the Endpoints controller of a real cluster would publish
//! for a selectorless Service (with a data plane, kube-controller-manager mirrors them into
//! EndpointSlices that kube-proxy routes).

use crate::Result;
use crate::apply::FIELD_MANAGER;
use k8s_openapi::api::core::v1::Endpoints;
use kube::api::{Api, Patch, PatchParams};

/// Creates or replaces (server-side apply, forced) the Endpoints `namespace/name`: one
/// ready address `ip` with these named ports.
pub async fn publish_endpoints(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    ip: &str,
    ports: &[(&str, u16)],
) -> Result<()> {
    let ports: Vec<_> = ports
        .iter()
        .map(|(name, port)| serde_json::json!({"name": name, "port": port}))
        .collect();
    let ep = serde_json::json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": name, "namespace": namespace},
        "subsets": [{"addresses": [{"ip": ip}], "ports": ports}],
    });
    Api::<Endpoints>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&ep),
        )
        .await?;
    Ok(())
}
