//! Errors of the storage targets, each with the errno an application sees.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("unsupported target URL '{0}' (expected file:///path/to/dir or s3://bucket[/prefix], with optional ?capacity=SIZE, and for s3 ?endpoint=URL&region=NAME)")]
    BadUrl(String),
    #[error("storage target {0} does not exist")]
    Missing(String),
    #[error("storage target {0} is not writable: {1}")]
    Unwritable(String, String),
    #[error("object {0} is missing from its target")]
    NotFound(String),
    #[error("no space left on storage target {0}")]
    NoSpace(u32),
    #[error("unknown storage target {0}")]
    UnknownTarget(u32),
    #[error("S3 credentials: {0}")]
    Credentials(String),
    #[error("invalid size '{0}' (expected a number with an optional K, M, G or T suffix)")]
    BadSize(String),
    #[error("storage target {0} has an unreadable identity marker (.tierfs-target): {1}")]
    BadIdentity(String, String),
    #[error("storage target {0} refused: {1}")]
    WrongTarget(String, String),
    #[error("archive {0} is unreachable: {1}")]
    ArchiveUnreachable(String, String),
    #[error("storage I/O error: {0}")]
    Io(String),
}

impl StoreError {
    pub fn errno(&self) -> i32 {
        match self {
            StoreError::NoSpace(_) => libc::ENOSPC,
            StoreError::BadUrl(_) | StoreError::BadSize(_) => libc::EINVAL,
            StoreError::Credentials(_) => libc::EACCES,
            _ => libc::EIO,
        }
    }
}

impl From<object_store::Error> for StoreError {
    fn from(e: object_store::Error) -> Self {
        match e {
            object_store::Error::NotFound { path, .. } => StoreError::NotFound(path),
            other => {
                let s = other.to_string();
                if s.contains("No space left") {
                    StoreError::NoSpace(u32::MAX)
                } else {
                    StoreError::Io(s)
                }
            }
        }
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;
