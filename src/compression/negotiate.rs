//! Which content coding a client accepts: `Accept-Encoding` with its q-values, `*` and `identity;q=0`.

use http::header::ACCEPT_ENCODING;
use http::HeaderMap;

/// A content coding tollgate writes (on the fly, or as a precompressed sibling file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Brotli,
    Gzip,
}

impl Coding {
    /// Preferred first when the client weighs them equally: brotli is
    /// usually the smaller for text.
    pub const ALL: [Coding; 2] = [Coding::Brotli, Coding::Gzip];

    /// The `Content-Encoding` token.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Brotli => "br",
            Coding::Gzip => "gzip",
        }
    }

    /// The suffix of a precompressed sibling (`app.js.br`, `app.js.gz`).
    pub fn suffix(self) -> &'static str {
        match self {
            Coding::Brotli => ".br",
            Coding::Gzip => ".gz",
        }
    }
}

/// What the client's `Accept-Encoding` allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Accepted {
    /// Weights in thousandths (`q=0.5` is 500), by [`Coding::ALL`] order.
    weights: [u16; 2],
    /// `identity;q=0`, or `*;q=0` without `identity`: an uncompressed answer
    /// is not acceptable, so even a short body is compressed.
    pub identity_refused: bool,
}

impl Accepted {
    /// Reads every `Accept-Encoding` line of `headers`. No header at all
    /// means identity only: RFC 9110 would allow any coding, but a client
    /// that says nothing (curl, a health check) expects plain bytes.
    pub fn from_headers(headers: &HeaderMap) -> Accepted {
        let lines = headers.get_all(ACCEPT_ENCODING);
        if lines.iter().next().is_none() {
            // Asked of every request: the usual answer without the weighing.
            return Accepted::default();
        }
        let mut entries: Vec<(&str, u16)> = Vec::new();
        for line in lines {
            let Ok(line) = line.to_str() else { continue };
            for element in line.split(',') {
                let mut parts = element.split(';');
                let name = parts.next().unwrap_or("").trim();
                if name.is_empty() {
                    continue;
                }
                let q = parts
                    .find_map(|p| {
                        let (k, v) = p.split_once('=')?;
                        k.trim().eq_ignore_ascii_case("q").then(|| qvalue(v.trim()))
                    })
                    .unwrap_or(Some(1000));
                // A malformed weight counts as 0: never a coding the client did not ask for.
                entries.push((name, q.unwrap_or(0)));
            }
        }
        let weight = |names: &[&str]| -> Option<u16> {
            entries
                .iter()
                .filter(|(n, _)| names.iter().any(|x| n.eq_ignore_ascii_case(x)))
                .map(|(_, q)| *q)
                .max()
        };
        let star = weight(&["*"]);
        let coding = |names: &[&str]| weight(names).or(star).unwrap_or(0);
        let identity = weight(&["identity"]).or(star).unwrap_or(1000);
        Accepted {
            weights: [coding(&["br"]), coding(&["gzip", "x-gzip"])],
            identity_refused: identity == 0,
        }
    }

    /// Accepts exactly `coding` (tests, benches).
    pub fn only(coding: Coding) -> Accepted {
        let mut a = Accepted::default();
        a.weights[coding as usize] = 1000;
        a
    }

    /// Whether the client takes `coding` at all.
    pub fn accepts(&self, coding: Coding) -> bool {
        self.weights[coding as usize] > 0
    }

    /// The coding to answer with: the highest weight, brotli on a tie; None
    /// when the client takes neither.
    pub fn best(&self) -> Option<Coding> {
        Coding::ALL
            .into_iter()
            .filter(|c| self.accepts(*c))
            .max_by_key(|c| (self.weights[*c as usize], *c == Coding::Brotli))
    }

    /// Acceptable codings, best first (for choosing a precompressed sibling).
    pub fn ranked(&self) -> impl Iterator<Item = Coding> + '_ {
        let mut all = Coding::ALL;
        all.sort_by_key(|c| std::cmp::Reverse((self.weights[*c as usize], *c == Coding::Brotli)));
        all.into_iter().filter(|c| self.accepts(*c))
    }
}

/// `0`, `0.5`, `1.000` → thousandths; None if it is not a qvalue (RFC 9110 §12.4.2).
fn qvalue(v: &str) -> Option<u16> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut thousandths: u16 = 0;
    for (i, b) in frac.bytes().enumerate() {
        thousandths += u16::from(b - b'0') * [100, 10, 1][i];
    }
    match int {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> Accepted {
        let mut h = HeaderMap::new();
        h.insert(ACCEPT_ENCODING, v.parse().unwrap());
        Accepted::from_headers(&h)
    }

    #[test]
    fn brotli_wins_a_tie_and_the_higher_weight_wins_otherwise() {
        assert_eq!(accept("gzip, deflate, br").best(), Some(Coding::Brotli));
        assert_eq!(accept("gzip;q=1.0, br;q=0.8").best(), Some(Coding::Gzip));
        assert_eq!(accept("br;q=0.2, gzip;q=0.1").best(), Some(Coding::Brotli));
        assert_eq!(accept("GZIP").best(), Some(Coding::Gzip));
        assert_eq!(accept("x-gzip").best(), Some(Coding::Gzip));
    }

    #[test]
    fn a_zero_weight_refuses_a_coding_and_star_covers_the_unnamed() {
        assert_eq!(accept("br;q=0, gzip").best(), Some(Coding::Gzip));
        assert_eq!(accept("br;q=0, *").best(), Some(Coding::Gzip));
        assert_eq!(accept("*").best(), Some(Coding::Brotli));
        assert_eq!(accept("*;q=0").best(), None);
        assert_eq!(accept("deflate").best(), None);
        assert_eq!(accept("").best(), None);
        assert_eq!(Accepted::from_headers(&HeaderMap::new()).best(), None);
        // No header at all is read as an empty one would be.
        assert_eq!(Accepted::from_headers(&HeaderMap::new()), accept(""));
    }

    #[test]
    fn identity_is_refused_only_by_a_zero_weight() {
        assert!(accept("gzip, identity;q=0").identity_refused);
        assert!(accept("gzip, *;q=0").identity_refused);
        assert!(!accept("gzip, *;q=0, identity").identity_refused);
        assert!(!accept("gzip").identity_refused);
    }

    #[test]
    fn malformed_weights_count_as_zero() {
        assert_eq!(accept("gzip;q=2").best(), None);
        assert_eq!(accept("gzip;q=0.1234").best(), None);
        assert_eq!(
            accept("gzip;q=abc, br;q=0.001").best(),
            Some(Coding::Brotli)
        );
        assert_eq!(qvalue("1.000"), Some(1000));
        assert_eq!(qvalue("0.5"), Some(500));
        assert_eq!(qvalue("1.5"), None);
    }

    #[test]
    fn ranked_lists_acceptable_codings_best_first() {
        let r: Vec<_> = accept("gzip, br;q=0.5").ranked().collect();
        assert_eq!(r, [Coding::Gzip, Coding::Brotli]);
        let r: Vec<_> = accept("gzip").ranked().collect();
        assert_eq!(r, [Coding::Gzip]);
    }
}
