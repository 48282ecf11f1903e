//! The campaign for the leader Lease: take it, renew it every third of its duration,
//! release it on shutdown; and the timer that ends a term nobody renewed.

use super::*;

/// Flips the leadership off when the term ends unrenewed: the transition followers
/// wait on. Writers do not rely on it: they read the clock.
pub(super) async fn expire(term: Arc<Term>, shutdown: CancellationToken) {
    loop {
        let end = *term.end.lock();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = term.moved.notified() => continue,
            _ = async {
                match end {
                    Some(end) => tokio::time::sleep_until(end.into()).await,
                    None => std::future::pending().await,
                }
            } => term.expire(Instant::now()),
        }
    }
}

pub(super) struct Campaign {
    pub(super) api: Api<Lease>,
    pub(super) opts: LeaderOptions,
    pub(super) term: Arc<Term>,
    /// The resourceVersion of our last successful write (the release's precondition).
    pub(super) written: Option<String>,
}

pub(super) fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl Campaign {
    pub(super) fn secs(&self) -> i32 {
        self.opts.duration.as_secs().max(1) as i32
    }

    pub(super) fn patch_params(&self) -> PatchParams {
        PatchParams {
            field_manager: Some(format!("service-mirror-{}", self.opts.identity)),
            ..PatchParams::default()
        }
    }

    pub(super) async fn run(mut self, shutdown: CancellationToken) {
        let d = self.opts.duration;
        let mut seen: Option<Seen> = None;
        let mut failures = 0u32;
        loop {
            // Each request is bounded (a stalled apiserver must not hold up the
            // campaign past a renewal) and gives way to shutdown.
            let bound = renew_every(d);
            let read = tokio::select! {
                _ = shutdown.cancelled() => break,
                r = tokio::time::timeout(bound, self.api.get_opt(&self.opts.lease_name)) => r,
            };
            let next = match read.map_err(|_| format!("no answer within {bound:?}")) {
                Ok(Err(e)) => {
                    failures += 1;
                    self.failed("read", &e, failures);
                    Instant::now() + retry_after(d)
                }
                Err(e) => {
                    failures += 1;
                    self.failed("read", &e, failures);
                    Instant::now() + retry_after(d)
                }
                Ok(Ok(lease)) => {
                    let record = lease.as_ref().map(Record::of);
                    let (step, remember) = decide(
                        record.as_ref(),
                        &self.opts.identity,
                        seen.as_ref(),
                        Instant::now(),
                        d,
                    );
                    seen = remember;
                    match step {
                        Step::Follow(at) => {
                            // Someone else holds it: over now, whatever our term says.
                            self.term.set(None);
                            failures = 0;
                            at
                        }
                        _ => {
                            let sent = Instant::now();
                            let write = tokio::select! {
                                _ = shutdown.cancelled() => break,
                                r = tokio::time::timeout(bound, self.write(step, lease)) => r,
                            };
                            let Ok(write) = write else {
                                failures += 1;
                                let e = format!("no answer within {bound:?}");
                                self.failed("write", &e, failures);
                                tokio::select! {
                                    _ = shutdown.cancelled() => break,
                                    _ = tokio::time::sleep(retry_after(d)) => {}
                                }
                                continue;
                            };
                            match write {
                                // Created unheld: take it on the next read, at once.
                                Ok(()) if step == Step::Create => Instant::now(),
                                Ok(()) => {
                                    self.term.set(Some(term_end(sent, d)));
                                    failures = 0;
                                    sent + renew_every(d)
                                }
                                // Written by someone else since our read: read again now.
                                Err(e) if is_conflict(&e) => {
                                    tracing::debug!(lease = %self.opts.lease_name, "leader Lease changed meanwhile; reading it again");
                                    Instant::now() + Duration::from_millis(50)
                                }
                                Err(e) => {
                                    failures += 1;
                                    self.failed("write", &e, failures);
                                    Instant::now() + retry_after(d)
                                }
                            }
                        }
                    }
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(next.into()) => {}
            }
        }
        // Bounded: a stalled apiserver must not keep the process from exiting.
        let _ = tokio::time::timeout(renew_every(d), self.release()).await;
    }

    pub(super) fn failed(&self, what: &str, e: &dyn std::fmt::Display, failures: u32) {
        if failures == 1 || failures.is_power_of_two() {
            tracing::error!(lease = %self.opts.lease_name, namespace = %self.opts.namespace, failures, error = %e, "cannot {what} the leader-election Lease; writing only until the current term ends");
        }
    }

    /// Creates (unheld), renews or takes the Lease (`lease`: as read). One way in, the
    /// resourceVersion-preconditioned patch: two replicas racing on a new Lease both
    /// create or conflict, then one patch wins.
    pub(super) async fn write(&mut self, step: Step, lease: Option<Lease>) -> kube::Result<()> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let written = match (step, lease) {
            (Step::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.opts.lease_name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                let params = PostParams {
                    field_manager: self.patch_params().field_manager,
                    ..PostParams::default()
                };
                self.api.create(&params, &lease).await?
            }
            (step, Some(lease)) => {
                let mut spec = serde_json::json!({
                    "holderIdentity": self.opts.identity,
                    "leaseDurationSeconds": self.secs(),
                    "renewTime": now,
                });
                if step == Step::Acquire {
                    let transitions = lease
                        .spec
                        .as_ref()
                        .and_then(|s| s.lease_transitions)
                        .unwrap_or(0);
                    spec["acquireTime"] = serde_json::json!(now);
                    spec["leaseTransitions"] = serde_json::json!(transitions + 1);
                }
                let patch = serde_json::json!({
                    "metadata": { "resourceVersion": lease.metadata.resource_version },
                    "spec": spec,
                });
                self.api
                    .patch(
                        &self.opts.lease_name,
                        &self.patch_params(),
                        &Patch::Merge(&patch),
                    )
                    .await?
            }
            (_, None) => unreachable!("only Create is decided without a Lease"),
        };
        self.written = written.metadata.resource_version;
        Ok(())
    }

    /// On shutdown, while still leading: gives the Lease up (holder cleared) if
    /// unchanged since our last write, so another replica takes it at once.
    pub(super) async fn release(&mut self) {
        let leading = may_write(*self.term.end.lock(), Instant::now());
        self.term.set(None);
        let Some(rv) = self.written.take().filter(|_| leading) else {
            return;
        };
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": rv },
            "spec": {
                "holderIdentity": null,
                "acquireTime": null,
                "renewTime": null,
                "leaseDurationSeconds": null,
            },
        });
        let released = self
            .api
            .patch(
                &self.opts.lease_name,
                &self.patch_params(),
                &Patch::Merge(&patch),
            )
            .await;
        match released {
            Ok(_) => tracing::info!(lease = %self.opts.lease_name, "leader Lease released"),
            Err(e) => {
                tracing::warn!(lease = %self.opts.lease_name, error = %e, "leader Lease not released (taken over already?)")
            }
        }
    }
}
