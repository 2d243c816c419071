//! The PROXY protocol parser under arbitrary bytes: it never panics, never claims a header longer than what it was given or than the bound, and reading a header off a stream never takes more than the bound, however the bytes arrive.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use proptest::prelude::*;
use tokio::io::{AsyncRead, ReadBuf};
use tollgate::proxy_protocol::{parse, read_header, Parsed, MAX_HEADER};

/// Bytes that start like a header often enough to reach past the signatures.
fn start() -> impl Strategy<Value = Vec<u8>> {
    let v2_signature = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    prop_oneof![
        Just(Vec::new()),
        Just(b"PROXY ".to_vec()),
        Just(b"PROXY TCP4 ".to_vec()),
        Just(b"PROXY TCP6 ".to_vec()),
        Just(v2_signature.clone()),
        Just([v2_signature.clone(), vec![0x21, 0x11]].concat()),
        Just([v2_signature, vec![0x21, 0x21, 0x00, 0x24]].concat()),
    ]
}

fn input() -> impl Strategy<Value = Vec<u8>> {
    (start(), prop::collection::vec(any::<u8>(), 0..600)).prop_map(|(a, b)| [a, b].concat())
}

/// A stream that hands out `bytes` in chunks of `chunk`, counting what was taken.
struct Trickle {
    bytes: Vec<u8>,
    at: usize,
    chunk: usize,
}

impl AsyncRead for Trickle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self
            .chunk
            .min(buf.remaining())
            .min(self.bytes.len() - self.at);
        let at = self.at;
        buf.put_slice(&self.bytes[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn parsing_arbitrary_bytes_never_panics_nor_overreaches(bytes in input()) {
        if let Parsed::Complete { len, .. } = parse(&bytes) {
            prop_assert!(len <= bytes.len());
            prop_assert!(len <= MAX_HEADER);
        }
    }

    #[test]
    fn reading_a_stream_takes_at_most_the_bound(
        bytes in input(),
        filler in prop::collection::vec(any::<u8>(), 0..6000),
        chunk in 1usize..700,
    ) {
        let bytes = [bytes, filler].concat();
        let total = bytes.len();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let mut stream = Trickle { bytes, at: 0, chunk };
        let read = runtime.block_on(read_header(&mut stream, Duration::from_secs(5)));
        prop_assert!(stream.at <= MAX_HEADER, "read {} bytes", stream.at);
        if let Ok(header) = read {
            // What was read past the header is handed on, never lost.
            prop_assert!(header.rest.len() <= stream.at);
            prop_assert!(stream.at <= total);
        }
    }
}
