//! One cgroup root per node (kubelet's `cgroupRoot`), made in every hierarchy and removed
//! with the node; roots of processes that died without removing theirs (SIGKILL) are
//! swept when the next node starts. Nodes never share a cgroup, and the host's are never
//! touched.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Prefix of every root this crate makes: `/service-mirror-<pid>-<node>`.
const PREFIX: &str = "service-mirror-";

/// The mount points of every cgroup hierarchy (v1 controllers and the unified v2 one),
/// from /proc/self/mountinfo.
fn hierarchies() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fstype = after.split_whitespace().next()?;
            (fstype == "cgroup" || fstype == "cgroup2")
                .then(|| before.split_whitespace().nth(4).map(PathBuf::from))
                .flatten()
        })
        .collect()
}

/// The cgroup root of node `node` of this process: `/service-mirror-<pid>-<node>`.
pub(crate) fn root_name(node: &str) -> String {
    format!("/{PREFIX}{}-{node}", std::process::id())
}

/// Makes `root` in every hierarchy. kubelet refuses a root that does not exist; a new v1
/// cpuset is empty, so it gets its parent's CPUs and memory nodes.
pub(crate) fn create(root: &str) -> std::io::Result<()> {
    sweep();
    for h in hierarchies() {
        let dir = h.join(root.trim_start_matches('/'));
        std::fs::create_dir_all(&dir)?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(h.join(file)) {
                std::fs::write(dir.join(file), value.trim())?;
            }
        }
    }
    Ok(())
}

/// Removes `root` and everything below it in every hierarchy, deepest first, retrying
/// for up to `wait` while the processes in it are still dying.
pub(crate) fn remove(root: &str, wait: Duration) {
    let deadline = Instant::now() + wait;
    loop {
        let mut left = false;
        for h in hierarchies() {
            let dir = h.join(root.trim_start_matches('/'));
            if dir.exists() && !remove_tree(&dir) {
                left = true;
            }
        }
        if !left || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// rmdir of `dir`'s sub-cgroups, deepest first, then of `dir`; whether it is gone.
fn remove_tree(dir: &Path) -> bool {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    std::fs::remove_dir(dir).is_ok() || !dir.exists()
}

/// Removes the roots of processes that no longer run (done by every node start; a
/// SIGKILLed owner cannot remove its own).
pub fn sweep() {
    for h in hierarchies() {
        let Ok(entries) = std::fs::read_dir(&h) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix(PREFIX))
                .and_then(|rest| rest.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                remove_tree(&e.path());
            }
        }
    }
}

/// The roots of this crate present in any hierarchy (for tests of the teardown).
pub fn leftover_cgroups() -> Vec<PathBuf> {
    hierarchies()
        .into_iter()
        .flat_map(|h| std::fs::read_dir(h).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(PREFIX))
        .map(|e| e.path())
        .collect()
}
