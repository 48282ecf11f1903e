//! Minimal DNS (A queries over UDP) and HTTP/1.1 (one request per connection) on sockets
//! of a node namespace: just what tests, the workload and the gateway need.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// One DNS query waits this long for its answer; [`query_a`] tries 3 times.
const DNS_TIMEOUT: Duration = Duration::from_millis(700);
/// Request heads larger than this are refused (the harness sends ~100 bytes).
const MAX_HEAD: usize = 16 * 1024;

/// A DNS answer to an A query: its response code and its A records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsAnswer {
    /// The response code (0 NOERROR, 3 NXDOMAIN, ...).
    pub rcode: u8,
    /// The A records (none: NXDOMAIN, or NODATA when `rcode` is 0).
    pub addresses: Vec<Ipv4Addr>,
}

/// The A records for `name` from the server at `server`; empty for NXDOMAIN or no A record.
pub(crate) async fn query_a(
    socket: &UdpSocket,
    server: SocketAddr,
    name: &str,
) -> std::io::Result<Vec<Ipv4Addr>> {
    let answer = query_a_answer(socket, server, name).await?;
    match answer.rcode {
        0 | 3 => Ok(answer.addresses),
        rcode => Err(std::io::Error::other(format!("DNS rcode {rcode}"))),
    }
}

/// The answer to an A query for `name` from the server at `server`, whatever its code.
pub(crate) async fn query_a_answer(
    socket: &UdpSocket,
    server: SocketAddr,
    name: &str,
) -> std::io::Result<DnsAnswer> {
    let id: u16 = rand_id();
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    // Flags: recursion desired; one question.
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(std::io::Error::other(format!("bad DNS name {name:?}")));
        }
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]); // root, type A, class IN
    let mut buf = [0u8; 1500];
    let mut last = std::io::Error::other("no attempt");
    for _ in 0..3 {
        socket.send_to(&q, server).await?;
        match tokio::time::timeout(DNS_TIMEOUT, socket.recv_from(&mut buf)).await {
            Ok(Ok((n, _))) if n >= 12 && buf[..2] == id.to_be_bytes() => {
                return parse_a(&buf[..n]);
            }
            Ok(Ok(_)) => last = std::io::Error::other("unrelated DNS answer"),
            Ok(Err(e)) => last = e,
            Err(_) => {
                last = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no DNS answer from {server} in {DNS_TIMEOUT:?}"),
                )
            }
        }
    }
    Err(last)
}

fn rand_id() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::Instant::now()) as u16
}

fn parse_a(msg: &[u8]) -> std::io::Result<DnsAnswer> {
    let bad = || std::io::Error::other("malformed DNS answer");
    let rcode = msg[3] & 0x0f;
    if rcode != 0 {
        return Ok(DnsAnswer {
            rcode,
            addresses: Vec::new(),
        });
    }
    let qd = u16::from_be_bytes([msg[4], msg[5]]);
    let an = u16::from_be_bytes([msg[6], msg[7]]);
    let mut i = 12;
    let skip_name = |mut i: usize| -> Option<usize> {
        loop {
            let l = *msg.get(i)? as usize;
            if l == 0 {
                return Some(i + 1);
            }
            if l & 0xc0 == 0xc0 {
                return Some(i + 2);
            }
            i += 1 + l;
        }
    };
    for _ in 0..qd {
        i = skip_name(i).ok_or_else(bad)? + 4;
    }
    let mut out = Vec::new();
    for _ in 0..an {
        i = skip_name(i).ok_or_else(bad)?;
        let h = msg.get(i..i + 10).ok_or_else(bad)?;
        let (ty, len) = (
            u16::from_be_bytes([h[0], h[1]]),
            u16::from_be_bytes([h[8], h[9]]) as usize,
        );
        let data = msg.get(i + 10..i + 10 + len).ok_or_else(bad)?;
        if ty == 1 && len == 4 {
            out.push(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
        }
        i += 10 + len;
    }
    Ok(DnsAnswer {
        rcode,
        addresses: out,
    })
}

/// An HTTP answer: status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAnswer {
    /// The status code.
    pub status: u16,
    /// The body, as text.
    pub body: String,
}

/// Sends `GET <path>` with `Host: <host>` on `stream` and reads the answer to its end.
pub(crate) async fn http_get(
    mut stream: TcpStream,
    host: &str,
    path: &str,
) -> std::io::Result<HttpAnswer> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no HTTP answer: {text:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no HTTP status: {head:?}")))?;
    Ok(HttpAnswer {
        status,
        body: body.to_string(),
    })
}

/// Reads a request head (up to the blank line) from `stream`: the raw bytes read so far,
/// the request path and the Host header.
pub(crate) async fn read_head(
    stream: &mut TcpStream,
) -> std::io::Result<(Vec<u8>, String, Option<String>)> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 2048];
    while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 || raw.len() > MAX_HEAD {
            return Err(std::io::Error::other("incomplete request head"));
        }
        raw.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let path = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("/")
        .to_string();
    let host = text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("host").then(|| v.trim().to_string())
    });
    Ok((raw, path, host))
}

/// Writes a complete `HTTP/1.1 <status>` answer with `body` and closes the write side.
pub(crate) async fn respond(
    stream: &mut TcpStream,
    status: u16,
    body: &str,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        502 => "Bad Gateway",
        _ => "Status",
    };
    let answer = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(answer.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_records_and_nxdomain() {
        // Header (id 1, 1 question, 1 answer), question web.x A IN, answer ptr to it.
        let mut m = vec![0, 1, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0];
        m.extend_from_slice(&[3, b'w', b'e', b'b', 1, b'x', 0, 0, 1, 0, 1]);
        m.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4, 198, 18, 1, 7]);
        assert_eq!(
            parse_a(&m).unwrap(),
            DnsAnswer {
                rcode: 0,
                addresses: vec![Ipv4Addr::new(198, 18, 1, 7)]
            }
        );
        let mut nx = m[..12].to_vec();
        nx[3] = 0x83;
        nx[7] = 0;
        assert_eq!(
            parse_a(&nx).unwrap(),
            DnsAnswer {
                rcode: 3,
                addresses: Vec::new()
            }
        );
    }
}
