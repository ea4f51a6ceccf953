//! Client errors, mapped to the errno returned at the FUSE boundary.

use thiserror::Error;
use tierfs_meta::MetaError;
use tierfs_store::StoreError;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Errno(&'static str, i32),
    #[error("{0}")]
    Failed(String, i32),
}

impl ClientError {
    pub fn errno(&self) -> i32 {
        match self {
            ClientError::Meta(e) => e.errno(),
            ClientError::Store(e) => e.errno(),
            ClientError::Errno(_, n) | ClientError::Failed(_, n) => *n,
        }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;
