//! Child processes that cannot outlive the process that started them.
//!
//! Linux delivers the parent-death signal when the *thread* that forked the child exits,
//! so every child is spawned from one dedicated thread that lives as long as the process.

use parking_lot::Mutex;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{OnceLock, mpsc};

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("local-cluster-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // Keep this thread alive: its exit would kill every child.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawn the process-spawner thread");
        Mutex::new(tx)
    })
}

/// Spawns `cmd` so that the child dies with this process (parent-death signal, and
/// never started at all if this process is already gone); in a process group of its
/// own if `own_group`, so that killing the group takes its children too.
pub fn spawn_tied(mut cmd: Command, own_group: bool) -> std::io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe libc calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if own_group {
                libc::setpgid(0, 0);
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .send((cmd, tx))
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?
}

/// A running child process with its log file; killed (with its process group) on drop.
#[derive(Debug)]
pub(crate) struct Process {
    name: String,
    child: Child,
    log: PathBuf,
    /// Whether [`Process::kill`] ran.
    killed: bool,
}

impl Process {
    /// Starts `program args...` with stdout and stderr appended to `log`.
    pub(crate) fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> std::io::Result<Self> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        Self::spawn_command(name, cmd, log)
    }

    /// Starts `cmd` (its own pre-exec steps run before the harness's) with stdout and
    /// stderr appended to `log`.
    pub(crate) fn spawn_command(name: &str, mut cmd: Command, log: &Path) -> std::io::Result<Self> {
        let out = File::options().create(true).append(true).open(log)?;
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = spawn_tied(cmd, true)?;
        Ok(Self {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            killed: false,
        })
    }

    /// The name it was started under.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The OS process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited, with its status text.
    pub(crate) fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    /// The last `lines` lines of the log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// The start failure error for this process.
    pub(crate) fn start_error(&self, reason: impl Into<String>) -> crate::Error {
        crate::Error::Start {
            what: self.name.clone(),
            reason: reason.into(),
            log_tail: self.log_tail(40),
        }
    }

    /// Kills the process group with SIGKILL and reaps the child.
    pub(crate) fn kill(&mut self) {
        // Once: after the first the pid (and group) may belong to another process.
        if self.killed {
            return;
        }
        self.killed = true;
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: plain signal delivery to the group this child leads.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a log file (at most 64 KiB are read).
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
