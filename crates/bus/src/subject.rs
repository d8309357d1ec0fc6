//! Subject layout: `{prefix}.{tenant}.{model}` with each name escaped into a
//! single safe subject token.
//!
//! A NATS subject token may not be empty and may not contain `.`, `*`, `>` or
//! whitespace; tenants and models are free-form strings. The escape keeps
//! `[A-Za-z0-9_-]` as is, writes every other byte as `~HH` (upper-case hex
//! of the UTF-8 byte) and an empty name as a lone `~`. It is injective (a
//! `~` is always followed by two hex digits except in the lone `~`), so one
//! (tenant, model) is exactly one subject, and a fleet can shard by subject
//! (`{prefix}.{tenant}.>` is one tenant's traffic).

/// Escapes one name into a subject token.
pub fn escape_token(name: &str) -> String {
    if name.is_empty() {
        return "~".to_owned();
    }
    let mut out = String::with_capacity(name.len());
    for &b in name.as_bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.push('~');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
    out
}

/// Reverses [`escape_token`]; `None` for a token it could not have produced.
pub fn unescape_token(token: &str) -> Option<String> {
    if token == "~" {
        return Some(String::new());
    }
    if token.is_empty() {
        return None;
    }
    let b = token.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'~' => {
                let hex = token.get(i + 1..i + 3)?;
                if !hex
                    .bytes()
                    .all(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(&c))
                {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            c if c.is_ascii_alphanumeric() || c == b'_' || c == b'-' => {
                out.push(c);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// The subject of one (tenant, model).
pub fn subject(prefix: &str, tenant: &str, model: &str) -> String {
    format!("{prefix}.{}.{}", escape_token(tenant), escape_token(model))
}

/// Every subject of the stream.
pub fn all_subjects(prefix: &str) -> String {
    format!("{prefix}.>")
}

/// Every subject of one tenant (for a fleet sharded by tenant).
pub fn tenant_subjects(prefix: &str, tenant: &str) -> String {
    format!("{prefix}.{}.>", escape_token(tenant))
}

/// Parses a stream subject back into (tenant, model).
pub fn parse_subject(prefix: &str, subject: &str) -> Option<(String, String)> {
    let rest = subject.strip_prefix(prefix)?.strip_prefix('.')?;
    let (t, m) = rest.split_once('.')?;
    Some((unescape_token(t)?, unescape_token(m)?))
}

/// Whether `prefix` is a valid subject prefix: dot-separated tokens of
/// printable, non-wildcard characters.
pub fn valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.split('.').all(|t| {
            !t.is_empty()
                && t.bytes()
                    .all(|c| c.is_ascii_graphic() && c != b'*' && c != b'>')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_become_single_safe_tokens() {
        assert_eq!(escape_token("team-a"), "team-a");
        assert_eq!(escape_token(""), "~");
        assert_eq!(escape_token("a.b"), "a~2Eb");
        assert_eq!(escape_token("*>"), "~2A~3E");
        assert_eq!(escape_token("~"), "~7E");
        assert_eq!(escape_token("meta-llama/Llama 3"), "meta-llama~2FLlama~203");
        assert_eq!(subject("ic", "t.1", ""), "ic.t~2E1.~");
        assert_eq!(
            parse_subject("ic", "ic.t~2E1.~"),
            Some(("t.1".into(), String::new()))
        );
        assert_eq!(parse_subject("ic", "ic.bad~zz.m"), None);
        assert_eq!(parse_subject("ic", "other.t.m"), None);
        assert!(valid_prefix("inferencecache.v1"));
        assert!(!valid_prefix("a..b"));
        assert!(!valid_prefix("a.*"));
        assert!(!valid_prefix(""));
        assert!(!valid_prefix("a b"));
    }

    proptest! {
        #[test]
        fn escape_round_trips_and_is_a_safe_token(s in ".{0,24}") {
            let t = escape_token(&s);
            prop_assert!(!t.is_empty());
            prop_assert!(t.bytes().all(|c| c.is_ascii_graphic() && !b".*>".contains(&c)));
            prop_assert_eq!(unescape_token(&t), Some(s));
        }

        #[test]
        fn escape_is_injective(a in ".{0,8}", b in ".{0,8}") {
            prop_assert_eq!(a == b, escape_token(&a) == escape_token(&b));
        }
    }
}
