//! Reading the `Authorization` header a caller sent: `Bearer <secret>` (what
//! Keyway's own clients send) or `Basic base64(<any user>:<secret>)` (what a
//! browser sends after the `WWW-Authenticate: Basic` prompt, e.g. for the
//! manager's dashboard). The user name of the Basic form is ignored: the
//! cluster secret is one shared credential, not a per-caller identity.

use crate::ClusterSecret;
use base64::Engine;

/// What a request's credentials amount to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The right secret.
    Accepted,
    /// No `Authorization` header.
    Missing,
    /// A header that is neither a Bearer nor a well-formed Basic credential.
    Malformed,
    /// A well-formed credential with another secret.
    Wrong,
}

impl Verdict {
    /// The label of a refusal in `keyway_auth_refused`.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::Missing => "missing",
            Verdict::Malformed => "malformed",
            Verdict::Wrong => "wrong",
        }
    }

    /// The one-line reason a refused caller is told.
    pub fn reason(self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::Missing => {
                "missing cluster secret: send Authorization: Bearer <secret> \
                 (--cluster-secret-file)"
            }
            Verdict::Malformed => {
                "malformed Authorization header: expected Bearer <secret> or \
                 Basic base64(user:<secret>)"
            }
            Verdict::Wrong => "wrong cluster secret (--cluster-secret-file)",
        }
    }
}

/// Checks one `Authorization` header value (`None`: no header) against `secret`.
pub fn check(secret: &ClusterSecret, header: Option<&[u8]>) -> Verdict {
    let Some(value) = header else {
        return Verdict::Missing;
    };
    match presented_secret(value) {
        None => Verdict::Malformed,
        Some(candidate) if secret.matches(&candidate) => Verdict::Accepted,
        Some(_) => Verdict::Wrong,
    }
}

/// The secret a header value presents, `None` if it is malformed. The scheme
/// is case-insensitive (RFC 9110); the secret is the Bearer token or the
/// Basic credential's password (after the first `:`).
pub fn presented_secret(value: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let (scheme, rest) = text.split_once(' ')?;
    let rest = rest.trim_start();
    if scheme.eq_ignore_ascii_case("bearer") {
        (!rest.is_empty()).then(|| rest.as_bytes().to_vec())
    } else if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .ok()?;
        let colon = decoded.iter().position(|&b| b == b':')?;
        Some(decoded[colon + 1..].to_vec())
    } else {
        None
    }
}

/// `Basic base64(user:secret)`: what a browser sends (for tests and tools).
pub fn basic_value(user: &str, secret: &ClusterSecret) -> String {
    let mut plain = format!("{user}:").into_bytes();
    plain.extend_from_slice(secret.expose());
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(plain)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> ClusterSecret {
        ClusterSecret::from_bytes(b"s3cr3t-s3cr3t-s3cr3t").unwrap()
    }

    #[test]
    fn bearer_and_basic_are_accepted() {
        let s = secret();
        assert_eq!(check(&s, Some(s.bearer().as_bytes())), Verdict::Accepted);
        assert_eq!(
            check(&s, Some(b"bearer   s3cr3t-s3cr3t-s3cr3t ")),
            Verdict::Accepted
        );
        assert_eq!(
            check(&s, Some(basic_value("admin", &s).as_bytes())),
            Verdict::Accepted
        );
        // Any user, even an empty one; a ':' inside the password is kept.
        assert_eq!(
            check(&s, Some(basic_value("", &s).as_bytes())),
            Verdict::Accepted
        );
        let with_colon = ClusterSecret::from_bytes(b"a:b:c:d:e:f:g:h:i").unwrap();
        assert_eq!(
            check(&with_colon, Some(basic_value("u", &with_colon).as_bytes())),
            Verdict::Accepted
        );
    }

    #[test]
    fn everything_else_is_refused_with_its_reason() {
        let s = secret();
        let other = ClusterSecret::from_bytes(b"another-secret-value").unwrap();
        assert_eq!(check(&s, None), Verdict::Missing);
        assert_eq!(check(&s, Some(other.bearer().as_bytes())), Verdict::Wrong);
        assert_eq!(
            check(&s, Some(basic_value("admin", &other).as_bytes())),
            Verdict::Wrong
        );
        // A prefix or an extension of the secret is not the secret.
        assert_eq!(
            check(&s, Some(b"Bearer s3cr3t-s3cr3t-s3cr3")),
            Verdict::Wrong
        );
        assert_eq!(
            check(&s, Some(b"Bearer s3cr3t-s3cr3t-s3cr3tX")),
            Verdict::Wrong
        );
        for malformed in [
            &b""[..],
            b"Bearer",
            b"Bearer ",
            b"s3cr3t-s3cr3t-s3cr3t",
            b"Token s3cr3t-s3cr3t-s3cr3t",
            b"Basic !!!not-base64!!!",
            // base64("no-colon-here"): no user:password split.
            b"Basic bm8tY29sb24taGVyZQ==",
            b"\xff\xfe",
        ] {
            assert_eq!(
                check(&s, Some(malformed)),
                Verdict::Malformed,
                "{malformed:?}"
            );
        }
        assert!(Verdict::Missing.reason().contains("--cluster-secret-file"));
        assert!(Verdict::Wrong.reason().contains("wrong cluster secret"));
    }
}
