//! The controller under test as a child process, and what `/proc` says about a process:
//! CPU seconds (utime + stime) and memory (VmRSS, VmHWM).

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Clock ticks per second of `/proc/<pid>/stat` times (`getconf CLK_TCK`).
fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// CPU seconds (user + system) used so far by process `pid`.
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces: fields are counted after its closing ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is fields[0]; utime is field 14, stime field 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clk_tck())
}

/// A `Vm*` line of `/proc/<pid>/status` (`VmRSS`, `VmHWM`) in MiB.
pub(crate) fn memory_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
}

/// Which program runs the controller.
#[derive(Debug, Clone)]
pub(crate) enum ControllerBin {
    /// A `service-mirror` executable: `<path> run ...`.
    Path(PathBuf),
    /// This executable, which runs the same `service_mirror_controller::cli` as `service-mirror`
    /// when its first argument is [`SELF_CONTROLLER_ARG`].
    SelfExec,
}

/// First argument that turns this binary into `service-mirror` (see `main`).
pub(crate) const SELF_CONTROLLER_ARG: &str = "__service-mirror";

impl std::fmt::Display for ControllerBin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControllerBin::Path(p) => write!(f, "{}", p.display()),
            ControllerBin::SelfExec => write!(f, "<bench executable> {SELF_CONTROLLER_ARG}"),
        }
    }
}

/// Finds the `service-mirror` binary of the same profile as this one. Under cargo (the
/// `CARGO` variable is set) it is built first, so it is never stale; otherwise the
/// executable next to this one is used; failing both, this executable itself.
pub(crate) fn locate_controller(workspace: &Path) -> anyhow::Result<ControllerBin> {
    let release = !cfg!(debug_assertions);
    if let Ok(cargo) = std::env::var("CARGO") {
        eprintln!(
            "building the controller: cargo build{} -p service-mirror",
            if release { " --release" } else { "" }
        );
        let mut cmd = Command::new(cargo);
        cmd.current_dir(workspace)
            .args(["build", "-p", "service-mirror", "--bin", "service-mirror"])
            .args(["--message-format", "json-render-diagnostics"])
            .stderr(Stdio::inherit());
        if release {
            cmd.arg("--release");
        }
        let out = cmd.output().context("running cargo build")?;
        if !out.status.success() {
            bail!("cargo build -p service-mirror failed");
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if msg["reason"] == "compiler-artifact"
                && msg["target"]["name"] == "service-mirror"
                && let Some(exe) = msg["executable"].as_str()
            {
                return Ok(ControllerBin::Path(exe.into()));
            }
        }
        bail!("cargo build -p service-mirror named no executable");
    }
    let exe = std::env::current_exe()?;
    if let Some(sibling) = exe.parent().map(|d| d.join("service-mirror"))
        && sibling.is_file()
    {
        return Ok(ControllerBin::Path(sibling));
    }
    Ok(ControllerBin::SelfExec)
}

/// `line` without ANSI escape sequences (colours).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, then one final byte in @..~.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A running `service-mirror run`, or several replicas sharding the links (`--replicas`);
/// killed on drop.
pub(crate) struct Controller {
    child: Child,
    /// Its process id (the first replica's).
    pub(crate) pid: u32,
    /// Its log (stdout and stderr).
    pub(crate) log: PathBuf,
    /// The other replicas (`run --shard-links`), if any.
    others: Vec<Controller>,
    /// Replicas [`Controller::kill_replica`] killed: only their logs are read.
    killed: Vec<Controller>,
}

impl Controller {
    /// Starts `service-mirror run` against the local cluster of `kubeconfig`, reading
    /// link Secrets in `namespace`, without leader election, admin server on `admin`.
    pub(crate) fn spawn(
        bin: &ControllerBin,
        kubeconfig: &Path,
        namespace: &str,
        admin: &str,
        extra: &[String],
        log: &Path,
    ) -> anyhow::Result<Self> {
        Self::spawn_one(bin, kubeconfig, namespace, admin, extra, log, None)
    }

    /// As [`Controller::spawn`] with `replicas` replicas sharding the links (`run
    /// --shard-links`, leader election on, `POD_NAME` `bench-replica-<i>`); the first
    /// has the admin server on `admin`, the others on a free port; logs `<log>.<i>`.
    pub(crate) fn spawn_replicas(
        bin: &ControllerBin,
        kubeconfig: &Path,
        namespace: &str,
        admin: &str,
        extra: &[String],
        log: &Path,
        replicas: usize,
    ) -> anyhow::Result<Self> {
        if replicas <= 1 {
            return Self::spawn(bin, kubeconfig, namespace, admin, extra, log);
        }
        let named = |i: usize| {
            let mut p = log.as_os_str().to_owned();
            p.push(format!(".{i}"));
            PathBuf::from(p)
        };
        let mut first = Self::spawn_one(
            bin,
            kubeconfig,
            namespace,
            admin,
            extra,
            &named(0),
            Some("bench-replica-0"),
        )?;
        for i in 1..replicas {
            first.others.push(Self::spawn_one(
                bin,
                kubeconfig,
                namespace,
                "127.0.0.1:0",
                extra,
                &named(i),
                Some(&format!("bench-replica-{i}")),
            )?);
        }
        Ok(first)
    }

    /// Kills replica `i` (`bench-replica-<i>`, not the first) with SIGKILL, as a node
    /// lost would, and leaves it out of every later reading and check but its log's
    /// warnings. Once a run: the numbers are those the replicas started with.
    pub(crate) fn kill_replica(&mut self, i: usize) -> anyhow::Result<()> {
        anyhow::ensure!(self.killed.is_empty(), "a replica was killed already");
        anyhow::ensure!(
            (1..=self.others.len()).contains(&i),
            "no replica {i} to kill (the first cannot be)"
        );
        let mut gone = self.others.remove(i - 1);
        gone.child.kill()?;
        gone.child.wait()?;
        self.killed.push(gone);
        Ok(())
    }

    /// Every replica's process id.
    pub(crate) fn pids(&self) -> Vec<u32> {
        std::iter::once(self.pid)
            .chain(self.others.iter().map(|o| o.pid))
            .collect()
    }

    /// CPU seconds used so far by every replica.
    pub(crate) fn cpu(&self) -> f64 {
        self.pids()
            .into_iter()
            .map(|p| cpu_seconds(p).unwrap_or(f64::NAN))
            .sum()
    }

    /// A `Vm*` figure summed over the replicas, and the largest of one replica.
    pub(crate) fn memory_mib(&self, field: &str) -> (f64, f64) {
        let each: Vec<f64> = self
            .pids()
            .into_iter()
            .map(|p| memory_mib(p, field).unwrap_or(f64::NAN))
            .collect();
        (
            each.iter().sum(),
            each.iter().copied().fold(f64::NAN, f64::max),
        )
    }

    fn spawn_one(
        bin: &ControllerBin,
        kubeconfig: &Path,
        namespace: &str,
        admin: &str,
        extra: &[String],
        log: &Path,
        replica: Option<&str>,
    ) -> anyhow::Result<Self> {
        let mut cmd = match bin {
            ControllerBin::Path(p) => Command::new(p),
            ControllerBin::SelfExec => {
                let mut c = Command::new(std::env::current_exe()?);
                c.arg(SELF_CONTROLLER_ARG);
                c
            }
        };
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("SERVICE_MIRROR_") || k == "KUBECONFIG" || k == "RUST_LOG" {
                cmd.env_remove(&key);
            }
        }
        if let Some(name) = replica {
            cmd.env("POD_NAME", name);
        }
        let out = std::fs::File::create(log)?;
        cmd.arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", namespace])
            .args(match replica {
                None => &["--leader-election=false"][..],
                Some(_) => &["--leader-election=true", "--shard-links=true"][..],
            })
            .args(["--metrics-addr", admin])
            .args(extra)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child =
            local_cluster::spawn_tied(cmd, false).with_context(|| format!("starting {bin}"))?;
        Ok(Self {
            pid: child.id(),
            child,
            log: log.to_path_buf(),
            others: Vec::new(),
            killed: Vec::new(),
        })
    }

    /// Fails if a replica has exited (with the tail of its log).
    pub(crate) fn check_running(&mut self) -> anyhow::Result<()> {
        for o in &mut self.others {
            o.check_running()?;
        }
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "the controller exited ({status}); log tail:\n{}",
                self.log_tail(30)
            );
        }
        Ok(())
    }

    /// The last `n` lines of its log.
    pub(crate) fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Log lines at WARN or ERROR, every replica's.
    pub(crate) fn warnings(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(strip_ansi)
            .filter(|l| {
                let level = l.split_whitespace().nth(1);
                level == Some("WARN") || level == Some("ERROR")
            })
            .chain(
                self.others
                    .iter()
                    .chain(&self.killed)
                    .flat_map(Controller::warnings),
            )
            .collect()
    }

    /// SIGTERM, then waits (at most 20 s, then SIGKILL) for the exit, of the other
    /// replicas first; the first replica's status (the others' when it is the only
    /// failure).
    pub(crate) fn stop(&mut self) -> anyhow::Result<ExitStatus> {
        let mut failed = None;
        for o in &mut self.others {
            let status = o.stop()?;
            if !status.success() {
                failed = Some(status);
            }
        }
        let status = self.stop_one()?;
        Ok(match (status.success(), failed) {
            (true, Some(f)) => f,
            _ => status,
        })
    }

    fn stop_one(&mut self) -> anyhow::Result<ExitStatus> {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGTERM);
        }
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = self.child.kill();
                return Ok(self.child.wait()?);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_cpu_and_memory() {
        let pid = std::process::id();
        assert!(cpu_seconds(pid).is_some_and(|s| s >= 0.0));
        assert!(memory_mib(pid, "VmRSS").is_some_and(|m| m > 0.0));
        assert!(memory_mib(pid, "VmHWM").is_some_and(|m| m > 0.0));
        assert!(memory_mib(pid, "VmNope").is_none());
    }

    #[test]
    fn warnings_are_found_with_or_without_colours() {
        let plain = "2026-01-01T00:00:00.000000Z  WARN service_mirror: x";
        let coloured = "\u{1b}[2m2026-01-01T00:00:00.000000Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m \u{1b}[2mservice_mirror\u{1b}[0m: x";
        for l in [plain, coloured] {
            assert_eq!(strip_ansi(l).split_whitespace().nth(1), Some("WARN"), "{l}");
        }
    }
}
