//! Working directories of local clusters, and the sweep of those left by dead processes.

use std::path::PathBuf;

/// Root under which every cluster of every process gets its directory.
fn root() -> PathBuf {
    std::env::temp_dir().join("service-mirror-local")
}

/// Creates a fresh directory `<root>/<pid>-<name>-<random>` for one cluster, after
/// removing the directories of processes that no longer run (killed with -9, say).
pub(crate) fn create(name: &str) -> std::io::Result<tempfile::TempDir> {
    let root = root();
    std::fs::create_dir_all(&root)?;
    sweep(&root);
    tempfile::Builder::new()
        .prefix(&format!("{}-{name}-", std::process::id()))
        .tempdir_in(&root)
}

fn sweep(root: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !PathBuf::from(format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
