//! Redis's glob matching (`stringmatchlen`), used by ACL key patterns and,
//! through `keyway-node`, by `KEYS`, `SCAN MATCH` and `COMMAND LIST FILTERBY PATTERN`.

/// Redis's `stringmatchlen` glob (`*`, `?`, `[...]` with ranges and `^`, `\\`
/// escapes), case-sensitive; a pattern of exactly `*` matches every key
/// (KEYS's and SCAN's shortcut), the empty one included.
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    if pattern == b"*" {
        return true;
    }
    let mut skip_longer = false;
    glob_rec(pattern, text, &mut skip_longer, 0)
}

/// Deepest `*` nesting Redis follows before it calls a pattern a non-match
/// (its protection against abusive patterns).
const GLOB_MAX_NESTING: usize = 1000;

/// A port of Redis 7.0's `stringmatchlen_impl`, including its
/// `skipLongerMatches` cut: once the rest of the pattern after a `*` matches
/// nowhere in the rest of the string, no earlier `*` can help either.
fn glob_rec(mut p: &[u8], mut s: &[u8], skip_longer: &mut bool, nesting: usize) -> bool {
    if nesting > GLOB_MAX_NESTING {
        return false;
    }
    while !p.is_empty() && !s.is_empty() {
        match p[0] {
            b'*' => {
                while p.len() > 1 && p[1] == b'*' {
                    p = &p[1..];
                }
                if p.len() == 1 {
                    return true;
                }
                while !s.is_empty() {
                    if glob_rec(&p[1..], s, skip_longer, nesting + 1) {
                        return true;
                    }
                    if *skip_longer {
                        return false;
                    }
                    s = &s[1..];
                }
                *skip_longer = true;
                return false;
            }
            b'?' => s = &s[1..],
            b'[' => {
                p = &p[1..];
                let not = p.first() == Some(&b'^');
                if not {
                    p = &p[1..];
                }
                let mut matched = false;
                loop {
                    if p.first() == Some(&b'\\') && p.len() >= 2 {
                        p = &p[1..];
                        if p[0] == s[0] {
                            matched = true;
                        }
                    } else if p.first() == Some(&b']') {
                        break;
                    } else if p.is_empty() {
                        // An unterminated class: Redis steps back onto its
                        // last byte, which the common step below consumes.
                        break;
                    } else if p.len() >= 3 && p[1] == b'-' {
                        let (lo, hi) = (p[0].min(p[2]), p[0].max(p[2]));
                        p = &p[2..];
                        if (lo..=hi).contains(&s[0]) {
                            matched = true;
                        }
                    } else if p[0] == s[0] {
                        matched = true;
                    }
                    p = &p[1..];
                }
                if matched == not {
                    return false;
                }
                s = &s[1..];
                if p.is_empty() {
                    // The stepped-back byte of an unterminated class.
                    return s.is_empty();
                }
            }
            c => {
                let c = if c == b'\\' && p.len() >= 2 {
                    p = &p[1..];
                    p[0]
                } else {
                    c
                };
                if c != s[0] {
                    return false;
                }
                s = &s[1..];
            }
        }
        p = &p[1..];
        if s.is_empty() {
            while p.first() == Some(&b'*') {
                p = &p[1..];
            }
            break;
        }
    }
    p.is_empty() && s.is_empty()
}
