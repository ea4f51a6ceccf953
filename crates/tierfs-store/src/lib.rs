//! tierfs storage targets: where file data lives, as immutable objects in object stores (the
//! Lustre OSS/OST role).
//!
//! - [`target`]: a target URL (`file:///dir`, with an optional `?capacity=`), opened through the
//!   `object_store` crate.
//! - [`objects`]: object naming and the put/get/delete of slice objects.
//! - [`allocator`]: which targets a new file's stripes go to (round-robin while balanced,
//!   weighted by free space once usage differs by more than a threshold, as Lustre's QOS).

pub mod allocator;
pub mod error;
pub mod objects;
pub mod size;
pub mod target;

pub use allocator::Allocator;
pub use error::StoreError;
pub use objects::object_path;
pub use target::{Target, TargetSet, TargetSpec};
