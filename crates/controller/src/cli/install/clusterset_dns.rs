//! `install --clusterset-dns`: the controller's `clusterset.local` DNS server on every
//! replica (`run --clusterset-dns-addr :5353`, the container ports `clusterset-udp` and
//! `clusterset-tcp`) and the Service `service-mirror-clusterset-dns` in front of them on
//! port 53, UDP and TCP: the address a cluster's CoreDNS forwards the zone to
//! (`clusterset.local:53 { forward . <its ClusterIP> }`). 5353 in the container: a
//! non-root process without capabilities cannot bind 53.

use super::{meta, selector_labels};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The DNS server's port in the container.
pub(crate) const DNS_CONTAINER_PORT: i32 = 5353;
/// The Service's port (CoreDNS forwards to port 53 unless told otherwise).
pub(crate) const DNS_SERVICE_PORT: i32 = 53;
/// The Service in front of every replica's DNS server.
pub(crate) const DNS_SERVICE_NAME: &str = "service-mirror-clusterset-dns";
/// The container ports' names (at most 15 characters), UDP then TCP.
const PORT_NAMES: [(&str, &str); 2] = [("clusterset-udp", "UDP"), ("clusterset-tcp", "TCP")];

/// Adds the DNS server to `docs` (install's manifests): the flag and ports on the
/// Deployment's container, the Service after the admin Service.
pub(super) fn add(docs: &mut Vec<serde_json::Value>, namespace: &str) {
    let Some(at) = docs.iter().position(|d| d["kind"] == "Deployment") else {
        return;
    };
    let container = &mut docs[at]["spec"]["template"]["spec"]["containers"][0];
    if let Some(args) = container["args"].as_array_mut() {
        args.push(format!("--clusterset-dns-addr=:{DNS_CONTAINER_PORT}").into());
    }
    if let Some(ports) = container["ports"].as_array_mut() {
        for (name, protocol) in PORT_NAMES {
            ports.push(serde_json::json!({
                "name": name, "containerPort": DNS_CONTAINER_PORT, "protocol": protocol,
            }));
        }
    }
    let svc = Service {
        metadata: meta(DNS_SERVICE_NAME, Some(namespace)),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector_labels()),
            ports: Some(
                PORT_NAMES
                    .iter()
                    .map(|(name, protocol)| ServicePort {
                        name: Some((*name).into()),
                        port: DNS_SERVICE_PORT,
                        target_port: Some(IntOrString::String((*name).into())),
                        protocol: Some((*protocol).into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    let svc = serde_json::to_value(svc).expect("a Service serialises to JSON");
    docs.insert(at, svc);
}

#[cfg(test)]
mod tests {
    use super::super::{Install, install_manifests};
    use serde_json::json;

    fn manifests(dns: bool) -> Vec<serde_json::Value> {
        let mut docs = install_manifests(&Install {
            namespace: "mc",
            ha: false,
            image: "example.org/sm:1",
            link_crd: true,
            mcs_crds: true,
            cluster_property_crd: true,
            cluster_profile_crd: false,
        });
        if dns {
            super::add(&mut docs, "mc");
        }
        docs
    }

    #[test]
    fn the_dns_server_gets_its_flag_ports_and_a_service_on_53_udp_and_tcp() {
        let docs = manifests(true);
        let d = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            c["args"].as_array().unwrap().last().unwrap(),
            "--clusterset-dns-addr=:5353"
        );
        assert_eq!(
            c["ports"],
            json!([
                {"name": "mirror-admin", "containerPort": 9999, "protocol": "TCP"},
                {"name": "clusterset-udp", "containerPort": 5353, "protocol": "UDP"},
                {"name": "clusterset-tcp", "containerPort": 5353, "protocol": "TCP"},
            ])
        );
        let svc = docs
            .iter()
            .find(|d| d["metadata"]["name"] == "service-mirror-clusterset-dns")
            .unwrap();
        assert_eq!(svc["kind"], "Service");
        assert_eq!(svc["metadata"]["namespace"], "mc");
        assert_eq!(svc["spec"]["type"], "ClusterIP");
        assert_eq!(
            svc["spec"]["ports"],
            json!([
                {"name": "clusterset-udp", "port": 53, "targetPort": "clusterset-udp", "protocol": "UDP"},
                {"name": "clusterset-tcp", "port": 53, "targetPort": "clusterset-tcp", "protocol": "TCP"},
            ])
        );
        assert_eq!(
            svc["spec"]["selector"],
            d["spec"]["selector"]["matchLabels"]
        );
        // Off (the default): nothing of it.
        let off = manifests(false);
        assert!(!serde_json::to_string(&off).unwrap().contains("clusterset"));
        assert_eq!(off.len() + 1, docs.len());
    }
}
