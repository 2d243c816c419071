//! A response body compressed as it streams: each chunk is encoded when it arrives, nothing is buffered whole.
//!
//! Why our own wrapper rather than an `AsyncRead` adapter: an adapter holds
//! output until its buffer fills, so a PHP page that flushes its head early
//! (or a slow upstream) would reach the browser late. Here, whenever the
//! upstream has nothing more for now, what was encoded so far is flushed
//! (a sync flush: a few bytes of cost), so compression never delays bytes
//! the client could already use.

use std::io::{self, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

use super::negotiate::Coding;
use crate::body::{Body, BoxError};

/// gzip level 1–9 (zlib's default is 6). `benches/compression.rs` on HTML,
/// CSS, JS and JSON (docs/PERFORMANCE.md, "Compression"): with miniz_oxide,
/// level 4 costs a quarter less CPU than 5 for about 1 % more bytes, and 6
/// and above cost half as much again for 1 % less; at 1 the output is a
/// third larger.
pub const GZIP_LEVEL: u32 = 4;
/// brotli quality 0–11; 4 costs about what gzip's level does and sends
/// about a tenth fewer bytes (a third of gzip's on JSON); 5 costs over
/// half as much again for 7 % less (same bench).
pub const BROTLI_QUALITY: u32 = 4;
/// brotli window: 2^18 = 256 KiB of history instead of the library's
/// 2^22 (4 MiB): the ring buffer each response in flight holds is bounded
/// by it, whatever the response's size, and text pages gain little from a
/// longer history.
pub const BROTLI_WINDOW: u32 = 18;

/// One encoder writing into a buffer that each poll empties.
pub enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
}

impl Encoder {
    pub fn new(coding: Coding) -> Encoder {
        match coding {
            Coding::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(GZIP_LEVEL),
            )),
            Coding::Brotli => Encoder::Brotli(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                16 * 1024,
                BROTLI_QUALITY,
                BROTLI_WINDOW,
            ))),
        }
    }

    /// Encodes `data`; returns what the encoder has output so far (often nothing).
    pub fn write(&mut self, data: &[u8]) -> io::Result<Bytes> {
        match self {
            Encoder::Gzip(e) => e.write_all(data)?,
            Encoder::Brotli(e) => e.write_all(data)?,
        }
        Ok(self.take())
    }

    /// Pushes out everything written so far, decodable as it stands.
    pub fn flush(&mut self) -> io::Result<Bytes> {
        match self {
            Encoder::Gzip(e) => e.flush()?,
            Encoder::Brotli(e) => e.flush()?,
        }
        Ok(self.take())
    }

    /// Ends the stream (gzip's trailer, brotli's last block).
    pub fn finish(self) -> io::Result<Bytes> {
        Ok(Bytes::from(match self {
            Encoder::Gzip(e) => e.finish()?,
            Encoder::Brotli(e) => e.into_inner(),
        }))
    }

    fn take(&mut self) -> Bytes {
        let out = match self {
            Encoder::Gzip(e) => e.get_mut(),
            Encoder::Brotli(e) => e.get_mut(),
        };
        Bytes::from(std::mem::take(out))
    }
}

/// `inner` encoded with one coding.
pub struct Encoded {
    inner: Body,
    encoder: Option<Encoder>,
    /// Data went in since the last flush.
    unflushed: bool,
    /// Trailers that came after the data, sent once the stream is finished.
    trailers: Option<http::HeaderMap>,
    /// Bytes in and out, counted for `tollgate_compression_bytes_total`.
    counts: super::Counts,
}

impl Encoded {
    pub fn new(inner: Body, coding: Coding, counts: super::Counts) -> Encoded {
        Encoded {
            inner,
            encoder: Some(Encoder::new(coding)),
            unflushed: false,
            trailers: None,
            counts,
        }
    }

    fn out(&mut self, bytes: io::Result<Bytes>) -> Option<Result<Frame<Bytes>, BoxError>> {
        match bytes {
            Ok(b) if b.is_empty() => None,
            Ok(b) => {
                self.counts.wrote(b.len());
                Some(Ok(Frame::data(b)))
            }
            Err(e) => Some(Err(e.into())),
        }
    }
}

impl http_body::Body for Encoded {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            let Some(encoder) = this.encoder.as_mut() else {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            };
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => {
                    if !std::mem::take(&mut this.unflushed) {
                        return Poll::Pending;
                    }
                    // The upstream has nothing more for now: what is encoded goes out.
                    let flushed = encoder.flush();
                    match this.out(flushed) {
                        Some(frame) => return Poll::Ready(Some(frame)),
                        None => return Poll::Pending,
                    }
                }
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.counts.read(data.len());
                        this.unflushed = true;
                        let written = encoder.write(&data);
                        if let Some(frame) = this.out(written) {
                            return Poll::Ready(Some(frame));
                        }
                    }
                    Err(frame) => {
                        if let Ok(t) = frame.into_trailers() {
                            this.trailers = Some(t);
                        }
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    // A broken upstream body stays broken: no trailer that
                    // would make the truncated stream look complete.
                    this.encoder = None;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    let finished = this.encoder.take().expect("checked above").finish();
                    if let Some(frame) = this.out(finished) {
                        return Poll::Ready(Some(frame));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.encoder.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn gunzip(b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(b)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    fn unbrotli(b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        brotli::Decompressor::new(b, 4096)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn a_flush_makes_everything_so_far_decodable_before_the_end() {
        let text = b"<html><head><title>a page that flushes its head early</title></head>";
        for coding in Coding::ALL {
            let mut e = Encoder::new(coding);
            let mut sent = e.write(text).unwrap().to_vec();
            sent.extend_from_slice(&e.flush().unwrap());
            // A streaming decoder gets the whole head from the flushed part alone.
            let mut partial = Vec::new();
            match coding {
                Coding::Gzip => {
                    let mut d = flate2::write::GzDecoder::new(Vec::new());
                    d.write_all(&sent).unwrap();
                    d.flush().unwrap();
                    partial = d.get_ref().clone();
                }
                Coding::Brotli => {
                    let mut d = brotli::DecompressorWriter::new(&mut partial, 4096);
                    d.write_all(&sent).unwrap();
                    d.flush().unwrap();
                    drop(d);
                }
            }
            assert_eq!(partial, text, "{coding:?}");
            sent.extend_from_slice(&e.finish().unwrap());
            let whole = match coding {
                Coding::Gzip => gunzip(&sent),
                Coding::Brotli => unbrotli(&sent),
            };
            assert_eq!(whole, text, "{coding:?}");
        }
    }
}
