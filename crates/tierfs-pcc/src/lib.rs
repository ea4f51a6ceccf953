//! tierfs Persistent Client Cache (the Lustre PCC role): files cached on a client's local disk
//! and served by kernel FUSE passthrough.
//!
//! - [`rules`]: the attach-rule grammar (Lustre `lctl pcc add` syntax) and its evaluation.
//! - [`store`]: the cache directory: cached files and their descriptions, kept across restarts.

pub mod rules;
pub mod store;
