//! tierfs client daemon: the FUSE filesystem that `tierfs mount` runs (the Lustre llite role).
//!
//! - [`caller`]: who makes each change (uid/gid, job id), for changelog records.
//! - [`acl`]: POSIX ACLs (encoding, and the mode/ACL rules the daemon applies).
//! - [`fs`]: the FUSE operations, mapped onto the metadata engine and the data path.
//! - [`data`]: reads and writes of file data over the storage targets.
//! - [`daemon`]: mounting, the client session (heartbeat, garbage collection), signals.
//! - [`config`]: the client's TOML configuration.
//! - [`metrics`]: Prometheus metrics and the stats file.
//! - [`mover`]: the HSM data movers (archive, restore, remove of one taken request).
//! - [`pcc`]: the persistent client cache as this client runs it.
//! - [`lease`]: recalling another client's RW-PCC lease before an open or truncate (every
//!   client, with a cache or not).
//! - [`liveness`]: whether a session's daemon still runs, when it ran on this machine.
//! - [`memfs`]: the FUSE floor, an in-memory filesystem mounted as tierfs is (benchmarks only).
//! - [`recall`]: the loop that gives RW-PCC leases back on request (notified or polling).
//! - [`session`]: this client's session, and its fencing when the session ended under it.
//! - [`workers`]: the background workers (heartbeat, reaper, close recorder, PCC, GC,
//!   compaction, maintenance, recalls), each on its own thread, with state and last error.

pub mod acl;
pub mod caller;
pub mod config;
pub mod copysum;
pub mod daemon;
pub mod data;
pub mod error;
pub mod fs;
pub mod lease;
pub mod liveness;
pub mod memfs;
pub mod metrics;
pub mod mover;
pub mod pcc;
pub mod pcc_state;
pub mod recall;
pub mod session;
pub mod workers;
pub mod xattr_hint;

pub use config::ClientConfig;
pub use daemon::{mount, MountRequest};
