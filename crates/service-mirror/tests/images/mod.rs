//! The registry-less images of `scripts/build-images.sh`, checked from the outside: the
//! docker-archives are read with `tar` and serde_json, the Dockerfile is parsed here, and
//! the binaries are started in a chroot of the unpacked layer. Nothing of the script is
//! reused (a checker never reuses the code it checks).

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub(crate) const SERVICE_MIRROR_TAG: &str = "service-mirror.local/service-mirror:dev";

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Outside CI a test that cannot run prints one `skipped:` line; under CI=true it fails.
pub(crate) fn skip(reason: &str) {
    assert!(!in_ci(), "CI=true and {reason}");
    eprintln!("skipped: {reason}");
}

/// The directory `bash scripts/build-images.sh` prints (built once per test binary), or
/// why it could not run.
pub(crate) fn images_dir() -> Result<PathBuf, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = run(Command::new("bash")
            .arg("scripts/build-images.sh")
            .current_dir(workspace_root()))?;
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    })
    .clone()
}

/// Runs `cmd`; Err holds its stderr when it fails.
pub(crate) fn run(cmd: &mut Command) -> Result<Output, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{cmd:?} exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// What the Dockerfile says about the released image.
#[derive(Debug)]
pub(crate) struct Dockerfile {
    pub(crate) entrypoint: Vec<String>,
    pub(crate) user: String,
    pub(crate) exposed: BTreeSet<String>,
    /// Where the final stage copies the binary (`COPY --from=<stage> <src> <dest>`).
    pub(crate) binary_path: String,
    /// The arguments of `cargo` in the build stage's `RUN cargo build …`.
    pub(crate) cargo_args: Vec<String>,
}

pub(crate) fn parse_dockerfile(text: &str) -> Dockerfile {
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let lines: Vec<&str> = joined.lines().map(str::trim).collect();
    let last_from = lines
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .expect("a FROM");
    let final_stage = &lines[last_from..];
    let last = |instruction: &str| {
        final_stage
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix(instruction))
            .map(str::trim)
            .unwrap_or_else(|| panic!("the final stage has no {instruction}"))
    };
    let entrypoint = serde_json::from_str(last("ENTRYPOINT ")).expect("ENTRYPOINT in exec form");
    let binary_path = final_stage
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("COPY --from="))
        .and_then(|rest| rest.split_whitespace().next_back())
        .map(String::from)
        .expect("the final stage copies the binary from the build stage");
    let exposed = last("EXPOSE ")
        .split_whitespace()
        .map(|p| {
            if p.contains('/') {
                p.to_string()
            } else {
                format!("{p}/tcp")
            }
        })
        .collect();
    let run = lines
        .iter()
        .find_map(|l| l.split_once("cargo build").map(|(_, rest)| rest))
        .expect("RUN cargo build");
    let cargo_args = std::iter::once("build")
        .chain(run.split("&&").next().unwrap().split_whitespace())
        .map(String::from)
        .collect();
    Dockerfile {
        entrypoint,
        user: last("USER ").to_string(),
        exposed,
        binary_path,
        cargo_args,
    }
}

/// A docker-archive unpacked: its manifest entry, config, and the layer's root
/// filesystem (unpacked by `tar` as root keeps owners and modes).
pub(crate) struct Image {
    pub(crate) repo_tags: Vec<String>,
    pub(crate) config: Value,
    pub(crate) rootfs: PathBuf,
    _dir: tempfile::TempDir,
}

pub(crate) fn unpack(archive: &Path) -> Image {
    let dir = tempfile::tempdir().unwrap();
    let outer = dir.path().join("archive");
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(&outer).unwrap();
    std::fs::create_dir_all(&rootfs).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&outer))
    .unwrap();
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(outer.join("manifest.json")).unwrap()).unwrap();
    let entry = &manifest.as_array().expect("manifest.json is a list")[0];
    let config: Value = serde_json::from_slice(
        &std::fs::read(outer.join(entry["Config"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    let layers = entry["Layers"].as_array().unwrap();
    let diff_ids = config["rootfs"]["diff_ids"].as_array().unwrap();
    assert_eq!(layers.len(), diff_ids.len(), "one diff_id per layer");
    for layer in layers {
        let layer = outer.join(layer.as_str().unwrap());
        run(Command::new("tar")
            .arg("-xf")
            .arg(&layer)
            .arg("-C")
            .arg(&rootfs))
        .unwrap();
    }
    Image {
        repo_tags: serde_json::from_value(entry["RepoTags"].clone()).unwrap(),
        config,
        rootfs,
        _dir: dir,
    }
}

/// Starts `argv` in a chroot of `rootfs` as `user` (uid:gid): what the image needs to
/// start is inside it, or this fails with the loader's message.
pub(crate) fn start_in(rootfs: &Path, user: &str, argv: &[&str]) -> Result<String, String> {
    let out = run(Command::new("chroot")
        .arg(format!("--userspec={user}"))
        .arg(rootfs)
        .args(argv))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The shared libraries shipped in an image (`*.so*` files anywhere).
pub(crate) fn shipped_libraries(rootfs: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                walk(&path, found);
            } else if kind.is_file() && entry.file_name().to_string_lossy().contains(".so") {
                found.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(rootfs, &mut found);
    found.sort();
    found
}
