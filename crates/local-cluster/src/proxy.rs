//! A loopback TCP forwarder whose connectivity a test can cut and restore: a network
//! outage between one client and an apiserver, while everyone else still reaches it.

use crate::Result;
use parking_lot::Mutex;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// How many connections may wait to be accepted.
const BACKLOG: u32 = 128;

/// A TCP forwarder from `127.0.0.1:<free port>` to a target address.
///
/// Every accepted connection is forwarded byte for byte (TLS passes through untouched, so
/// a client verifies the target's certificate: point it at [`TcpProxy::addr`] with a
/// kubeconfig from [`crate::LocalCluster::admin_kubeconfig_via`] or
/// [`crate::Kubeconfig::via`]).
///
/// [`TcpProxy::cut`] drops every open connection and refuses new ones (connection
/// refused: the port stays bound but does not listen, so nobody else can take it) until
/// [`TcpProxy::restore`]. Dropping the proxy stops it and drops its connections. Its tasks
/// run on the tokio runtime that called [`TcpProxy::start`].
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    target: SocketAddr,
    runtime: tokio::runtime::Handle,
    state: Mutex<State>,
    stats: Arc<Stats>,
}

#[derive(Debug, Default)]
struct Stats {
    accepted: AtomicU64,
    open: AtomicU64,
}

#[derive(Debug)]
enum State {
    /// Listening on the socket `fd`; the task owns it, accepts and owns every
    /// connection task.
    Forwarding(JoinHandle<()>, RawFd),
    /// The port is held by a bound socket that does not listen: connections are refused.
    Cut(TcpSocket),
    /// Neither: a restore failed and the port could not be held again.
    Stopped,
}

/// A socket bound to `addr` that allows another socket of this user on the same port
/// (so the port can be held while the listener is closed).
fn bound_socket(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

impl TcpProxy {
    /// Starts forwarding from a free port on 127.0.0.1 to `target`. Call it inside a
    /// tokio runtime.
    pub async fn start(target: SocketAddr) -> Result<Self> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), target).await
    }

    /// Starts forwarding from `listen` (port 0: a free one) to `target`: the data plane
    /// listens on the host side of its veth so that a node namespace reaches an apiserver
    /// bound to 127.0.0.1.
    pub async fn start_on(listen: SocketAddr, target: SocketAddr) -> Result<Self> {
        let socket = bound_socket(listen)?;
        let addr = socket.local_addr()?;
        let listener = socket.listen(BACKLOG)?;
        let fd = listener.as_raw_fd();
        let stats = Arc::new(Stats::default());
        let task = tokio::spawn(forward(listener, target, stats.clone()));
        Ok(Self {
            addr,
            target,
            runtime: tokio::runtime::Handle::current(),
            state: Mutex::new(State::Forwarding(task, fd)),
            stats,
        })
    }

    /// Where clients connect: `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where connections are forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Connections accepted and forwarded since the start.
    pub fn accepted(&self) -> u64 {
        self.stats.accepted.load(Ordering::SeqCst)
    }

    /// Connections open right now.
    pub fn open_connections(&self) -> u64 {
        self.stats.open.load(Ordering::SeqCst)
    }

    /// Whether the proxy is cut.
    pub fn is_cut(&self) -> bool {
        matches!(*self.lock(), State::Cut(_))
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Drops every open connection and refuses new ones until [`TcpProxy::restore`];
    /// returns once every connection is closed. Cutting a cut proxy does nothing.
    pub async fn cut(&self) -> Result<()> {
        let task = {
            let mut state = self.lock();
            let State::Forwarding(_, fd) = *state else {
                return Ok(());
            };
            // Hold the port before the listener goes, so nobody can take it meanwhile.
            let holder = bound_socket(self.addr)?;
            stop_listening(fd);
            match std::mem::replace(&mut *state, State::Cut(holder)) {
                State::Forwarding(task, _) => task,
                _ => unreachable!("matched above"),
            }
        };
        // Aborting the accept task drops the listener and its set of connection tasks,
        // which aborts them all and closes both sides of every connection.
        task.abort();
        let _ = task.await;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while self.open_connections() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        Ok(())
    }

    /// Accepts and forwards connections again after [`TcpProxy::cut`], on the same port.
    /// Restoring a forwarding proxy does nothing.
    pub fn restore(&self) -> Result<()> {
        let mut state = self.lock();
        if matches!(*state, State::Cut(_)) {
            let State::Cut(holder) = std::mem::replace(&mut *state, State::Stopped) else {
                unreachable!("matched above")
            };
            let _guard = self.runtime.enter();
            match holder.listen(BACKLOG) {
                Ok(listener) => {
                    let fd = listener.as_raw_fd();
                    let task =
                        self.runtime
                            .spawn(forward(listener, self.target, self.stats.clone()));
                    *state = State::Forwarding(task, fd);
                }
                Err(e) => {
                    // The holder is gone with the failed listen; hold the port again if we can.
                    if let Ok(holder) = bound_socket(self.addr) {
                        *state = State::Cut(holder);
                    }
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let State::Forwarding(task, fd) = &*self.lock() {
            stop_listening(*fd);
            task.abort();
        }
    }
}

/// Makes the listening socket `fd` refuse connections at once. Closing it is not enough:
/// a child process forked by another thread (a test starting a cluster) shares the
/// socket until it execs, and it would accept meanwhile. `fd` must be the open listener
/// of a forwarding proxy (its task, which owns it, is still running).
fn stop_listening(fd: RawFd) {
    // SAFETY: `fd` is an open socket owned by the accept task, which is not dropped yet;
    // shutdown does not close it. On Linux a shut down listener stops listening.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

/// Shuts both sockets of a connection down when dropped, before they are closed: a
/// forked child sharing them (see [`stop_listening`]) cannot keep the connection open.
struct ShutdownOnDrop([RawFd; 2]);

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        for fd in self.0 {
            // SAFETY: the streams owning these fds are declared before this guard in the
            // same task, so they are still open here; shutdown does not close them.
            unsafe {
                libc::shutdown(fd, libc::SHUT_RDWR);
            }
        }
    }
}

/// Counts one open connection while it lives (also when its task is aborted).
struct OpenGuard(Arc<Stats>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn forward(listener: TcpListener, target: SocketAddr, stats: Arc<Stats>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut inbound, _)) = accepted else {
                    // Out of file descriptors, say: do not spin.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                stats.accepted.fetch_add(1, Ordering::SeqCst);
                stats.open.fetch_add(1, Ordering::SeqCst);
                let guard = OpenGuard(stats.clone());
                connections.spawn(async move {
                    let _guard = guard;
                    let _ = inbound.set_nodelay(true);
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = outbound.set_nodelay(true);
                    // Dropped first, also when the task is aborted.
                    let _shutdown = ShutdownOnDrop([inbound.as_raw_fd(), outbound.as_raw_fd()]);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}
