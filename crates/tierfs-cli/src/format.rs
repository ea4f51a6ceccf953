//! `tierfs format`: a new metadata database and storage targets.

use tierfs_meta::{format_engine, FormatParams, MetaUrl};
use tierfs_store::size::parse_size;
use tierfs_store::TargetSpec;

use crate::cli::FormatArgs;
use crate::error::{CliError, Result};

/// Checks a stripe size: at least 64K, a multiple of 64K, at most 4G (as Lustre).
pub fn stripe_size(s: &str) -> Result<u64> {
    let n = parse_size(s)?;
    if n < 64 << 10 || n % (64 << 10) != 0 || n > 4 << 30 {
        return Err(CliError::Usage(format!(
            "invalid stripe size '{s}': must be a multiple of 64K between 64K and 4G"
        )));
    }
    Ok(n)
}

/// Checks a stripe count against the number of targets (-1 means all).
pub fn stripe_count(c: i64, targets: usize) -> Result<u32> {
    match c {
        -1 => Ok(targets as u32),
        n if n >= 1 && (n as usize) <= targets => Ok(n as u32),
        n => Err(CliError::Usage(format!(
            "invalid stripe count {n}: must be between 1 and the number of targets ({targets}), or -1 for all"
        ))),
    }
}

pub fn format(a: FormatArgs) -> Result<()> {
    MetaUrl::parse(&a.meta)?;
    let specs = a
        .targets
        .iter()
        .map(|t| {
            TargetSpec::parse(t)?.with_s3_defaults(a.s3_endpoint.as_deref(), a.s3_region.as_deref())
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let name = a.fs_name.clone().unwrap_or_else(|| a.name.clone());
    let count = stripe_count(a.stripe_count, specs.len())?;
    let size = stripe_size(&a.stripe_size)?;
    let inline = parse_size(&a.inline_threshold)?;
    if inline > 1 << 20 {
        return Err(CliError::Usage(
            "inline threshold must be at most 1M".into(),
        ));
    }
    if name.is_empty() || name.len() > 64 || name.contains(char::is_whitespace) {
        return Err(CliError::Usage(format!("invalid filesystem name '{name}'")));
    }
    for s in &specs {
        s.check(true)?;
        if s.has_objects()? && !a.force {
            return Err(CliError::Usage(format!(
                "storage target {} already holds tierfs data (use --force to destroy it)",
                s.url
            )));
        }
    }
    let params = FormatParams {
        name,
        targets: specs.iter().map(|s| (s.full_url(), s.capacity)).collect(),
        stripe_count: count,
        stripe_size: size,
        inline_threshold: inline,
        force: a.force,
    };
    let engine = format_engine(&a.meta, &params)?;
    if a.force {
        for s in &specs {
            s.wipe()?;
        }
    }
    let info = engine.info()?;
    println!(
        "formatted {} ({}): {} target(s), stripe count {}, stripe size {}, inline up to {}",
        info.name,
        info.uuid,
        specs.len(),
        count,
        tierfs_store::size::human(size),
        tierfs_store::size::human(inline)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_stripes() {
        assert_eq!(stripe_size("1M").unwrap(), 1 << 20);
        assert!(stripe_size("1000").is_err());
        assert!(stripe_size("100K").is_err());
        assert!(stripe_size("8G").is_err());
        assert_eq!(stripe_count(-1, 3).unwrap(), 3);
        assert_eq!(stripe_count(2, 3).unwrap(), 2);
        assert!(stripe_count(0, 3).is_err());
        assert!(stripe_count(4, 3).is_err());
        assert!(stripe_count(-2, 3).is_err());
    }
}
