//! Sizes with binary units: `4G`, `512M`, `4096`, `1.5G`, `64KiB`.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SizeError {
    #[error("empty size")]
    Empty,
    #[error("invalid size {0:?}: expected a number with an optional unit K, M, G, T (powers of 1024), e.g. 4G or 512M")]
    Invalid(String),
    #[error("size {0:?} is too large")]
    Overflow(String),
}

/// Parse a byte count. Units are powers of 1024 (`K`, `M`, `G`, `T`, `P`,
/// optionally followed by `iB` or `B`); a bare number is bytes.
pub(crate) fn parse_size(text: &str) -> Result<u64, SizeError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(SizeError::Invalid(text.to_string()));
    }
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        _ => return Err(SizeError::Invalid(text.to_string())),
    };
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(1u64 << shift)
            .ok_or_else(|| SizeError::Overflow(text.to_string()));
    }
    let f: f64 = num
        .parse()
        .map_err(|_| SizeError::Invalid(text.to_string()))?;
    let v = f * (1u64 << shift) as f64;
    if !v.is_finite() || v >= u64::MAX as f64 {
        return Err(SizeError::Overflow(text.to_string()));
    }
    if v.fract() != 0.0 {
        return Err(SizeError::Invalid(text.to_string()));
    }
    Ok(v as u64)
}

/// Format a byte count the way [`parse_size`] reads it, exactly.
pub(crate) fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes != 0 && bytes % (1u64 << shift) == 0 {
            return format!("{}{}", bytes >> shift, unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size(" 2T ").unwrap(), 2 << 40);
    }

    #[test]
    fn errors() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert!(matches!(parse_size("G"), Err(SizeError::Invalid(_))));
        assert!(matches!(parse_size("4X"), Err(SizeError::Invalid(_))));
        assert!(matches!(parse_size("-1"), Err(SizeError::Invalid(_))));
        assert!(matches!(parse_size("0.3"), Err(SizeError::Invalid(_))));
        assert!(matches!(
            parse_size("99999999999P"),
            Err(SizeError::Overflow(_))
        ));
    }

    #[test]
    fn roundtrip() {
        for v in [0u64, 1, 512, 4096, 1 << 20, 3 << 30, 12345] {
            assert_eq!(parse_size(&format_size(v)).unwrap(), v);
        }
    }
}
