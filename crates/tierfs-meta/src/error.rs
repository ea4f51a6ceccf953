//! Errors of the metadata engine, each mapped to the errno the FUSE layer returns.

use thiserror::Error;

/// What can go wrong in a metadata operation.
#[derive(Debug, Error)]
pub enum MetaError {
    #[error("no such file or directory")]
    NotFound,
    /// A lookup in a directory that no longer exists (removed, maybe by another client): not
    /// "no such name", so the kernel walks the path again (ESTALE) rather than caching a
    /// negative entry under a dead directory.
    #[error("the directory no longer exists")]
    StaleDir,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("file name too long")]
    NameTooLong,
    #[error("no such attribute")]
    NoAttr,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("resource temporarily unavailable (lock held)")]
    WouldBlock,
    #[error("too many links")]
    TooManyLinks,
    /// The file is open on another client (an RW-PCC lease cannot be taken: writes through
    /// that client's handles would be lost at the owner's next write-back).
    #[error("file is open on another client")]
    InUse,
    #[error("no space left on target")]
    NoSpace,
    /// A live session already uses this client name (its description).
    #[error("client name {0}")]
    ClientNameInUse(String),
    /// The session has ended (reaped after missing its heartbeats, or evicted by an
    /// administrator): its opens and locks are gone, and nothing more is recorded under it.
    /// The client fences itself and registers a new session; handles opened under the old
    /// one fail with EIO (as Lustre's after an eviction).
    #[error("session {0} has ended (reaped or evicted): this client was fenced")]
    SessionEnded(u64),
    #[error("filesystem is not formatted: {0}")]
    NotFormatted(String),
    #[error("filesystem is already formatted as '{0}' (use --force to format again)")]
    AlreadyFormatted(String),
    #[error("unsupported metadata URL '{0}' (expected sqlite:///path/to/meta.db or postgres://user@host[:port]/db)")]
    BadUrl(String),
    #[error("metadata schema version {found} is newer than this tierfs understands ({supported})")]
    SchemaTooNew { found: i64, supported: i64 },
    #[error("metadata engine busy after {0} retries")]
    Busy(u32),
    #[error("metadata database error: {0}")]
    Db(String),
    /// The connection to a networked database (PostgreSQL) is lost or cannot be made; the next
    /// operation reconnects.
    #[error("metadata database unreachable: {0}")]
    Unavailable(String),
    /// Bad input to a changelog operation (unknown reader, clear past the end, ...).
    #[error("{0}")]
    Changelog(#[from] crate::changelog::ChangelogError),
    /// A refusal of, or bad input to, an HSM operation.
    #[error("{0}")]
    Hsm(#[from] crate::hsm::HsmError),
}

impl MetaError {
    /// The errno an application sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            MetaError::NotFound => libc::ENOENT,
            MetaError::StaleDir => libc::ESTALE,
            MetaError::Exists => libc::EEXIST,
            MetaError::NotDir => libc::ENOTDIR,
            MetaError::IsDir => libc::EISDIR,
            MetaError::NotEmpty => libc::ENOTEMPTY,
            MetaError::Invalid(_) => libc::EINVAL,
            MetaError::NameTooLong => libc::ENAMETOOLONG,
            MetaError::NoAttr => libc::ENODATA,
            MetaError::NotPermitted => libc::EPERM,
            MetaError::WouldBlock => libc::EAGAIN,
            MetaError::TooManyLinks => libc::EMLINK,
            MetaError::InUse | MetaError::ClientNameInUse(_) => libc::EBUSY,
            MetaError::NoSpace => libc::ENOSPC,
            MetaError::Busy(_) => libc::EAGAIN,
            MetaError::NotFormatted(_)
            | MetaError::AlreadyFormatted(_)
            | MetaError::BadUrl(_)
            | MetaError::SchemaTooNew { .. }
            | MetaError::Db(_)
            | MetaError::Unavailable(_)
            | MetaError::SessionEnded(_) => libc::EIO,
            MetaError::Changelog(e) => e.errno(),
            MetaError::Hsm(e) => e.errno(),
        }
    }
}

pub type Result<T> = std::result::Result<T, MetaError>;
