//! Checking the permissions against the apiserver: which APIs it serves, a
//! SelfSubjectAccessReview per permission, and the startup check that logs what is
//! missing.

use super::*;

/// Which of [`local_network_permissions`] the client's identity lacks.
pub async fn missing_local_network_permissions(client: &kube::Client) -> kube::Result<Vec<String>> {
    missing_of(client, local_network_permissions()).await
}

/// Which of [`mcs_permissions`] the client's identity lacks.
pub async fn missing_mcs_permissions(client: &kube::Client) -> kube::Result<Vec<String>> {
    missing_of(client, mcs_permissions()).await
}

/// Whether the local apiserver serves the ServiceExport resource (v1beta1).
pub async fn service_export_api_served(client: &kube::Client) -> kube::Result<bool> {
    api_served(
        client,
        service_mirror_core::mcs::GROUP,
        crate::mcs::VERSION,
        crate::mcs::resource::SERVICE_EXPORT_PLURAL,
    )
    .await
}

/// Whether the local apiserver serves the `Link` resource (its CRD is installed and
/// established).
pub async fn link_api_served(client: &kube::Client) -> kube::Result<bool> {
    api_served(
        client,
        crate::links::LINK_GROUP,
        crate::links::LINK_VERSION,
        crate::links::LINK_PLURAL,
    )
    .await
}

/// Whether the local apiserver serves the `ClusterProfile` resource (KEP-4322; its CRD
/// is installed and established).
pub async fn cluster_profile_api_served(client: &kube::Client) -> kube::Result<bool> {
    use service_mirror_api::clusterprofile::{
        CLUSTER_PROFILE_GROUP, CLUSTER_PROFILE_PLURAL, CLUSTER_PROFILE_VERSION,
    };
    api_served(
        client,
        CLUSTER_PROFILE_GROUP,
        CLUSTER_PROFILE_VERSION,
        CLUSTER_PROFILE_PLURAL,
    )
    .await
}

/// Whether `plural` of `group/version` is served, asked through discovery, which every
/// authenticated identity may read (a group not served at all is a 404: false).
async fn api_served(
    client: &kube::Client,
    group: &str,
    version: &str,
    plural: &str,
) -> kube::Result<bool> {
    match client
        .list_api_group_resources(&format!("{group}/{version}"))
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == plural)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Asks the API server whether the client's identity holds `permission`.
pub async fn is_allowed(client: &kube::Client, permission: &Permission) -> kube::Result<bool> {
    // `links/status` is resource `links`, subresource `status` to the authorizer.
    let (resource, subresource) = match permission.resource.split_once('/') {
        Some((r, sub)) => (r.to_string(), Some(sub.to_string())),
        None => (permission.resource.clone(), None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(permission.group.clone()),
                resource: Some(resource),
                subresource,
                verb: Some(permission.verb.clone()),
                namespace: permission.namespace.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// The permissions of [`required_permissions`] that the client's identity does not hold,
/// as human-readable lines (`create services (cluster-wide)`, `watch secrets in namespace
/// linkerd-multicluster`), in a stable order. Fails if a review itself fails.
pub async fn missing_permissions(
    client: &kube::Client,
    namespace: &str,
) -> kube::Result<Vec<String>> {
    missing_of(client, required_permissions(namespace)).await
}

/// The permissions of [`link_permissions`] the client's identity does not hold, as
/// [`missing_permissions`] reports them.
pub async fn missing_link_permissions(
    client: &kube::Client,
    namespace: &str,
) -> kube::Result<Vec<String>> {
    missing_of(client, link_permissions(namespace)).await
}

/// The permissions of [`cluster_profile_permissions`] the client's identity does not
/// hold, as [`missing_permissions`] reports them.
pub async fn missing_cluster_profile_permissions(
    client: &kube::Client,
    namespace: &str,
) -> kube::Result<Vec<String>> {
    missing_of(client, cluster_profile_permissions(namespace)).await
}

async fn missing_of(
    client: &kube::Client,
    permissions: Vec<Permission>,
) -> kube::Result<Vec<String>> {
    let answers: Vec<(Permission, kube::Result<bool>)> = futures::stream::iter(permissions)
        .map(|p| async move {
            let allowed = is_allowed(client, &p).await;
            (p, allowed)
        })
        .buffered(8)
        .collect()
        .await;
    let mut missing = Vec::new();
    for (permission, allowed) in answers {
        if !allowed? {
            missing.push(permission.to_string());
        }
    }
    Ok(missing)
}

/// How long the startup check may take before it gives up (with a warning).
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// Checks the permissions of the controller running in `namespace` and logs each missing
/// one as an error. Never fails: a review that cannot be made is a warning, and the
/// controller runs on either way (its reconciles then report the API's refusals).
/// The Link permissions are checked only where the Link CRD is served; with
/// `cluster_profiles` (the ClusterProfile link source enabled), the ClusterProfile
/// permissions where their CRD is served.
/// With `mcs`, the MCS permissions and the ServiceExport CRD are checked too.
pub async fn log_missing_permissions(
    client: kube::Client,
    namespace: String,
    mcs: bool,
    cluster_profiles: bool,
) {
    log_missing_required(&client, &namespace).await;
    log_missing_link_permissions(&client, &namespace).await;
    if cluster_profiles {
        log_missing_cluster_profile_permissions(&client, &namespace).await;
    }
    log_missing_local_network_permissions(&client).await;
    if mcs {
        log_missing_mcs(&client).await;
    }
    // Said last, so that a reader of the log knows every missing permission is above.
    tracing::info!("{PERMISSION_CHECK_DONE}");
}

/// The log line that ends the startup permission check.
pub const PERMISSION_CHECK_DONE: &str = "startup permission check done";

async fn log_missing_required(client: &kube::Client, namespace: &str) {
    let namespace = namespace.to_string();
    match tokio::time::timeout(CHECK_TIMEOUT, missing_permissions(client, &namespace)).await {
        Ok(Ok(missing)) if missing.is_empty() => {
            tracing::info!(
                checked = required_permissions(&namespace).len(),
                "local permissions checked: all granted"
            );
        }
        Ok(Ok(missing)) => {
            for permission in &missing {
                tracing::error!(
                    %permission,
                    "missing permission: {permission}: the controller cannot work without it (grant the roles printed by `service-mirror install`)"
                );
            }
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not check the local permissions (SelfSubjectAccessReview failed); running anyway");
        }
        Err(_) => {
            tracing::warn!(
                timeout_s = CHECK_TIMEOUT.as_secs(),
                "could not check the local permissions in time; running anyway"
            );
        }
    }
}

/// The optional part: without the CRD there is nothing to check (Secret links only);
/// with it, a missing permission breaks Link links and nothing else.
async fn log_missing_link_permissions(client: &kube::Client, namespace: &str) {
    log_missing_optional(
        "Link",
        link_api_served(client),
        missing_link_permissions(client, namespace),
        link_permissions(namespace).len(),
        || {
            tracing::info!(
                crd = crate::links::LINK_CRD_NAME,
                "the Link CRD is not installed: links come from Secrets only"
            )
        },
        "Link resources cannot be served without it (Secret links are unaffected; grant the Role printed by `service-mirror install`)",
    )
    .await
}

/// Where ClusterProfiles are a link source: without their CRD there is nothing to
/// check (the watch says so too); with it, a missing permission breaks ClusterProfile
/// links (list, watch) or our condition on them (status patch), nothing else.
async fn log_missing_cluster_profile_permissions(client: &kube::Client, namespace: &str) {
    log_missing_optional(
        "ClusterProfile",
        cluster_profile_api_served(client),
        missing_cluster_profile_permissions(client, namespace),
        cluster_profile_permissions(namespace).len(),
        || {
            tracing::info!(
                crd = service_mirror_api::clusterprofile::CLUSTER_PROFILE_CRD_NAME,
                "the ClusterProfile CRD is not installed: no ClusterProfile links until it is"
            )
        },
        "ClusterProfile links cannot work without it (other link sources are unaffected; grant the Role printed by `service-mirror install`)",
    )
    .await
}

/// The local networks' reads: a missing one degrades the default address policy (a
/// warning naming what is no longer refused), it breaks nothing.
async fn log_missing_local_network_permissions(client: &kube::Client) {
    match tokio::time::timeout(CHECK_TIMEOUT, missing_local_network_permissions(client)).await {
        Ok(Ok(missing)) if missing.is_empty() => {
            tracing::info!(
                checked = local_network_permissions().len(),
                "local network permissions checked: all granted"
            );
        }
        Ok(Ok(missing)) => {
            for permission in &missing {
                tracing::warn!(
                    %permission,
                    "missing permission: {permission}: degraded: gateway addresses in the local service or pod CIDRs it reads are not refused by default (grant the ClusterRole printed by `service-mirror install`, or list them with --gateway-address-deny)"
                );
            }
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not check the local network permissions; running anyway");
        }
        Err(_) => {
            tracing::warn!(
                timeout_s = CHECK_TIMEOUT.as_secs(),
                "could not check the local network permissions in time; running anyway"
            );
        }
    }
}

/// Where MCS runs: the CRD must be served and its permissions granted, or no
/// export gets its conditions (the mirrors are unaffected).
async fn log_missing_mcs(client: &kube::Client) {
    // `get clusterproperties` is the start's, which names its own refusal (MCS off,
    // `forbidden`); a component that runs has its name already.
    let missing = async {
        missing_mcs_permissions(client).await.map(|m| {
            m.into_iter()
                .filter(|p| !p.contains(" clusterproperties."))
                .collect()
        })
    };
    log_missing_optional(
        "MCS",
        service_export_api_served(client),
        missing,
        mcs_permissions().len() - 1,
        || {
            tracing::error!(
                crd = crate::mcs::SERVICE_EXPORT_CRD_NAME,
                "MCS runs (--mcs=on or --mcs-cluster-name) but the ServiceExport CRD is not served: no export is read until it is (install it with `service-mirror install`)"
            )
        },
        "ServiceExports get no conditions without it (mirrors are unaffected; grant the ClusterRole printed by `service-mirror install`)",
    )
    .await
}

/// The check of an optional group of permissions (`what`): asked only where its API is
/// `served` (else `absent` says so), each `missing` one logged as an error saying
/// what it breaks (`effect`); never fails.
async fn log_missing_optional(
    what: &str,
    served: impl std::future::Future<Output = kube::Result<bool>>,
    missing: impl std::future::Future<Output = kube::Result<Vec<String>>>,
    checked: usize,
    absent: impl FnOnce(),
    effect: &str,
) {
    let check = async {
        if !served.await? {
            return Ok(None);
        }
        missing.await.map(Some)
    };
    match tokio::time::timeout(CHECK_TIMEOUT, check).await {
        Ok(Ok(None)) => absent(),
        Ok(Ok(Some(missing))) if missing.is_empty() => {
            tracing::info!(checked, "{what} permissions checked: all granted");
        }
        Ok(Ok(Some(missing))) => {
            for permission in &missing {
                tracing::error!(%permission, "missing permission: {permission}: {effect}");
            }
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not check the {what} permissions; running anyway");
        }
        Err(_) => {
            tracing::warn!(
                timeout_s = CHECK_TIMEOUT.as_secs(),
                "could not check the {what} permissions in time; running anyway"
            );
        }
    }
}

/// Runs [`log_missing_permissions`] in the background, so that a slow or unreachable
/// API server never delays the admin server or the controller.
pub fn spawn_startup_check(
    client: &kube::Client,
    namespace: &str,
    mcs: bool,
    cluster_profiles: bool,
) {
    tokio::spawn(log_missing_permissions(
        client.clone(),
        namespace.to_string(),
        mcs,
        cluster_profiles,
    ));
}
