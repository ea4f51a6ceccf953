//! Errors of `tierfs bench`: one enum, each variant one line of text.

use std::path::PathBuf;

/// Why a benchmark (or one run of it) failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Bad or contradictory options.
    #[error("{0}")]
    Args(String),
    /// A system call failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Data read back differs from what was written.
    #[error("data mismatch in {path} at offset {offset}: {detail}")]
    Verify {
        path: PathBuf,
        offset: u64,
        detail: String,
    },
    /// A read returned fewer bytes than the file must hold.
    #[error("short read in {path} at offset {offset}: wanted {wanted} bytes, got {got}")]
    ShortRead {
        path: PathBuf,
        offset: u64,
        wanted: usize,
        got: usize,
    },
    /// An external command (tierfs, fio, tar) failed.
    #[error("{command}: {detail}")]
    Command { command: String, detail: String },
    /// Setting up or tearing down the filesystem under test failed.
    #[error("setup: {0}")]
    Setup(String),
    /// A required tool is not installed: the workload is skipped, not failed.
    #[error("{0}")]
    Missing(String),
    /// Ctrl-C or SIGTERM.
    #[error("interrupted")]
    Interrupted,
    /// Some runs failed (the report says which).
    #[error("{0}")]
    Failed(String),
    /// Writing a report or chart failed.
    #[error("report: {0}")]
    Report(String),
}

impl BenchError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        BenchError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Adds context to `std::io::Result`.
pub trait IoContext<T> {
    fn ctx(self, f: impl FnOnce() -> String) -> Result<T, BenchError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, f: impl FnOnce() -> String) -> Result<T, BenchError> {
        self.map_err(|e| BenchError::io(f(), e))
    }
}
