//! The certificates and keys of one local cluster, generated with rcgen.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::net::{IpAddr, Ipv4Addr};

/// PEM-encoded material for one cluster.
#[derive(Debug, Clone)]
pub(crate) struct Pki {
    pub ca_cert: String,
    /// The CA's parameters and private key: [`Pki::client_cert`] signs node
    /// certificates with them.
    ca_params: CertificateParams,
    ca_key: String,
    pub serving_cert: String,
    pub serving_key: String,
    pub admin_cert: String,
    pub admin_key: String,
    /// Service-account token signing key (private) and its public half.
    pub sa_key: String,
    pub sa_pub: String,
}

impl Pki {
    /// A new CA, a serving certificate for 127.0.0.1/localhost and `extra_ips` (a node
    /// cluster's `kubernetes` ClusterIP and the address its pods reach the apiserver at)
    /// and an admin client certificate in group `system:masters`.
    pub(crate) fn generate(cluster: &str, extra_ips: &[Ipv4Addr]) -> Result<Self, rcgen::Error> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::default();
        ca.distinguished_name
            .push(DnType::CommonName, format!("{cluster}-ca"));
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key)?;
        let ca_key_pem = ca_key.serialize_pem();
        let ca_params = ca.clone();
        let issuer = Issuer::new(ca, ca_key);

        let serving_key = KeyPair::generate()?;
        let mut serving = CertificateParams::new(vec!["localhost".to_string()])?;
        serving
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        for ip in extra_ips {
            serving
                .subject_alt_names
                .push(SanType::IpAddress(IpAddr::V4(*ip)));
        }
        // In-cluster clients that name the Service (`kubernetes.default.svc`).
        for name in ["kubernetes", "kubernetes.default", "kubernetes.default.svc"] {
            serving
                .subject_alt_names
                .push(SanType::DnsName(name.try_into()?));
        }
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &issuer)?;

        let admin_key = KeyPair::generate()?;
        let mut admin = CertificateParams::default();
        admin.distinguished_name.push(DnType::CommonName, "admin");
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &issuer)?;

        let sa = KeyPair::generate()?;
        Ok(Self {
            ca_cert: ca_cert.pem(),
            ca_params,
            ca_key: ca_key_pem,
            serving_cert: serving_cert.pem(),
            serving_key: serving_key.serialize_pem(),
            admin_cert: admin_cert.pem(),
            admin_key: admin_key.serialize_pem(),
            sa_key: sa.serialize_pem(),
            sa_pub: sa.public_key_pem(),
        })
    }

    /// A client certificate and key (PEM) for `common_name` in group `organization`,
    /// signed by this cluster's CA: `system:node:<name>` in `system:nodes` for a kubelet.
    pub(crate) fn client_cert(
        &self,
        common_name: &str,
        organization: &str,
    ) -> Result<(String, String), rcgen::Error> {
        let issuer = Issuer::new(self.ca_params.clone(), KeyPair::from_pem(&self.ca_key)?);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, organization);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}
