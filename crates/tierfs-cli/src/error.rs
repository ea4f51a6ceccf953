//! Errors of the `tierfs` command; `main` prints each as one line.

use thiserror::Error;
use tierfs_client::daemon::DaemonError;
use tierfs_meta::MetaError;
use tierfs_store::StoreError;

#[derive(Debug, Error)]
pub enum CliError {
    #[error("{0}")]
    Meta(#[from] MetaError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Daemon(#[from] DaemonError),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("config {0}: {1}")]
    Config(String, String),
    #[error("{0}")]
    Usage(String),
    #[error("{0} is not in a tierfs mount")]
    NotTierfs(String),
    #[error("{0} is not mounted")]
    NotMounted(String),
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, CliError>;
