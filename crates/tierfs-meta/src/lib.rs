//! tierfs metadata engine: the namespace, file layouts, slices, sessions and locks of a tierfs
//! filesystem, kept in an existing database (the Lustre MDS/MDT role).
//!
//! - [`engine`]: the domain traits (namespace, file data, sessions, PCC, locks, admin,
//!   changelog, workers, HSM) and [`engine::MetaEngine`], all of them at once; one transaction per
//!   method.
//! - [`core::SqlMeta`]: the one implementation of them, over the SQL layer [`sql`].
//! - [`sqlite::SqliteEngine`]: the embedded default's driver (SQLite in WAL mode);
//!   [`sqlite::SqliteMeta`] is the engine.
//! - [`postgres::PgEngine`]: the cluster engine's driver (PostgreSQL); [`postgres::PgMeta`].
//! - [`conformance`]: the test suite every engine must pass.

pub mod changelog;
pub mod conformance;
pub mod core;
pub mod engine;
pub mod error;
pub mod faulty;
pub mod hsm;
pub mod locks;
pub mod postgres;
pub mod sql;
pub mod sqlite;
pub mod types;
pub mod url;

pub use engine::{
    Admin, Changelog, Channel, FileData, Hsm, Listener, Locks, MetaEngine, Namespace, Notice, Pcc,
    Sessions, Workers, OPEN_TRASH_GRACE, ORPHAN_GRACE, UNLINK_GRACE,
};
pub use error::{MetaError, Result};
pub use types::*;
pub use url::{format_engine, open_engine, MetaUrl};
