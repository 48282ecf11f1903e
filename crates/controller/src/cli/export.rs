//! `service-mirror export` / `unexport`: mark a Service of a (remote) cluster as
//! exported, or not, with the two gateway annotations the mirror looks for.
//!
//! ```text
//! service-mirror export web -n shop --context east     # mirrored in linked clusters
//! service-mirror unexport web -n shop --context east   # mirrors deleted
//! ```

use super::args::KubeArgs;
use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use service_mirror_core::labels::{GATEWAY_NAME_ANNOTATION, GATEWAY_NS_ANNOTATION};

/// Default name of the gateway Service (Linkerd's).
pub(crate) const DEFAULT_GATEWAY_NAME: &str = "linkerd-gateway";
/// Default namespace of the gateway Service (Linkerd's).
pub(crate) const DEFAULT_GATEWAY_NAMESPACE: &str = "linkerd-multicluster";

/// Arguments of `export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// Name of the Service to export.
    pub service: String,
    /// Namespace of the Service.
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    /// Name of the gateway Service that receives the cross-cluster traffic.
    #[arg(long, env = "SERVICE_MIRROR_GATEWAY_NAME", default_value = DEFAULT_GATEWAY_NAME)]
    pub gateway_name: String,
    /// Namespace of the gateway Service.
    #[arg(
        long,
        env = "SERVICE_MIRROR_GATEWAY_NAMESPACE",
        default_value = DEFAULT_GATEWAY_NAMESPACE
    )]
    pub gateway_namespace: String,
    /// The cluster that owns the Service.
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// Arguments of `unexport`.
#[derive(Debug, clap::Args)]
pub struct UnexportArgs {
    /// Name of the Service to stop exporting.
    pub service: String,
    /// Namespace of the Service.
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    /// The cluster that owns the Service.
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// The merge patch that exports a Service through gateway `gateway_namespace/gateway_name`.
pub(crate) fn export_patch(gateway_name: &str, gateway_namespace: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "annotations": {
                GATEWAY_NAME_ANNOTATION: gateway_name,
                GATEWAY_NS_ANNOTATION: gateway_namespace,
            }
        }
    })
}

/// The merge patch that removes both gateway annotations (`null` deletes a key).
pub(crate) fn unexport_patch() -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "annotations": {
                GATEWAY_NAME_ANNOTATION: null,
                GATEWAY_NS_ANNOTATION: null,
            }
        }
    })
}

/// Merge-patches Service `namespace/name`, turning 404 and 403 into readable errors.
async fn patch_service(
    client: kube::Client,
    namespace: &str,
    name: &str,
    patch: serde_json::Value,
) -> anyhow::Result<Service> {
    let services: Api<Service> = Api::namespaced(client, namespace);
    match services
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(s) => Ok(s),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            bail!("service {namespace}/{name} not found")
        }
        Err(kube::Error::Api(status)) if status.code == 403 => bail!(
            "not allowed to patch service {namespace}/{name}: {}",
            status.message
        ),
        Err(e) => Err(e).with_context(|| format!("patching service {namespace}/{name}")),
    }
}

fn check_nonempty(what: &str, value: &str) -> anyhow::Result<()> {
    anyhow::ensure!(!value.trim().is_empty(), "{what} must not be empty");
    Ok(())
}

/// Adds the gateway annotations.
pub(crate) async fn export(args: ExportArgs) -> anyhow::Result<()> {
    check_nonempty("the service name", &args.service)?;
    check_nonempty("--namespace", &args.namespace)?;
    check_nonempty("--gateway-name", &args.gateway_name)?;
    check_nonempty("--gateway-namespace", &args.gateway_namespace)?;
    let client = args.kube.client().await?;
    patch_service(
        client,
        &args.namespace,
        &args.service,
        export_patch(&args.gateway_name, &args.gateway_namespace),
    )
    .await?;
    println!(
        "service {}/{} exported through gateway {}/{}",
        args.namespace, args.service, args.gateway_namespace, args.gateway_name
    );
    Ok(())
}

/// Removes the gateway annotations.
pub(crate) async fn unexport(args: UnexportArgs) -> anyhow::Result<()> {
    check_nonempty("the service name", &args.service)?;
    check_nonempty("--namespace", &args.namespace)?;
    let client = args.kube.client().await?;
    patch_service(client, &args.namespace, &args.service, unexport_patch()).await?;
    println!("service {}/{} unexported", args.namespace, args.service);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn export_patch_sets_both_annotations() {
        assert_eq!(
            export_patch("gw", "gw-ns"),
            json!({"metadata": {"annotations": {
                "mirror.linkerd.io/gateway-name": "gw",
                "mirror.linkerd.io/gateway-ns": "gw-ns",
            }}})
        );
    }

    #[test]
    fn unexport_patch_nulls_both_annotations() {
        assert_eq!(
            unexport_patch(),
            json!({"metadata": {"annotations": {
                "mirror.linkerd.io/gateway-name": null,
                "mirror.linkerd.io/gateway-ns": null,
            }}})
        );
    }

    #[test]
    fn defaults_are_linkerds() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: ExportArgs,
        }
        let args = Cli::try_parse_from(["export", "web"]).unwrap().args;
        assert_eq!(args.service, "web");
        assert_eq!(args.namespace, "default");
        assert_eq!(args.gateway_name, "linkerd-gateway");
        assert_eq!(args.gateway_namespace, "linkerd-multicluster");
        let args = Cli::try_parse_from(["export", "web", "-n", "shop"])
            .unwrap()
            .args;
        assert_eq!(args.namespace, "shop");
        assert!(
            Cli::try_parse_from(["export"]).is_err(),
            "SERVICE is required"
        );
    }
}
