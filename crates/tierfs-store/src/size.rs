//! Human sizes: `64K`, `1M`, `10G` (powers of 1024), as Lustre's `lfs` takes them.

use crate::error::{Result, StoreError};

pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        Some('B') => (&t[..t.len() - 1], 1),
        _ => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| StoreError::BadSize(s.to_string()))?;
    n.checked_mul(mult)
        .ok_or_else(|| StoreError::BadSize(s.to_string()))
}

/// `1.5G`-style rendering for df.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n}B")
    } else {
        format!("{v:.1}{}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("x").is_err());
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(human(1536), "1.5K");
    }
}
