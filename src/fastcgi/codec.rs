//! The FastCGI wire format (FastCGI 1.0 spec): record headers, name-value pairs, the records a responder exchanges.
//!
//! Only what a web server sends to php-fpm and reads back is here; one
//! request per connection at a time, so the request id is always 1 (as
//! nginx does; php-fpm does not multiplex).

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub const VERSION: u8 = 1;
pub const REQUEST_ID: u16 = 1;
/// The largest content one record carries.
pub const MAX_CONTENT: usize = 65535;
pub const HEADER_LEN: usize = 8;

pub const BEGIN_REQUEST: u8 = 1;
pub const ABORT_REQUEST: u8 = 2;
pub const END_REQUEST: u8 = 3;
pub const PARAMS: u8 = 4;
pub const STDIN: u8 = 5;
pub const STDOUT: u8 = 6;
pub const STDERR: u8 = 7;

const ROLE_RESPONDER: u16 = 1;
const FLAG_KEEP_CONN: u8 = 1;

/// END_REQUEST protocol status: the request ran to its end.
pub const REQUEST_COMPLETE: u8 = 0;

/// The 8-byte header of a record with `len` bytes of content and no padding.
pub fn header(kind: u8, len: usize) -> [u8; HEADER_LEN] {
    debug_assert!(len <= MAX_CONTENT);
    let len = (len as u16).to_be_bytes();
    let id = REQUEST_ID.to_be_bytes();
    [VERSION, kind, id[0], id[1], len[0], len[1], 0, 0]
}

/// BEGIN_REQUEST for the responder role; `keep_conn` asks php-fpm to leave
/// the connection open after END_REQUEST, so it can carry the next request.
pub fn begin_request(out: &mut BytesMut, keep_conn: bool) {
    out.put_slice(&header(BEGIN_REQUEST, 8));
    out.put_u16(ROLE_RESPONDER);
    out.put_u8(if keep_conn { FLAG_KEEP_CONN } else { 0 });
    out.put_slice(&[0; 5]);
}

/// Writes PARAMS records, packing whole name-value pairs into each: php-fpm
/// parses every PARAMS record on its own, so a pair never spans two.
pub struct Params<'a> {
    out: &'a mut BytesMut,
    /// Where the open record's header sits in `out`.
    record: usize,
}

impl<'a> Params<'a> {
    pub fn new(out: &'a mut BytesMut) -> Params<'a> {
        let record = out.len();
        out.put_slice(&header(PARAMS, 0));
        Params { out, record }
    }

    /// Adds one pair; returns false (and adds nothing) when it cannot fit one record.
    pub fn push(&mut self, name: &[u8], value: &[u8]) -> bool {
        let len = length_len(name.len()) + length_len(value.len()) + name.len() + value.len();
        if len > MAX_CONTENT {
            return false;
        }
        if self.content_len() + len > MAX_CONTENT {
            self.close();
            self.record = self.out.len();
            self.out.put_slice(&header(PARAMS, 0));
        }
        put_length(self.out, name.len());
        put_length(self.out, value.len());
        self.out.put_slice(name);
        self.out.put_slice(value);
        true
    }

    fn content_len(&self) -> usize {
        self.out.len() - self.record - HEADER_LEN
    }

    fn close(&mut self) {
        let len = self.content_len();
        let h = header(PARAMS, len);
        self.out[self.record..self.record + HEADER_LEN].copy_from_slice(&h);
    }

    /// Closes the last record and ends the stream with an empty PARAMS record.
    pub fn finish(mut self) {
        if self.content_len() == 0 {
            // The open record is empty: it is the terminator itself.
            return;
        }
        self.close();
        self.out.put_slice(&header(PARAMS, 0));
    }
}

fn length_len(n: usize) -> usize {
    if n < 128 {
        1
    } else {
        4
    }
}

fn put_length(out: &mut BytesMut, n: usize) {
    if n < 128 {
        out.put_u8(n as u8);
    } else {
        out.put_u32(n as u32 | 0x8000_0000);
    }
}

/// One record read from php-fpm.
#[derive(Debug, PartialEq)]
pub struct Record {
    pub kind: u8,
    pub content: Bytes,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CodecError {
    #[error("php-fpm sent a record of FastCGI version {0}, not 1")]
    Version(u8),
}

/// Takes one whole record off the front of `buf`, or None if it is not all there yet.
pub fn parse(buf: &mut BytesMut) -> Result<Option<Record>, CodecError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    if buf[0] != VERSION {
        return Err(CodecError::Version(buf[0]));
    }
    let kind = buf[1];
    let len = u16::from_be_bytes([buf[4], buf[5]]) as usize;
    let padding = buf[6] as usize;
    if buf.len() < HEADER_LEN + len + padding {
        // Room for the rest, so the next read fills it in one go.
        buf.reserve(HEADER_LEN + len + padding - buf.len());
        return Ok(None);
    }
    buf.advance(HEADER_LEN);
    let content = buf.split_to(len).freeze();
    buf.advance(padding);
    Ok(Some(Record { kind, content }))
}

/// An END_REQUEST record's content: (application status, protocol status).
pub fn end_request(content: &[u8]) -> (u32, u8) {
    if content.len() < 5 {
        return (0, u8::MAX);
    }
    let app = u32::from_be_bytes([content[0], content[1], content[2], content[3]]);
    (app, content[4])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads back the pairs of a PARAMS stream, record by record, the way php-fpm does.
    fn decode_params(mut buf: BytesMut) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut records = Vec::new();
        while let Some(r) = parse(&mut buf).unwrap() {
            assert_eq!(r.kind, PARAMS);
            let mut c = r.content.clone();
            let mut pairs = Vec::new();
            let len = |c: &mut Bytes| {
                if c[0] & 0x80 == 0 {
                    c.get_u8() as usize
                } else {
                    (c.get_u32() & 0x7fff_ffff) as usize
                }
            };
            while c.has_remaining() {
                let n = len(&mut c);
                let v = len(&mut c);
                let name = c.split_to(n).to_vec();
                let value = c.split_to(v).to_vec();
                pairs.push((name, value));
            }
            records.push(pairs);
        }
        assert!(buf.is_empty());
        records
    }

    #[test]
    fn short_and_long_pairs_use_one_and_four_byte_lengths() {
        let mut out = BytesMut::new();
        let mut p = Params::new(&mut out);
        let long = vec![b'x'; 300];
        assert!(p.push(b"SCRIPT_NAME", b"/index.php"));
        assert!(p.push(b"HTTP_COOKIE", &long));
        p.finish();
        let records = decode_params(out);
        assert_eq!(
            records.len(),
            2,
            "one record of pairs, then the empty terminator"
        );
        assert_eq!(
            records[0][0],
            (b"SCRIPT_NAME".to_vec(), b"/index.php".to_vec())
        );
        assert_eq!(records[0][1], (b"HTTP_COOKIE".to_vec(), long));
        assert!(records[1].is_empty());
    }

    #[test]
    fn pairs_that_overflow_a_record_start_a_new_one_and_never_span_two() {
        let mut out = BytesMut::new();
        let mut p = Params::new(&mut out);
        let value = vec![b'v'; 40_000];
        assert!(p.push(b"HTTP_A", &value));
        assert!(p.push(b"HTTP_B", &value));
        assert!(
            !p.push(b"HTTP_HUGE", &vec![b'v'; 70_000]),
            "a pair over 64 KiB is refused"
        );
        p.finish();
        let records = decode_params(out);
        assert_eq!(records.len(), 3);
        assert_eq!(records[0].len(), 1);
        assert_eq!(records[1].len(), 1);
        assert_eq!(records[1][0].0, b"HTTP_B");
        assert!(records[2].is_empty());
    }

    #[test]
    fn a_record_is_parsed_only_when_whole_and_its_padding_is_skipped() {
        let mut buf = BytesMut::new();
        buf.put_slice(&[VERSION, STDOUT, 0, 1, 0, 3, 5, 0]);
        buf.put_slice(b"ab");
        assert_eq!(parse(&mut buf).unwrap(), None);
        buf.put_slice(b"c");
        buf.put_slice(&[0; 5]);
        buf.put_slice(&[
            VERSION,
            END_REQUEST,
            0,
            1,
            0,
            8,
            0,
            0,
            0,
            0,
            0,
            7,
            REQUEST_COMPLETE,
            0,
            0,
            0,
        ]);
        let r = parse(&mut buf).unwrap().unwrap();
        assert_eq!((r.kind, &r.content[..]), (STDOUT, &b"abc"[..]));
        let r = parse(&mut buf).unwrap().unwrap();
        assert_eq!(r.kind, END_REQUEST);
        assert_eq!(end_request(&r.content), (7, REQUEST_COMPLETE));
        assert!(buf.is_empty());
    }

    #[test]
    fn a_record_of_another_version_is_an_error() {
        let mut buf = BytesMut::from(&[2u8, STDOUT, 0, 1, 0, 0, 0, 0][..]);
        assert_eq!(parse(&mut buf), Err(CodecError::Version(2)));
    }

    #[test]
    fn begin_request_asks_for_the_responder_role_and_keep_alive() {
        let mut out = BytesMut::new();
        begin_request(&mut out, true);
        assert_eq!(&out[..], &[1, 1, 0, 1, 0, 8, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]);
    }
}
