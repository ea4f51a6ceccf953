//! `tierfs format`: a new metadata database and storage targets.

use tierfs_meta::{format_engine, open_engine, FormatParams, MetaUrl};
use tierfs_store::identity::{self, TargetIdentity};
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

/// The uuid of the filesystem `meta` holds now, if it holds one that can be read.
fn current_uuid(meta: &str) -> Option<String> {
    if let Some(p) = meta.strip_prefix("sqlite://") {
        // Opening a missing SQLite file would create it.
        if !std::path::Path::new(p.split('?').next().unwrap_or(p)).is_file() {
            return None;
        }
    }
    open_engine(meta)
        .and_then(|e| e.info())
        .ok()
        .map(|i| i.uuid)
}

/// Checks the targets before anything is written: no place listed twice (or one inside
/// another), none of another filesystem, none holding anything but tierfs's own files. With
/// `force`, the targets of the filesystem `meta` holds now (which format destroys), and
/// targets formatted before identity markers existed, are wiped; a target of any other
/// filesystem is refused even then.
fn check_targets(meta: &str, specs: &[TargetSpec], force: bool) -> Result<()> {
    let mut seen: Vec<(String, &str)> = Vec::new();
    for s in specs {
        let loc = identity::location(s);
        for (other, url) in &seen {
            if *other == loc {
                return Err(CliError::Usage(format!(
                    "storage target {} is listed twice (also as {url})",
                    s.url
                )));
            }
            if identity::within(&loc, other) || identity::within(other, &loc) {
                return Err(CliError::Usage(format!(
                    "storage targets {} and {url} overlap (one lies inside the other)",
                    s.url
                )));
            }
        }
        seen.push((loc, &s.url));
    }
    // Without --force, format_engine refuses a formatted database itself.
    let current = current_uuid(meta);
    for s in specs {
        s.check(true)?;
        match identity::read(s)? {
            Some(m) if current.as_deref() == Some(m.fs_uuid.as_str()) => {}
            Some(m) => {
                let why = if force {
                    " (--force replaces only the filesystem of --meta)"
                } else {
                    " (to format that filesystem again, give its --meta with --force)"
                };
                return Err(CliError::Usage(format!(
                    "storage target {} belongs to {}{why}; if that filesystem is gone, empty the target first",
                    s.url,
                    m.describe()
                )));
            }
            None => {
                let c = identity::contents(s)?;
                if let Some(f) = c.foreign {
                    return Err(CliError::Usage(format!(
                        "storage target {} is not empty and is not a tierfs target (it holds '{f}'); give an empty directory or prefix",
                        s.url
                    )));
                }
                if c.objects && !force {
                    return Err(CliError::Usage(format!(
                        "storage target {} already holds tierfs data without an identity marker, from an older tierfs (use --force to destroy it)",
                        s.url
                    )));
                }
            }
        }
    }
    Ok(())
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
    check_targets(&a.meta, &specs, a.force)?;
    let params = FormatParams {
        name,
        targets: specs.iter().map(|s| (s.full_url(), s.capacity)).collect(),
        stripe_count: count,
        stripe_size: size,
        inline_threshold: inline,
        force: a.force,
    };
    let engine = format_engine(&a.meta, &params)?;
    let info = engine.info()?;
    let recorded = engine.targets()?;
    for (i, s) in specs.iter().enumerate() {
        if a.force {
            s.wipe()?;
        }
        let id = recorded
            .iter()
            .find(|t| t.url == s.full_url())
            .map(|t| t.id)
            .unwrap_or(i as u32);
        identity::write(s, &TargetIdentity::new(&info.uuid, &info.name, id))?;
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
