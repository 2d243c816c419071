//! Bytes on the wire as the strict readers of tests/framing.rs and tests/upstream_framing.rs see them.

/// A `tchar` of RFC 9110 §5.6.2: what a method or a field name is made of.
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Where `needle` first starts in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
