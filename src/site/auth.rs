//! `auth.basic`: an htpasswd users file (bcrypt, apr1, `{SHA}` lines) and the check of a request's `Authorization: Basic` credentials against it.
//!
//! The file is read by the config loader, never on the request path, and
//! read again by a reload (the file watch reloads when its content changes).
//! A bcrypt check costs milliseconds of CPU, so the app runs it on a
//! blocking thread; credentials that passed are remembered (by their SHA-256)
//! until the next reload, so a logged-in browser pays for one check, not
//! one per request. Digests are compared in constant time.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine as _;
use http::HeaderValue;
use md5::{Digest as _, Md5};
use parking_lot::Mutex;
use subtle::ConstantTimeEq;

/// Credentials remembered as good at most (then the memory starts over).
const REMEMBERED: usize = 4096;

/// `auth.basic` of a route.
#[derive(Debug, Clone)]
pub struct BasicAuth {
    pub realm: String,
    pub users_file: PathBuf,
    /// Read by the loader (empty straight out of validation).
    pub users: Arc<Users>,
    /// Forward the client's `Authorization` header to the upstream (default: removed).
    pub forward_authorization: bool,
    /// `Basic realm="…"`, written once.
    pub challenge: HeaderValue,
}

/// The users of one file, each with its hash.
#[derive(Debug, Default)]
pub struct Users {
    /// The file's text as read (the file watch compares against it).
    pub source: String,
    hashes: HashMap<String, Hash>,
    /// SHA-256 of `user:password` pairs that passed.
    passed: Mutex<HashSet<[u8; 32]>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Hash {
    /// `$2y$`, `$2b$`, `$2a$`: the whole line's hash, as bcrypt reads it.
    Bcrypt(String),
    /// `$apr1$salt$digest`.
    Apr1 { salt: String, digest: String },
    /// `{SHA}` + base64 of SHA-1.
    Sha1([u8; 20]),
}

impl Users {
    /// Parses an htpasswd file: `user:hash` lines, blank lines and `#`
    /// comments. A line whose hash is not bcrypt, apr1 or `{SHA}` (crypt(3),
    /// plain text) is an error naming its line.
    pub fn parse(text: &str) -> Result<Users, String> {
        let mut hashes = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (user, hash) = line
                .split_once(':')
                .ok_or_else(|| format!("line {}: not `user:hash`", n + 1))?;
            let hash = Hash::parse(hash).ok_or_else(|| {
                format!(
                    "line {} (user {user:?}): the hash is not bcrypt (`$2y$`), apr1 (`$apr1$`) or `{{SHA}}`; make it with `htpasswd -B`",
                    n + 1
                )
            })?;
            hashes.insert(user.to_string(), hash);
        }
        Ok(Users {
            source: text.to_string(),
            hashes,
            passed: Mutex::default(),
        })
    }

    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// Whether `password` is `user`'s. Blocking for bcrypt (milliseconds of
    /// CPU): call it off the runtime unless [`Users::remembered`] said yes.
    pub fn verify(&self, user: &str, password: &str) -> bool {
        let Some(hash) = self.hashes.get(user) else {
            return false;
        };
        let ok = match hash {
            Hash::Bcrypt(h) => bcrypt::verify(password, h).unwrap_or(false),
            Hash::Apr1 { salt, digest } => apr1(password.as_bytes(), salt.as_bytes())
                .as_bytes()
                .ct_eq(digest.as_bytes())
                .into(),
            Hash::Sha1(expected) => {
                let got: [u8; 20] = sha1::Sha1::digest(password.as_bytes()).into();
                got.ct_eq(expected).into()
            }
        };
        if ok {
            let mut passed = self.passed.lock();
            if passed.len() >= REMEMBERED {
                passed.clear();
            }
            passed.insert(fingerprint(user, password));
        }
        ok
    }

    /// Whether these credentials passed before (since this file was read).
    pub fn remembered(&self, user: &str, password: &str) -> bool {
        self.passed.lock().contains(&fingerprint(user, password))
    }
}

fn fingerprint(user: &str, password: &str) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    sha2::Digest::update(&mut h, user.as_bytes());
    sha2::Digest::update(&mut h, b":");
    sha2::Digest::update(&mut h, password.as_bytes());
    sha2::Digest::finalize(h).into()
}

impl Hash {
    fn parse(hash: &str) -> Option<Hash> {
        if let Some(b64) = hash.strip_prefix("{SHA}") {
            let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
            return bytes.try_into().ok().map(Hash::Sha1);
        }
        if let Some(rest) = hash.strip_prefix("$apr1$") {
            let (salt, digest) = rest.split_once('$')?;
            return (salt.len() <= 8 && digest.len() == 22).then(|| Hash::Apr1 {
                salt: salt.to_string(),
                digest: digest.to_string(),
            });
        }
        let bcrypt = ["$2y$", "$2b$", "$2a$"].iter().any(|p| hash.starts_with(p));
        (bcrypt && hash.len() == 60).then(|| Hash::Bcrypt(hash.to_string()))
    }
}

/// The user and password of an `Authorization: Basic` header, if it is one.
pub fn credentials(header: &HeaderValue) -> Option<(String, String)> {
    let value = header.to_str().ok()?.trim();
    let (scheme, b64) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// Apache's MD5 crypt (`$apr1$`): the 22-character digest of `password`
/// with `salt` (apr_md5.c's algorithm, on RustCrypto's MD5).
fn apr1(password: &[u8], salt: &[u8]) -> String {
    const MAGIC: &[u8] = b"$apr1$";
    let mut ctx = Md5::new();
    ctx.update(password);
    ctx.update(MAGIC);
    ctx.update(salt);
    let alternate = Md5::new()
        .chain_update(password)
        .chain_update(salt)
        .chain_update(password)
        .finalize();
    let mut left = password.len();
    while left > 0 {
        ctx.update(&alternate[..left.min(16)]);
        left = left.saturating_sub(16);
    }
    let mut i = password.len();
    while i != 0 {
        if i & 1 == 1 {
            ctx.update([0u8]);
        } else {
            ctx.update(&password[..1]);
        }
        i >>= 1;
    }
    let mut digest = ctx.finalize();
    for round in 0..1000 {
        let mut c = Md5::new();
        if round & 1 == 1 {
            c.update(password);
        } else {
            c.update(digest);
        }
        if round % 3 != 0 {
            c.update(salt);
        }
        if round % 7 != 0 {
            c.update(password);
        }
        if round & 1 == 1 {
            c.update(digest);
        } else {
            c.update(password);
        }
        digest = c.finalize();
    }
    let d = digest;
    let mut out = String::with_capacity(22);
    for (a, b, c) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        let v = (u32::from(d[a]) << 16) | (u32::from(d[b]) << 8) | u32::from(d[c]);
        to64(&mut out, v, 4);
    }
    to64(&mut out, u32::from(d[11]), 2);
    out
}

fn to64(out: &mut String, mut v: u32, n: usize) {
    const ITOA64: &[u8] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    for _ in 0..n {
        out.push(ITOA64[(v & 0x3f) as usize] as char);
        v >>= 6;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apr1_matches_apache() {
        assert_eq!(apr1(b"password", b"lZL6V/ci"), "eIMz/iKDkbtys/uU7LEK00");
        assert_eq!(apr1(b"password", b"RandSalt"), "PgCXHRrkpSt4cbyC2C6bm/");
    }

    #[test]
    fn every_kind_of_line_verifies_and_a_wrong_password_fails() {
        let bcrypt_hash = bcrypt::hash_with_salt("s3cret", 4, [7u8; 16])
            .unwrap()
            .format_for_version(bcrypt::Version::TwoY);
        let text = format!(
            "# staff\nann:{bcrypt_hash}\nbob:$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00\n\ncid:{{SHA}}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n"
        );
        let users = Users::parse(&text).unwrap();
        assert_eq!(users.len(), 3);
        assert!(users.verify("ann", "s3cret"));
        assert!(users.verify("bob", "password"));
        assert!(users.verify("cid", "password"));
        assert!(!users.verify("ann", "wrong"));
        assert!(!users.verify("bob", "Password"));
        assert!(!users.verify("dan", "password"));
        assert!(users.remembered("ann", "s3cret") && !users.remembered("ann", "wrong"));
    }

    #[test]
    fn a_hash_it_cannot_check_is_refused_with_its_line() {
        let e = Users::parse("ann:plain\n").unwrap_err();
        assert!(e.starts_with("line 1"), "{e}");
        assert!(
            Users::parse("ann:$1$abc$def\n").is_err(),
            "md5-crypt is not apr1"
        );
        assert!(Users::parse("no colon\n").is_err());
    }

    #[test]
    fn basic_credentials_are_read_from_the_header() {
        let h = HeaderValue::from_static("Basic YW5uOnMzOmNyZXQ=");
        assert_eq!(credentials(&h), Some(("ann".into(), "s3:cret".into())));
        assert_eq!(credentials(&HeaderValue::from_static("Bearer x")), None);
        assert_eq!(credentials(&HeaderValue::from_static("Basic !!")), None);
    }
}
