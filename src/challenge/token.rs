//! The two signed texts, a challenge and a pass: their fields, their HMAC-SHA256 (truncated to 128 bits), and why one is refused.
//!
//! Both are plain ASCII joined with `~` so that they travel unchanged in a
//! form field and in a cookie, and both carry what they are bound to (site,
//! address block, expiry) in the clear, under the MAC: a refusal can then
//! say *why* (another site, another address block, expired) without any
//! server-side state.
//!
//! ```text
//! challenge: <key id>~<expiry, Unix s>~<bits>~<32 hex random>~<site>~<prefix>~<32 hex MAC>
//! pass:      <key id>~<32 hex pass id, or ->~<expiry, Unix s>~<bits>~<site>~<prefix>~<32 hex MAC>
//! ```
//!
//! A pass carries the difficulty its challenge was solved at (`bits`), so it
//! opens only routes that ask for no more; its id is `-` when the address
//! block had used its allowance of new passes: such a pass lets its browser
//! through the challenge but counts as the client's address
//! ([`COUNTS_AS_ADDRESS`]).
//!
//! The MAC covers a domain tag (`c1`, `p2`) and every field before it, so a
//! challenge can never be presented as a pass or the reverse (nor a pass of
//! the older form without `bits`, `p1`, as one of today's).

use ring::hmac;

/// Bytes of HMAC-SHA256 kept: 128 bits is beyond forging by search.
const MAC_LEN: usize = 16;
/// Separates the fields; never in a hex digit, a number, an address block or a site hash.
const SEP: char = '~';
/// The longest text either token can be (both are well under it).
pub const MAX_LEN: usize = 160;

/// Why a challenge's solution or a pass is not accepted; each is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenFault {
    /// Not the shape tollgate writes (cut, padded, a field missing).
    Malformed,
    /// Signed by a key the secret file no longer holds (or never did).
    UnknownKey,
    /// The MAC does not match: a field was changed, or it was made up.
    Forged,
    Expired,
    /// Made for another site (Host) than the one it is presented to.
    OtherSite,
    /// Made for another client address block.
    OtherPrefix,
    /// A challenge whose nonce does not give enough leading zero bits.
    Unsolved,
}

impl TokenFault {
    pub const ALL: [TokenFault; 7] = [
        TokenFault::Malformed,
        TokenFault::UnknownKey,
        TokenFault::Forged,
        TokenFault::Expired,
        TokenFault::OtherSite,
        TokenFault::OtherPrefix,
        TokenFault::Unsolved,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TokenFault::Malformed => "malformed",
            TokenFault::UnknownKey => "unknown_key",
            TokenFault::Forged => "forged",
            TokenFault::Expired => "expired",
            TokenFault::OtherSite => "other_site",
            TokenFault::OtherPrefix => "other_prefix",
            TokenFault::Unsolved => "unsolved",
        }
    }
}

/// A signing key and the id tokens name it by.
pub struct SigningKey {
    pub id: String,
    mac: hmac::Key,
}

impl SigningKey {
    pub fn new(id: &str, secret: &[u8]) -> SigningKey {
        SigningKey {
            id: id.to_string(),
            mac: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    /// The truncated MAC of `tag` ‖ `body`, in hex.
    fn mac(&self, tag: &str, body: &str) -> String {
        let mut ctx = hmac::Context::with_key(&self.mac);
        ctx.update(tag.as_bytes());
        ctx.update(body.as_bytes());
        hex(&ctx.sign().as_ref()[..MAC_LEN])
    }
}

/// What a challenge binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge<'t> {
    pub key_id: &'t str,
    pub expires: u64,
    pub bits: u8,
    pub random: &'t str,
    pub site: &'t str,
    pub prefix: &'t str,
}

/// What a pass binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass<'t> {
    pub key_id: &'t str,
    /// 32 hex digits: the identity `key: pass` counts on; or [`COUNTS_AS_ADDRESS`].
    pub id: &'t str,
    pub expires: u64,
    /// The difficulty its challenge was solved at.
    pub bits: u8,
    pub site: &'t str,
    pub prefix: &'t str,
}

const CHALLENGE_TAG: &str = "c1~";
const PASS_TAG: &str = "p2~";
/// The id of a pass that identifies no browser: `key: pass` counts its
/// holder as its address, as it does a client without a pass.
pub const COUNTS_AS_ADDRESS: &str = "-";

pub fn write_challenge(key: &SigningKey, c: &Challenge<'_>) -> String {
    let body = format!(
        "{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}",
        key.id, c.expires, c.bits, c.random, c.site, c.prefix
    );
    let mac = key.mac(CHALLENGE_TAG, &body);
    format!("{body}{SEP}{mac}")
}

pub fn write_pass(key: &SigningKey, p: &Pass<'_>) -> String {
    let body = format!(
        "{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}",
        key.id, p.id, p.expires, p.bits, p.site, p.prefix
    );
    let mac = key.mac(PASS_TAG, &body);
    format!("{body}{SEP}{mac}")
}

/// Splits `text` into its body and MAC and checks the MAC with the key the
/// body names (constant time); `fields` is how many fields the body holds.
fn open<'t, const N: usize>(
    text: &'t str,
    tag: &str,
    keys: &[SigningKey],
) -> Result<[&'t str; N], TokenFault> {
    if text.len() > MAX_LEN || !text.is_ascii() {
        return Err(TokenFault::Malformed);
    }
    let (body, mac) = text.rsplit_once(SEP).ok_or(TokenFault::Malformed)?;
    let mut fields = [""; N];
    let mut parts = body.split(SEP);
    for f in fields.iter_mut() {
        *f = parts.next().ok_or(TokenFault::Malformed)?;
    }
    if parts.next().is_some() || mac.len() != MAC_LEN * 2 {
        return Err(TokenFault::Malformed);
    }
    let key = keys
        .iter()
        .find(|k| k.id == fields[0])
        .ok_or(TokenFault::UnknownKey)?;
    if !same(key.mac(tag, body).as_bytes(), mac.as_bytes()) {
        return Err(TokenFault::Forged);
    }
    Ok(fields)
}

/// A challenge whose MAC holds (expiry and binding are the caller's to check).
pub fn read_challenge<'t>(text: &'t str, keys: &[SigningKey]) -> Result<Challenge<'t>, TokenFault> {
    let [key_id, expires, bits, random, site, prefix] = open::<6>(text, CHALLENGE_TAG, keys)?;
    Ok(Challenge {
        key_id,
        expires: expires.parse().map_err(|_| TokenFault::Malformed)?,
        bits: bits.parse().map_err(|_| TokenFault::Malformed)?,
        random,
        site,
        prefix,
    })
}

/// A pass whose MAC holds (expiry and binding are the caller's to check).
pub fn read_pass<'t>(text: &'t str, keys: &[SigningKey]) -> Result<Pass<'t>, TokenFault> {
    let [key_id, id, expires, bits, site, prefix] = open::<6>(text, PASS_TAG, keys)?;
    Ok(Pass {
        key_id,
        id,
        expires: expires.parse().map_err(|_| TokenFault::Malformed)?,
        bits: bits.parse().map_err(|_| TokenFault::Malformed)?,
        site,
        prefix,
    })
}

/// Leading zero bits of `digest`.
pub fn leading_zero_bits(digest: &[u8]) -> u32 {
    let mut bits = 0;
    for b in digest {
        if *b == 0 {
            bits += 8;
        } else {
            return bits + b.leading_zeros();
        }
    }
    bits
}

/// Compares in time independent of where the texts differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Vec<SigningKey> {
        vec![
            SigningKey::new("0a0b0c0d", b"old secret"),
            SigningKey::new("01020304", b"new"),
        ]
    }

    fn pass() -> Pass<'static> {
        Pass {
            key_id: "01020304",
            id: "00112233445566778899aabbccddeeff",
            expires: 1_767_225_600,
            bits: 14,
            site: "5d41402a",
            prefix: "203.0.113.0/24",
        }
    }

    #[test]
    fn a_pass_reads_back_with_any_key_the_file_still_holds() {
        let k = keys();
        let text = write_pass(&k[1], &pass());
        assert_eq!(read_pass(&text, &k), Ok(pass()));
        assert_eq!(read_pass(&text, &k[..1]), Err(TokenFault::UnknownKey));
    }

    #[test]
    fn changing_any_field_of_a_pass_breaks_its_mac() {
        let k = keys();
        let text = write_pass(&k[1], &pass());
        let tampered = text.replace("203.0.113.0/24", "198.51.100.0/24");
        assert_eq!(read_pass(&tampered, &k), Err(TokenFault::Forged));
        let longer = text.replace("~1767225600~", "~1767225601~");
        assert_eq!(read_pass(&longer, &k), Err(TokenFault::Forged));
        let harder = text.replace("~14~", "~24~");
        assert_eq!(read_pass(&harder, &k), Err(TokenFault::Forged));
        assert_eq!(read_pass("nonsense", &k), Err(TokenFault::Malformed));
        assert_eq!(
            read_pass(&format!("{text}~x"), &k),
            Err(TokenFault::Malformed)
        );
    }

    #[test]
    fn a_challenge_is_never_accepted_as_a_pass() {
        let k = keys();
        let c = Challenge {
            key_id: "01020304",
            expires: 1,
            bits: 16,
            random: "00112233445566778899aabbccddeeff",
            site: "5d41402a",
            prefix: "203.0.113.0",
        };
        let text = write_challenge(&k[1], &c);
        assert_eq!(read_challenge(&text, &k), Ok(c));
        assert!(read_pass(&text, &k).is_err());
    }

    #[test]
    fn leading_zero_bits_count_across_bytes() {
        assert_eq!(leading_zero_bits(&[0, 0, 0x10, 0xff]), 19);
        assert_eq!(leading_zero_bits(&[0x80]), 0);
        assert_eq!(leading_zero_bits(&[0, 0]), 16);
    }
}
