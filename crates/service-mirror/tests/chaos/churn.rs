//! Remote churn (what users do to the remote clusters all the time) and the seeded
//! random choices of the run.

use crate::support::{exported, ports};
use crate::{GATEWAYS, NAMESPACES, SERVICES};
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

/// xorshift64*: the whole run follows from the seed.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub(crate) fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    /// Fisher-Yates.
    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// One churn operation on a remote (through the test's admin client, not the proxy);
/// errors (an apiserver away, a race) are ignored: the oracle reads what happened.
pub(crate) async fn churn(rng: &mut Rng, remotes: &[Client]) {
    let client = rng.pick(remotes).clone();
    let ns = *rng.pick(&NAMESPACES);
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    let name = format!("svc-{}", rng.below(SERVICES));
    let pp = PatchParams::default();
    let gw = *rng.pick(&GATEWAYS);
    let _ = match rng.below(6) {
        0 => {
            let mut svc = exported(&name, ns, gw, &[("http", 80)]);
            if let Some(a) = svc.metadata.annotations.as_mut() {
                a.insert(
                    "mirror.linkerd.io/gateway-ns".into(),
                    NAMESPACES[0].to_string(),
                );
                if rng.chance(25) {
                    a.clear();
                }
            }
            api.create(&PostParams::default(), &svc).await.map(|_| ())
        }
        1 => {
            let n = 1 + rng.below(3);
            let p: Vec<(String, i32)> = (0..n)
                .map(|i| (format!("p{i}"), 8000 + rng.below(50) as i32))
                .collect();
            let p: Vec<(&str, i32)> = p.iter().map(|(n, p)| (n.as_str(), *p)).collect();
            let patch = serde_json::json!({"spec": {"ports": ports(&p)}});
            api.patch(&name, &pp, &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
        2 => {
            let patch = serde_json::json!({"metadata": {"annotations": {
                "mirror.linkerd.io/gateway-name": gw,
                "mirror.linkerd.io/gateway-ns": NAMESPACES[0]}}});
            api.patch(&name, &pp, &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
        3 => {
            let patch = serde_json::json!({"metadata": {"annotations": {
                "mirror.linkerd.io/gateway-name": null,
                "mirror.linkerd.io/gateway-ns": null}}});
            api.patch(&name, &pp, &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
        4 => api
            .delete(&name, &DeleteParams::default())
            .await
            .map(|_| ()),
        _ => move_gateway(rng, &client, gw).await,
    };
}

/// New addresses (1 or 2 in 192.0.2.0/24, never contacted) and sometimes a new port.
async fn move_gateway(rng: &mut Rng, client: &Client, gw: &str) -> Result<(), kube::Error> {
    let api: Api<Service> = Api::namespaced(client.clone(), NAMESPACES[0]);
    let ips: Vec<serde_json::Value> = (0..1 + rng.below(2))
        .map(|_| serde_json::json!({"ip": format!("192.0.2.{}", 1 + rng.below(200))}))
        .collect();
    let status = serde_json::json!({"status": {"loadBalancer": {"ingress": ips}}});
    api.patch_status(gw, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    if rng.chance(30) {
        let port = 4140 + rng.below(10) as i32;
        let patch = serde_json::json!({"spec": {"ports": [
            {"name": "mc-gateway", "port": port, "protocol": "TCP"}]}});
        api.patch(gw, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

/// A random local mirror Service (namespace, name), if any.
pub(crate) async fn some_mirror(rng: &mut Rng, local: &Client) -> Option<(String, String)> {
    let lp = ListParams::default().labels("mirror.linkerd.io/mirrored-service=true");
    let list = Api::<Service>::all(local.clone()).list(&lp).await.ok()?;
    if list.items.is_empty() {
        return None;
    }
    let s = rng.pick(&list.items);
    Some((s.metadata.namespace.clone()?, s.metadata.name.clone()?))
}
