//! How the story runs here: on real nodes (the controller as a Pod, requests from a
//! client Pod), with traffic from a data-plane node (the controller in this process), or
//! without traffic. Whatever cannot run is said in one `skipped:` line that names the one
//! command building what is missing, so a first-time user never needs the test suite.

/// How the story runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Real nodes: the controller as a Pod installed from `install`'s output, workloads,
    /// gateways and the client as Pods (crates/demo/src/nodes.rs).
    Nodes,
    /// Data planes: the controller in this process, requests from west's node namespace.
    Traffic,
    /// No traffic: gateways at documentation addresses, probes answered on 127.0.0.N.
    Story,
}

/// What [`decide`] depends on, gathered by [`Host::here`].
#[derive(Debug, Clone)]
pub struct Host {
    /// `CI=true`: whatever cannot run is an error, and missing builds are built.
    pub ci: bool,
    /// `--no-traffic`.
    pub no_traffic: bool,
    /// `--no-nodes`.
    pub no_nodes: bool,
    /// [`local_cluster::data_plane_support`]: root with the network tools.
    pub network: Result<(), String>,
    /// [`local_cluster::node_support`]: the node's packages too.
    pub nodes: Result<(), String>,
    /// The data-plane binaries (kube-controller-manager, kube-proxy, CoreDNS) are built.
    pub data_plane_built: bool,
    /// The node binaries (kubelet, kube-scheduler) are built.
    pub node_built: bool,
    /// The images of `scripts/build-images.sh` are there.
    pub images_built: bool,
}

/// The decision: the mode and at most one `skipped:` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// How the story runs.
    pub mode: Mode,
    /// The one line saying what did not run, why, and what builds it.
    pub skipped: Option<String>,
}

/// The one command that builds what `h` lacks (empty when nothing is missing). Each
/// part is idempotent and cached: the data plane and the node are Go builds of minutes
/// the first time; `--node` also installs the node's Debian packages as root.
pub fn build_command(h: &Host) -> String {
    let mut parts = Vec::new();
    if !h.data_plane_built {
        parts.push("scripts/build-control-plane.sh --data-plane");
    }
    if !h.node_built || h.nodes.is_err() {
        parts.push("scripts/build-control-plane.sh --node");
    }
    if !h.images_built {
        parts.push("scripts/build-images.sh");
    }
    parts.join(" && ")
}

/// The mode for `h`. Under `CI=true` a demo that cannot send traffic fails, and so does
/// one that runs as root but cannot run real nodes (unless `--no-nodes`); there missing
/// builds are built by the cluster start.
pub fn decide(h: &Host) -> anyhow::Result<Decision> {
    let skip = |mode, line: String| Decision {
        mode,
        skipped: Some(line),
    };
    if h.no_traffic {
        return Ok(skip(
            Mode::Story,
            "skipped: real traffic through the mirrors: --no-traffic".into(),
        ));
    }
    if let Err(why) = &h.network {
        anyhow::ensure!(!h.ci, "CI=true: the demo's real traffic cannot run: {why}");
        let command = build_command(h);
        let build = if command.is_empty() {
            String::new()
        } else {
            format!("; as root, `{command}` builds what they need")
        };
        return Ok(skip(
            Mode::Story,
            format!(
                "skipped: real traffic through the mirrors and real nodes: no network namespaces here, {why}{build}"
            ),
        ));
    }
    if h.no_nodes {
        let mode = if h.ci || h.data_plane_built {
            Mode::Traffic
        } else {
            Mode::Story
        };
        return Ok(skip(mode, "skipped: real nodes: --no-nodes".into()));
    }
    if let Err(why) = &h.nodes {
        anyhow::ensure!(!h.ci, "CI=true: the demo cannot run on real nodes: {why}");
    }
    if h.ci {
        return Ok(Decision {
            mode: Mode::Nodes,
            skipped: None,
        });
    }
    let command = build_command(h);
    if command.is_empty() {
        return Ok(Decision {
            mode: Mode::Nodes,
            skipped: None,
        });
    }
    let (mode, what) = if h.data_plane_built {
        (Mode::Traffic, "the controller as a Pod on real nodes")
    } else {
        (
            Mode::Story,
            "real traffic through the mirrors and the controller as a Pod on real nodes",
        )
    };
    let why = match &h.nodes {
        Err(why) => why.clone(),
        Ok(()) => "not built yet".into(),
    };
    Ok(skip(
        mode,
        format!("skipped: {what}: {why}; `{command}` builds what it needs (once, minutes)"),
    ))
}

impl Host {
    /// This process and machine.
    pub fn here(no_traffic: bool, no_nodes: bool) -> Self {
        Self {
            ci: std::env::var("CI").as_deref() == Ok("true"),
            no_traffic,
            no_nodes,
            network: local_cluster::data_plane_support(),
            nodes: local_cluster::node_support(),
            data_plane_built: local_cluster::built_data_plane_binaries().is_some(),
            node_built: local_cluster::built_node_binaries().is_some(),
            images_built: images_built(),
        }
    }
}

/// Whether `scripts/build-images.sh --print` names a directory holding every image (it
/// checks `SERVICE_MIRROR_IMAGES_DIR` itself when set). Builds nothing; a stale image is
/// rebuilt by the cluster start (`local_cluster::ensure_images`).
fn images_built() -> bool {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/build-images.sh");
    let Ok(out) = std::process::Command::new("bash")
        .args([script, "--print"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return false;
    };
    let dir = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    out.status.success()
        && ["service-mirror.tar", "pause.tar", "busybox.tar", "pause"]
            .iter()
            .all(|f| dir.join(f).is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready() -> Host {
        Host {
            ci: false,
            no_traffic: false,
            no_nodes: false,
            network: Ok(()),
            nodes: Ok(()),
            data_plane_built: true,
            node_built: true,
            images_built: true,
        }
    }

    fn mode(h: &Host) -> (Mode, Option<String>) {
        let d = decide(h).unwrap();
        (d.mode, d.skipped)
    }

    #[test]
    fn nodes_run_where_everything_is_there_and_ci_insists_as_root() {
        assert_eq!(mode(&ready()), (Mode::Nodes, None));
        // Under CI missing builds are built by the cluster start.
        let ci = Host {
            ci: true,
            data_plane_built: false,
            node_built: false,
            images_built: false,
            ..ready()
        };
        assert_eq!(mode(&ci), (Mode::Nodes, None));
        // Root without the node's packages: an error under CI, a skip line outside.
        let no_pkg = Host {
            nodes: Err("/usr/bin/containerd is missing".into()),
            ..ready()
        };
        assert!(
            decide(&Host {
                ci: true,
                ..no_pkg.clone()
            })
            .is_err()
        );
        let (m, line) = mode(&no_pkg);
        assert_eq!(m, Mode::Traffic);
        let line = line.unwrap();
        assert!(line.contains("containerd is missing"), "{line}");
        assert!(
            line.contains("`scripts/build-control-plane.sh --node`"),
            "{line}"
        );
    }

    #[test]
    fn what_is_missing_is_named_by_one_command_in_one_line() {
        for (h, m, command) in [
            (
                Host {
                    images_built: false,
                    ..ready()
                },
                Mode::Traffic,
                "`scripts/build-images.sh`",
            ),
            (
                Host {
                    node_built: false,
                    images_built: false,
                    ..ready()
                },
                Mode::Traffic,
                "`scripts/build-control-plane.sh --node && scripts/build-images.sh`",
            ),
            (
                Host {
                    data_plane_built: false,
                    node_built: false,
                    images_built: false,
                    ..ready()
                },
                Mode::Story,
                "`scripts/build-control-plane.sh --data-plane && scripts/build-control-plane.sh --node && scripts/build-images.sh`",
            ),
        ] {
            let (got, line) = mode(&h);
            assert_eq!(got, m);
            let line = line.unwrap();
            assert!(
                line.starts_with("skipped: ") && !line.contains('\n'),
                "{line}"
            );
            assert!(line.contains(command), "{line} lacks {command}");
        }
    }

    #[test]
    fn flags_win_and_without_root_ci_fails() {
        for ci in [false, true] {
            let h = Host {
                ci,
                no_traffic: true,
                network: Err("not root".into()),
                ..ready()
            };
            assert_eq!(
                mode(&h),
                (
                    Mode::Story,
                    Some("skipped: real traffic through the mirrors: --no-traffic".into())
                )
            );
            let h = Host {
                ci,
                no_nodes: true,
                ..ready()
            };
            assert_eq!(
                mode(&h),
                (
                    Mode::Traffic,
                    Some("skipped: real nodes: --no-nodes".into())
                )
            );
        }
        let no_root = Host {
            network: Err("not root".into()),
            ..ready()
        };
        assert!(
            decide(&Host {
                ci: true,
                ..no_root.clone()
            })
            .is_err()
        );
        let (m, line) = mode(&no_root);
        assert_eq!(m, Mode::Story);
        assert!(line.unwrap().contains("not root"));
    }
}
