//! The `clusterset.local` DNS zone (`--clusterset-dns-addr`), served from the MCS
//! component's caches of the ServiceImports (as Submariner's Lighthouse serves it): a
//! cluster's CoreDNS forwards the zone here (`clusterset.local:53 { forward . <addr> }`).
//!
//! Files: `wire.rs` (the DNS wire format: a query read, a response written and cut to
//! size), `answer.rs` (the zone's answers, pure, table-tested in `answer_tests.rs`),
//! `metrics.rs`; the data comes from a [`Zone`] (`crate::mcs::dns_view`). Every replica
//! answers (reads only: no leadership).
//!
//! Bounds: UDP messages are read into a 4 KiB buffer (a longer datagram is cut, and a
//! query cut so is a FORMERR) and answered in order on one task (an answer is a lookup
//! under the caches' lock, microseconds); TCP takes at most [`MAX_TCP_CONNECTIONS`]
//! connections at once (more are closed at once), each message at most 64 KiB (its
//! length prefix), each read and write within [`TCP_IDLE`] (then the connection is
//! closed).

pub(crate) mod answer;
#[cfg(test)]
mod answer_tests;
pub(crate) mod metrics;
pub(crate) mod wire;

pub(crate) use answer::Zone;
use answer::{Lookup, answer};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use wire::{Echo, ReadError, Response};

/// TCP connections served at once; one more is closed at once.
pub(crate) const MAX_TCP_CONNECTIONS: usize = 64;
/// A TCP connection idle this long (no whole query), or this slow to take an answer,
/// is closed (RFC 7766 suggests seconds).
pub(crate) const TCP_IDLE: Duration = Duration::from_secs(10);
/// The UDP receive buffer.
const UDP_BUFFER: usize = 4096;

/// The zone when MCS does not run: every name of it SERVFAIL (the zone cannot be
/// served; other zones are still REFUSED).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unserved;

impl Zone for Unserved {
    fn service(&self, _: &str, _: &str) -> Lookup {
        Lookup::NotListed
    }

    fn namespace_exists(&self, _: &str) -> Option<bool> {
        None
    }
}

/// Parses `--clusterset-dns-addr`: empty is off, `:5353` every interface (`[::]:5353`:
/// IPv6 and, dual-stack, IPv4; [`serve`] falls back to `0.0.0.0` where IPv6 is off).
pub(crate) fn parse_addr(addr: &str) -> anyhow::Result<Option<SocketAddr>> {
    let addr = addr.trim();
    if addr.is_empty() {
        return Ok(None);
    }
    let full = if addr.starts_with(':') {
        format!("[::]{addr}")
    } else {
        addr.to_string()
    };
    full.parse()
        .map(Some)
        .map_err(|e| anyhow::anyhow!("invalid --clusterset-dns-addr {addr:?}: {e}"))
}

/// The zone to serve: the MCS component's imports, or, without MCS, a warning and a
/// zone that answers SERVFAIL (the Service CoreDNS forwards to answers at once rather
/// than time out; a restart once MCS can run serves it).
pub(crate) fn zone_of(mcs: Option<&crate::mcs::Mcs>) -> Arc<dyn Zone + Send + Sync> {
    match mcs {
        Some(mcs) => mcs.clusterset_zone(),
        None => {
            tracing::warn!(
                "--clusterset-dns-addr is set but MCS does not run (no ServiceExport CRD or no cluster name): clusterset.local answers SERVFAIL until the controller restarts with MCS on"
            );
            Arc::new(Unserved)
        }
    }
}

/// The answer to one message, and its response code (`None`: dropped); `tcp` picks the
/// size limit.
pub(crate) fn respond(
    msg: &[u8],
    zone: &(impl Zone + ?Sized),
    tcp: bool,
) -> Option<(Vec<u8>, wire::Rcode, bool)> {
    match wire::read_query(msg) {
        Ok(q) => {
            let limit = wire::size_limit(q.edns, tcp);
            let resp = answer(&q, zone, limit);
            let out = wire::write_response(&Echo::of(&q), &resp, limit);
            let truncated = out[2] & 0x02 != 0;
            Some((out, resp.rcode, truncated))
        }
        Err(ReadError::Drop) => None,
        Err(ReadError::FormErr {
            id,
            opcode,
            rd,
            edns,
        }) => {
            let echo = Echo {
                id,
                opcode,
                rd,
                question: None,
                edns,
            };
            let resp = Response::empty(wire::Rcode::FormErr);
            Some((
                wire::write_response(&echo, &resp, wire::UDP_PLAIN_MAX),
                wire::Rcode::FormErr,
                false,
            ))
        }
    }
}

/// Binds `addr` (UDP and TCP, the same port: with port 0, the one TCP got) and serves
/// the zone until `shutdown`; returns the bound address and the two tasks. `[::]` is
/// bound dual-stack (IPv4 too); where IPv6 is unavailable (a kernel or pod without it)
/// it falls back to `0.0.0.0` with a warning.
pub(crate) async fn serve(
    addr: SocketAddr,
    zone: Arc<dyn Zone + Send + Sync>,
    metrics: Arc<crate::metrics::Metrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, Vec<JoinHandle<()>>)> {
    let (tcp, udp) = match bind(addr).await {
        Ok(sockets) => sockets,
        Err(v6) if addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) => {
            let v4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()));
            tracing::warn!(error = %v6, %v4, "clusterset.local DNS: IPv6 unavailable, listening on IPv4 only");
            bind(v4).await?
        }
        Err(e) => return Err(e),
    };
    let bound = tcp.local_addr()?;
    let udp_task = tokio::spawn(serve_udp(
        udp,
        zone.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));
    let tcp_task = tokio::spawn(serve_tcp(tcp, zone, metrics, shutdown));
    tracing::info!(%bound, "clusterset.local DNS server listening (UDP and TCP)");
    Ok((bound, vec![udp_task, tcp_task]))
}

/// The TCP listener and the UDP socket on `addr` (`[::]`: dual-stack).
async fn bind(addr: SocketAddr) -> anyhow::Result<(TcpListener, UdpSocket)> {
    let v6_any = addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED);
    let tcp = {
        let socket = if addr.is_ipv6() {
            TcpSocket::new_v6()
        } else {
            TcpSocket::new_v4()
        };
        socket
            .and_then(|s| {
                if v6_any {
                    // Explicitly, whatever net.ipv6.bindv6only says.
                    socket2::SockRef::from(&s).set_only_v6(false)?;
                }
                s.set_reuseaddr(true)?;
                s.bind(addr)?;
                s.listen(1024)
            })
            .map_err(|e| {
                anyhow::anyhow!("binding the clusterset.local DNS server (TCP) to {addr}: {e}")
            })?
    };
    let bound = tcp.local_addr()?;
    let udp = {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(bound),
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        );
        socket
            .and_then(|s| {
                if v6_any {
                    s.set_only_v6(false)?;
                }
                s.set_nonblocking(true)?;
                s.bind(&bound.into())?;
                Ok(s)
            })
            .and_then(|s| UdpSocket::from_std(s.into()))
            .map_err(|e| {
                anyhow::anyhow!("binding the clusterset.local DNS server (UDP) to {bound}: {e}")
            })?
    };
    Ok((tcp, udp))
}

async fn serve_udp(
    socket: UdpSocket,
    zone: Arc<dyn Zone + Send + Sync>,
    metrics: Arc<crate::metrics::Metrics>,
    shutdown: CancellationToken,
) {
    let mut buf = vec![0u8; UDP_BUFFER];
    loop {
        let (len, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = socket.recv_from(&mut buf) => match r {
                Ok(r) => r,
                Err(e) => {
                    // ICMP errors of earlier sends surface here on some systems.
                    tracing::debug!(error = %e, "clusterset.local DNS: UDP receive failed");
                    continue;
                }
            },
        };
        match respond(&buf[..len], zone.as_ref(), false) {
            Some((out, rcode, truncated)) => {
                metrics.dns.query("udp", rcode.label(), truncated);
                if let Err(e) = socket.send_to(&out, peer).await {
                    tracing::debug!(error = %e, %peer, "clusterset.local DNS: UDP send failed");
                }
            }
            None => metrics.dns.drop("malformed"),
        }
    }
}

async fn serve_tcp(
    listener: TcpListener,
    zone: Arc<dyn Zone + Send + Sync>,
    metrics: Arc<crate::metrics::Metrics>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_TCP_CONNECTIONS));
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: wait a little rather than spin.
                    tracing::warn!(error = %e, "clusterset.local DNS: TCP accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            metrics.dns.drop("tcp_connections");
            drop(stream);
            continue;
        };
        let (zone, metrics, shutdown) = (zone.clone(), metrics.clone(), shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = serve_connection(stream, zone.as_ref(), &metrics) => {}
            }
            drop(permit);
        });
    }
}

/// Queries of one TCP connection, one after another, until it closes, sends something
/// unreadable or idles past [`TCP_IDLE`].
async fn serve_connection(
    mut stream: TcpStream,
    zone: &(dyn Zone + Send + Sync),
    metrics: &crate::metrics::Metrics,
) {
    let mut buf = Vec::new();
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return,
            Err(_) => return metrics.dns.drop("tcp_timeout"),
        }
        let len = u16::from_be_bytes(len) as usize;
        buf.resize(len, 0);
        match tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut buf)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return,
            Err(_) => return metrics.dns.drop("tcp_timeout"),
        }
        let Some((out, rcode, truncated)) = respond(&buf, zone, true) else {
            return metrics.dns.drop("malformed");
        };
        metrics.dns.query("tcp", rcode.label(), truncated);
        let mut framed = Vec::with_capacity(out.len() + 2);
        framed.extend_from_slice(&(out.len() as u16).to_be_bytes());
        framed.extend_from_slice(&out);
        match tokio::time::timeout(TCP_IDLE, stream.write_all(&framed)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => return metrics.dns.drop("tcp_timeout"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query for `clusterset.local.` SOA, id 7.
    const QUERY: [u8; 34] = [
        0, 7, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, b'c', b'l', b'u', b's', b't', b'e', b'r', b's',
        b'e', b't', 5, b'l', b'o', b'c', b'a', b'l', 0, 0, 6, 0, 1,
    ];

    #[test]
    fn a_port_alone_is_every_interface_ipv6_and_ipv4() {
        assert_eq!(
            parse_addr(":5353").unwrap(),
            Some("[::]:5353".parse().unwrap())
        );
        assert_eq!(
            parse_addr("10.0.0.1:53").unwrap(),
            Some("10.0.0.1:53".parse().unwrap())
        );
        assert_eq!(parse_addr(" ").unwrap(), None);
        assert!(parse_addr("nope").is_err());
    }

    /// `:0` answers over IPv4 and, where the host has IPv6, over IPv6 (one dual-stack
    /// socket), UDP and TCP.
    #[tokio::test]
    async fn every_interface_answers_over_ipv4_and_ipv6() {
        let shutdown = CancellationToken::new();
        let addr = parse_addr(":0").unwrap().unwrap();
        let (bound, tasks) = serve(
            addr,
            Arc::new(Unserved),
            crate::metrics::Metrics::new(),
            shutdown.clone(),
        )
        .await
        .unwrap();
        let v6 = std::net::UdpSocket::bind("[::1]:0").is_ok();
        let mut targets = vec![SocketAddr::from((Ipv4Addr::LOCALHOST, bound.port()))];
        if v6 {
            assert!(bound.is_ipv6(), "{bound}");
            targets.push(SocketAddr::from((Ipv6Addr::LOCALHOST, bound.port())));
        }
        for to in targets {
            let udp = UdpSocket::bind(SocketAddr::new(
                if to.is_ipv4() {
                    Ipv4Addr::UNSPECIFIED.into()
                } else {
                    Ipv6Addr::UNSPECIFIED.into()
                },
                0,
            ))
            .await
            .unwrap();
            udp.send_to(&QUERY, to).await.unwrap();
            let mut buf = [0u8; 512];
            let (n, _) = tokio::time::timeout(Duration::from_secs(5), udp.recv_from(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("no UDP answer from {to}"))
                .unwrap();
            // The apex's SOA (the one name answered without MCS), id echoed.
            assert!(n >= 12);
            assert_eq!(
                (&buf[..2], buf[3] & 0x0f, buf[7]),
                (&[0, 7][..], 0, 1),
                "UDP {to}"
            );
            let mut tcp = TcpStream::connect(to).await.unwrap();
            let mut framed = (QUERY.len() as u16).to_be_bytes().to_vec();
            framed.extend_from_slice(&QUERY);
            tcp.write_all(&framed).await.unwrap();
            let mut len = [0u8; 2];
            tcp.read_exact(&mut len).await.unwrap();
            let mut out = vec![0u8; u16::from_be_bytes(len) as usize];
            tcp.read_exact(&mut out).await.unwrap();
            assert_eq!(
                (&out[..2], out[3] & 0x0f, out[7]),
                (&[0, 7][..], 0, 1),
                "TCP {to}"
            );
            eprintln!("{to}: answered over UDP and TCP");
        }
        shutdown.cancel();
        for t in tasks {
            t.await.unwrap();
        }
    }
}
