//! The apply step of a reconcile: a decision carried out by the writer, in the plan's
//! order (a headless set's mirrors concurrently), each write remembered until the
//! caches show it.

use super::*;

/// The name of an object written.
fn name_of(o: &Object) -> String {
    o.metadata().name.clone().unwrap_or_default()
}

/// What [`Reconciler::write_in_order`] did.
#[derive(Debug, Default)]
struct Written {
    /// A write was stale: the rest of its group was not made.
    stale: bool,
    /// The uid of the first Service created.
    created_uid: Option<String>,
    /// Every Service created: (name, uid).
    created: Vec<(String, String)>,
}

pub(super) fn is_delete(a: &Action) -> bool {
    matches!(a, Action::Delete(_))
}

/// A headless set's writes by mirror, each mirror's in the plan's order (Service before
/// Endpoints and slices), so the mirrors can be written concurrently; the deletes last,
/// in one group in the plan's order. A plan of one mirror is one group.
pub(super) fn by_mirror(actions: &[Action]) -> Vec<Vec<&Action>> {
    use service_mirror_core::labels::SERVICE_NAME_LABEL;
    let mut groups: Vec<Vec<&Action>> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    let mut deletes = Vec::new();
    for a in actions {
        let name = match a {
            Action::Create(Object::Service(s)) | Action::Update(Object::Service(s)) => {
                s.metadata.name.as_deref()
            }
            Action::Create(Object::Endpoints(e)) | Action::Update(Object::Endpoints(e)) => {
                e.metadata.name.as_deref()
            }
            Action::Create(Object::EndpointSlice(e)) | Action::Update(Object::EndpointSlice(e)) => {
                e.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .or(e.metadata.name.as_ref())
                    .map(String::as_str)
            }
            _ => {
                deletes.push(a);
                continue;
            }
        };
        let i = *at.entry(name.unwrap_or_default()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(a);
    }
    if !deletes.is_empty() {
        groups.push(deletes);
    }
    groups
}

impl Reconciler {
    /// Carries out a decision (`set`: of a headless set, whose mirrors are written
    /// concurrently).
    /// `fingerprint`: of the desired state the plan's updates write towards, recorded for
    /// the contention check once every write of the plan is made (a stale write is none).
    pub(super) async fn apply(
        &self,
        key: &ServiceKey,
        decision: Decision,
        fingerprint: Option<u64>,
        slots: Option<usize>,
        set: bool,
    ) -> Result<Outcome> {
        let cluster = &self.view.link.cluster_name;
        let writes = match decision {
            Decision::Wait => return Ok(Outcome::Done),
            Decision::Refuse {
                reason,
                release_slot,
            } => {
                // Refuse it visibly and touch nothing: an existing mirror stays as it was.
                // The key's text comes from the remote (a hostile one sends what an
                // apiserver would refuse): bounded and cleaned before it is said.
                let service = crate::links::sanitize_remote_text(&key.to_string());
                tracing::warn!(%cluster, %service, reason = reason.reason(), "exported service cannot be mirrored: {}", reason.describe());
                self.fx.metrics.error(reason.reason());
                if let Some(link) = &self.fx.link_secret {
                    let note = format!(
                        "exported service {service} of cluster {cluster} is not mirrored: {}",
                        reason.describe()
                    );
                    self.fx
                        .writer
                        .record(link, "InvalidService", "Mirror", note)
                        .await;
                }
                if release_slot {
                    self.release_slot(key);
                }
                return Ok(Outcome::Done);
            }
            Decision::Pending { requeue } => {
                tracing::trace!(%cluster, %key, "cache behind our own write");
                return Ok(requeue.map_or(Outcome::Done, Outcome::RequeueAfter));
            }
            Decision::Write(writes) => writes,
        };
        let Writes {
            steps,
            admit,
            release_slot,
            create_permit,
            second_pass,
            requeue,
            slices_of_new_service,
            slices_of_new_members,
            awaiting_mirroring,
        } = writes;
        match awaiting_mirroring {
            true => {
                let mut waits = self.memory.mirroring_waits.lock();
                let n = waits.entry(key.clone()).or_default();
                *n = n.saturating_add(1);
                let cluster = &self.view.link.cluster_name;
                tracing::debug!(%cluster, %key, waits = *n, "slices kept until kube-controller-manager's mirrored ones route the same");
                // About 3 minutes of looks: kcm is down, slow, or cannot mirror it all
                // (over 1000 addresses). Said once; the slices stay meanwhile.
                if *n == 10 {
                    tracing::warn!(%cluster, %key, "endpoints mode: kube-controller-manager has not mirrored this mirror's Endpoints into slices routing every gateway address and port; our EndpointSlices are kept until it has");
                }
            }
            false => {
                memory::forget(&self.memory.mirroring_waits, key);
            }
        }
        // `slots`: None when the key's slots are taken already (`admit_members`).
        if admit
            && let Some(slots) = slots
            && let Admission::Refused { first } = self.fx.limit.admit(key, slots)
        {
            self.refuse_over_limit(key, first, false).await;
            return Ok(Outcome::Done);
        } else if release_slot {
            self.release_slot(key);
        }
        // A plan that creates holds a create permit to its end: a Service create and then
        // its Endpoints, as the apiserver takes them fastest (writer::CREATES_IN_FLIGHT).
        // The semaphore is never closed, so acquiring cannot fail.
        let _permit = match create_permit {
            true => self.fx.create_limit.acquire().await.ok(),
            false => None,
        };
        if second_pass {
            memory::forget(&self.memory.endpoints_first, key);
        }
        let done = requeue.map_or(Outcome::Done, Outcome::RequeueAfter);
        // Reported once the writes are made (the mirror's namespace may be new).
        let over_capacity = self.over_capacity(key, &steps);
        let actions = match steps {
            Steps::EndpointsFirst { endpoints, service } => {
                tracing::debug!(%cluster, %key, actions = ?endpoints, "writing Endpoints first");
                self.record_all(over_capacity).await;
                let mut replaced = Vec::new();
                for action in &endpoints {
                    let rv = match action {
                        Action::Update(Object::Endpoints(e)) => e.metadata.resource_version.clone(),
                        Action::Update(Object::EndpointSlice(e)) => {
                            e.metadata.resource_version.clone()
                        }
                        _ => unreachable!("decide puts only Endpoints and slice updates first"),
                    };
                    match self.execute(action).await {
                        Ok(Applied::Done) => replaced.extend(rv),
                        // The event bringing the newer object queues the key again.
                        Ok(Applied::Stale) => return Ok(done),
                        // They cannot be written now: the Service still is, as when the
                        // plan runs in its own order; the key is retried for the rest.
                        Err(err) => {
                            self.execute(&service).await?;
                            return Err(err);
                        }
                    }
                }
                self.memory
                    .endpoints_first
                    .lock()
                    .insert(key.clone(), replaced);
                return Ok(Outcome::RequeueAfter(std::time::Duration::ZERO));
            }
            Steps::InOrder(actions) => actions,
        };
        let mut created_uid = None;
        // A headless set's new Services: name -> uid.
        let mut created: HashMap<String, String> = HashMap::new();
        let mut stale = false;
        // A headless set's mirrors are written concurrently, each in the plan's order, and
        // its deletes after them (see `by_mirror`); any other plan in its own order. A
        // pod joins the parent's endpoints only once its endpoint mirror is cached with a
        // ClusterIP, so the parent never waits for this pass's creates.
        let groups = match set {
            true => by_mirror(&actions),
            false => vec![actions.iter().collect()],
        };
        let (writes, deletes) = match (set, groups.last()) {
            (true, Some(last)) if last.iter().all(|a| is_delete(a)) => {
                let mut groups = groups;
                let deletes = groups.pop();
                (groups, deletes)
            }
            _ => (groups, None),
        };
        // Made first, not in the stream: a closure in a stream of a spawned future fails
        // the Send check (rust-lang/rust#102211).
        let writes: Vec<_> = writes
            .into_iter()
            .map(|group| self.write_in_order(key, group))
            .collect();
        let results: Vec<Result<Written>> = futures::stream::iter(writes)
            .buffer_unordered(self.fx.member_writes.max(1))
            .collect()
            .await;
        let mut results = results.into_iter().collect::<Result<Vec<_>>>()?;
        if let Some(deletes) = deletes.filter(|_| !results.iter().any(|r| r.stale)) {
            results.push(self.write_in_order(key, deletes).await?);
        }
        for r in results {
            stale |= r.stale;
            created_uid = created_uid.or(r.created_uid);
            if !slices_of_new_members.is_empty() {
                created.extend(r.created);
            }
        }
        if let (false, Some(fp)) = (stale, fingerprint) {
            self.memory.contention.written(key, fp);
        }
        // A new mirror's slices need its Service's uid, which the plan could not know:
        // it came with the create, so they are written now rather than on a second pass
        // after the watch event (a second pass over every key made a cold sync of 1,000
        // mirrors in `both` mode 1.86x the reference writer's time).
        if let (Some(uid), Some(d)) = (created_uid, &slices_of_new_service) {
            for slice in desired_slices(d, &uid) {
                let action = Action::Create(Object::EndpointSlice(slice));
                tracing::debug!(%cluster, %key, ?action, "writing");
                if self.execute(&action).await? == Applied::Stale {
                    break;
                }
            }
        }
        // The same for each new mirror of a headless set (measured: 1,000 pods in `both`
        // mode wrote their last slice 34 s after the start with a second pass, see
        // docs/operations.md).
        // Concurrently per mirror, as above.
        let mut member_slices = Vec::new();
        for d in &slices_of_new_members {
            if let Some(uid) = d
                .service
                .metadata
                .name
                .as_ref()
                .and_then(|n| created.get(n))
            {
                member_slices.push(self.write_slices(key, d, uid));
            }
        }
        let results: Vec<Result<()>> = futures::stream::iter(member_slices)
            .buffer_unordered(self.fx.member_writes.max(1))
            .collect()
            .await;
        results.into_iter().collect::<Result<Vec<()>>>()?;
        self.record_all(over_capacity).await;
        Ok(done)
    }

    /// Writes `group` in its order, stopping at the first stale write.
    async fn write_in_order(&self, key: &ServiceKey, group: Vec<&Action>) -> Result<Written> {
        let cluster = &self.view.link.cluster_name;
        let mut out = Written::default();
        for action in group {
            tracing::debug!(%cluster, %key, ?action, "writing");
            let (applied, uid) = self.execute_returning_uid(action).await?;
            if applied == Applied::Stale {
                // Keep the plan's order (Service before Endpoints): the watch event that
                // brings the newer version queues this key again.
                out.stale = true;
                break;
            }
            if let (Action::Create(Object::Service(s)), Some(uid)) = (action, &uid) {
                out.created.push((s.name_any(), uid.clone()));
            }
            out.created_uid = out.created_uid.or(uid);
        }
        Ok(out)
    }

    /// Creates the slices of the new mirror `d` (Service uid `uid`), stopping at a stale
    /// write.
    async fn write_slices(&self, key: &ServiceKey, d: &DesiredMirror, uid: &str) -> Result<()> {
        let cluster = &self.view.link.cluster_name;
        for slice in desired_slices(d, uid) {
            let action = Action::Create(Object::EndpointSlice(slice));
            tracing::debug!(%cluster, %key, ?action, "writing");
            if self.execute(&action).await? == Applied::Stale {
                break;
            }
        }
        Ok(())
    }

    /// Executes one action and remembers the write until the caches show it.
    async fn execute(&self, action: &Action) -> Result<Applied> {
        Ok(self.execute_returning_uid(action).await?.0)
    }

    /// As [`Reconciler::execute`], with the uid of a Service created now.
    async fn execute_returning_uid(&self, action: &Action) -> Result<(Applied, Option<String>)> {
        let (applied, stored) = self.fx.writer.write(action).await?;
        // Only a Service created now: its slices name its uid.
        let uid = match (action, stored) {
            (Action::Create(Object::Service(_)), Some(o)) => o.metadata().uid.clone(),
            _ => None,
        };
        if applied != Applied::Done {
            return Ok((applied, None));
        }
        // What the write replaced: the version updated or deleted (a precondition of the
        // write), nothing for a create.
        let kind = match action.kind() {
            ObjectKind::Service => LocalObject::Service,
            ObjectKind::Endpoints => LocalObject::Endpoints,
            ObjectKind::EndpointSlice => LocalObject::EndpointSlice,
            // A link plans no ServiceImport: nothing to expect.
            ObjectKind::ServiceImport => return Ok((applied, uid)),
        };
        let (ns, name, replaced) = match action {
            Action::Create(o) => (o.metadata().namespace.clone(), name_of(o), None),
            Action::Update(o) => (
                o.metadata().namespace.clone(),
                name_of(o),
                o.metadata().resource_version.clone(),
            ),
            Action::Delete(r) => (
                Some(r.namespace.clone()),
                r.name.clone(),
                // No version precondition: whatever the cache shows next counts.
                Some(r.resource_version.clone().unwrap_or_default()),
            ),
        };
        let ns = ns.unwrap_or_default();
        self.view.expectations.written(kind, &ns, &name, replaced);
        // Recorded first, then checked against the cache: the event may have come already
        // (and then went by without finding it), or comes after, and finds it.
        let cached = match kind {
            LocalObject::Service => self
                .view
                .local_services
                .get(&ObjectRef::new(&name).within(&ns))
                .and_then(|o| o.metadata.resource_version.clone()),
            LocalObject::Endpoints => self
                .view
                .local_endpoints
                .get(&ObjectRef::new(&name).within(&ns))
                .and_then(|o| o.metadata.resource_version.clone()),
            LocalObject::EndpointSlice => self
                .view
                .local_slices
                .get(&ObjectRef::new(&name).within(&ns))
                .and_then(|o| o.metadata.resource_version.clone()),
        };
        self.view
            .expectations
            .observed(kind, &ns, &name, cached.as_deref());
        Ok((applied, uid))
    }
}
