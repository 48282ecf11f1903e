//! Starting a cluster's data plane: its node namespace, kube-proxy, CoreDNS and
//! kube-controller-manager, the optional kubelet nodes, and the wait until they serve.

use super::*;

impl DataPlane {
    pub(crate) async fn start(cluster: ClusterView<'_>) -> Result<Self> {
        data_plane_support().map_err(Error::DataPlane)?;
        let bin = tokio::task::spawn_blocking(ensure_data_plane_binaries)
            .await
            .map_err(|e| Error::Binaries(e.to_string()))??;
        let dir = cluster.dir.join("data-plane");
        std::fs::create_dir_all(&dir)?;
        let fabric = match cluster.fabric.clone() {
            Some(f) => f,
            None => Fabric::get(&dir)?,
        };
        let node_name = format!("{}-node", cluster.name);
        let node = Arc::new(if cluster.nodes > 0 {
            crate::node::node_support().map_err(Error::DataPlane)?;
            crate::node::namespaces(&node_name, &dir.join("nodes").join(&node_name)).await?
        } else {
            Netns::create(&node_name, &dir)?
        });
        let node_ip = fabric.plug(&node, cluster.service_cidr)?;
        let inner = Arc::new(Inner {
            node_name,
            node_ip,
            node,
            fabric,
        });

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("data-plane-{}", cluster.name))
            .enable_all()
            .build()?;
        // Node clusters advertise the fabric address with the apiserver's own port as the
        // `kubernetes` Service's endpoint: the forwarder listens there.
        let listen_port = if cluster.nodes > 0 {
            cluster.apiserver.port()
        } else {
            0
        };
        let listen = SocketAddr::from((inner.fabric.host_ip(), listen_port));
        let target = cluster.apiserver;
        let forwarder = runtime
            .spawn(async move { TcpProxy::start_on(listen, target).await })
            .await
            .map_err(|e| Error::DataPlane(e.to_string()))??;
        let mut plane = Self {
            inner,
            processes: Mutex::new(Vec::new()),
            dir: dir.clone(),
            forwarder: None,
            nodes: Vec::new(),
            runtime: Some(runtime),
        };
        let node_kubeconfig = dir.join("node.kubeconfig");
        let yaml = with_server(cluster.admin_yaml, &format!("https://{}", forwarder.addr()))?;
        // The serving certificate names 127.0.0.1 and localhost, not the forwarder's address.
        let yaml = yaml.replace(
            "    certificate-authority-data:",
            "    tls-server-name: localhost\n    certificate-authority-data:",
        );
        std::fs::write(&node_kubeconfig, yaml)?;
        let apiserver_via_fabric = forwarder.addr();
        plane.forwarder = Some(forwarder);

        if cluster.nodes == 0 {
            plane.create_node(cluster.admin_yaml).await?;
        }
        plane.spawn_processes(&bin, &dir, &cluster, &node_kubeconfig)?;
        // kubelets before the wait: kube-proxy waits (30 s) for its Node, which the first
        // node's kubelet registers.
        if cluster.nodes > 0 {
            plane
                .start_nodes(&cluster, &dir, apiserver_via_fabric, &node_kubeconfig)
                .await?;
        }
        plane.wait_ready(cluster.service_cidr).await?;
        if cluster.nodes > 0 {
            let client = crate::client_from_yaml(cluster.admin_yaml).await?;
            crate::node::wait_ready(&client, &plane.nodes, READY_TIMEOUT).await?;
        }
        Ok(plane)
    }

    /// The cluster's real nodes: the first in the data plane's node namespaces, the
    /// others in namespaces of their own.
    pub(super) async fn start_nodes(
        &mut self,
        cluster: &ClusterView<'_>,
        dir: &Path,
        apiserver: SocketAddr,
        proxy_kubeconfig: &Path,
    ) -> Result<()> {
        for i in 0..cluster.nodes {
            let name = if i == 0 {
                self.inner.node_name.clone()
            } else {
                format!("{}-node-{i}", cluster.name)
            };
            let node_dir = dir.join("nodes").join(&name);
            let (ns, ip) = if i == 0 {
                (self.inner.node.clone(), self.inner.node_ip)
            } else {
                let ns = Arc::new(crate::node::namespaces(&name, &node_dir).await?);
                let ip = self.inner.fabric.plug(&ns, cluster.service_cidr)?;
                (ns, ip)
            };
            let spec = crate::node::NodeSpec {
                cluster: cluster.name,
                name,
                dir: node_dir,
                fabric: self.inner.fabric.clone(),
                apiserver,
                pki: cluster.pki,
                dns: self.inner.node_ip,
                proxy_kubeconfig,
            };
            self.nodes
                .push(crate::node::Node::start(spec, ns, ip, i > 0).await?);
        }
        Ok(())
    }

    /// Shuts every real node down (a cluster stopping at process exit, whose handle is
    /// never dropped).
    pub(crate) fn shut_down_nodes(&self) {
        for n in &self.nodes {
            n.shut_down();
        }
    }

    /// The cluster's real nodes ([`crate::ClusterOptions::nodes`]); the first shares the
    /// data plane's node namespaces (its CoreDNS, kube-proxy, workloads and gateways).
    pub fn nodes(&self) -> &[crate::node::Node] {
        &self.nodes
    }

    pub(super) async fn create_node(&self, admin_yaml: &str) -> Result<()> {
        let client = crate::client_from_yaml(admin_yaml).await?;
        let nodes: Api<Node> = Api::all(client);
        let node = Node {
            metadata: ObjectMeta {
                name: Some(self.inner.node_name.clone()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: self.inner.node_ip.to_string(),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        // Status given on create may be dropped: set it through the subresource too.
        let patch = serde_json::json!({ "status": node.status });
        nodes
            .patch_status(
                &self.inner.node_name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await?;
        Ok(())
    }

    pub(super) fn spawn_processes(
        &self,
        bin: &DataPlaneBinaries,
        dir: &Path,
        cluster: &ClusterView<'_>,
        node_kubeconfig: &Path,
    ) -> Result<()> {
        let mut procs = self.processes.lock();
        let kc = node_kubeconfig.display().to_string();

        // On the host, against 127.0.0.1: only the controllers that turn Endpoints and
        // Services into EndpointSlices; no serving port, no leader election.
        let mut kcm = std::process::Command::new(&bin.kube_controller_manager);
        kcm.args([
            format!("--kubeconfig={}", cluster.admin_path.display()),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=false".into(),
            "--secure-port=0".into(),
            "--v=1".into(),
        ]);
        if cluster.nodes > 0 {
            // Every default controller (deployments, replicasets, serviceaccount and
            // token, root-ca publisher, endpointslice, node lifecycle, garbage
            // collector, disruption…). A node whose Lease is 10 s old is NotReady, then
            // its pods are evicted after the apiserver's 10 s default toleration.
            let d = |f: &str| cluster.dir.join(f).display().to_string();
            kcm.args([
                format!("--root-ca-file={}", d("ca.crt")),
                format!("--service-account-private-key-file={}", d("sa.key")),
                "--node-monitor-period=2s".into(),
                "--node-monitor-grace-period=10s".into(),
                "--allocate-node-cidrs=false".into(),
                // Else its flexvolume prober makes /usr/libexec/kubernetes on the host.
                format!("--flex-volume-plugin-dir={}", d("kcm-flexvolume")),
            ]);
        } else {
            kcm.arg("--controllers=endpointslice-controller,endpointslice-mirroring-controller");
        }
        procs.push(Process::spawn_command(
            "kube-controller-manager",
            kcm,
            &dir.join("kube-controller-manager.log"),
        )?);

        if cluster.nodes > 0 {
            let node_bin = crate::ensure_node_binaries()?;
            let mut scheduler = std::process::Command::new(&node_bin.kube_scheduler);
            scheduler.args([
                format!("--kubeconfig={}", cluster.admin_path.display()),
                "--leader-elect=false".to_string(),
                "--secure-port=0".into(),
                "--v=1".into(),
            ]);
            procs.push(Process::spawn_command(
                "kube-scheduler",
                scheduler,
                &dir.join("kube-scheduler.log"),
            )?);
        }

        let ip = self.inner.node_ip.to_string();
        let mut proxy = self.inner.node.command(&bin.kube_proxy);
        proxy.args([
            format!("--kubeconfig={kc}"),
            "--proxy-mode=nftables".into(),
            format!("--hostname-override={}", self.inner.node_name),
            format!("--bind-address={ip}"),
            // The global nf_conntrack_max is read-only inside a namespace.
            "--conntrack-max-per-core=0".into(),
            "--healthz-bind-address=127.0.0.1:10256".into(),
            "--metrics-bind-address=127.0.0.1:10249".into(),
            "--v=1".into(),
        ]);
        if cluster.nodes > 0 {
            proxy.arg(format!("--cluster-cidr={}", crate::node::ALL_POD_CIDRS));
        }
        procs.push(Process::spawn_command(
            "kube-proxy",
            proxy,
            &dir.join("kube-proxy.log"),
        )?);

        // cache 2 s: a test that unexports sees the name go within seconds.
        let corefile = format!(
            "cluster.local:53 {{\n  errors\n  health 127.0.0.1:8080\n  ready 127.0.0.1:8181\n  kubernetes cluster.local {{\n    kubeconfig {kc}\n  }}\n  cache 2\n}}\n"
        );
        let corefile_path = dir.join("Corefile");
        std::fs::write(&corefile_path, corefile)?;
        let mut dns = self.inner.node.command(&bin.coredns);
        dns.args(["-conf".to_string(), corefile_path.display().to_string()]);
        procs.push(Process::spawn_command(
            "coredns",
            dns,
            &dir.join("coredns.log"),
        )?);
        Ok(())
    }

    pub(super) async fn wait_ready(&self, service_cidr: &str) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        // The apiserver's own Service gets the first address of the range.
        let kubernetes_ip = first_service_ip(service_cidr)?;
        let mut dns_ok = false;
        let mut proxy_ok = false;
        let mut kcm_ok = false;
        loop {
            self.check_processes()?;
            if !kcm_ok {
                kcm_ok = self
                    .log_tail("kube-controller-manager", 400)
                    .lines()
                    .any(|l| {
                        l.contains("\"Started controller\"")
                            && l.contains("endpointslice-mirroring-controller")
                    });
            }
            if !dns_ok {
                dns_ok = self
                    .resolve("kubernetes.default.svc.cluster.local")
                    .await
                    .is_ok_and(|ips| ips.contains(&kubernetes_ip));
            }
            if !proxy_ok {
                let healthz = SocketAddr::from((Ipv4Addr::LOCALHOST, 10256));
                proxy_ok = self
                    .http_get_addr(healthz, "127.0.0.1", "/healthz")
                    .await
                    .is_ok_and(|a| a.status == 200);
            }
            if dns_ok && proxy_ok && kcm_ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                let which = match (dns_ok, proxy_ok) {
                    (false, _) => "coredns",
                    (true, false) => "kube-proxy",
                    (true, true) => "kube-controller-manager",
                };
                return Err(self.process_error(
                    which,
                    format!("not ready within {}s", READY_TIMEOUT.as_secs()),
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// An error if a process of the data plane has exited.
    pub(super) fn check_processes(&self) -> Result<()> {
        let mut procs = self.processes.lock();
        for p in procs.iter_mut() {
            if let Some(status) = p.exited() {
                return Err(p.start_error(format!("exited: {status}")));
            }
        }
        Ok(())
    }

    pub(super) fn process_error(&self, name: &str, reason: String) -> Error {
        let procs = self.processes.lock();
        match procs.iter().find(|p| p.name() == name) {
            Some(p) => p.start_error(reason),
            None => Error::DataPlane(format!("{name}: {reason}")),
        }
    }
}
