//! The password file PostgreSQL's own tools read (`~/.pgpass`, or the file `PGPASSFILE`
//! names), so a client machine keeps the database password in a file only its owner can read
//! rather than in the URL (which `ps` shows) or the environment.
//!
//! Format, as libpq's: one `hostname:port:database:username:password` per line, `*` matching
//! anything in the first four fields, `\:` and `\\` escaping, `#` starting a comment line. As
//! libpq does, a file that its group or others may read is ignored (with a warning).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The password file to read: `PGPASSFILE`, else `~/.pgpass`.
pub fn default_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PGPASSFILE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pgpass"))
}

/// The password for this connection from `path`, if the file exists, is private, and has a
/// matching line (the first match wins).
pub fn lookup(path: &Path, host: &str, port: u16, db: &str, user: &str) -> Option<String> {
    let md = std::fs::metadata(path).ok()?;
    if !md.is_file() {
        return None;
    }
    if md.mode() & 0o077 != 0 {
        tracing::warn!(
            "password file {} has group or world access (mode {:04o}); ignored: chmod 600 it",
            path.display(),
            md.mode() & 0o7777
        );
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let port = port.to_string();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split(line);
        if fields.len() != 5 {
            continue;
        }
        let want = [host, port.as_str(), db, user];
        if fields[..4]
            .iter()
            .zip(want)
            .all(|(f, w)| f == "*" || f == w)
        {
            return Some(fields[4].clone());
        }
    }
    None
}

/// Splits a line at unescaped ':' (at most 5 fields; the password keeps any further ':').
fn split(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    out.last_mut().expect("one field").push(n);
                }
            }
            ':' if out.len() < 5 => out.push(String::new()),
            c => out.last_mut().expect("one field").push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(text: &str, mode: u32) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pgpass");
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        (d, p)
    }

    #[test]
    fn finds_the_first_matching_line() {
        let (_d, p) = file(
            "# comment\nother:5432:*:tierfs:nope\ndb1:5432:tierfs:tierfs:s3cr\\:et\n*:*:*:*:fallback\n",
            0o600,
        );
        assert_eq!(
            lookup(&p, "db1", 5432, "tierfs", "tierfs").as_deref(),
            Some("s3cr:et")
        );
        assert_eq!(
            lookup(&p, "db2", 6000, "x", "y").as_deref(),
            Some("fallback")
        );
    }

    #[test]
    fn ignores_a_file_others_can_read() {
        let (_d, p) = file("*:*:*:*:pw\n", 0o644);
        assert_eq!(lookup(&p, "h", 5432, "d", "u"), None);
    }

    #[test]
    fn a_password_may_hold_colons() {
        assert_eq!(split("h:1:d:u:a:b"), ["h", "1", "d", "u", "a:b"]);
    }
}
