//! The `allow`, `link`, `export` and `unexport` commands: the real binary against a real
//! apiserver (a shared local cluster playing the remote cluster).

use base64::Engine;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service, ServicePort, ServiceSpec};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use local_cluster::{LocalCluster, apply_yaml, client_from_yaml, shared_cluster, unique_namespace};
use std::collections::BTreeMap;
use std::sync::Arc;

#[path = "../images/mod.rs"]
mod images;

use crate::support::controller::service_mirror;

const GATEWAY_NAME: &str = "mirror.linkerd.io/gateway-name";
const GATEWAY_NS: &str = "mirror.linkerd.io/gateway-ns";

async fn remote() -> Arc<LocalCluster> {
    shared_cluster("remote")
        .await
        .expect("start the remote cluster")
}

fn admin_path(cluster: &LocalCluster) -> String {
    cluster.admin_kubeconfig().path.display().to_string()
}

/// Runs `allow` for `ns`/`sa` and applies its output; returns the applied objects.
async fn allow(cluster: &LocalCluster, ns: &str, sa: &str) -> Vec<String> {
    let run = service_mirror(&["allow", "--namespace", ns, "--service-account-name", sa]);
    assert!(run.ok, "allow failed: {}", run.stderr);
    let client = cluster.client().await.unwrap();
    apply_yaml(&client, &run.stdout)
        .await
        .expect("apply allow's output")
}

fn link_args<'a>(kubeconfig: &'a str, ns: &'a str, sa: &'a str) -> Vec<&'a str> {
    vec![
        "link",
        "--cluster-name",
        "east",
        "--kubeconfig",
        kubeconfig,
        "--namespace",
        ns,
        "--service-account-name",
        sa,
    ]
}

/// The kubeconfig YAML inside a link Secret.
fn kubeconfig_in(secret: &Secret) -> String {
    let data = secret.data.as_ref().expect("link Secret has data");
    String::from_utf8(data["kubeconfig"].0.clone()).expect("utf-8 kubeconfig")
}

fn parse_yaml_secret(text: &str) -> Secret {
    let value: serde_json::Value = serde_saphyr::from_str(text).expect("link prints YAML");
    serde_json::from_value(value).expect("link prints a Secret")
}

fn forbidden<T: std::fmt::Debug>(r: kube::Result<T>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403)
}

#[tokio::test]
async fn allow_then_link_gives_a_read_only_kubeconfig() {
    let cluster = remote().await;
    let admin = cluster.client().await.unwrap();
    let kubeconfig = admin_path(&cluster);
    let ns = unique_namespace("cli-link");
    let sa = "mirror-reader";

    let applied = allow(&cluster, &ns, sa).await;
    assert_eq!(applied.len(), 5, "{applied:?}");
    assert_eq!(applied[0], format!("Namespace/{ns}"));
    assert!(
        applied.contains(&format!("Secret/{ns}/{sa}-token")),
        "{applied:?}"
    );
    // Applying the same output again changes nothing and does not fail.
    allow(&cluster, &ns, sa).await;

    // The token controller has not run yet: link explains what is missing.
    let early = service_mirror(&link_args(&kubeconfig, &ns, sa));
    assert!(!early.ok, "link without a token must fail");
    assert_eq!(early.code, Some(1));
    assert!(
        early.stdout.is_empty(),
        "nothing printed on stdout: {}",
        early.stdout
    );
    assert!(
        early
            .stderr
            .contains(&format!("Secret {ns}/{sa}-token has no token yet")),
        "{}",
        early.stderr
    );
    assert!(
        early.stderr.contains("token controller"),
        "{}",
        early.stderr
    );

    cluster
        .fill_token_secret(&ns, &format!("{sa}-token"))
        .await
        .unwrap();
    let token = Api::<Secret>::namespaced(admin.clone(), &ns)
        .get(&format!("{sa}-token"))
        .await
        .unwrap()
        .data
        .unwrap()["token"]
        .0
        .clone();
    let token = String::from_utf8(token).unwrap();

    let run = service_mirror(&link_args(&kubeconfig, &ns, sa));
    assert!(run.ok, "link failed: {}", run.stderr);
    assert!(
        !run.stderr.contains(&token),
        "the token never reaches the logs"
    );
    let secret = parse_yaml_secret(&run.stdout);
    assert_eq!(
        secret.metadata.name.as_deref(),
        Some("cluster-credentials-east")
    );
    assert_eq!(
        secret.metadata.namespace.as_deref(),
        Some("linkerd-multicluster")
    );
    assert_eq!(
        secret.type_.as_deref(),
        Some("mirror.linkerd.io/remote-kubeconfig")
    );
    let annotations = secret.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["mirror.linkerd.io/cluster-name"], "east");
    assert_eq!(
        annotations["mirror.linkerd.io/remote-cluster-domain"],
        "cluster.local"
    );

    let yaml = kubeconfig_in(&secret);
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    assert_eq!(kc.current_context.as_deref(), Some("east"));
    let server = kc.clusters[0].cluster.as_ref().unwrap().server.clone();
    assert_eq!(server, Some(cluster.server_url()));
    let user = serde_json::to_value(kc.auth_infos[0].auth_info.as_ref().unwrap()).unwrap();
    assert_eq!(user["token"], token.as_str());

    // The link's credentials may read Services everywhere, and nothing else.
    let linked = client_from_yaml(&yaml).await.expect("client from the link");
    Api::<Service>::all(linked.clone())
        .list(&ListParams::default())
        .await
        .expect("the link may list services in all namespaces");
    let svc = Service {
        metadata: ObjectMeta {
            name: Some("intruder".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(
        forbidden(
            Api::<Service>::namespaced(linked.clone(), &ns)
                .create(&PostParams::default(), &svc)
                .await
        ),
        "the link must not create services"
    );
    assert!(
        forbidden(
            Api::<Secret>::namespaced(linked.clone(), &ns)
                .list(&ListParams::default())
                .await
        ),
        "the link must not list secrets"
    );
    assert!(
        forbidden(
            Api::<Secret>::all(linked.clone())
                .list(&ListParams::default())
                .await
        ),
        "the link must not list secrets anywhere"
    );
}

#[tokio::test]
async fn link_options_shape_the_secret() {
    let cluster = remote().await;
    let kubeconfig = admin_path(&cluster);
    let ns = unique_namespace("cli-opts");
    let sa = "linkerd-service-mirror-remote-access-default";
    allow(&cluster, &ns, sa).await;
    cluster
        .fill_token_secret(&ns, &format!("{sa}-token"))
        .await
        .unwrap();

    let mut args = vec![
        "link",
        "--cluster-name",
        "west-2",
        "--kubeconfig",
        &kubeconfig,
    ];
    args.extend([
        "--namespace",
        &ns,
        "--api-server-address",
        "https://remote.example:6443",
        "--cluster-domain",
        "remote.example",
        "--link-namespace",
        "mirrors",
        "-o",
        "json",
    ]);
    let run = service_mirror(&args);
    assert!(run.ok, "link failed: {}", run.stderr);
    let secret: Secret = serde_json::from_str(&run.stdout).expect("link -o json prints a Secret");
    assert_eq!(
        secret.metadata.name.as_deref(),
        Some("cluster-credentials-west-2")
    );
    assert_eq!(secret.metadata.namespace.as_deref(), Some("mirrors"));
    let annotations = secret.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["mirror.linkerd.io/cluster-name"], "west-2");
    assert_eq!(
        annotations["mirror.linkerd.io/remote-cluster-domain"],
        "remote.example"
    );
    let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig_in(&secret)).unwrap();
    assert_eq!(kc.current_context.as_deref(), Some("west-2"));
    let c = kc.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(c.server.as_deref(), Some("https://remote.example:6443"));
    let ca = base64::engine::general_purpose::STANDARD
        .decode(c.certificate_authority_data.as_deref().unwrap())
        .unwrap();
    assert_eq!(ca, cluster.ca_pem().as_bytes());
}

#[tokio::test]
async fn link_errors_are_clear() {
    let cluster = remote().await;
    let kubeconfig = admin_path(&cluster);
    let ns = unique_namespace("cli-missing");

    // Nothing applied: the token Secret does not exist.
    let run = service_mirror(&link_args(&kubeconfig, &ns, "nobody"));
    assert!(!run.ok);
    assert!(
        run.stderr.contains(&format!(
            "ServiceAccount token Secret {ns}/nobody-token not found"
        )),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("service-mirror allow"),
        "{}",
        run.stderr
    );

    // An invalid cluster name is refused before anything is read.
    let run = service_mirror(&[
        "link",
        "--cluster-name",
        "East_1",
        "--kubeconfig",
        &kubeconfig,
    ]);
    assert!(!run.ok);
    assert_eq!(run.code, Some(2), "a usage error");
    assert!(run.stderr.contains("invalid character"), "{}", run.stderr);
}

async fn create_service(client: &kube::Client, ns: &str, name: &str) -> Api<Service> {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let services = Api::<Service>::namespaced(client.clone(), ns);
    services
        .create(
            &PostParams::default(),
            &Service {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    annotations: Some(BTreeMap::from([(
                        "keep.example/me".to_string(),
                        "yes".to_string(),
                    )])),
                    ..Default::default()
                },
                spec: Some(ServiceSpec {
                    ports: Some(vec![ServicePort {
                        port: 80,
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    services
}

async fn annotations(services: &Api<Service>, name: &str) -> BTreeMap<String, String> {
    services
        .get(name)
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default()
}

#[tokio::test]
async fn export_and_unexport_toggle_the_gateway_annotations() {
    let cluster = remote().await;
    let admin = cluster.client().await.unwrap();
    let kubeconfig = admin_path(&cluster);
    let ns = unique_namespace("cli-export");
    let services = create_service(&admin, &ns, "web").await;

    let run = service_mirror(&["export", "web", "-n", &ns, "--kubeconfig", &kubeconfig]);
    assert!(run.ok, "export failed: {}", run.stderr);
    assert_eq!(
        run.stdout.trim(),
        format!("service {ns}/web exported through gateway linkerd-multicluster/linkerd-gateway")
    );
    let a = annotations(&services, "web").await;
    assert_eq!(a[GATEWAY_NAME], "linkerd-gateway");
    assert_eq!(a[GATEWAY_NS], "linkerd-multicluster");
    assert_eq!(a["keep.example/me"], "yes");

    let run = service_mirror(&[
        "export",
        "web",
        "--namespace",
        &ns,
        "--gateway-name",
        "gw",
        "--gateway-namespace",
        "gw-ns",
        "--kubeconfig",
        &kubeconfig,
    ]);
    assert!(run.ok, "export failed: {}", run.stderr);
    let a = annotations(&services, "web").await;
    assert_eq!(a[GATEWAY_NAME], "gw");
    assert_eq!(a[GATEWAY_NS], "gw-ns");

    let run = service_mirror(&["unexport", "web", "-n", &ns, "--kubeconfig", &kubeconfig]);
    assert!(run.ok, "unexport failed: {}", run.stderr);
    assert_eq!(run.stdout.trim(), format!("service {ns}/web unexported"));
    let a = annotations(&services, "web").await;
    assert!(!a.contains_key(GATEWAY_NAME), "{a:?}");
    assert!(!a.contains_key(GATEWAY_NS), "{a:?}");
    assert_eq!(a["keep.example/me"], "yes", "other annotations untouched");

    // Unexporting twice is harmless.
    let run = service_mirror(&["unexport", "web", "-n", &ns, "--kubeconfig", &kubeconfig]);
    assert!(run.ok, "second unexport failed: {}", run.stderr);
}

#[tokio::test]
async fn export_of_a_missing_service_fails_clearly() {
    let cluster = remote().await;
    let kubeconfig = admin_path(&cluster);
    let ns = unique_namespace("cli-nosvc");
    for command in ["export", "unexport"] {
        let run = service_mirror(&[command, "ghost", "-n", &ns, "--kubeconfig", &kubeconfig]);
        assert!(!run.ok, "{command} of a missing service must fail");
        assert_eq!(run.code, Some(1));
        assert!(
            run.stderr
                .contains(&format!("service {ns}/ghost not found")),
            "{command}: {}",
            run.stderr
        );
    }
}

#[test]
fn allow_prints_yaml_and_json() {
    let yaml = service_mirror(&["allow"]);
    assert!(yaml.ok, "{}", yaml.stderr);
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml.stdout).unwrap();
    assert_eq!(docs.len(), 5);
    assert_eq!(docs[0]["metadata"]["name"], "linkerd-multicluster");
    assert_eq!(
        docs[1]["metadata"]["name"],
        "linkerd-service-mirror-remote-access-default"
    );

    let json = service_mirror(&["allow", "-o", "json"]);
    assert!(json.ok, "{}", json.stderr);
    let list: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"], serde_json::Value::Array(docs));
}

/// The image built without a registry (`scripts/build-images.sh`) is the Dockerfile's
/// image: the same entrypoint, user 65532, ports and binary path, a binary built with the
/// Dockerfile's cargo arguments, and that binary reports no default features.
#[test]
fn local_release_image_agrees_with_the_dockerfile() {
    let dir = match images::images_dir() {
        Ok(dir) => dir,
        Err(e) => return images::skip(&format!("scripts/build-images.sh cannot run: {e}")),
    };
    let dockerfile = std::fs::read_to_string(images::workspace_root().join("Dockerfile")).unwrap();
    let want = images::parse_dockerfile(&dockerfile);
    let image = images::unpack(&dir.join("service-mirror.tar"));
    assert_eq!(image.repo_tags, [images::SERVICE_MIRROR_TAG]);
    let config = &image.config["config"];

    assert_eq!(config["Entrypoint"], serde_json::json!(want.entrypoint));
    assert_eq!(want.entrypoint, std::slice::from_ref(&want.binary_path));
    assert_eq!(config["User"], want.user.as_str());
    assert_eq!(
        want.user.split(':').next(),
        Some("65532"),
        "runs as nonroot"
    );
    let exposed: std::collections::BTreeSet<String> = config["ExposedPorts"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(exposed, want.exposed);
    let passwd = std::fs::read_to_string(image.rootfs.join("etc/passwd")).unwrap();
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with("nonroot:x:65532:65532:")),
        "{passwd}"
    );

    // Built as the Dockerfile builds it: the same cargo arguments (recorded in the image),
    // no default features (the binary says so itself).
    assert!(
        want.cargo_args.iter().any(|a| a == "--no-default-features")
            && !want.cargo_args.iter().any(|a| a.starts_with("--features")),
        "{:?}",
        want.cargo_args
    );
    assert_eq!(
        config["Labels"]["dev.service-mirror.build"],
        format!("cargo {}", want.cargo_args.join(" "))
    );
    let binary = image.rootfs.join(want.binary_path.trim_start_matches('/'));
    let version = images::run(std::process::Command::new(&binary).arg("--version"))
        .expect("the image's binary runs on the build host");
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(version.contains("(features: none)"), "{version}");
    assert_eq!(
        config["Labels"]["dev.service-mirror.version"],
        version.trim()
    );
}

/// An image that cannot start is caught here, not by a user: the controller starts in a
/// chroot of its layer as 65532 (every library it needs is in the image), each shipped
/// library is needed (removing it makes the same check fail), the busybox image runs its
/// shell and the pause image stops cleanly on SIGTERM as 65535.
#[test]
fn local_images_start_from_their_layer_alone() {
    let dir = match images::images_dir() {
        Ok(dir) => dir,
        Err(e) => return images::skip(&format!("scripts/build-images.sh cannot run: {e}")),
    };
    if unsafe { libc::geteuid() } != 0 {
        return images::skip("needs root to chroot into the image layers");
    }
    let image = images::unpack(&dir.join("service-mirror.tar"));
    let entrypoint: Vec<String> =
        serde_json::from_value(image.config["config"]["Entrypoint"].clone()).unwrap();
    let user = image.config["config"]["User"].as_str().unwrap().to_string();
    let argv = [entrypoint[0].as_str(), "--version"];
    let version = images::start_in(&image.rootfs, &user, &argv).expect("the controller starts");
    assert!(version.contains("(features: none)"), "{version}");

    let libraries = images::shipped_libraries(&image.rootfs);
    assert!(libraries.len() >= 3, "glibc at least: {libraries:?}");
    for library in libraries {
        let aside = library.with_extension("aside");
        std::fs::rename(&library, &aside).unwrap();
        let err = images::start_in(&image.rootfs, &user, &argv)
            .expect_err("a missing library must stop the controller from starting");
        let name = library.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            err.contains(&name) || name.starts_with("ld-linux"),
            "{name}: {err}"
        );
        std::fs::rename(&aside, &library).unwrap();
    }
    images::start_in(&image.rootfs, &user, &argv).expect("starts again with all libraries");

    let busybox = images::unpack(&dir.join("busybox.tar"));
    let out = images::start_in(
        &busybox.rootfs,
        "65534:65534",
        &["sh", "-c", "cat /www/index.html"],
    )
    .expect("busybox runs its shell");
    assert!(!out.is_empty());

    let pause = images::unpack(&dir.join("pause.tar"));
    let pause_user = pause.config["config"]["User"].as_str().unwrap();
    let mut child = std::process::Command::new("chroot")
        .arg(format!("--userspec={pause_user}"))
        .arg(&pause.rootfs)
        .arg("/pause")
        .spawn()
        .unwrap();
    // chroot execs /pause; signal it once its SIGTERM handler is in place (SigCgt bit 15).
    let status = format!("/proc/{}/status", child.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_to_string(&status).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m & (1 << (libc::SIGTERM - 1)) != 0)
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "pause never handled SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success(), "pause exits 0 on SIGTERM");
}

/// Two builds from the same inputs give the same bytes: every archive and the pause binary
/// (so a node never re-imports an unchanged image under a new digest).
#[test]
fn local_image_archives_are_reproducible() {
    let dir = match images::images_dir() {
        Ok(dir) => dir,
        Err(e) => return images::skip(&format!("scripts/build-images.sh cannot run: {e}")),
    };
    // The same binary as the one packaged, so no cargo build runs here.
    let image = images::unpack(&dir.join("service-mirror.tar"));
    let entrypoint = image.config["config"]["Entrypoint"][0].as_str().unwrap();
    let binary = image.rootfs.join(entrypoint.trim_start_matches('/'));
    let builds: Vec<std::path::PathBuf> = (0..2)
        .map(|_| {
            let cache = tempfile::tempdir().unwrap().keep();
            let out = images::run(
                std::process::Command::new("bash")
                    .arg("scripts/build-images.sh")
                    .current_dir(images::workspace_root())
                    .env_remove("SERVICE_MIRROR_IMAGES_DIR")
                    .env("SERVICE_MIRROR_CACHE", &cache)
                    .env("SERVICE_MIRROR_IMAGE_BINARY", &binary),
            )
            .expect("build-images.sh");
            std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        })
        .collect();
    for file in ["service-mirror.tar", "pause.tar", "busybox.tar", "pause"] {
        let first = std::fs::read(builds[0].join(file)).unwrap();
        assert!(
            first == std::fs::read(builds[1].join(file)).unwrap(),
            "{file} differs between two builds"
        );
        assert!(
            first == std::fs::read(dir.join(file)).unwrap(),
            "{file} differs from {}",
            dir.display()
        );
    }
    for build in builds {
        // <cache>/images/<key>: remove the whole cache.
        std::fs::remove_dir_all(build.parent().unwrap().parent().unwrap()).unwrap();
    }
}
