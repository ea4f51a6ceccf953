//! `tierfs hsm`: the archive tier from the user's side (docs/hsm.md): archives, archive /
//! release / restore / remove / cancel requests, per-file flags, and the coordinator's queue.
//!
//! Files are named by paths in a tierfs mount: the mount's `.tierfs-info` names its metadata
//! database (as `tierfs pcc rule` and `tierfs changelog` find it) and the path's inode number
//! is the file's. The commands act on the metadata engine directly, so they need access to
//! the metadata database (its file for SQLite, a role for PostgreSQL), as the other
//! administration commands do. Nothing here opens the files themselves: a release is refused
//! while the file is open anywhere, this command included.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Subcommand};
use tierfs_meta::hsm::{
    HsmAction, HsmError, HsmFlags, HsmListFilter, HsmRequest, RequestState, MAX_ARCHIVE_ID,
};
use tierfs_meta::{now_nanos, open_engine, MetaEngine, MetaError, MetaUrl};

use crate::changelog::FsArgs;
use crate::error::{CliError, Result};
use crate::locate::mount_of;
use tierfs_store::archive::ArchiveStore;

/// The first schema with HSM.
const HSM_SCHEMA: i64 = 8;

#[derive(Debug, Subcommand)]
pub enum HsmCmd {
    /// Register archive backend ID (1..=65535) at URL: file:///dir or
    /// s3://bucket/prefix?endpoint=... (the movers, `tierfs agent`, read and write it).
    ArchiveAdd {
        /// The archive's id, 1..=65535.
        id: u32,
        /// file:///DIR or s3://BUCKET[/PREFIX][?endpoint=...].
        url: String,
        #[command(flatten)]
        fs: FsArgs,
    },
    /// List the registered archives (id and URL).
    #[command(alias = "archives")]
    ArchiveList {
        #[command(flatten)]
        fs: FsArgs,
    },
    /// Forget archive ID (refused while a file has a copy in it or a request is active on it).
    ArchiveDel {
        /// The archive's id.
        id: u32,
        #[command(flatten)]
        fs: FsArgs,
    },
    /// Queue a copy of files' capacity-tier data to an archive (done by an agent: see
    /// `tierfs hsm action` / `tierfs hsm list`). A file already queued is not queued twice.
    Archive {
        /// The archive (default: the file's archive, else the coordinator's default archive,
        /// else the only registered one).
        #[arg(long, short = 'a')]
        archive: Option<u32>,
        /// Also the files named in this file, one path a line ("-": standard input).
        #[arg(long, value_name = "FILE")]
        filelist: Option<PathBuf>,
        /// Files in a tierfs mount.
        files: Vec<PathBuf>,
    },
    /// Drop the capacity-tier data of archived, clean files: they keep size and times, their
    /// data stays in the archive and comes back on open (or `tierfs hsm restore`). Refused for
    /// a dirty, unarchived, norelease or open file.
    Release {
        /// Also the files named in this file, one path a line ("-": standard input).
        #[arg(long, value_name = "FILE")]
        filelist: Option<PathBuf>,
        /// Files in a tierfs mount.
        files: Vec<PathBuf>,
    },
    /// Queue a restore of released files at top priority (an open of a released file does
    /// the same and waits for it). Files that are not released are left alone.
    Restore {
        /// Also the files named in this file, one path a line ("-": standard input).
        #[arg(long, value_name = "FILE")]
        filelist: Option<PathBuf>,
        /// Files in a tierfs mount.
        files: Vec<PathBuf>,
    },
    /// Queue removal of files' archive copies (the file is then no longer archived).
    Remove {
        /// Also the files named in this file, one path a line ("-": standard input).
        #[arg(long, value_name = "FILE")]
        filelist: Option<PathBuf>,
        /// Files in a tierfs mount.
        files: Vec<PathBuf>,
    },
    /// Cancel the waiting or running requests of files, at once (a running mover stops at its
    /// next progress report). An error when a file has none.
    Cancel {
        /// Files in a tierfs mount.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Files' HSM flags and archive id, as `lfs hsm_state`:
    /// `/mnt/f: (0x0000000d) released exists archived, archive_id:1`.
    State {
        /// Files in a tierfs mount.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Set HSM flags by hand (root's tools, as `lfs hsm_set`).
    Set(FlagArgs),
    /// Clear HSM flags by hand (as `lfs hsm_clear`).
    Clear(FlagArgs),
    /// Files' current request (else their last one) and its progress, as `lfs hsm_action`:
    /// `/mnt/f: ARCHIVE RUNNING (104857600 bytes moved)`; a failed one says why.
    Action {
        /// Files in a tierfs mount.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Make each file under SRC_PREFIX of archive N a released file under DEST_DIR (a directory
    /// in a tierfs mount), with the size, mtime, mode and owner the archive gives, without
    /// copying data: an open restores it. Subdirectories are made in DEST_DIR. Reads file://
    /// archives; an s3:// archive's objects become files of mode 0644 owned by the caller, with the
    /// object's size and LastModified time. An existing name fails its batch of files.
    Import {
        /// The archive holding the data.
        #[arg(long, short = 'a')]
        archive: u32,
        /// A path under the archive's root ("" or "." for all of it).
        src_prefix: String,
        /// A directory in a tierfs mount.
        dest_dir: PathBuf,
    },
    /// Show the coordinator's settings (without options), or change those given; kept in the
    /// metadata database, so every agent and client applies them (docs/hsm.md).
    Config(ConfigArgs),
    /// The coordinator's queue: requests with action, state, archive, agent, age, progress
    /// and file (running first, then waiting in the order agents take them).
    List {
        /// Also finished requests (succeeded, failed, canceled) still kept.
        #[arg(long)]
        all: bool,
        /// Only this archive's requests.
        #[arg(long, short = 'a')]
        archive: Option<u32>,
        /// At most this many lines (0: all).
        #[arg(long, default_value = "0")]
        limit: usize,
        #[command(flatten)]
        fs: FsArgs,
    },
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Most requests one agent holds at once (default 4).
    #[arg(long)]
    pub max_per_agent: Option<u32>,
    /// Most started requests on one archive, all agents together (default 16).
    #[arg(long)]
    pub max_per_archive: Option<u32>,
    /// A started request with no report for this long is requeued, e.g. 300s, 1h
    /// (default 300 s).
    #[arg(long, value_name = "DURATION")]
    pub request_timeout: Option<humantime::Duration>,
    /// Attempts per request before it fails for good (default 3).
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// Wait before the second attempt, doubling each time (default 10 s).
    #[arg(long, value_name = "DURATION")]
    pub retry_backoff: Option<humantime::Duration>,
    /// How long finished requests stay listed (default 1 day).
    #[arg(long, value_name = "DURATION")]
    pub keep_done: Option<humantime::Duration>,
    /// Archive of an archive request without --archive (0: the file's, else the only one).
    #[arg(long, value_name = "ID")]
    pub default_archive: Option<u32>,
    /// Unlinking an archived file's last name queues removal of its archive copy: on or off
    /// (default off, as Lustre's).
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub remove_archive_on_last_unlink: Option<bool>,
    #[command(flatten)]
    pub fs: FsArgs,
}

fn on_off(s: &str) -> std::result::Result<bool, String> {
    match s {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        _ => Err(format!("{s:?}: expected on or off")),
    }
}

fn ns(d: humantime::Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn secs(ns: i64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(
        (ns.max(0) / 1_000_000_000) as u64,
    ))
    .to_string()
}

fn config(a: ConfigArgs) -> Result<()> {
    let e = engine(&a.fs)?;
    let mut s = e.hsm_settings()?;
    let before = s.clone();
    if let Some(v) = a.max_per_agent {
        s.max_per_agent = v;
    }
    if let Some(v) = a.max_per_archive {
        s.max_per_archive = v;
    }
    if let Some(v) = a.request_timeout {
        s.request_timeout_ns = ns(v);
    }
    if let Some(v) = a.max_attempts {
        s.max_attempts = v;
    }
    if let Some(v) = a.retry_backoff {
        s.retry_backoff_ns = ns(v);
    }
    if let Some(v) = a.keep_done {
        s.keep_done_ns = ns(v);
    }
    if let Some(v) = a.default_archive {
        s.default_archive = v;
    }
    if let Some(v) = a.remove_archive_on_last_unlink {
        s.remove_archive_on_last_unlink = v;
    }
    if s != before {
        e.hsm_set_settings(&s)?;
    }
    println!("max_per_agent = {}", s.max_per_agent);
    println!("max_per_archive = {}", s.max_per_archive);
    println!("request_timeout = {}", secs(s.request_timeout_ns));
    println!("max_attempts = {}", s.max_attempts);
    println!("retry_backoff = {}", secs(s.retry_backoff_ns));
    println!("keep_done = {}", secs(s.keep_done_ns));
    println!("default_archive = {}", s.default_archive);
    println!(
        "remove_archive_on_last_unlink = {}",
        if s.remove_archive_on_last_unlink {
            "on"
        } else {
            "off"
        }
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct FlagArgs {
    /// Release is refused.
    #[arg(long)]
    pub norelease: bool,
    /// Archive is refused.
    #[arg(long)]
    pub noarchive: bool,
    /// The file differs from its archive copy.
    #[arg(long)]
    pub dirty: bool,
    /// The archive copy is lost (restore is refused).
    #[arg(long)]
    pub lost: bool,
    /// Files in a tierfs mount.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

impl FlagArgs {
    fn bits(&self) -> u32 {
        let mut b = 0;
        for (on, bit) in [
            (self.norelease, HsmFlags::NORELEASE),
            (self.noarchive, HsmFlags::NOARCHIVE),
            (self.dirty, HsmFlags::DIRTY),
            (self.lost, HsmFlags::LOST),
        ] {
            if on {
                b |= bit;
            }
        }
        b
    }
}

/// Checks a metadata URL and that its schema has HSM (without upgrading it), then opens it.
fn open_checked(url: &str) -> Result<Arc<dyn MetaEngine>> {
    MetaUrl::parse(url)?;
    if let Some(found) = tierfs_meta::url::schema_version(url)? {
        if found < HSM_SCHEMA {
            return Err(MetaError::from(HsmError::OldSchema {
                found,
                needed: HSM_SCHEMA,
            })
            .into());
        }
    }
    Ok(open_engine(url)?)
}

fn engine(fs: &FsArgs) -> Result<Arc<dyn MetaEngine>> {
    open_checked(&fs.meta_url()?)
}

/// The engines of the files' filesystems (one per metadata URL) and each file's inode.
#[derive(Default)]
struct Files {
    engines: HashMap<String, Arc<dyn MetaEngine>>,
}

impl Files {
    /// The engine of `path`'s filesystem and its inode number.
    fn resolve(&mut self, path: &Path) -> Result<(Arc<dyn MetaEngine>, u64)> {
        let (_root, mi) = mount_of(path)?;
        let ino = std::fs::symlink_metadata(path)
            .map_err(|e| CliError::Io(path.display().to_string(), e))?
            .ino();
        let e = match self.engines.get(&mi.meta) {
            Some(e) => e.clone(),
            None => {
                let e = open_checked(&mi.meta)?;
                self.engines.insert(mi.meta.clone(), e.clone());
                e
            }
        };
        Ok((e, ino))
    }
}

/// An engine error about `path`, as one line naming it.
fn about(path: &Path, e: CliError) -> CliError {
    match e {
        CliError::Meta(m) => CliError::Other(format!("{}: {m}", path.display())),
        other => other,
    }
}

/// The paths given on the command line followed by those of `--filelist`.
fn with_filelist(files: Vec<PathBuf>, list: Option<&Path>) -> Result<Vec<PathBuf>> {
    let mut out = files;
    if let Some(l) = list {
        let text = if l == Path::new("-") {
            std::io::read_to_string(std::io::stdin())
                .map_err(|e| CliError::Io("standard input".into(), e))?
        } else {
            std::fs::read_to_string(l).map_err(|e| CliError::Io(l.display().to_string(), e))?
        };
        out.extend(
            text.lines()
                .filter(|s| !s.trim().is_empty())
                .map(PathBuf::from),
        );
    }
    if out.is_empty() {
        return Err(CliError::Usage(
            "no files given (name them, or --filelist FILE)".into(),
        ));
    }
    Ok(out)
}

/// Runs `f` on each file: with one file its error is the command's one line; with several,
/// each failure is a line and the command fails at the end with a count.
/// Several files show a progress bar on a terminal (a `--filelist` may name thousands).
fn each(files: &[PathBuf], mut f: impl FnMut(&mut Files, &Path) -> Result<()>) -> Result<()> {
    let mut ctx = Files::default();
    let mut failed = 0usize;
    let pb = (files.len() > 1).then(|| crate::check::bar(files.len() as u64, "files"));
    for p in files {
        if let Err(e) = f(&mut ctx, p).map_err(|e| about(p, e)) {
            if files.len() == 1 {
                return Err(e);
            }
            match &pb {
                Some(pb) => pb.suspend(|| eprintln!("tierfs: {e}")),
                None => eprintln!("tierfs: {e}"),
            }
            failed += 1;
        }
        if let Some(pb) = &pb {
            pb.inc(1);
        }
    }
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if failed > 0 {
        return Err(CliError::Other(format!(
            "{failed} of {} file(s) failed",
            files.len()
        )));
    }
    Ok(())
}

fn check_archive_id(id: u32) -> Result<()> {
    if id == 0 || id > MAX_ARCHIVE_ID {
        return Err(MetaError::from(HsmError::BadArchiveId(id)).into());
    }
    Ok(())
}

/// The archive URL schemes the movers understand.
fn check_archive_url(url: &str) -> Result<()> {
    let ok = url
        .strip_prefix("file://")
        .is_some_and(|p| p.starts_with('/') && p.len() > 1)
        || url
            .strip_prefix("s3://")
            .is_some_and(|b| !b.is_empty() && !b.starts_with('/'));
    if !ok {
        return Err(CliError::Usage(format!(
            "archive URL {url:?}: expected file:///DIR or s3://BUCKET[/PREFIX][?endpoint=...]"
        )));
    }
    Ok(())
}

/// `(0x0000000d) released exists archived, archive_id:1`, as `lfs hsm_state` prints it (no
/// names for no flags, no archive id for none).
fn state_text(flags: HsmFlags, archive_id: u32) -> String {
    let mut s = format!("(0x{:08x})", flags.0);
    let names = flags.names();
    if !names.is_empty() {
        s.push(' ');
        s.push_str(&names);
    }
    if archive_id != 0 {
        s.push_str(&format!(", archive_id:{archive_id}"));
    }
    s
}

/// `RUNNING` for a started request, Lustre's word; the state's name otherwise.
fn state_word(s: RequestState) -> &'static str {
    match s {
        RequestState::Started => "RUNNING",
        other => other.name(),
    }
}

/// `ARCHIVE RUNNING (104857600 bytes moved)` (an active RESTORE adds its restored prefix,
/// `, 8388608 restored`: what readers may read already), then why the last attempt failed, if
/// it did.
fn action_text(r: &HsmRequest) -> String {
    let mut s = format!(
        "{} {} ({} bytes moved",
        r.action.name(),
        state_word(r.state),
        r.bytes_moved
    );
    if r.action == HsmAction::Restore && r.state.is_active() && r.restored > 0 {
        s.push_str(&format!(", {} restored", r.restored));
    }
    s.push(')');
    if let Some(e) = &r.last_error {
        if r.state != RequestState::Succeeded {
            s.push_str(&format!(": {e}"));
        }
    }
    s
}

/// A duration in seconds for humans: 42s, 3m12s, 5h03m, 2d04h.
fn age(ns: i64) -> String {
    let s = (ns.max(0) / 1_000_000_000) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

pub fn run(cmd: HsmCmd) -> Result<()> {
    match cmd {
        HsmCmd::ArchiveAdd { id, url, fs } => {
            check_archive_id(id)?;
            check_archive_url(&url)?;
            engine(&fs)?.hsm_archive_add(id, &url)?;
            Ok(())
        }
        HsmCmd::ArchiveList { fs } => {
            for a in engine(&fs)?.hsm_archives()? {
                println!("{} {}", a.id, a.url);
            }
            Ok(())
        }
        HsmCmd::ArchiveDel { id, fs } => {
            check_archive_id(id)?;
            engine(&fs)?.hsm_archive_del(id)?;
            Ok(())
        }
        HsmCmd::Archive {
            archive,
            filelist,
            files,
        } => {
            if let Some(a) = archive {
                check_archive_id(a)?;
            }
            let files = with_filelist(files, filelist.as_deref())?;
            each(&files, |ctx, p| {
                let (e, ino) = ctx.resolve(p)?;
                e.hsm_request(ino, HsmAction::Archive, archive)?;
                Ok(())
            })
        }
        HsmCmd::Release { filelist, files } => {
            let files = with_filelist(files, filelist.as_deref())?;
            each(&files, |ctx, p| {
                let (e, ino) = ctx.resolve(p)?;
                release(&*e, ino)
            })
        }
        HsmCmd::Restore { filelist, files } => {
            let files = with_filelist(files, filelist.as_deref())?;
            each(&files, |ctx, p| {
                let (e, ino) = ctx.resolve(p)?;
                e.hsm_request(ino, HsmAction::Restore, None)?;
                Ok(())
            })
        }
        HsmCmd::Remove { filelist, files } => {
            let files = with_filelist(files, filelist.as_deref())?;
            each(&files, |ctx, p| {
                let (e, ino) = ctx.resolve(p)?;
                e.hsm_request(ino, HsmAction::Remove, None)?;
                Ok(())
            })
        }
        HsmCmd::Cancel { files } => each(&files, |ctx, p| {
            let (e, ino) = ctx.resolve(p)?;
            e.hsm_cancel(ino)?;
            Ok(())
        }),
        HsmCmd::State { files } => each(&files, |ctx, p| {
            let (e, ino) = ctx.resolve(p)?;
            let st = e.hsm_state(ino)?;
            println!("{}: {}", p.display(), state_text(st.flags, st.archive_id));
            Ok(())
        }),
        HsmCmd::Config(a) => config(a),
        HsmCmd::Import {
            archive,
            src_prefix,
            dest_dir,
        } => import(archive, &src_prefix, &dest_dir),
        HsmCmd::Set(f) => flags(&f, true),
        HsmCmd::Clear(f) => flags(&f, false),
        HsmCmd::Action { files } => each(&files, |ctx, p| {
            let (e, ino) = ctx.resolve(p)?;
            match e.hsm_action(ino)? {
                Some(r) => println!("{}: {}", p.display(), action_text(&r)),
                None => println!("{}: NOOP", p.display()),
            }
            Ok(())
        }),
        HsmCmd::List {
            all,
            archive,
            limit,
            fs,
        } => {
            let e = engine(&fs)?;
            let reqs = e.hsm_list(&HsmListFilter {
                include_done: all,
                ino: None,
                archive_id: archive,
                limit,
            })?;
            let now = now_nanos();
            println!(
                "{:>8} {:<8} {:<9} {:>7} {:>6} {:>8} {:>8} {:>21} FILE",
                "ID", "ACTION", "STATE", "ARCHIVE", "AGENT", "AGE", "TRIES", "PROGRESS"
            );
            for r in reqs {
                let file = match e.path_of(r.ino) {
                    Ok(Some(p)) => String::from_utf8_lossy(&p).into_owned(),
                    _ => format!("ino {}", r.ino),
                };
                let progress = if r.bytes_total > 0 {
                    format!("{}/{}", r.bytes_moved, r.bytes_total)
                } else {
                    format!("{}", r.bytes_moved)
                };
                println!(
                    "{:>8} {:<8} {:<9} {:>7} {:>6} {:>8} {:>8} {:>21} {}{}",
                    r.id,
                    r.action.name(),
                    state_word(r.state),
                    r.archive_id,
                    r.agent.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
                    age(now - r.created),
                    r.attempts,
                    progress,
                    file,
                    match (&r.last_error, r.state) {
                        (Some(err), s) if s != RequestState::Succeeded => format!(" ({err})"),
                        _ => String::new(),
                    }
                );
            }
            Ok(())
        }
    }
}

/// How long a release refused because the file is open is tried again: a mount records the
/// closes of its files in batches (every 50 ms), so a file closed just now may still count as
/// open for a moment.
const RELEASE_OPEN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

fn release(e: &dyn MetaEngine, ino: u64) -> Result<()> {
    let deadline = std::time::Instant::now() + RELEASE_OPEN_GRACE;
    loop {
        match e.hsm_release(ino) {
            Err(MetaError::Hsm(HsmError::ReleaseOpen(_)))
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            r => return r.map(|_| ()).map_err(Into::into),
        }
    }
}

/// Files imported per `hsm_import` transaction.
const IMPORT_BATCH: usize = 1000;

fn import(archive: u32, prefix: &str, dest: &Path) -> Result<()> {
    check_archive_id(archive)?;
    let (_root, mi) = mount_of(dest)?;
    let meta = std::fs::metadata(dest).map_err(|e| CliError::Io(dest.display().to_string(), e))?;
    if !meta.is_dir() {
        return Err(CliError::Usage(format!(
            "{}: not a directory",
            dest.display()
        )));
    }
    let e = open_checked(&mi.meta)?;
    let a = e
        .hsm_archives()?
        .into_iter()
        .find(|a| a.id == archive)
        .ok_or(MetaError::from(HsmError::UnknownArchive(archive)))?;
    let prefix = prefix.trim_matches('/');
    if Path::new(prefix)
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(CliError::Usage(format!("{prefix:?}: .. is not allowed")));
    }
    let prefix = if prefix == "." { "" } else { prefix };
    let mut imp = Importer {
        e: Arc::clone(&e),
        archive,
        targets: e.targets()?,
        batch: Vec::new(),
        files: 0,
        bytes: 0,
    };
    if let Some(base) = a.url.strip_prefix("file://") {
        let base = PathBuf::from(base.split('?').next().unwrap_or(base));
        import_dir(&mut imp, &base, prefix, dest)?;
    } else {
        import_s3(&mut imp, &a.url, prefix, dest)?;
    }
    imp.flush()?;
    println!(
        "imported {} files ({} bytes) from archive {archive} into {}",
        imp.files,
        imp.bytes,
        dest.display()
    );
    Ok(())
}

/// Gathers the released files of an import and makes them in batches of [`IMPORT_BATCH`]
/// (one engine transaction each), whatever the archive's kind.
struct Importer {
    e: Arc<dyn MetaEngine>,
    archive: u32,
    targets: Vec<tierfs_meta::TargetInfo>,
    batch: Vec<tierfs_meta::hsm::HsmImport>,
    files: u64,
    bytes: u64,
}

/// One archived file to import: where in the archive, and what the archive says of it.
struct ImportItem {
    key: String,
    name: Vec<u8>,
    perm: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime_ns: i64,
}

impl Importer {
    /// Adds `it` as a released file in the directory `dir` of the mount.
    fn add(&mut self, dir: &Path, it: ImportItem) -> Result<()> {
        let parent = std::fs::metadata(dir)
            .map_err(|e| CliError::Io(dir.display().to_string(), e))?
            .ino();
        let def = self.e.resolve_stripe_default(parent)?;
        // stripes over the targets in turn, as the allocator would for an empty fs
        let nt = self.targets.len().max(1);
        let n = (def.stripe_count as usize).clamp(1, nt);
        let first = self.files as usize;
        let layout = tierfs_meta::Layout {
            stripe_size: def.stripe_size,
            targets: (0..n)
                .filter_map(|i| self.targets.get((first + i) % nt))
                .map(|t| t.id)
                .collect(),
        };
        self.files += 1;
        self.bytes += it.size;
        self.batch.push(tierfs_meta::hsm::HsmImport {
            parent,
            name: it.name,
            perm: it.perm,
            uid: it.uid,
            gid: it.gid,
            size: it.size,
            mtime: it.mtime_ns,
            key: it.key,
            checksum: String::new(),
            layout,
        });
        if self.batch.len() >= IMPORT_BATCH {
            self.flush()?;
            eprintln!("tierfs: imported {} files so far", self.files);
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if !self.batch.is_empty() {
            self.e.hsm_import(self.archive, &self.batch)?;
            self.batch.clear();
        }
        Ok(())
    }
}

/// Makes directory `p` in the mount (one already there is fine).
fn mkdir_in_mount(p: &Path) -> Result<()> {
    match std::fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(CliError::Io(p.display().to_string(), e)),
    }
}

/// Imports a directory archive's tree under `prefix`: each regular file with its mode, owner,
/// size and mtime; each directory made in `dest` (empty ones too).
fn import_dir(imp: &mut Importer, base: &Path, prefix: &str, dest: &Path) -> Result<()> {
    let src = if prefix.is_empty() {
        base.to_path_buf()
    } else {
        base.join(prefix)
    };
    // (directory in the archive, its directory in the mount)
    let mut dirs = vec![(src, dest.to_path_buf())];
    while let Some((from, to)) = dirs.pop() {
        let rd =
            std::fs::read_dir(&from).map_err(|e| CliError::Io(from.display().to_string(), e))?;
        let mut names: Vec<_> = rd.filter_map(|d| d.ok()).collect();
        names.sort_by_key(|d| d.file_name());
        for d in names {
            let p = d.path();
            let m = std::fs::symlink_metadata(&p)
                .map_err(|e| CliError::Io(p.display().to_string(), e))?;
            if m.is_dir() {
                let sub = to.join(d.file_name());
                mkdir_in_mount(&sub)?;
                dirs.push((p, sub));
            } else if m.is_file() {
                let key = p
                    .strip_prefix(base)
                    .map_err(|_| CliError::Other(format!("{}: outside the archive", p.display())))?
                    .to_string_lossy()
                    .into_owned();
                imp.add(
                    &to,
                    ImportItem {
                        key,
                        name: d.file_name().as_encoded_bytes().to_vec(),
                        perm: m.mode() & 0o7777,
                        uid: m.uid(),
                        gid: m.gid(),
                        size: m.len(),
                        mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                    },
                )?;
            }
        }
    }
    Ok(())
}

/// Imports an S3 archive's objects under the key prefix `prefix/`: each object a released
/// file of its size and LastModified time, mode 0644 owned by the caller (S3 keeps neither),
/// its key's "directories" made in `dest`.
fn import_s3(imp: &mut Importer, url: &str, prefix: &str, dest: &Path) -> Result<()> {
    let store = ArchiveStore::open(url)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Other(format!("tokio runtime: {e}")))?;
    let objects = rt.block_on(store.list_objects(prefix))?;
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    for o in objects {
        let rel = if prefix.is_empty() {
            o.key.as_str()
        } else {
            match o.key.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')) {
                Some(r) => r,
                None => continue, // "prefixfoo/x" under prefix "prefix"
            }
        };
        let mut parts: Vec<&str> = rel.split('/').collect();
        let Some(name) = parts.pop().filter(|n| !n.is_empty()) else {
            continue; // a "directory marker" object (key ending in /)
        };
        let mut dir = dest.to_path_buf();
        for p in parts {
            dir.push(p);
            mkdir_in_mount(&dir)?;
        }
        imp.add(
            &dir,
            ImportItem {
                key: o.key.clone(),
                name: name.as_bytes().to_vec(),
                perm: 0o644,
                uid,
                gid,
                size: o.size,
                mtime_ns: o.mtime_ns,
            },
        )?;
    }
    Ok(())
}

fn flags(f: &FlagArgs, set: bool) -> Result<()> {
    let bits = f.bits();
    if bits == 0 {
        return Err(CliError::Usage(
            "no flag given: --norelease, --noarchive, --dirty or --lost".into(),
        ));
    }
    each(&f.files, |ctx, p| {
        let (e, ino) = ctx.resolve(p)?;
        if set {
            e.hsm_set_flags(ino, bits, 0)?;
        } else {
            e.hsm_set_flags(ino, 0, bits)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_urls_are_checked() {
        assert!(check_archive_url("file:///srv/a1").is_ok());
        assert!(check_archive_url("s3://cold/tierfs?endpoint=http://x:9000").is_ok());
        assert!(check_archive_url("file://relative").is_err());
        assert!(check_archive_url("/srv/a1").is_err());
        assert!(check_archive_url("s3:///nobucket").is_err());
        assert!(check_archive_url("http://x").is_err());
    }

    #[test]
    fn state_prints_like_lfs_hsm_state() {
        let f = HsmFlags(HsmFlags::RELEASED | HsmFlags::EXISTS | HsmFlags::ARCHIVED);
        assert_eq!(
            state_text(f, 1),
            "(0x0000000d) released exists archived, archive_id:1"
        );
        assert_eq!(state_text(HsmFlags(0), 0), "(0x00000000)");
    }

    #[test]
    fn ages_read_well() {
        let s = 1_000_000_000;
        assert_eq!(age(42 * s), "42s");
        assert_eq!(age(192 * s), "3m12s");
        assert_eq!(age((5 * 3600 + 180) * s), "5h03m");
        assert_eq!(age(-5), "0s");
    }
}
