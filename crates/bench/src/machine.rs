//! The machine and the source a report was measured on, and a free port.

use super::*;

pub(super) fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(super) fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu_model = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mem_gib = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map(|kib| kib / 1024.0 / 1024.0)
        .unwrap_or(f64::NAN);
    let control_plane = local_cluster::ensure_binaries()
        .ok()
        .and_then(|b| {
            b.kube_apiserver
                .parent()
                .and_then(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    serde_json::json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": cpu_model,
        "memory_gib": (mem_gib * 10.0).round() / 10.0,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "control_plane": control_plane,
        "load_average": read("/proc/loadavg").split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    })
}

pub(super) fn git_describe() -> serde_json::Value {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(workspace_dir())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    serde_json::json!({
        "commit": run(&["rev-parse", "HEAD"]),
        "dirty": run(&["status", "--porcelain"]).map(|s| !s.is_empty()),
    })
}
