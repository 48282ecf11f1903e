//! `TcpProxy`: forwarding, cut and restore, on plain TCP and with a real apiserver client.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, WatchParams};
use local_cluster::{TcpProxy, shared_cluster};
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An echo server on 127.0.0.1; runs until the test's runtime ends.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
    s.write_all(msg).await?;
    let mut buf = vec![0; msg.len()];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
        .await
        .map_err(|_| std::io::Error::new(ErrorKind::TimedOut, "no echo within 5 s"))??;
    Ok(buf)
}

/// Whether a connection to `addr` is refused.
async fn refused(addr: SocketAddr) -> bool {
    matches!(TcpStream::connect(addr).await, Err(e) if e.kind() == ErrorKind::ConnectionRefused)
}

#[tokio::test]
async fn cut_drops_connections_and_refuses_new_ones_until_restored() {
    let target = echo_server().await;
    let proxy = TcpProxy::start(target).await.unwrap();
    assert!(proxy.addr().ip().is_loopback());
    assert_ne!(proxy.addr(), target);

    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut s, b"hello").await.unwrap(), b"hello");
    assert_eq!(proxy.accepted(), 1);
    assert_eq!(proxy.open_connections(), 1);

    proxy.cut().await.unwrap();
    assert!(proxy.is_cut());
    assert_eq!(proxy.open_connections(), 0, "cut closes every connection");
    // The open connection is gone: EOF or reset, not an echo.
    let mut buf = [0u8; 8];
    let _ = s.write_all(b"lost").await;
    let read = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("the cut connection answers at once");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "cut connection still forwards: {read:?}"
    );
    assert!(refused(proxy.addr()).await, "new connections are refused");
    proxy.cut().await.unwrap(); // idempotent

    proxy.restore().unwrap();
    assert!(!proxy.is_cut());
    proxy.restore().unwrap(); // idempotent
    let mut s = TcpStream::connect(proxy.addr())
        .await
        .expect("same port again");
    assert_eq!(round_trip(&mut s, b"again").await.unwrap(), b"again");
    assert_eq!(proxy.accepted(), 2);

    let addr = proxy.addr();
    drop(proxy);
    // The accept task is aborted by the drop; the runtime closes its listener shortly.
    let mut stopped = false;
    for _ in 0..100 {
        if refused(addr).await {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(stopped, "a dropped proxy refuses connections");
    let read = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("the dropped proxy's connection answers at once");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}

/// A child forked by another thread (a test starting a cluster, say) shares every socket
/// of the process until it execs: a closed listener would still accept meanwhile.
#[tokio::test]
async fn cut_refuses_at_once_even_while_another_thread_forks() {
    use std::os::unix::process::CommandExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let target = echo_server().await;
    let stop = Arc::new(AtomicBool::new(false));
    let forking = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut forks = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut child = std::process::Command::new("true");
                // SAFETY: an empty pre-exec hook (it makes std fork rather than spawn).
                unsafe {
                    child.pre_exec(|| Ok(()));
                }
                let _ = child.status();
                forks += 1;
            }
            forks
        })
    };
    let mut accepted = 0;
    for _ in 0..1000 {
        let proxy = TcpProxy::start(target).await.unwrap();
        proxy.cut().await.unwrap();
        if TcpStream::connect(proxy.addr()).await.is_ok() {
            accepted += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let forks = forking.join().unwrap();
    assert!(forks > 0);
    assert_eq!(
        accepted, 0,
        "connections accepted after cut ({forks} forks meanwhile)"
    );
}

#[tokio::test]
async fn apiserver_clients_through_the_proxy_lose_and_regain_the_cluster() {
    let cluster = shared_cluster("proxied").await.unwrap();
    let proxy = TcpProxy::start(cluster.apiserver_addr()).await.unwrap();
    assert_eq!(proxy.target(), cluster.apiserver_addr());
    let kubeconfig = cluster.admin_kubeconfig_via(proxy.addr()).unwrap();
    assert!(
        kubeconfig
            .yaml
            .contains(&format!("server: https://{}\n", proxy.addr())),
        "{}",
        kubeconfig.yaml
    );
    assert!(kubeconfig.path.is_file());
    assert_ne!(kubeconfig.path, cluster.admin_kubeconfig().path);
    let proxied = kubeconfig.client().await.unwrap();
    let direct = cluster.client().await.unwrap();
    let proxied_ns: Api<Namespace> = Api::all(proxied);
    let direct_ns: Api<Namespace> = Api::all(direct);

    // TLS passes through and verifies against the cluster CA.
    let listed = proxied_ns.list(&ListParams::default()).await.unwrap();
    assert!(
        listed
            .items
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some("default"))
    );
    assert!(proxy.accepted() >= 1);

    // A long watch through the proxy.
    let rv = listed.metadata.resource_version.unwrap();
    let mut watch = Box::pin(
        proxied_ns
            .watch(&WatchParams::default().timeout(290), &rv)
            .await
            .unwrap(),
    );
    assert!(proxy.open_connections() >= 1);

    proxy.cut().await.unwrap();
    // The watch ends or fails within moments: its connection is gone.
    let next = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the cut watch ends at once");
    assert!(
        matches!(next, None | Some(Err(_))),
        "the cut watch still delivers: {next:?}"
    );
    drop(watch);
    let during = tokio::time::timeout(
        Duration::from_secs(10),
        proxied_ns.list(&ListParams::default()),
    )
    .await
    .expect("a cut request fails at once, it does not hang");
    assert!(during.is_err(), "the proxied client cannot list while cut");
    assert!(refused(proxy.addr()).await);
    direct_ns
        .list(&ListParams::default())
        .await
        .expect("the direct client is not affected");

    proxy.restore().unwrap();
    let after = proxied_ns
        .list(&ListParams::default())
        .await
        .expect("the same client works again after restore");
    assert!(!after.items.is_empty());
}
