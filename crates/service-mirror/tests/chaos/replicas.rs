//! The controller as deployed: two replicas of the real binary, each with the token of
//! its own ServiceAccount bound by the manifests of `service-mirror install` (not
//! cluster-admin), leader election on. Every process that ever ran is kept until the
//! end, with how it was ended, so that its exit status and log can be judged.

use crate::support::controller::Controller;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::Duration;

/// How a retired process was ended, and so what its exit status must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// SIGKILL: the status must say killed by signal 9, nothing else.
    Killed,
    /// SIGTERM: a graceful exit with status 0 (checked when it happens).
    Terminated,
}

/// One replica slot: its credentials and the process running in it, if any.
pub(crate) struct Replica {
    /// `replica-a`, `replica-b`: its `POD_NAME`, so its Lease holder identity.
    pub(crate) identity: String,
    /// Its kubeconfig (the ServiceAccount token, through the local fault proxy).
    kubeconfig: PathBuf,
    process: Option<Controller>,
    /// SIGSTOPped by the test.
    pub(crate) paused: bool,
}

/// The replicas and every process that ever ran in them.
pub(crate) struct Replicas {
    pub(crate) list: Vec<Replica>,
    args: Vec<String>,
    namespace: String,
    retired: Vec<(Controller, Ending)>,
}

impl Replicas {
    /// Starts one process per `(identity, kubeconfig)` with `args`.
    pub(crate) fn start(namespace: &str, slots: Vec<(String, PathBuf)>, args: &[&str]) -> Self {
        let mut replicas = Self {
            list: slots
                .into_iter()
                .map(|(identity, kubeconfig)| Replica {
                    identity,
                    kubeconfig,
                    process: None,
                    paused: false,
                })
                .collect(),
            args: args.iter().map(|a| a.to_string()).collect(),
            namespace: namespace.into(),
            retired: Vec::new(),
        };
        for i in 0..replicas.list.len() {
            replicas.spawn(i);
        }
        replicas
    }

    /// Starts a process in slot `i` (empty).
    pub(crate) fn spawn(&mut self, i: usize) {
        let r = &mut self.list[i];
        assert!(r.process.is_none(), "slot {} already runs", r.identity);
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        r.process = Some(Controller::spawn_as(
            &r.kubeconfig,
            &self.namespace,
            &args,
            &[("POD_NAME", r.identity.as_str())],
        ));
        r.paused = false;
        // Up once it has started (its SIGTERM handler is taken before it says so): a
        // SIGTERM fault aims at a running replica, not at a process still loading.
        // Bounded; a process that exits meanwhile is judged with the others.
        let started = std::time::Instant::now();
        let c = r.process.as_mut().expect("just spawned");
        while c.log_lines("service mirror running").is_empty()
            && started.elapsed() < Duration::from_secs(30)
            && c.child.try_wait().ok().flatten().is_none()
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The identity of each running, unpaused replica and when its process started.
    pub(crate) fn running(&self) -> Vec<(String, std::time::Instant)> {
        self.list
            .iter()
            .filter(|r| !r.paused)
            .filter_map(|r| r.process.as_ref().map(|c| (r.identity.clone(), c.started)))
            .collect()
    }

    /// Indexes of the slots whose process runs (paused or not).
    pub(crate) fn up(&self) -> Vec<usize> {
        (0..self.list.len())
            .filter(|&i| self.list[i].process.is_some())
            .collect()
    }

    /// SIGKILL the process of slot `i` and retire it.
    pub(crate) fn kill(&mut self, i: usize) {
        let mut c = self.list[i].process.take().expect("a running replica");
        let _ = c.child.kill();
        let _ = c.child.wait();
        self.list[i].paused = false;
        self.retired.push((c, Ending::Killed));
    }

    /// SIGTERM the process of slot `i`: it must exit by itself with status 0, having
    /// released its Lease; returns how long the exit took.
    pub(crate) fn terminate(&mut self, i: usize) -> Duration {
        let mut c = self.list[i].process.take().expect("a running replica");
        if self.list[i].paused {
            signal(&c, libc::SIGCONT);
            self.list[i].paused = false;
        }
        let (ok, took) = c.terminate();
        assert!(
            ok,
            "replica {} exited with failure after SIGTERM; log tail:\n{}",
            self.list[i].identity,
            tail(&c.log_text(), 40)
        );
        self.retired.push((c, Ending::Terminated));
        took
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) the process of slot `i`.
    pub(crate) fn pause(&mut self, i: usize, stop: bool) {
        let c = self.list[i].process.as_ref().expect("a running replica");
        signal(c, if stop { libc::SIGSTOP } else { libc::SIGCONT });
        self.list[i].paused = stop;
    }

    /// The slot whose process says it leads (`service_mirror_leader 1`), asking the
    /// running, unpaused ones.
    pub(crate) async fn leader(&self) -> Option<usize> {
        for i in self.up() {
            if self.list[i].paused {
                continue;
            }
            let c = self.list[i].process.as_ref().expect("up");
            if c.metrics()
                .await
                .lines()
                .any(|l| l == "service_mirror_leader 1")
            {
                return Some(i);
            }
        }
        None
    }

    /// Fails the test if a process the test did not end has exited: a crash.
    pub(crate) fn assert_none_crashed(&mut self, context: &str) {
        for r in &mut self.list {
            if let Some(c) = r.process.as_mut()
                && let Some(status) = c.child.try_wait().unwrap()
            {
                panic!(
                    "{context}: replica {} exited by itself ({status}); log tail:\n{}",
                    r.identity,
                    tail(&c.log_text(), 60)
                );
            }
        }
    }

    /// Waits until every running, unpaused process answers `/ready`.
    pub(crate) async fn wait_ready(&self) {
        for r in &self.list {
            if let (Some(c), false) = (&r.process, r.paused) {
                c.wait_ready().await;
            }
        }
    }

    /// Waits (at most `within`) until every running, unpaused process has a connected
    /// watch of each of `clusters` (`service_mirror_remote_connected 1`): a replica
    /// restarted late in a round, or one whose retries of a fault ran long, has then
    /// linked and said so (its `Linked` Event) before the world is called converged;
    /// and no link rotation is still syncing (it says `CredentialsRotated` when it takes
    /// over: long run seed 7 round 397, after a partition). False if one has not.
    pub(crate) async fn wait_connected(&self, clusters: &[String], within: Duration) -> bool {
        let start = std::time::Instant::now();
        loop {
            let mut all = true;
            for r in &self.list {
                let (Some(c), false) = (&r.process, r.paused) else {
                    continue;
                };
                let page = c.metrics().await;
                all &= clusters.iter().all(|cluster| {
                    page.lines().any(|l| {
                        l.starts_with("service_mirror_remote_connected{")
                            && l.contains(&format!("cluster=\"{cluster}\""))
                            && l.ends_with(" 1")
                    })
                });
                // A rotation still syncing reports when it takes over (an Event):
                // not converged until it has.
                all &= page
                    .lines()
                    .any(|l| l == "service_mirror_link_rotations_in_progress 0");
            }
            if all {
                return true;
            }
            if start.elapsed() > within {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every process that ever ran: no log holds a panic, and every retired one ended
    /// as the test ended it (SIGKILL: signal 9 and nothing else). Returns how many
    /// processes were judged.
    pub(crate) fn assert_exits_and_logs_clean(&mut self) -> usize {
        let mut judged = 0;
        for (c, ending) in &mut self.retired {
            let status = c.child.wait().expect("exit status");
            if *ending == Ending::Killed {
                assert_eq!(
                    status.signal(),
                    Some(libc::SIGKILL),
                    "a killed replica ended otherwise: {status}; log tail:\n{}",
                    tail(&c.log_text(), 40)
                );
            }
            assert_no_panic(c);
            judged += 1;
        }
        for r in &self.list {
            if let Some(c) = &r.process {
                assert_no_panic(c);
                judged += 1;
            }
        }
        judged
    }

    /// Every log of every process, for the credential-leak check.
    pub(crate) fn logs(&self) -> Vec<String> {
        self.retired
            .iter()
            .map(|(c, _)| c.log_text())
            .chain(
                self.list
                    .iter()
                    .filter_map(|r| r.process.as_ref().map(Controller::log_text)),
            )
            .collect()
    }

    /// Rotations each running, unpaused process has ended (`service_mirror_link_rotations_total`,
    /// every outcome), with its identity and start.
    pub(crate) async fn rotations_ended(&self) -> Vec<(String, std::time::Instant, u64)> {
        let mut out = Vec::new();
        for r in &self.list {
            if let (Some(c), false) = (&r.process, r.paused) {
                let n = c
                    .metrics()
                    .await
                    .lines()
                    .filter(|l| l.starts_with("service_mirror_link_rotations_total{"))
                    .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
                    .sum();
                out.push((r.identity.clone(), c.started, n));
            }
        }
        out
    }

    /// Waits (at most `within`) until every running, unpaused process runs each link of
    /// `sources` (cluster, Secret uid) from that Secret (`service_mirror_link_source`):
    /// a replica whose Secret watch is behind takes a re-created Secret in late, and
    /// may unlink and link again then (chaos run 14, round 238: a follower's `Linked`
    /// Event after the oracle passed). The world is not settled before.
    pub(crate) async fn wait_sources(
        &self,
        sources: &[(String, String)],
        within: Duration,
    ) -> bool {
        let start = std::time::Instant::now();
        loop {
            let pages = self.metrics().await;
            let seen = sources.iter().all(|(cluster, uid)| {
                let series =
                    format!("service_mirror_link_source{{cluster=\"{cluster}\",uid=\"{uid}\"}} 1");
                pages.iter().all(|p| p.lines().any(|l| l == series))
            });
            if seen {
                return true;
            }
            if start.elapsed() > within {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Metrics of every running, unpaused process.
    pub(crate) async fn metrics(&self) -> Vec<String> {
        let mut pages = Vec::new();
        for r in &self.list {
            if let (Some(c), false) = (&r.process, r.paused) {
                pages.push(c.metrics().await);
            }
        }
        pages
    }

    /// The log tails of the running processes, for a failure message.
    pub(crate) fn tails(&self, lines: usize) -> String {
        self.list
            .iter()
            .filter_map(|r| {
                let c = r.process.as_ref()?;
                Some(format!(
                    "--- {} ---\n{}",
                    r.identity,
                    tail(&c.log_text(), lines)
                ))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        // A stopped process ignores SIGKILL's siblings until continued; SIGKILL itself
        // works on it, but be explicit.
        for r in &self.list {
            if let (Some(c), true) = (&r.process, r.paused) {
                signal(c, libc::SIGCONT);
            }
        }
    }
}

fn signal(c: &Controller, sig: i32) {
    // SAFETY: signalling our own child process, which has not been reaped.
    unsafe {
        libc::kill(c.child.id() as i32, sig);
    }
}

fn assert_no_panic(c: &Controller) {
    let log = c.log_text();
    assert!(
        !log.contains("panicked at"),
        "a replica panicked; log:\n{}",
        tail(&log, 80)
    );
}

/// The last `n` lines of `text`.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
