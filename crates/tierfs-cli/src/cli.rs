//! Command-line interface: subcommands named as Lustre users know them (`lfs df`, `lfs
//! setstripe`, `lfs getstripe`, `lfs project`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tierfs",
    version,
    about = "tierfs: a parallel filesystem with a persistent client cache, on an existing database and object stores",
    long_about = "tierfs keeps its namespace in a database (SQLite by default) and stripes file data \
over storage targets (object stores: local directories by default). Each client mounts it with FUSE.\n\n\
Start with `tierfs up` for a ready-made demo filesystem."
)]
pub struct Cli {
    /// Log level: error, warn, info, debug or trace (or a tracing filter such as tierfs_client=debug).
    #[arg(long, global = true, default_value = "warn", env = "TIERFS_LOG")]
    pub log_level: String,
    /// S3 credentials file for s3:// targets: TOML with access_key_id and secret_access_key,
    /// mode 0600. Without it: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, then
    /// /etc/tierfs/s3-credentials.toml. Never stored in the metadata database.
    #[arg(
        long,
        global = true,
        env = "TIERFS_S3_CREDENTIALS",
        hide_env_values = true
    )]
    pub s3_credentials: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Format (if needed) and mount a demo filesystem in ./tierfs-demo: SQLite metadata, two
    /// local storage targets, mounted at ./tierfs-demo/mnt.
    Up(UpArgs),
    /// Create a new filesystem: its metadata database and storage targets.
    Format(FormatArgs),
    /// Mount a filesystem (returns once the mount is ready; the daemon keeps serving).
    Mount(MountArgs),
    /// Unmount a tierfs mount: stops its daemon cleanly, or removes a crashed daemon's dead mount.
    #[command(alias = "unmount")]
    Umount(UmountArgs),
    /// Space per storage target and for metadata, then a summary (like `lfs df`).
    Df(DfArgs),
    /// Set the layout of a new (or empty) file, or a directory's default for new files.
    Setstripe(SetstripeArgs),
    /// Show a file's layout and which targets hold its data, or a directory's default.
    Getstripe(GetstripeArgs),
    /// Show or set project ids (like `lfs project`); PCC rules match on them.
    Project(ProjectArgs),
    /// The filesystem, its targets, and the clients mounted now.
    Status(StatusArgs),
    /// Operation counts, latencies and bytes per target of one mount.
    Stats(StatsArgs),
    /// Benchmarks: IOR, mdtest, fio, filebench and untar on the local disk and on tierfs, side by side.
    Bench(tierfs_bench::BenchArgs),
    /// Remove objects left on the targets by uploads that never committed (clients killed
    /// mid-write), after a grace period; prints what it scanned, kept and removed.
    Gc(crate::check::GcArgs),
    /// Check the metadata against the objects on the targets and report in one table; exit 0
    /// when clean, 1 when problems were found (repaired or not), 2 on error. Safe while
    /// clients are mounted: it only reads, and --repair changes only what is re-checked in its
    /// own transaction (see docs/fsck.md).
    Fsck(crate::check::FsckArgs),
    /// Write the metadata of a filesystem to a portable file (to move it to another engine).
    Dump(crate::dump::DumpArgs),
    /// Load a `tierfs dump` file into a freshly formatted, empty filesystem.
    Load(crate::dump::LoadArgs),
    /// An HSM copytool: registers with the coordinator for the given archives, takes their
    /// ARCHIVE, RESTORE and REMOVE requests and moves the data (no mount needed); SIGTERM or
    /// SIGINT gives the requests under way back and exits. See docs/hsm.md.
    Agent(crate::agent::AgentArgs),
    /// The changelog: register readers, print records (--follow), clear, deregister (like
    /// Lustre's lfs changelog). Records are kept only while a reader is registered.
    Changelog(crate::changelog::ChangelogArgs),
    /// The persistent client cache: attach, detach, state, pin, rules, stats.
    #[command(subcommand)]
    Pcc(crate::pcc::PccCmd),
    /// The archive tier (HSM, as Lustre's lfs hsm_*): archives, archive / release / restore /
    /// remove / cancel of files, their flags, and the coordinator's queue (docs/hsm.md).
    #[command(subcommand)]
    Hsm(crate::hsm::HsmCmd),
    /// Client sessions: list them, or evict one (end it at once, like Lustre's `lctl evict`:
    /// its opens and locks go; the client fences itself and registers a new session).
    #[command(subcommand)]
    Session(crate::session::SessionCmd),
    /// Mount as mount(8) asks a helper to: SOURCE MOUNTPOINT -o OPTS (/etc/fstab lines of type
    /// fuse.tierfs; also run as mount.fuse.tierfs, or as `tierfs SOURCE MOUNTPOINT -o OPTS`).
    MountHelper(crate::helper::MountHelperArgs),
    /// Make /sbin/mount.fuse.tierfs (a symlink to this binary), for /etc/fstab lines of type
    /// fuse.tierfs.
    InstallHelper(crate::helper::InstallHelperArgs),
    /// The FUSE floor (benchmarks only): an in-memory filesystem mounted as tierfs is, in the
    /// foreground, until unmounted (docs/benchmarks.md, "The FUSE floor on this machine").
    #[command(hide = true)]
    Memfs(crate::memfs::MemfsArgs),
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Directory of the demo filesystem.
    #[arg(long, default_value = "tierfs-demo")]
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct FormatArgs {
    /// Metadata database URL, e.g. sqlite:///srv/tfs/meta.db or postgres://tierfs@db1/tierfs
    /// (the password from PGPASSWORD or ~/.pgpass; one in the URL is refused).
    #[arg(long)]
    pub meta: String,
    /// Storage target URL (repeat for several), e.g. file:///srv/ost0,
    /// file:///srv/ost1?capacity=100G or s3://bucket/ost0 (an existing bucket).
    #[arg(long = "target", required = true)]
    pub targets: Vec<String>,
    /// Endpoint of an S3-compatible store for s3:// targets whose URL does not name one
    /// (?endpoint=), e.g. http://10.0.0.5:3900; default: AWS. Recorded with the targets.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// Region for s3:// targets whose URL does not name one (?region=); default us-east-1.
    #[arg(long)]
    pub s3_region: Option<String>,
    /// Default number of targets each file is striped over (-1: all).
    #[arg(long, short = 'c', default_value = "1", allow_hyphen_values = true)]
    pub stripe_count: i64,
    /// Default stripe size: a multiple of 64K, e.g. 1M.
    #[arg(long, short = 'S', default_value = "1M")]
    pub stripe_size: String,
    /// Files no larger than this keep their data in the metadata database (0 disables), as
    /// Lustre's Data-on-MDT: no object, and no object fsync at close (at most 1M).
    #[arg(long, default_value = "256K")]
    pub inline_threshold: String,
    /// Filesystem name.
    #[arg(long, default_value = "tierfs")]
    pub name: String,
    /// Filesystem name, as a positional argument (same as --name).
    #[arg(value_name = "NAME", conflicts_with = "name")]
    pub fs_name: Option<String>,
    /// Format even if the database already holds a filesystem: destroys it and the data on its
    /// targets. A target that belongs to another filesystem (its .tierfs-target marker names
    /// another uuid) is refused even so.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct MountArgs {
    /// Metadata database URL, e.g. sqlite:///srv/tfs/meta.db or postgres://tierfs@db1/tierfs
    /// (a password in the URL is refused: use PGPASSWORD or ~/.pgpass, which the daemon
    /// inherits or reads).
    #[arg(long)]
    pub meta: String,
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// Name of this client (default: the host name); `tierfs status` lists it. A name is
    /// mounted once at a time: a second mount of a live client's name is refused.
    #[arg(long)]
    pub client_name: Option<String>,
    /// Stay in the foreground instead of returning once mounted.
    #[arg(long, short = 'f')]
    pub foreground: bool,
    /// Client configuration file (TOML); see docs/configuration in the README for keys.
    #[arg(long, env = "TIERFS_CONFIG")]
    pub config: Option<PathBuf>,
    /// Seconds the kernel caches attributes and names (default 1).
    #[arg(long)]
    pub attr_ttl: Option<f64>,
    /// Serve Prometheus metrics on this address, e.g. 127.0.0.1:9567.
    #[arg(long)]
    pub metrics: Option<String>,
    /// Where the background daemon logs (default: /tmp/tierfs-<client>.log). Created mode
    /// 0600; a symbolic link at that path is not followed and a file of another user is
    /// refused.
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// Persistent client cache directory on a local disk (enables PCC on this client).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Capacity of the persistent client cache, e.g. 200G (default 10G).
    #[arg(long)]
    pub cache_size: Option<String>,
    /// Where changelog records take the writer's job id from: the name of an environment
    /// variable of the writing process (e.g. SLURM_JOB_ID), procname_uid (process name and
    /// uid, as Lustre), or disable (the default). Config key jobid_var.
    #[arg(long)]
    pub jobid_var: Option<String>,
}

#[derive(Debug, Args)]
pub struct UmountArgs {
    /// Mount point to unmount.
    pub mountpoint: PathBuf,
}

#[derive(Debug, Args)]
#[command(disable_help_flag = true)]
pub struct DfArgs {
    /// Human-readable sizes (as `lfs df -h`).
    #[arg(short = 'h', long = "human-readable")]
    pub human: bool,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// A path inside a tierfs mount (default: every tierfs mount).
    pub path: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SetstripeArgs {
    /// Stripe count (-1: all targets).
    #[arg(short = 'c', long = "stripe-count", allow_hyphen_values = true)]
    pub count: Option<i64>,
    /// Stripe size, a multiple of 64K (e.g. 1M).
    #[arg(short = 'S', long = "stripe-size")]
    pub size: Option<String>,
    /// New file, empty file, or directory.
    pub path: PathBuf,
}

#[derive(Debug, Args)]
pub struct GetstripeArgs {
    pub path: PathBuf,
}

#[derive(Debug, Args)]
pub struct ProjectArgs {
    /// Project id to set (without it: show).
    #[arg(short = 'p', long)]
    pub projid: Option<u32>,
    /// Set the inherit flag on directories: the subtree and new children get the id.
    #[arg(short = 's', long)]
    pub inherit: bool,
    pub path: PathBuf,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Metadata database URL (instead of a path).
    #[arg(long)]
    pub meta: Option<String>,
    /// A path inside a tierfs mount.
    pub path: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The mount point.
    pub mount: PathBuf,
    /// Print the raw Prometheus text.
    #[arg(long)]
    pub raw: bool,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
