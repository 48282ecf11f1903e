//! Linking the demo's clusters: the remote's token (narrowed by `allow`), a link
//! Secret or a Link, the Link CRD.

use super::*;

/// `allow` on the remote and the token a controller manager would fill.
pub(crate) async fn remote_token(r: &Remote) -> anyhow::Result<String> {
    allowed_token(&r.cluster, &r.client).await
}

/// `allow` applied to `cluster` (reached through `client`), and the token of its
/// ServiceAccount, filled as a controller manager would.
pub(crate) async fn allowed_token(
    cluster: &LocalCluster,
    client: &Client,
) -> anyhow::Result<String> {
    let manifests = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": allow_manifests(DEFAULT_NAMESPACE, DEFAULT_SERVICE_ACCOUNT)});
    apply_yaml(client, &manifests.to_string()).await?;
    let token_secret = token_secret_name(DEFAULT_SERVICE_ACCOUNT);
    cluster
        .fill_token_secret(DEFAULT_NAMESPACE, &token_secret)
        .await?;
    let filled = Api::<Secret>::namespaced(client.clone(), DEFAULT_NAMESPACE)
        .get(&token_secret)
        .await?;
    filled
        .data
        .as_ref()
        .and_then(|d| d.get("token"))
        .map(|t| String::from_utf8_lossy(&t.0).into_owned())
        .context("token")
}

/// `link`'s Secret applied to the local cluster.
pub(crate) async fn link_remote(local: &Client, r: &Remote, token: &str) -> anyhow::Result<()> {
    link_cluster(local, &r.cluster, &r.cluster.server_url(), token).await
}

/// `link`'s Secret of `remote` (its ServiceAccount's `token`; its apiserver at `server`)
/// applied through `local`.
pub(crate) async fn link_cluster(
    local: &Client,
    remote: &LocalCluster,
    server: &str,
    token: &str,
) -> anyhow::Result<()> {
    let secret = link_secret(
        remote.name(),
        "cluster.local",
        DEFAULT_NAMESPACE,
        server,
        remote.ca_pem().as_bytes(),
        token,
    )?;
    Api::<Secret>::namespaced(local.clone(), DEFAULT_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

/// What `link --format link` prints (same code) for `remote` (reached through
/// `remote_client`; its apiserver at `server` in the kubeconfig), applied to `local`.
pub(crate) async fn link_by_link(
    local: &Client,
    remote: &LocalCluster,
    remote_client: &Client,
    server: &str,
    token: &str,
) -> anyhow::Result<()> {
    let cluster = remote.name();
    let args = LinkGenArgs::default();
    let gateway = Api::<Service>::namespaced(remote_client.clone(), &args.gateway_namespace)
        .get(&args.gateway_name)
        .await?;
    let kubeconfig = kubeconfig_yaml(cluster, server, remote.ca_pem().as_bytes(), token)?;
    let (link, _warnings) = link_resource(
        cluster,
        "cluster.local",
        DEFAULT_NAMESPACE,
        &args,
        Some(&gateway),
    )?;
    let secret = credentials_secret(cluster, DEFAULT_NAMESPACE, kubeconfig);
    let docs = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [secret, link]});
    apply_yaml(local, &docs.to_string()).await?;
    Ok(())
}

/// The Link CRD, applied and served (at most 30 s).
pub(crate) async fn install_link_crd(local: &Client) -> anyhow::Result<()> {
    apply_yaml(local, LINK_CRD_YAML).await?;
    let links: Api<LinkResource> = Api::namespaced(local.clone(), DEFAULT_NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(30);
    while links.list(&ListParams::default()).await.is_err() {
        anyhow::ensure!(Instant::now() < deadline, "the Link CRD is not served");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Discovery (apply_yaml's kind lookup) lags the first list a little.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}
