//! tierfs metadata engine: the namespace, file layouts, slices, sessions and locks of a tierfs
//! filesystem, kept in an existing database (the Lustre MDS/MDT role).
//!
//! - [`engine::MetaEngine`]: the trait every engine implements, one transaction per method.
//! - [`sqlite::SqliteEngine`]: the embedded default (SQLite in WAL mode).
//! - [`postgres::PgEngine`]: the cluster engine (PostgreSQL), same schema and semantics.
//! - [`conformance`]: the test suite every engine must pass.

pub mod changelog;
pub mod conformance;
pub mod engine;
pub mod error;
pub mod locks;
pub mod postgres;
pub mod sqlite;
pub mod types;
pub mod url;

pub use engine::{Channel, Listener, MetaEngine, Notice, ORPHAN_GRACE};
pub use error::{MetaError, Result};
pub use types::*;
pub use url::{format_engine, open_engine, MetaUrl};
