//! An upstream answer's head as the lean exchange reads it: httparse finds it, its fields become a map sharing its bytes, and RFC 9112 §6.3 says how its body ends.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, Version};

use super::{ExchangeError, MAX_HEADERS, UPSTREAM_READ_BUF};

/// An answer's head as read: its parts, how its body ends, and whether the
/// connection may carry another request after it.
pub(super) type Head = (http::response::Parts, Framing, bool);

/// Fields an answer's map has room for beyond its own: what tollgate adds
/// on the way out (the rate-limit headers, `X-Request-Id`, `Vary`), so
/// adding them does not grow and rehash the map (~700 instructions a
/// proxied answer, callgrind). The room is not lost: once the answer is
/// written, hyper parses the client's next request into its cleared map.
const ROOM: usize = 8;

/// How the answer's body ends (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// No body: HEAD, 1xx, 204, 304, or `Content-Length: 0`.
    Empty,
    Length(u64),
    Chunked,
    /// Until the upstream closes: the connection ends with the body.
    Close,
}

/// The answer's head, once whole at the start of `buf` (which then holds
/// only what follows it): its parts, how its body ends, and whether the
/// connection may carry another request. Interim answers (1xx but 101) are
/// read past, as hyper does.
pub(super) fn read_head(
    buf: &mut BytesMut,
    method: &Method,
) -> Result<Option<Head>, ExchangeError> {
    let mut spans = [Span::default(); MAX_HEADERS];
    loop {
        let Some(found) = locate(buf, &mut spans)? else {
            return Ok(None);
        };
        if found.status.is_informational() && found.status != StatusCode::SWITCHING_PROTOCOLS {
            buf.advance(found.len);
            continue;
        }
        let head = buf.split_to(found.len).freeze();
        let (mut headers, said) = fields(&head, &spans[..found.count])?;
        let (framing, reuse) = framing(found.status, method, found.version, &said)?;
        if said.transfer_encoding && said.content_length {
            // Both framings: chunked wins, and the Content-Length must not
            // go on with a body it does not describe.
            headers.remove(header::CONTENT_LENGTH);
        } else if let (true, Some(Ok(n))) = (said.rewrite, said.length) {
            // `5, 5`, two fields of 5, or `05`: one plain value goes on (RFC 9110 §8.6).
            headers.insert(header::CONTENT_LENGTH, crate::header_value::number(n));
        }
        let mut parts = Response::new(()).into_parts().0;
        parts.status = found.status;
        parts.version = found.version;
        parts.headers = headers;
        return Ok(Some((parts, framing, reuse)));
    }
}

/// Where a field's name and value lie in the head: start and end of each.
/// A head is at most `UPSTREAM_READ_BUF` bytes, so the offsets fit.
#[derive(Clone, Copy, Default)]
struct Span {
    name: (u32, u32),
    value: (u32, u32),
}

/// A whole head found by httparse at the start of the buffer.
struct Found {
    len: usize,
    status: StatusCode,
    version: Version,
    /// How many of the spans hold its fields.
    count: usize,
}

/// Parses the head at the start of `buf`, its fields' places put in
/// `spans` (so the fields can share the head's bytes once it is split
/// off); `None` while it is incomplete.
fn locate(buf: &[u8], spans: &mut [Span; MAX_HEADERS]) -> Result<Option<Found>, ExchangeError> {
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut res,
        buf,
        &mut fields,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) if len <= UPSTREAM_READ_BUF => len,
        Ok(httparse::Status::Partial) if buf.len() < UPSTREAM_READ_BUF => return Ok(None),
        Ok(_) | Err(httparse::Error::TooManyHeaders) => return Err(ExchangeError::HeadTooLarge),
        Err(e) => return Err(ExchangeError::Head(e)),
    };
    let status = StatusCode::from_u16(res.code.unwrap_or(0))
        .map_err(|_| ExchangeError::Malformed("a status code out of range"))?;
    let version = match res.version {
        Some(1) => Version::HTTP_11,
        _ => Version::HTTP_10,
    };
    let start = buf.as_ptr() as usize;
    let at = |part: &[u8]| {
        let from = part.as_ptr() as usize - start;
        (from as u32, (from + part.len()) as u32)
    };
    for (span, field) in spans.iter_mut().zip(res.headers.iter()) {
        *span = Span {
            name: at(field.name.as_bytes()),
            value: at(field.value),
        };
    }
    Ok(Some(Found {
        len,
        status,
        version,
        count: res.headers.len(),
    }))
}

/// The head's fields as a map sharing its bytes, and what they say of the framing.
fn fields(head: &Bytes, spans: &[Span]) -> Result<(HeaderMap, Said), ExchangeError> {
    let mut headers = HeaderMap::with_capacity(spans.len() + ROOM);
    let mut said = Said::default();
    for span in spans {
        let (n0, n1) = (span.name.0 as usize, span.name.1 as usize);
        let name = HeaderName::from_bytes(&head[n0..n1])
            .map_err(|_| ExchangeError::Malformed("an invalid field name"))?;
        let value = head.slice(span.value.0 as usize..span.value.1 as usize);
        // SAFETY: httparse took every byte of it as a field value: tab,
        // 0x20–0x7E and 0x80–0xFF, the very set `HeaderValue` accepts (a
        // bare CR, a NUL, a DEL or a folded line fail the parse; see
        // tests/upstream_framing.rs). Checking again cost ~500 instructions
        // a proxied answer (callgrind); hyper's client skips it the same way.
        let value = unsafe { HeaderValue::from_maybe_shared_unchecked(value) };
        if said.hear(&name, &value) {
            headers.append(name, value);
        }
    }
    Ok((headers, said))
}

/// What an answer's framing fields say, gathered as its head is read (one
/// pass, no lookups afterwards).
#[derive(Default)]
struct Said {
    transfer_encoding: bool,
    /// `Transfer-Encoding` names `chunked` and nothing else.
    chunked: bool,
    content_length: bool,
    /// The length was not written as one plain number (`5, 5`, two fields, `05`).
    rewrite: bool,
    /// The length every `Content-Length` value names, or why there is none.
    length: Option<Result<u64, &'static str>>,
    close: bool,
    keep_alive: bool,
}

impl Said {
    /// Takes in one field; false for a field that is this connection's
    /// business alone and stays out of the answer's map: a `Connection`
    /// that says only `keep-alive` or `close`, as nearly every upstream's
    /// does. Hop-by-hop, it would be removed on the way out anyway; kept
    /// out, it costs neither its insert nor its removal (~800 instructions
    /// a proxied answer, callgrind). A `Connection` naming other fields
    /// stays, for the proxy to remove them by it.
    fn hear(&mut self, name: &HeaderName, value: &HeaderValue) -> bool {
        if name == header::CONTENT_LENGTH {
            let plain = !value.as_bytes().starts_with(b"0") || value.len() == 1;
            self.rewrite |= self.content_length || !plain || value.as_bytes().contains(&b',');
            self.content_length = true;
            for item in value.as_bytes().split(|&b| b == b',') {
                let n = digits(item.trim_ascii()).ok_or("an invalid Content-Length");
                self.length = Some(match (self.length, n) {
                    (Some(Err(e)), _) | (_, Err(e)) => Err(e),
                    (Some(Ok(l)), Ok(n)) if l != n => Err("two different Content-Lengths"),
                    (_, Ok(n)) => Ok(n),
                });
            }
        } else if name == header::TRANSFER_ENCODING {
            // Only `chunked` alone: a body in any other coding would reach
            // the client without the name of its coding (Transfer-Encoding
            // is hop-by-hop), so it is refused, as nginx does.
            self.chunked = !self.transfer_encoding
                && value
                    .as_bytes()
                    .trim_ascii()
                    .eq_ignore_ascii_case(b"chunked");
            self.transfer_encoding = true;
        } else if name == header::CONNECTION {
            // One of the two alone: one compare, not two scans of the list.
            let alone = value.as_bytes();
            if alone.eq_ignore_ascii_case(b"keep-alive") {
                self.keep_alive = true;
                return false;
            } else if alone.eq_ignore_ascii_case(b"close") {
                self.close = true;
                return false;
            }
            self.close |= crate::header_value::lists(value, &["close"]);
            self.keep_alive |= crate::header_value::lists(value, &["keep-alive"]);
        }
        true
    }
}

/// How the body of an answer to `method` ends, and whether the connection
/// may carry another request after it (RFC 9112 §6.3, §9.3).
fn framing(
    status: StatusCode,
    method: &Method,
    version: Version,
    said: &Said,
) -> Result<(Framing, bool), ExchangeError> {
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(ExchangeError::Malformed(
            "101 Switching Protocols to a request that asked for no upgrade",
        ));
    }
    // HTTP/1.1 keeps a connection unless it says `close`; HTTP/1.0 only if it says `keep-alive`.
    let alive = match version {
        Version::HTTP_11 => !said.close,
        _ => said.keep_alive && !said.close,
    };
    if matches!(status.as_u16(), 204 | 304) {
        return Ok((Framing::Empty, alive));
    }
    // A HEAD answer's length describes the GET's body; it goes on, so it must be one.
    if let (true, Some(Err(e))) = (method == Method::HEAD, said.length) {
        return Err(ExchangeError::Malformed(e));
    }
    if method == Method::HEAD {
        return Ok((Framing::Empty, alive));
    }
    if said.transfer_encoding {
        if version == Version::HTTP_10 {
            return Err(ExchangeError::Malformed(
                "Transfer-Encoding in an HTTP/1.0 answer",
            ));
        }
        if !said.chunked {
            return Err(ExchangeError::Malformed(
                "a transfer coding other than chunked",
            ));
        }
        // With a Content-Length too, the connection is not trusted again.
        return Ok((Framing::Chunked, alive && !said.content_length));
    }
    Ok(match said.length {
        Some(Err(e)) => return Err(ExchangeError::Malformed(e)),
        Some(Ok(0)) => (Framing::Empty, alive),
        Some(Ok(n)) => (Framing::Length(n), alive),
        None => (Framing::Close, false),
    })
}

/// A decimal number of at most 19 digits (no sign, no space), as a length.
pub(super) fn digits(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 19 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(text.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}
