//! tierfs Persistent Client Cache (the Lustre PCC role): files cached on a client's local disk
//! and served by kernel FUSE passthrough.
//!
//! - [`rules`]: the attach-rule grammar (Lustre `lctl pcc add` syntax) and its evaluation.

pub mod rules;
