//! Network namespaces held by a tied `sleep` process: the namespace has no name (no bind
//! mount under /run/netns), so it disappears with its last process, and the holder dies
//! with the harness (parent-death signal). A SIGKILLed owner therefore leaves no
//! namespace, and with it no veth or nft table, behind.

use crate::process::Process;
use crate::{Error, Result};
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// One network namespace and the process that keeps it alive.
#[derive(Debug)]
pub(crate) struct Netns {
    /// `/proc/<holder>/ns/net`, open: what `setns` joins.
    fd: File,
    holder: Process,
    /// A real node's first process (pid 1 of its pid namespace), inside the namespaces.
    init: Option<u32>,
    /// Whether [`Netns::kill`] ran.
    killed: std::sync::atomic::AtomicBool,
}

impl Netns {
    /// A new, empty network namespace (only a `lo`, down).
    pub(crate) fn create(name: &str, log_dir: &Path) -> Result<Self> {
        let mut cmd = Command::new("sleep");
        cmd.arg("infinity");
        // SAFETY: unshare is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::unshare(libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let holder =
            Process::spawn_command(&format!("netns {name}"), cmd, &log_dir.join("netns.log"))?;
        // The namespace exists once the holder runs `sleep` (after exec, so after unshare).
        let path = format!("/proc/{}/ns/net", holder.pid());
        let own = std::fs::read_link("/proc/self/ns/net")?;
        for _ in 0..500 {
            if let (Ok(link), Ok(exe)) = (
                std::fs::read_link(&path),
                std::fs::read_link(format!("/proc/{}/exe", holder.pid())),
            ) && link != own
                && exe.file_name().is_some_and(|n| n == "sleep")
            {
                let fd = File::open(&path)?;
                return Ok(Self {
                    fd,
                    holder,
                    init: None,
                    killed: Default::default(),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Err(Error::Start {
            what: format!("network namespace {name}"),
            reason: "the holder process did not enter a new network namespace within 5 s".into(),
            log_tail: holder.log_tail(10),
        })
    }

    /// A real node's namespaces: pid, mount, network and uts, held by `init` (a reaper:
    /// the pause binary) as the pid namespace's first process, under `unshare
    /// --kill-child`, which dies with the harness. When that first process dies the
    /// kernel kills every process of the node (containerd, kubelet, shims, containers)
    /// and its mounts go with the mount namespace: a SIGKILLed test leaves none behind.
    ///
    /// Before `init` runs, a shell in the new namespaces sets the hostname, mounts a
    /// fresh /proc (for the new pid namespace), private tmpfs on /run, /var/lib and
    /// /var/log (containerd 1.6's pod netns mounts, kubelet's device-plugin socket,
    /// libcni's cache, kubelet's /var/log/containers links: fixed host paths otherwise
    /// shared by every node, and left behind by a killed one) and binds each file of
    /// `sysctls` (`(proc path under /proc/sys, file holding the value)`) over its
    /// sysctl, which kubelet would otherwise rewrite on the host.
    pub(crate) fn create_node(
        name: &str,
        log_dir: &Path,
        init: &Path,
        sysctls: &[(String, std::path::PathBuf)],
    ) -> Result<Self> {
        let mut script = format!("set -e\nhostname {name}\n");
        script.push_str("mount -t tmpfs -o mode=755 tmpfs /run\n");
        script.push_str("mount -t tmpfs -o mode=755 tmpfs /var/lib\n");
        // kubelet links every container log into the fixed /var/log/containers.
        script.push_str("mount -t tmpfs -o mode=755 tmpfs /var/log\n");
        for (sysctl, file) in sysctls {
            script.push_str(&format!(
                "mount --bind {} /proc/sys/{sysctl}\n",
                file.display()
            ));
        }
        script.push_str(&format!("exec {}\n", init.display()));
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--pid",
            "--fork",
            "--kill-child",
            "--mount",
            "--net",
            "--uts",
            "--propagation",
            "private",
            "--mount-proc",
            "--",
            "/bin/sh",
            "-c",
            &script,
        ]);
        let holder =
            Process::spawn_command(&format!("node {name}"), cmd, &log_dir.join("node-ns.log"))?;
        // The node is up once unshare's child (pid 1 of the node) runs `init`.
        let init_name = init.file_name().map(|n| n.to_os_string());
        let own = std::fs::read_link("/proc/self/ns/net")?;
        for _ in 0..1000 {
            let children =
                std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", holder.pid()))
                    .unwrap_or_default();
            if let Some(first) = children
                .split_whitespace()
                .next()
                .and_then(|p| p.parse::<u32>().ok())
            {
                let path = format!("/proc/{first}/ns/net");
                if let (Ok(link), Ok(exe)) = (
                    std::fs::read_link(&path),
                    std::fs::read_link(format!("/proc/{first}/exe")),
                ) && link != own
                    && exe.file_name().map(|n| n.to_os_string()) == init_name
                {
                    let fd = File::open(&path)?;
                    return Ok(Self {
                        fd,
                        holder,
                        init: Some(first),
                        killed: Default::default(),
                    });
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Err(Error::Start {
            what: format!("node namespaces {name}"),
            reason: "the node's first process did not run its init within 10 s".into(),
            log_tail: holder.log_tail(20),
        })
    }

    /// The pid of a process inside the namespace (what `ip link ... netns <pid>` and
    /// `nsenter -t <pid>` take): the holder, or a node's first process.
    pub(crate) fn pid(&self) -> u32 {
        self.init.unwrap_or_else(|| self.holder.pid())
    }

    /// `program` set up to run inside every namespace of a real node (mount, uts,
    /// network, pid) through `nsenter`, which forks into the pid namespace: the process
    /// dies with the node.
    pub(crate) fn node_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args([
            "--target",
            &self.pid().to_string(),
            "--mount",
            "--uts",
            "--net",
            "--pid",
            "--",
        ]);
        cmd.arg(program);
        cmd
    }

    /// Kills the node at once, as a power loss would: SIGKILL to its first process,
    /// which takes every process of the node's pid namespace with it.
    pub(crate) fn kill(&self) {
        // Once: the pid is reaped (and may be reused) after the first.
        if self.killed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if let Some(pid) = self.init {
            // SAFETY: plain signal delivery.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
    }

    fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// `cmd` set up to run inside this namespace (joined between fork and exec).
    pub(crate) fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        let fd = self.raw_fd();
        // SAFETY: setns is async-signal-safe; `fd` stays open in the child until exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// Runs `ip <args>` inside this namespace.
    pub(crate) fn ip(&self, args: &[&str]) -> Result<()> {
        let mut cmd = self.command("ip");
        cmd.args(args);
        run(cmd, &format!("ip {}", args.join(" ")))
    }

    /// Runs `ip -batch -` inside this namespace with `commands` (one `ip` command per
    /// line, without the leading `ip`) on its stdin: thousands of changes in one process.
    pub(crate) fn ip_batch(&self, commands: &str) -> Result<()> {
        use std::io::Write;
        let mut cmd = self.command("ip");
        cmd.args(["-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let what = format!("ip -batch ({} commands)", commands.lines().count());
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::DataPlane(format!("{what}: {e}")))?;
        let written = child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(commands.as_bytes());
        let out = child
            .wait_with_output()
            .map_err(|e| Error::DataPlane(format!("{what}: {e}")))?;
        if let Err(e) = written {
            return Err(Error::DataPlane(format!("{what}: writing stdin: {e}")));
        }
        if !out.status.success() {
            return Err(Error::DataPlane(format!(
                "{what}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Runs `f` on a thread inside this namespace: sockets it creates belong to the
    /// namespace (for good, whichever thread uses them later).
    pub(crate) fn enter<T: Send>(
        &self,
        f: impl FnOnce() -> std::io::Result<T> + Send,
    ) -> std::io::Result<T> {
        let fd = self.raw_fd();
        std::thread::scope(|s| {
            s.spawn(move || {
                // SAFETY: moves only this new thread into the namespace.
                if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                f()
            })
            .join()
            .map_err(|_| std::io::Error::other("namespace thread panicked"))?
        })
    }

    /// A TCP socket of this namespace.
    pub(crate) fn tcp_socket(&self) -> std::io::Result<tokio::net::TcpSocket> {
        self.enter(tokio::net::TcpSocket::new_v4)
    }

    /// A TCP listener on `addr` in this namespace.
    pub(crate) fn tcp_listener(
        &self,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<std::net::TcpListener> {
        self.enter(|| {
            let l = std::net::TcpListener::bind(addr)?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
    }

    /// A UDP socket on an ephemeral port of this namespace.
    pub(crate) fn udp_socket(&self) -> std::io::Result<std::net::UdpSocket> {
        self.enter(|| {
            let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
    }
}

/// Runs `cmd` to completion; an error carries its output.
pub(crate) fn run(mut cmd: Command, what: &str) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::DataPlane(format!("{what}: {e}")))?;
    if !out.status.success() {
        return Err(Error::DataPlane(format!(
            "{what}: {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        )));
    }
    Ok(())
}

/// Runs `ip <args>` on the host.
pub(crate) fn host_ip(args: &[&str]) -> Result<()> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    run(cmd, &format!("ip {}", args.join(" ")))
}

/// The output of `ip <args>` on the host.
pub(crate) fn host_ip_output(args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::DataPlane(format!("ip {}: {e}", args.join(" "))))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
