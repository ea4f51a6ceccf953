//! `tierfs memfs MOUNTPOINT` (hidden): the FUSE floor of issue 14, an in-memory filesystem
//! mounted with tierfs's own FUSE code, mount options, kernel flags and TTLs
//! ([`tierfs_client::memfs`]). `scripts/bench-small.sh --floor` runs every workload on it
//! beside native and tierfs. It runs in the foreground until unmounted or signalled.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tierfs_client::config::{ClientConfig, ReaddirPlus};
use tierfs_client::memfs::{serve, MemfsOptions};

use crate::error::{CliError, Result};

#[derive(Debug, Args)]
pub struct MemfsArgs {
    /// Where to mount it (an existing directory).
    pub mountpoint: PathBuf,
    /// Seconds the kernel caches names and attributes (default: what a tierfs mount's replies
    /// carry with its default configuration: follow_ttl while following changes).
    #[arg(long)]
    pub ttl: Option<f64>,
    /// Threads serving FUSE requests (default: tierfs's fuse_threads).
    #[arg(long)]
    pub threads: Option<usize>,
    /// FUSE over io_uring where the kernel offers it (as tierfs's fuse_uring).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub fuse_uring: bool,
    /// Ask for FUSE_POSIX_ACL (as tierfs's posix_acl).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub posix_acl: bool,
    /// always, auto or off (as tierfs's readdirplus).
    #[arg(long, default_value = "always")]
    pub readdirplus: String,
}

pub fn memfs(a: MemfsArgs) -> Result<()> {
    let d = ClientConfig::default();
    let ttl = a.ttl.unwrap_or(if d.follow_changes {
        d.follow_ttl
    } else {
        d.attr_ttl
    });
    if !(0.0..=3600.0).contains(&ttl) {
        return Err(CliError::Usage(format!(
            "--ttl {ttl} is out of range 0..3600"
        )));
    }
    let readdirplus = ReaddirPlus::parse(&a.readdirplus).map_err(CliError::Usage)?;
    let opts = MemfsOptions {
        attr_ttl: Duration::from_secs_f64(ttl),
        entry_ttl: Duration::from_secs_f64(ttl),
        readdirplus,
        posix_acl: a.posix_acl,
        fuse_uring: a.fuse_uring,
        threads: a.threads.unwrap_or(d.fuse_threads).max(1),
    };
    // As `tierfs mount`: an existing directory, not already mounted (a crashed daemon's dead
    // mount is cleaned up).
    let mp = tierfs_client::daemon::prepare_mountpoint(&a.mountpoint)?;
    serve(&mp, opts, || {}).map_err(CliError::Other)
}
