//! Locating (and building when absent) the etcd and kube-apiserver binaries, and those of
//! the data plane.

use crate::{Error, Result};
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Paths of the two control-plane programs.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The etcd server.
    pub etcd: PathBuf,
    /// The kube-apiserver.
    pub kube_apiserver: PathBuf,
}

impl Binaries {
    fn in_dir(dir: &Path) -> Option<Self> {
        let b = Self {
            etcd: dir.join("etcd"),
            kube_apiserver: dir.join("kube-apiserver"),
        };
        (b.etcd.is_file() && b.kube_apiserver.is_file()).then_some(b)
    }
}

/// The project's build script, found relative to this crate's sources.
fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/build-control-plane.sh")
}

static ENSURED: Mutex<Option<Binaries>> = Mutex::new(None);

/// Returns the control-plane binaries, building them with the project's script when they
/// are not cached yet (progress goes to stderr). `SERVICE_MIRROR_CONTROL_PLANE_DIR`
/// overrides the location.
pub fn ensure_binaries() -> Result<Binaries> {
    ensure(
        &ENSURED,
        "SERVICE_MIRROR_CONTROL_PLANE_DIR",
        None,
        "etcd or kube-apiserver",
        Binaries::in_dir,
    )
}

/// The binaries in `slot`, else in the directory `$env` names, else in the directory
/// the build script (with `mode`) prints after building what is missing. `what` names
/// the binaries in errors.
fn ensure<B: Clone>(
    slot: &Mutex<Option<B>>,
    env: &str,
    mode: Option<&str>,
    what: &str,
    in_dir: fn(&Path) -> Option<B>,
) -> Result<B> {
    let mut ensured = slot.lock();
    if let Some(b) = ensured.as_ref() {
        return Ok(b.clone());
    }
    if let Some(dir) = std::env::var_os(env) {
        let dir = PathBuf::from(dir);
        let b = in_dir(&dir)
            .ok_or_else(|| Error::Binaries(format!("{env}={} lacks {what}", dir.display())))?;
        *ensured = Some(b.clone());
        return Ok(b);
    }
    let script = build_script();
    if !script.is_file() {
        return Err(Error::Binaries(format!(
            "build script {} not found; set {env}",
            script.display()
        )));
    }
    let run = format!("{} {}", script.display(), mode.unwrap_or_default());
    let out = Command::new("bash")
        .arg(&script)
        .args(mode)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Error::Binaries(format!("running {run}: {e}")))?;
    if !out.status.success() {
        return Err(Error::Binaries(format!(
            "{run} failed ({}); run it by hand to see why",
            out.status
        )));
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let b = in_dir(Path::new(&dir))
        .ok_or_else(|| Error::Binaries(format!("script printed {dir}, which lacks {what}")))?;
    *ensured = Some(b.clone());
    Ok(b)
}

/// Paths of the data-plane programs (`scripts/build-control-plane.sh --data-plane`).
#[derive(Debug, Clone)]
pub struct DataPlaneBinaries {
    /// kube-controller-manager (same k8s.io/kubernetes version as the apiserver).
    pub kube_controller_manager: PathBuf,
    /// kube-proxy (same version).
    pub kube_proxy: PathBuf,
    /// CoreDNS with the plugins of control-plane/coredns/main.go.
    pub coredns: PathBuf,
}

impl DataPlaneBinaries {
    fn in_dir(dir: &Path) -> Option<Self> {
        let b = Self {
            kube_controller_manager: dir.join("kube-controller-manager"),
            kube_proxy: dir.join("kube-proxy"),
            coredns: dir.join("coredns"),
        };
        [&b.kube_controller_manager, &b.kube_proxy, &b.coredns]
            .iter()
            .all(|p| p.is_file())
            .then_some(b)
    }
}

static ENSURED_DATA_PLANE: Mutex<Option<DataPlaneBinaries>> = Mutex::new(None);

/// Returns the data-plane binaries, building them with `build-control-plane.sh
/// --data-plane` when they are not cached yet (progress goes to stderr; a few minutes the
/// first time). `SERVICE_MIRROR_DATA_PLANE_DIR` overrides the location.
pub fn ensure_data_plane_binaries() -> Result<DataPlaneBinaries> {
    ensure(
        &ENSURED_DATA_PLANE,
        "SERVICE_MIRROR_DATA_PLANE_DIR",
        Some("--data-plane"),
        "kube-controller-manager, kube-proxy or coredns",
        DataPlaneBinaries::in_dir,
    )
}

/// The data-plane binaries if they are already there (in `SERVICE_MIRROR_DATA_PLANE_DIR`,
/// or cached by `build-control-plane.sh --data-plane`); never builds. For callers that
/// do without a data plane rather than wait minutes for a build (the demo).
pub fn built_data_plane_binaries() -> Option<DataPlaneBinaries> {
    if let Some(b) = ENSURED_DATA_PLANE.lock().as_ref() {
        return Some(b.clone());
    }
    if let Some(dir) = std::env::var_os("SERVICE_MIRROR_DATA_PLANE_DIR") {
        return DataPlaneBinaries::in_dir(Path::new(&dir));
    }
    let out = Command::new("bash")
        .arg(build_script())
        .args(["--data-plane", "--print"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    DataPlaneBinaries::in_dir(Path::new(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Paths of the real-node programs (`scripts/build-control-plane.sh --node`).
#[derive(Debug, Clone)]
pub struct NodeBinaries {
    /// kubelet (same k8s.io/kubernetes version as the apiserver).
    pub kubelet: PathBuf,
    /// kube-scheduler (same version).
    pub kube_scheduler: PathBuf,
    /// helm (control-plane/helm's version), for the chart's tests.
    pub helm: PathBuf,
}

impl NodeBinaries {
    fn in_dir(dir: &Path) -> Option<Self> {
        let b = Self {
            kubelet: dir.join("kubelet"),
            kube_scheduler: dir.join("kube-scheduler"),
            helm: dir.join("helm"),
        };
        [&b.kubelet, &b.kube_scheduler, &b.helm]
            .iter()
            .all(|p| p.is_file())
            .then_some(b)
    }
}

static ENSURED_NODE: Mutex<Option<NodeBinaries>> = Mutex::new(None);

/// Returns the real-node binaries, building them with `build-control-plane.sh --node`
/// when they are not cached yet (which as root also installs containerd, runc, the CNI
/// plugins and busybox-static). `SERVICE_MIRROR_NODE_DIR` overrides the location.
pub fn ensure_node_binaries() -> Result<NodeBinaries> {
    ensure(
        &ENSURED_NODE,
        "SERVICE_MIRROR_NODE_DIR",
        Some("--node"),
        "kubelet, kube-scheduler or helm",
        NodeBinaries::in_dir,
    )
}

/// The real-node binaries if they are already there; never builds (the demo).
pub fn built_node_binaries() -> Option<NodeBinaries> {
    if let Some(b) = ENSURED_NODE.lock().as_ref() {
        return Some(b.clone());
    }
    if let Some(dir) = std::env::var_os("SERVICE_MIRROR_NODE_DIR") {
        return NodeBinaries::in_dir(Path::new(&dir));
    }
    let out = Command::new("bash")
        .arg(build_script())
        .args(["--node", "--print"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    NodeBinaries::in_dir(Path::new(String::from_utf8_lossy(&out.stdout).trim()))
}

static ENSURED_IMAGES: Mutex<Option<PathBuf>> = Mutex::new(None);

/// The directory of the images every node imports (`scripts/build-images.sh`: the
/// controller, pause, busybox as docker archives, and the static `pause` binary), built
/// by that script when missing or stale. `SERVICE_MIRROR_IMAGES_DIR` overrides it.
pub fn ensure_images() -> Result<PathBuf> {
    let mut ensured = ENSURED_IMAGES.lock();
    if let Some(dir) = ensured.as_ref() {
        return Ok(dir.clone());
    }
    let valid = |dir: &Path| dir.join("pause").is_file() && dir.join("pause.tar").is_file();
    if let Some(dir) = std::env::var_os("SERVICE_MIRROR_IMAGES_DIR") {
        let dir = PathBuf::from(dir);
        if !valid(&dir) {
            return Err(Error::Binaries(format!(
                "SERVICE_MIRROR_IMAGES_DIR={} lacks pause or pause.tar",
                dir.display()
            )));
        }
        *ensured = Some(dir.clone());
        return Ok(dir);
    }
    let script = build_script().with_file_name("build-images.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Error::Binaries(format!("running {}: {e}", script.display())))?;
    if !out.status.success() {
        return Err(Error::Binaries(format!(
            "{} failed ({}); run it by hand to see why",
            script.display(),
            out.status
        )));
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !valid(&dir) {
        return Err(Error::Binaries(format!(
            "{} printed {}, which lacks pause or pause.tar",
            script.display(),
            dir.display()
        )));
    }
    *ensured = Some(dir.clone());
    Ok(dir)
}
