//! tierfs storage targets: where file data lives, as immutable objects in object stores (the
//! Lustre OSS/OST role).
//!
//! - [`target`]: a target URL (`file:///dir` or `s3://bucket/prefix?endpoint=...`, with an
//!   optional `?capacity=`), opened through the `object_store` crate.
//! - [`archive`]: HSM archive backends (same URLs), holding one object per archive copy.
//! - [`s3`]: S3-compatible targets: retries, multipart uploads, parallel ranged reads.
//! - [`credentials`]: where S3 credentials come from (never from the metadata engine).
//! - [`identity`]: the marker naming the filesystem and index a target belongs to, written
//!   at format and checked at each mount.
//! - [`objects`]: object naming and the put/get/delete of slice objects.
//! - [`allocator`]: which targets a new file's stripes go to (round-robin while balanced,
//!   weighted by free space once usage differs by more than a threshold, as Lustre's QOS).

pub mod allocator;
pub mod archive;
pub mod credentials;
pub mod error;
pub mod identity;
pub mod objects;
pub mod s3;
pub mod size;
pub mod target;

pub use allocator::Allocator;
pub use error::StoreError;
pub use objects::object_path;
pub use target::{Target, TargetSet, TargetSpec};
