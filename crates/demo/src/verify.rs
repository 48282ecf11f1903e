//! What the demo checks and prints as it goes: the safety invariants (every object
//! with our labels is ours, nothing else touched) and `service-mirror check`.

use super::*;

/// The oracle's check of west against `baseline`, printed; `remotes` are (name, client,
/// linked by a Link). The oracle knows the 2020 contract (Secret links) only: Link mirrors
/// are checked by `check`, and are the only mirrors it may call unexplained.
pub(crate) async fn invariants(
    local: &Client,
    remotes: &[(&str, &Client, bool)],
    baseline: &Baseline,
) -> anyhow::Result<()> {
    let world = World {
        local: local.clone(),
        remotes: remotes
            .iter()
            .filter(|r| !r.2)
            .map(|r| InvariantRemote {
                cluster: r.0.to_string(),
                domain: None,
                client: r.1.clone(),
            })
            .collect(),
        namespaces: NamespaceFilter::default(),
        controller_namespace: Some(DEFAULT_NAMESPACE.into()),
    };
    let mut violations = check(&world, baseline).await;
    let mut by_link = std::collections::BTreeSet::new();
    for r in remotes.iter().filter(|r| r.2) {
        by_link.extend(owned_by(local, r.0).await?);
    }
    violations.retain(|v| !matches!(v, Violation::Extra(_, key, _) if by_link.contains(key)));
    println!(
        "\nInvariant check of east (mirrors = exported services of linked clusters, nothing foreign changed): {} violation(s).",
        violations.len()
    );
    for v in &violations {
        println!("  {v:?}");
    }
    anyhow::ensure!(
        violations.is_empty(),
        "the world does not keep its invariants"
    );
    Ok(())
}

/// `(namespace, name)` of every mirror object of `cluster` (the ownership labels).
pub(crate) async fn owned_by(
    local: &Client,
    cluster: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let lp = ListParams::default().labels(&owner_selector(cluster));
    let key = |m: &kube::api::ObjectMeta| {
        (
            m.namespace.clone().unwrap_or_default(),
            m.name.clone().unwrap_or_default(),
        )
    };
    let mut out: Vec<(String, String)> = Vec::new();
    out.extend(
        Api::<Service>::all(local.clone())
            .list(&lp)
            .await?
            .iter()
            .map(|o| key(&o.metadata)),
    );
    out.extend(
        Api::<Endpoints>::all(local.clone())
            .list(&lp)
            .await?
            .iter()
            .map(|o| key(&o.metadata)),
    );
    out.extend(
        Api::<EndpointSlice>::all(local.clone())
            .list(&lp)
            .await?
            .iter()
            .map(|o| key(&o.metadata)),
    );
    Ok(out)
}

/// `check` on west (the same checks), and the gateways it saw.
pub(crate) async fn print_check(local: &Client, admin: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let lines = loop {
        let g = gather(
            local,
            DEFAULT_NAMESPACE,
            LEASE_NAME,
            &MetricsSource::Addr(admin.into()),
        )
        .await?;
        let lines = checks::all(&g);
        // Right after the story's last step a probe may still be on its way.
        if lines.iter().all(|l| l.ok) || Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!("\n$ service-mirror check --context west");
    print!("{}", checks::render(&lines));
    println!("\n$ service-mirror gateways --admin-addr {admin}");
    print!(
        "{}",
        service_mirror_controller::cli::gateways::gateways_table(admin).await?
    );
    anyhow::ensure!(
        lines.iter().all(|l| l.ok),
        "check failed on the demo's clusters"
    );
    Ok(())
}
