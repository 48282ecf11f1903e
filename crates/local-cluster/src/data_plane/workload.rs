//! An HTTP workload serving a fixed body inside a node's namespace.

use super::*;

impl DataPlane {
    /// Starts an HTTP server on `<node ip>:<port>` of this node that answers every
    /// request with 200 and `body`: a workload whose address a test publishes as a
    /// Service's Endpoints. Stops when the handle drops.
    pub fn serve_http(&self, port: u16, body: &str) -> Result<Workload> {
        self.serve_http_at(self.inner.node_ip, port, body)
    }

    /// [`DataPlane::serve_http`] on another address of this node
    /// ([`DataPlane::add_address`]): a second "pod" of the node.
    pub fn serve_http_at(&self, ip: Ipv4Addr, port: u16, body: &str) -> Result<Workload> {
        let addr = SocketAddr::from((ip, port));
        let listener = self.inner.node.tcp_listener(addr)?;
        let body = body.to_string();
        let _guard = self.runtime().enter();
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let task = self.runtime().spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let body = body.clone();
                tokio::spawn(async move {
                    let answer = async {
                        wire::read_head(&mut s).await?;
                        wire::respond(&mut s, 200, &body).await
                    };
                    let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer).await;
                });
            }
        });
        Ok(Workload { addr, task })
    }
}

/// A test workload: an HTTP server in a node namespace (see [`DataPlane::serve_http`]).
#[derive(Debug)]
pub struct Workload {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Workload {
    /// Where it listens (a node address): publish it as the Service's endpoint.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.task.abort();
    }
}
