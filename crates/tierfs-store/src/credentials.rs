//! S3 credentials: where they come from, and the rule that they never reach a log, `--help`,
//! `tierfs status` or the metadata engine.
//!
//! Looked up in this order (the first that exists wins):
//! 1. the file named by `TIERFS_S3_CREDENTIALS` (`tierfs format/mount --s3-credentials FILE`
//!    sets it for the daemon);
//! 2. the environment: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, optionally
//!    `AWS_SESSION_TOKEN`;
//! 3. `/etc/tierfs/s3-credentials.toml`.
//!
//! A credentials file is TOML with `access_key_id`, `secret_access_key` and an optional
//! `session_token`. It must be a regular file that only its owner can read (no group or other
//! permission bits, like ssh's keys); anything else is refused rather than used.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Result, StoreError};

/// The environment variable naming a credentials file.
pub const CREDENTIALS_ENV: &str = "TIERFS_S3_CREDENTIALS";
/// The credentials file used when nothing else is given.
pub const DEFAULT_CREDENTIALS_FILE: &str = "/etc/tierfs/s3-credentials.toml";

/// An access key pair. `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// Where they came from, for error messages (a path or "the environment").
    pub source: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"***")
            .field("session_token", &self.session_token.as_ref().map(|_| "***"))
            .field("source", &self.source)
            .finish()
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFormat {
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
}

/// Reads a file that holds secrets: it must be a regular file that no other user can read
/// (no group or other permission bits) and, unless the caller is root, owned by the caller.
/// The error says why in words, never with the file's contents.
pub fn read_private_file(path: &Path) -> std::result::Result<String, String> {
    let md = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !md.is_file() {
        return Err("not a regular file".into());
    }
    if md.mode() & 0o077 != 0 {
        return Err(format!(
            "mode {:04o} lets other users read it; chmod 600 it",
            md.mode() & 0o7777
        ));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me && me != 0 {
        return Err(format!("owned by uid {}, not by you", md.uid()));
    }
    std::fs::read_to_string(path).map_err(|e| e.to_string())
}

/// Reads a credentials file, refusing one that others could read.
pub fn from_file(path: &Path) -> Result<Credentials> {
    let bad = |why: String| StoreError::Credentials(format!("{}: {why}", path.display()));
    let text = read_private_file(path).map_err(bad)?;
    // The TOML error may quote the line it failed on, which may hold the secret: keep only
    // the position.
    let parsed: FileFormat = toml::from_str(&text).map_err(|e| {
        let at = e
            .span()
            .map(|s| {
                let line = text[..s.start].lines().count().max(1);
                format!(" at line {line}")
            })
            .unwrap_or_default();
        bad(format!(
            "not a credentials file{at} (expected access_key_id and secret_access_key)"
        ))
    })?;
    if parsed.access_key_id.is_empty() || parsed.secret_access_key.is_empty() {
        return Err(bad("empty access_key_id or secret_access_key".into()));
    }
    Ok(Credentials {
        access_key_id: parsed.access_key_id,
        secret_access_key: parsed.secret_access_key,
        session_token: parsed.session_token.filter(|s| !s.is_empty()),
        source: path.display().to_string(),
    })
}

fn from_env() -> Option<Credentials> {
    let id = std::env::var("AWS_ACCESS_KEY_ID").ok()?;
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").ok()?;
    if id.is_empty() || secret.is_empty() {
        return None;
    }
    Some(Credentials {
        access_key_id: id,
        secret_access_key: secret,
        session_token: std::env::var("AWS_SESSION_TOKEN")
            .ok()
            .filter(|s| !s.is_empty()),
        source: "the environment (AWS_ACCESS_KEY_ID)".into(),
    })
}

/// The credentials to use, in the order of the module doc.
pub fn resolve() -> Result<Credentials> {
    if let Some(p) = std::env::var_os(CREDENTIALS_ENV).filter(|p| !p.is_empty()) {
        return from_file(&PathBuf::from(p));
    }
    if let Some(c) = from_env() {
        return Ok(c);
    }
    let default = Path::new(DEFAULT_CREDENTIALS_FILE);
    if default.exists() {
        return from_file(default);
    }
    Err(StoreError::Credentials(format!(
        "no S3 credentials: set {CREDENTIALS_ENV} (or --s3-credentials) to a file, or \
         AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or create {DEFAULT_CREDENTIALS_FILE}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn write(dir: &Path, text: &str, mode: u32) -> PathBuf {
        let p = dir.join("creds.toml");
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn reads_a_private_file() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "access_key_id = \"GK1\"\nsecret_access_key = \"s3cr3t\"\n",
            0o600,
        );
        let c = from_file(&p).unwrap();
        assert_eq!(c.access_key_id, "GK1");
        assert_eq!(c.secret_access_key, "s3cr3t");
        assert_eq!(c.session_token, None);
        assert!(!format!("{c:?}").contains("s3cr3t"));
    }

    #[test]
    fn refuses_a_file_others_can_read() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "access_key_id = \"GK1\"\nsecret_access_key = \"s3cr3t\"\n",
            0o644,
        );
        let e = from_file(&p).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        assert!(!e.contains("s3cr3t"));
    }

    #[test]
    fn a_malformed_file_never_echoes_the_secret() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "access_key_id = \"GK1\"\nsecret_access_key = s3cr3t-unquoted\n",
            0o600,
        );
        let e = from_file(&p).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
        let p = write(d.path(), "access_key_id = \"GK1\"\n", 0o600);
        assert!(matches!(from_file(&p), Err(StoreError::Credentials(_))));
    }
}
