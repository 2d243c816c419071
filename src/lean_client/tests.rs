//! The answer head and chunk lines as the lean exchange reads them: framing by RFC 9112 §6.3, strict where hyper is strict.

use bytes::BytesMut;
use http::{header, Method, StatusCode, Version};

use super::{
    chunk_size, line, read_head, ExchangeError, Framing, Head, MAX_HEADERS, UPSTREAM_READ_BUF,
};

/// Reads one head from `bytes`, answering `method`; what follows it stays in the buffer.
fn head(method: Method, bytes: &[u8]) -> (Result<Option<Head>, ExchangeError>, BytesMut) {
    let mut buf = BytesMut::from(bytes);
    let read = read_head(&mut buf, &method);
    (read, buf)
}

fn get(bytes: &[u8]) -> Head {
    head(Method::GET, bytes)
        .0
        .expect("a valid head")
        .expect("a whole head")
}

fn refused(method: Method, bytes: &[u8]) -> ExchangeError {
    match head(method, bytes).0 {
        Err(e) => e,
        Ok(read) => panic!(
            "{:?} was read as {:?}",
            String::from_utf8_lossy(bytes),
            read.map(|r| (r.0.status, r.1, r.2))
        ),
    }
}

#[test]
fn a_content_length_answer_keeps_its_connection_and_leaves_its_body_in_the_buffer() {
    let (read, rest) = head(
        Method::GET,
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello",
    );
    let (parts, framing, reuse) = read.unwrap().unwrap();
    assert_eq!(
        (parts.status, parts.version),
        (StatusCode::OK, Version::HTTP_11)
    );
    assert_eq!(parts.headers["x-a"], "b");
    assert_eq!((framing, reuse), (Framing::Length(5), true));
    assert_eq!(&rest[..], b"hello");
}

#[test]
fn a_head_in_pieces_is_read_only_once_whole() {
    let (read, rest) = head(Method::GET, b"HTTP/1.1 200 OK\r\nContent-Le");
    assert!(matches!(read, Ok(None)));
    assert_eq!(
        &rest[..],
        b"HTTP/1.1 200 OK\r\nContent-Le",
        "nothing is taken from a partial head"
    );
}

#[test]
fn interim_answers_are_read_past_to_the_final_one() {
    let (parts, framing, _) = get(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n");
    assert_eq!(parts.status, StatusCode::NO_CONTENT);
    assert!(
        parts.headers.get(header::LINK).is_none(),
        "the 103's fields stay with it"
    );
    assert_eq!(framing, Framing::Empty);
}

#[test]
fn chunked_wins_over_a_content_length_which_is_removed_and_the_connection_is_not_trusted_again() {
    let (parts, framing, reuse) =
        get(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!((framing, reuse), (Framing::Chunked, false));
    assert!(parts.headers.get(header::CONTENT_LENGTH).is_none());
    let (_, framing, reuse) = get(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(
        (framing, reuse),
        (Framing::Chunked, true),
        "chunked alone keeps the connection"
    );
}

#[test]
fn a_transfer_coding_other_than_chunked_alone_is_refused() {
    for fields in [
        "Transfer-Encoding: chunked, gzip",
        "Transfer-Encoding: gzip, chunked",
        "Transfer-Encoding: xchunked\r\nContent-Length: 5",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
    ] {
        let bytes = format!("HTTP/1.1 200 OK\r\n{fields}\r\n\r\n");
        assert!(
            matches!(
                refused(Method::GET, bytes.as_bytes()),
                ExchangeError::Malformed(_)
            ),
            "{fields}"
        );
    }
    assert_eq!(
        get(b"HTTP/1.1 200 OK\r\nTransfer-Encoding:  Chunked \r\n\r\n").1,
        Framing::Chunked
    );
}

#[test]
fn an_answer_without_framing_is_read_until_close() {
    assert_eq!(get(b"HTTP/1.1 200 OK\r\n\r\nall of it").1, Framing::Close);
    assert!(!get(b"HTTP/1.1 200 OK\r\n\r\n").2);
}

#[test]
fn a_repeated_or_padded_content_length_goes_on_as_one_plain_number() {
    for bytes in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 005\r\n\r\n",
    ] {
        let (parts, framing, _) = get(bytes);
        assert_eq!(framing, Framing::Length(5));
        let values: Vec<_> = parts
            .headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .collect();
        assert_eq!(values, ["5"], "{}", String::from_utf8_lossy(bytes));
    }
}

#[test]
fn differing_or_invalid_lengths_are_refused_for_a_head_request_too() {
    for value in [
        "5, 6",
        "abc",
        "-1",
        "+5",
        "0x5",
        "",
        "99999999999999999999",
        "5 5",
    ] {
        let bytes = format!("HTTP/1.1 200 OK\r\nContent-Length: {value}\r\n\r\n");
        assert!(
            matches!(
                refused(Method::GET, bytes.as_bytes()),
                ExchangeError::Malformed(_)
            ),
            "{value}"
        );
        assert!(
            matches!(
                refused(Method::HEAD, bytes.as_bytes()),
                ExchangeError::Malformed(_)
            ),
            "HEAD {value}"
        );
    }
    refused(
        Method::GET,
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    );
}

#[test]
fn bodiless_answers_have_no_body_whatever_their_fields_say() {
    let (_, framing, reuse) = head(
        Method::HEAD,
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
    )
    .0
    .unwrap()
    .unwrap();
    assert_eq!((framing, reuse), (Framing::Empty, true));
    for status in ["204 No Content", "304 Not Modified"] {
        let bytes = format!("HTTP/1.1 {status}\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(get(bytes.as_bytes()).1, Framing::Empty, "{status}");
    }
}

#[test]
fn http10_keeps_a_connection_only_when_it_says_keep_alive_and_http11_unless_it_says_close() {
    assert!(!get(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n").2);
    assert!(get(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n").2);
    assert!(!get(b"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 1\r\n\r\n").2);
    refused(
        Method::GET,
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
}

#[test]
fn malformed_heads_are_refused() {
    for bytes in [
        &b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nX-A: a\rb\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A : b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
        b"HTTP/2 200 OK\r\n\r\n",
    ] {
        refused(Method::GET, bytes);
    }
}

#[test]
fn a_head_over_its_bounds_is_refused_as_too_large() {
    let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..=MAX_HEADERS {
        many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert!(matches!(
        refused(Method::GET, &many),
        ExchangeError::HeadTooLarge
    ));
    let mut long = b"HTTP/1.1 200 OK\r\nX-Big: ".to_vec();
    long.resize(UPSTREAM_READ_BUF + 1, b'a');
    assert!(
        matches!(refused(Method::GET, &long), ExchangeError::HeadTooLarge),
        "an unfinished head at the bound"
    );
}

#[test]
fn chunk_sizes_are_hex_with_extensions_ignored_and_bounded_to_sixteen_digits() {
    assert_eq!(chunk_size(b"5").unwrap(), 5);
    assert_eq!(chunk_size(b"1aF;name=value").unwrap(), 0x1af);
    assert_eq!(chunk_size(b"10 ;x").unwrap(), 16);
    assert_eq!(chunk_size(b"ffffffffffffffff").unwrap(), u64::MAX);
    for bad in [
        &b""[..],
        b"zz",
        b"5x",
        b"5 x",
        b"-5",
        b"10000000000000000",
        b";x",
        b"5;a\x00",
    ] {
        assert!(chunk_size(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn a_line_ends_only_at_crlf_and_within_its_bound() {
    let mut buf = BytesMut::from(&b"5;x\r\nhello"[..]);
    assert_eq!(&line(&mut buf, 16).unwrap().unwrap()[..], b"5;x");
    assert_eq!(&buf[..], b"hello");
    assert!(
        line(&mut BytesMut::from(&b"5"[..]), 16).unwrap().is_none(),
        "unfinished"
    );
    assert!(
        line(&mut BytesMut::from(&b"5\n"[..]), 16).is_err(),
        "a bare LF"
    );
    assert!(
        line(&mut BytesMut::from(&b"5\r5\r\n"[..]), 16).is_err(),
        "a CR inside"
    );
    assert!(
        line(&mut BytesMut::from(&b"0123456789abcdefXYZ"[..]), 16).is_err(),
        "over the bound, unfinished"
    );
}
