//! The PROXY protocol (v1 text, v2 binary) that load balancers listed in `server.proxy_protocol` open each connection with: read under a bound on time and bytes, its source address, and why a connection was refused.
//!
//! A TCP load balancer (HAProxy in TCP mode, a cloud network load balancer)
//! cannot add `X-Forwarded-For`: it says who its client is in a header it
//! writes before the client's first byte, TLS handshake included. From a
//! listed peer that header is required, and its source address is the
//! client from then on (identity, limits, logs, FastCGI `REMOTE_ADDR`,
//! `X-Forwarded-For`). From any other peer nothing is read here: a PROXY
//! header it sends is just a malformed request (or handshake), so no client
//! can name its own address.
//!
//! As the protocol says, a v2 `LOCAL` command (the balancer's own health
//! check) and a v1 `UNKNOWN` or a v2 header without an IP address family
//! carry no client: the connection is the peer's own. v2 TLVs are skipped
//! unread. Parsing is `ppp`'s; what is read is bounded here: at most
//! [`MAX_HEADER`] bytes, within the budget the caller gives (the same as a
//! request head's), and nothing past the header is lost: bytes that arrived
//! with it are handed on in front of the stream ([`Prefixed`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use ppp::{v1, v2, HeaderResult, PartialResult};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use crate::metrics::{inc, Counter, Metrics};

/// The longest header read: v1 is at most 107 bytes, a v2 header 16 plus
/// its addresses (at most 216) plus TLVs. Balancers send a few TLVs (an
/// endpoint id, TLS facts) in far less; a longer one is refused rather than
/// buffered, whatever length its first bytes announce.
pub const MAX_HEADER: usize = 4096;

/// The v2 signature, 12 bytes.
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";
/// What every v1 header starts with.
const V1_SIGNATURE: &[u8] = b"PROXY ";

/// Why a connection from a listed peer was closed before HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The first bytes are not a PROXY header (a request, a TLS hello).
    Missing,
    /// A PROXY header that breaks the protocol's rules.
    Invalid,
    /// A v2 header longer than [`MAX_HEADER`].
    TooLong,
    /// No complete header within the budget.
    Timeout,
    /// The peer closed (or the read failed) before the header was complete.
    Closed,
}

impl Refused {
    pub const ALL: [Refused; 5] = [
        Refused::Missing,
        Refused::Invalid,
        Refused::TooLong,
        Refused::Timeout,
        Refused::Closed,
    ];

    /// The `reason` label of `tollgate_proxy_protocol_refused_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Missing => "missing",
            Refused::Invalid => "invalid",
            Refused::TooLong => "too_long",
            Refused::Timeout => "timeout",
            Refused::Closed => "closed",
        }
    }
}

/// A header read off a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// 1 or 2.
    pub version: u8,
    /// The client, or `None` when the header names none (v2 `LOCAL`, v1
    /// `UNKNOWN`, a v2 family other than IPv4/IPv6): the peer is the client.
    pub source: Option<SocketAddr>,
    /// Bytes that arrived after the header: the start of the client's stream.
    pub rest: Bytes,
}

/// What the bytes received so far make.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A header `len` bytes long.
    Complete {
        version: u8,
        source: Option<SocketAddr>,
        len: usize,
    },
    /// A header so far; more bytes may complete it.
    Incomplete,
    Refused(Refused),
}

/// Parses the start of a connection. Never reads past `input` and never
/// panics (`tests/proxy_protocol_parse.rs` feeds it arbitrary bytes).
pub fn parse(input: &[u8]) -> Parsed {
    let starts = |signature: &[u8]| input.starts_with(signature) || signature.starts_with(input);
    let v1 = starts(V1_SIGNATURE);
    if !v1 && !starts(V2_SIGNATURE) {
        // A request line, a TLS hello: the balancer sent no header at all.
        return Parsed::Refused(Refused::Missing);
    }
    if let Some(declared) = v2_declared_len(input) {
        if declared > MAX_HEADER {
            return Parsed::Refused(Refused::TooLong);
        }
    }
    match HeaderResult::parse(input) {
        HeaderResult::V2(Ok(h)) => Parsed::Complete {
            version: 2,
            source: v2_source(&h),
            len: h.len(),
        },
        HeaderResult::V1(Ok(h)) => Parsed::Complete {
            version: 1,
            source: v1_source(&h.addresses),
            len: h.header.len(),
        },
        // A v1 line ends at its first newline: past it, nothing completes it.
        r if r.is_incomplete() && !(v1 && input.contains(&b'\n')) => Parsed::Incomplete,
        _ => Parsed::Refused(Refused::Invalid),
    }
}

/// The whole length a v2 header announces (16 + its length field), once
/// its fixed part has arrived.
fn v2_declared_len(input: &[u8]) -> Option<usize> {
    if input.len() < 16 || !input.starts_with(V2_SIGNATURE) {
        return None;
    }
    Some(16 + usize::from(u16::from_be_bytes([input[14], input[15]])))
}

fn v2_source(h: &v2::Header<'_>) -> Option<SocketAddr> {
    if h.command != v2::Command::Proxy {
        return None;
    }
    match h.addresses {
        v2::Addresses::IPv4(a) => {
            Some(SocketAddr::new(IpAddr::V4(a.source_address), a.source_port))
        }
        v2::Addresses::IPv6(a) => {
            Some(SocketAddr::new(IpAddr::V6(a.source_address), a.source_port))
        }
        v2::Addresses::Unspecified | v2::Addresses::Unix(_) => None,
    }
}

fn v1_source(addresses: &v1::Addresses) -> Option<SocketAddr> {
    match addresses {
        v1::Addresses::Tcp4(a) => {
            Some(SocketAddr::new(IpAddr::V4(a.source_address), a.source_port))
        }
        v1::Addresses::Tcp6(a) => {
            Some(SocketAddr::new(IpAddr::V6(a.source_address), a.source_port))
        }
        v1::Addresses::Unknown => None,
    }
}

/// Reads a header off `io` within `budget`: the header, or why the
/// connection must be closed. Reads at most [`MAX_HEADER`] bytes.
pub async fn read_header<I: AsyncRead + Unpin>(
    io: &mut I,
    budget: Duration,
) -> Result<Header, Refused> {
    let mut buf = BytesMut::with_capacity(256);
    let read = async {
        loop {
            // Never more than the bound, whatever the peer has queued.
            let room = MAX_HEADER.saturating_sub(buf.len());
            if room == 0 {
                return Err(Refused::TooLong);
            }
            let mut chunk = (&mut *io).take(room as u64);
            match chunk.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return Err(Refused::Closed),
                Ok(_) => {}
            }
            match parse(&buf) {
                Parsed::Complete {
                    version,
                    source,
                    len,
                } => {
                    buf.advance(len);
                    return Ok(Header {
                        version,
                        source,
                        rest: buf.split().freeze(),
                    });
                }
                Parsed::Incomplete => {}
                Parsed::Refused(why) => return Err(why),
            }
        }
    };
    tokio::time::timeout(budget, read)
        .await
        .unwrap_or(Err(Refused::Timeout))
}

/// Whether `peer` is a load balancer listed in `server.proxy_protocol`.
pub fn listed(balancers: &[ipnet::IpNet], peer: SocketAddr) -> bool {
    let ip = peer.ip().to_canonical();
    balancers.iter().any(|n| n.contains(&ip))
}

/// Reads a listed peer's header off `io` and counts the outcome: the
/// client it names (the peer itself for `LOCAL`/`UNKNOWN`) and the stream
/// with what followed the header put back; `None`: close the connection.
pub async fn open<I: AsyncRead + Unpin>(
    mut io: I,
    peer: SocketAddr,
    budget: Duration,
    counters: &Counters,
) -> Option<(SocketAddr, Prefixed<I>)> {
    match read_header(&mut io, budget).await {
        Ok(header) => {
            counters.accepted(header.version);
            let client = header.source.unwrap_or(peer);
            tracing::trace!(balancer = %peer, %client, "PROXY protocol header");
            Some((client, Prefixed::new(header.rest, io)))
        }
        Err(why) => {
            counters.refused(why);
            tracing::debug!(%peer, reason = why.as_str(), "closed: no valid PROXY protocol header from a listed peer");
            None
        }
    }
}

/// The counters of PROXY-protocol connections, created with the app.
pub struct Counters {
    /// `tollgate_proxy_protocol_accepted_total{version}`, v1 then v2.
    accepted: [Counter; 2],
    /// `tollgate_proxy_protocol_refused_total{reason}`, by [`Refused::ALL`].
    refused: [Counter; Refused::ALL.len()],
}

pub const ACCEPTED: &str = "tollgate_proxy_protocol_accepted_total";
pub const REFUSED: &str = "tollgate_proxy_protocol_refused_total";

impl Counters {
    pub fn new(metrics: &Metrics) -> Counters {
        Counters {
            accepted: ["1", "2"].map(|v| metrics.counter(ACCEPTED, &[("version", v)])),
            refused: Refused::ALL.map(|r| metrics.counter(REFUSED, &[("reason", r.as_str())])),
        }
    }

    pub fn accepted(&self, version: u8) {
        inc(&self.accepted[usize::from(version == 2)]);
    }

    pub fn refused(&self, why: Refused) {
        inc(&self.refused[why as usize]);
    }

    /// Connections refused so far, all reasons.
    pub fn refused_total(&self) -> u64 {
        self.refused
            .iter()
            .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }
}

/// A stream with bytes already read off it put back in front: what came
/// with the PROXY header is read first, then the stream itself.
pub struct Prefixed<I> {
    front: Bytes,
    io: I,
}

impl<I> Prefixed<I> {
    pub fn new(front: Bytes, io: I) -> Prefixed<I> {
        Prefixed { front, io }
    }

    /// What is still in front, and the stream behind it.
    pub fn into_parts(self) -> (Bytes, I) {
        (self.front, self.io)
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.front.is_empty() {
            let n = self.front.len().min(buf.remaining());
            buf.put_slice(&self.front[..n]);
            self.front.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(command: u8, family: u8, addresses: &[u8], tlvs: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | command);
        h.push(family);
        h.extend(((addresses.len() + tlvs.len()) as u16).to_be_bytes());
        h.extend(addresses);
        h.extend(tlvs);
        h
    }

    const V4: [u8; 12] = [203, 0, 113, 9, 10, 0, 0, 1, 0x9c, 0x40, 0, 80];

    #[test]
    fn a_v1_header_names_its_source_and_its_length() {
        let h = b"PROXY TCP4 203.0.113.9 10.0.0.1 40000 80\r\nGET / HTTP/1.1\r\n";
        assert_eq!(
            parse(h),
            Parsed::Complete {
                version: 1,
                source: Some("203.0.113.9:40000".parse().unwrap()),
                len: 42,
            }
        );
        let h6 = b"PROXY TCP6 2001:db8::7 2001:db8::1 40000 443\r\n";
        assert!(
            matches!(parse(h6), Parsed::Complete { source: Some(s), .. } if s.ip() == "2001:db8::7".parse::<IpAddr>().unwrap())
        );
    }

    #[test]
    fn unknown_and_local_headers_leave_the_peer_as_the_client() {
        assert!(matches!(
            parse(b"PROXY UNKNOWN\r\n"),
            Parsed::Complete { source: None, .. }
        ));
        let local = v2(0, 0x11, &V4, &[]);
        assert!(matches!(
            parse(&local),
            Parsed::Complete {
                version: 2,
                source: None,
                ..
            }
        ));
    }

    #[test]
    fn a_v2_header_skips_its_tlvs() {
        // PP2_TYPE_AWS (0xEA) with a VPC endpoint id, then a NOOP.
        let tlvs = [0xEA, 0, 5, 1, b'v', b'p', b'c', b'e', 0x04, 0, 0];
        let h = v2(1, 0x11, &V4, &tlvs);
        assert_eq!(
            parse(&h),
            Parsed::Complete {
                version: 2,
                source: Some("203.0.113.9:40000".parse().unwrap()),
                len: h.len(),
            }
        );
    }

    #[test]
    fn a_request_or_a_tls_hello_is_a_missing_header() {
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\n"),
            Parsed::Refused(Refused::Missing)
        );
        assert_eq!(
            parse(&[0x16, 3, 1, 0, 200]),
            Parsed::Refused(Refused::Missing)
        );
    }

    #[test]
    fn a_broken_header_is_invalid_and_a_partial_one_waits() {
        assert_eq!(
            parse(b"PROXY TCP4 1.2.3\r\n"),
            Parsed::Refused(Refused::Invalid)
        );
        assert_eq!(parse(b"PROXY TCP4 203.0.11"), Parsed::Incomplete);
        assert_eq!(parse(&V2_SIGNATURE[..7]), Parsed::Incomplete);
        let mut bad_version = v2(1, 0x11, &V4, &[]);
        bad_version[12] = 0x31;
        assert_eq!(parse(&bad_version), Parsed::Refused(Refused::Invalid));
    }

    #[test]
    fn a_v2_header_announcing_more_than_the_bound_is_refused_at_once() {
        let mut h = v2(1, 0x11, &V4, &[]);
        h[14..16].copy_from_slice(&u16::MAX.to_be_bytes());
        assert_eq!(parse(&h), Parsed::Refused(Refused::TooLong));
    }

    #[tokio::test]
    async fn what_follows_the_header_is_read_first_from_the_stream() {
        let mut wire: &[u8] = b"PROXY TCP4 203.0.113.9 10.0.0.1 40000 80\r\nGET / HTTP/1.1\r\n";
        let header = read_header(&mut wire, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(&header.rest[..], b"GET / HTTP/1.1\r\n");
        let mut joined = Prefixed::new(header.rest, wire);
        let mut all = String::new();
        joined.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "GET / HTTP/1.1\r\n");
    }
}
