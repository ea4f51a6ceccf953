//! The client daemon: opens the filesystem, registers a session, mounts FUSE, starts the
//! background workers (heartbeat, dead-client reaping, close recording, PCC, garbage
//! collection, compaction, maintenance: see [`crate::workers`]) and unmounts cleanly on
//! SIGTERM/SIGINT, stopping the workers in order.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fuser::{MountOption, Notifier, SessionACL};
use thiserror::Error;

use tierfs_meta::{open_engine, MetaEngine, MetaError, SessionInfo};
use tierfs_store::{StoreError, TargetSet};

use crate::config::ClientConfig;
use crate::data::{DataConfig, DataPath};
use crate::fs::TierFs;
use crate::lease::Recaller;
use crate::metrics::Metrics;
use crate::pcc::{Pcc, PccConfig};
use crate::session::Session;
use crate::workers::{jobs, Workers};

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("{0}")]
    Meta(#[from] MetaError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("mount point {0} does not exist")]
    NoMountPoint(String),
    #[error("mount point {0} is not a directory")]
    NotDir(String),
    #[error("{0} is already mounted (use `tierfs umount {0}` first)")]
    AlreadyMounted(String),
    #[error("cannot mount {0}: {1}")]
    Mount(String, String),
    #[error("cannot serve metrics on {0}: {1}")]
    Metrics(String, String),
    #[error("{0}")]
    Other(String),
}

/// What `tierfs mount` asks for.
#[derive(Clone)]
pub struct MountRequest {
    pub meta_url: String,
    pub mountpoint: PathBuf,
    pub config: ClientConfig,
    /// The metadata engine to use instead of opening `meta_url` (which still names the
    /// filesystem in `.tierfs-info`): tests mount a client in their own process over a
    /// failure-injecting engine (`tierfs_meta::faulty`).
    pub engine: Option<Arc<dyn MetaEngine>>,
}

impl std::fmt::Debug for MountRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountRequest")
            .field(
                "meta_url",
                &tierfs_meta::postgres::without_password(&self.meta_url),
            )
            .field("mountpoint", &self.mountpoint)
            .field("config", &self.config)
            .field("engine", &self.engine.as_ref().map(|_| "given"))
            .finish()
    }
}

/// Is `path` a mount point now (per /proc/self/mountinfo)? Returns "TYPE SOURCE", e.g.
/// "fuse tierfs:demo".
pub fn mounted_fs_type(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.to_string_lossy().to_string();
    let mut found = None;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 10 {
            continue;
        }
        let mp = unescape_mount_path(fields[4]);
        if mp == want {
            let sep = fields.iter().position(|f| *f == "-")?;
            let fstype = fields.get(sep + 1).copied().unwrap_or("");
            let source = fields.get(sep + 2).copied().unwrap_or("");
            found = Some(format!("{fstype} {source}"));
        }
    }
    found
}

fn unescape_mount_path(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// A FUSE mount whose daemon is gone answers ENOTCONN; a request that was already waiting when
/// the kernel aborted the connection gets ECONNABORTED. With FUSE over io_uring the abort comes
/// a little after the daemon's death (its rings are torn down asynchronously), so a check made
/// in between sees ECONNABORTED. The probe is a `statfs`, which the kernel always sends to the
/// daemon: a `stat` of the mount's root is answered from the kernel's attribute cache while its
/// TTL lasts (with `follow_changes`, `follow_ttl`), dead daemon or not.
pub fn is_dead_mount(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: c is a valid NUL-terminated path; st is written by the call only.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r != 0 && dead_connection(std::io::Error::last_os_error().raw_os_error())
}

fn dead_connection(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::ENOTCONN) | Some(libc::ECONNABORTED))
}

/// The mount options and FUSE session settings of a tierfs mount (also the memfs floor's, so
/// that both are mounted alike: [`crate::memfs`]).
pub fn fuse_config(fsname: String, subtype: String, threads: usize) -> fuser::Config {
    let mut fcfg = fuser::Config::default();
    fcfg.mount_options = vec![
        MountOption::FSName(fsname),
        MountOption::Subtype(subtype),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
        MountOption::Dev,
        MountOption::Suid,
    ];
    fcfg.acl = SessionACL::All;
    fcfg.n_threads = Some(threads);
    fcfg.clone_fd = true;
    fcfg
}

/// Detaches a mount (lazily, so a dead or busy one goes too).
pub fn detach(path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: c is a valid NUL-terminated path.
    let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Checks the mount point; cleans up a dead mount left by a crashed daemon.
pub fn prepare_mountpoint(mp: &Path) -> Result<PathBuf, DaemonError> {
    let shown = mp.display().to_string();
    if is_dead_mount(mp) {
        tracing::warn!("{shown}: cleaning up the dead mount of a crashed daemon");
        detach(mp).map_err(|e| DaemonError::Mount(shown.clone(), e.to_string()))?;
    }
    let meta = std::fs::metadata(mp).map_err(|_| DaemonError::NoMountPoint(shown.clone()))?;
    if !meta.is_dir() {
        return Err(DaemonError::NotDir(shown));
    }
    let abs = std::fs::canonicalize(mp).map_err(|_| DaemonError::NoMountPoint(shown.clone()))?;
    if mounted_fs_type(&abs).is_some() {
        return Err(DaemonError::AlreadyMounted(abs.display().to_string()));
    }
    Ok(abs)
}

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread and those it starts (call it first), to
/// wait for them on one thread.
pub fn block_signals() -> signals::SigSet {
    signals::block(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
}

/// Tiny wrapper around sigprocmask/sigwait so that a process (the daemon, `tierfs agent`) can
/// wait for signals on one thread: block them first, before any other thread exists.
pub mod signals {
    pub struct SigSet(libc::sigset_t);

    /// Blocks `sigs` in the calling thread (and the threads it starts later).
    pub fn block(sigs: &[libc::c_int]) -> SigSet {
        // SAFETY: plain libc signal-set manipulation on a local sigset_t.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for &sig in sigs {
                libc::sigaddset(&mut set, sig);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            SigSet(set)
        }
    }

    // SAFETY: sigset_t is plain data.
    unsafe impl Send for SigSet {}

    impl SigSet {
        /// Waits for one of the blocked signals: its number.
        pub fn wait(&self) -> i32 {
            let mut sig: libc::c_int = 0;
            // SAFETY: the set is initialised and blocked in every thread.
            unsafe { libc::sigwait(&self.0, &mut sig) };
            sig
        }
    }
}

/// Refuses a target that belongs to another filesystem (or is another target of this one);
/// gives a target formatted before identity markers existed its marker now.
pub fn check_targets(
    targets: &TargetSet,
    info: &tierfs_meta::FsInfo,
) -> Result<(), tierfs_store::StoreError> {
    use tierfs_store::identity::{self, Checked};
    for t in targets.all() {
        match identity::check(&t.spec, &info.uuid, &info.name, t.id)? {
            Checked::Ok => {}
            Checked::Adopted { had_objects } => tracing::warn!(
                "storage target {} had no identity marker (formatted by an older tierfs{}): \
                 marked as target {} of filesystem '{}' ({})",
                t.spec.url,
                if had_objects {
                    ", holding objects"
                } else {
                    ", empty"
                },
                t.id,
                info.name,
                info.uuid
            ),
        }
    }
    Ok(())
}

/// Runs `f` while `session` heartbeats every `period` (before the heartbeat worker runs).
fn beating<T>(meta: &dyn MetaEngine, session: u64, period: Duration, f: impl FnOnce() -> T) -> T {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut last = std::time::Instant::now();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                if last.elapsed() >= period {
                    if let Err(e) = meta.heartbeat(session) {
                        tracing::warn!("heartbeat during cache recovery failed: {e}");
                    }
                    last = std::time::Instant::now();
                }
            }
        });
        let r = f();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    })
}

/// Mounts and serves until unmounted. `ready` is called once the mount is up (or failed).
/// Raises this process's soft limit of open descriptors to its hard limit (as the Go runtime
/// does for every program since Go 1.19): the daemon holds descriptors of cached files (kernel
/// passthrough, the `pcc-spares` worker's 512 unnamed spare files) and of objects, and a
/// service manager's default soft limit (1,024) is soon reached. Its children (none here) would
/// inherit it. A failure leaves the limit as it was.
pub fn raise_open_file_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            let was = l.rlim_cur;
            l.rlim_cur = l.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                tracing::debug!("open file limit stays {was}");
            }
        }
    }
}

pub fn mount(req: MountRequest, ready: impl FnOnce(Result<(), String>)) -> Result<(), DaemonError> {
    let sigs = block_signals();
    raise_open_file_limit();
    let cfg = req.config.clone();
    let mountpoint = prepare_mountpoint(&req.mountpoint)?;
    let meta = match &req.engine {
        Some(e) => Arc::clone(e),
        None => open_engine(&req.meta_url)?,
    };
    let info = meta.info()?;
    let tlist: Vec<(u32, String, u64)> = meta
        .targets()?
        .into_iter()
        .map(|t| (t.id, t.url, t.capacity))
        .collect();
    let targets = Arc::new(TargetSet::open(&tlist)?);
    check_targets(&targets, &info)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(32)
        .thread_name("tierfs-io")
        .enable_all()
        .build()
        .map_err(|e| DaemonError::Other(format!("cannot start the I/O runtime: {e}")))?;
    let metrics = Arc::new(Metrics::new());
    if let Some(addr) = &cfg.metrics {
        metrics
            .serve(addr)
            .map_err(|e| DaemonError::Metrics(addr.clone(), e.to_string()))?;
    }
    let client_name = cfg.client_name.clone().unwrap_or_else(hostname);
    // Changelog records made by this process carry its client name.
    tierfs_meta::changelog::set_process_client(&client_name);
    // Sessions of daemons that ran here and are gone (kill -9) end now: their client name is
    // free again and their opens and locks go, without waiting for the session timeout.
    if let Err(e) = crate::liveness::end_gone_sessions(meta.as_ref()) {
        tracing::warn!("ending the sessions of dead local daemons failed: {e}");
    }
    // One live session per client name: a second mount of the name is refused.
    let session = Session::register(
        meta.clone(),
        SessionInfo {
            id: 0,
            client_name: client_name.clone(),
            host: crate::liveness::host_field(&hostname()),
            pid: std::process::id(),
            mountpoint: mountpoint.display().to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            started: 0,
            heartbeat: 0,
        },
        Duration::from_secs(cfg.session_timeout_secs).as_nanos() as i64,
    )?;
    let first_session = session.id();
    let data = Arc::new(DataPath::new(
        meta.clone(),
        targets,
        rt.handle().clone(),
        Arc::clone(&metrics),
        info.inline_threshold,
        DataConfig {
            dirty_limit: cfg.dirty_limit_mb << 20,
            readahead_chunks: cfg.readahead_chunks,
            cache_chunks: cfg.cache_chunks,
            upload_parallelism: cfg.upload_parallelism,
            buffer_limit: cfg.buffer_limit_mb << 20,
        },
    ));
    data.set_session(Arc::clone(&session));
    // Every client recalls other clients' RW-PCC leases before it opens or truncates a file.
    let recaller = Arc::new(Recaller::new(
        meta.clone(),
        Arc::clone(&metrics),
        client_name.clone(),
        cfg.cache_dir.is_some(),
        Duration::from_secs(cfg.pcc_recall_timeout_secs),
        Duration::from_secs(cfg.heartbeat_secs),
        Duration::from_secs(cfg.session_timeout_secs),
    ));
    let pcc = match &cfg.cache_dir {
        Some(dir) => {
            let pc = PccConfig {
                cache_dir: dir.clone(),
                capacity: cfg.cache_bytes().map_err(DaemonError::Other)?,
                high_watermark: cfg.cache_high_watermark,
                low_watermark: cfg.cache_low_watermark,
                eviction: cfg.eviction().map_err(DaemonError::Other)?,
                writeback_delay: Duration::from_secs(cfg.writeback_delay_secs),
                passthrough: cfg.pcc_passthrough,
                open_cache: Duration::from_secs(cfg.pcc_open_cache_secs),
            };
            let p = Pcc::new(
                pc,
                &info.uuid,
                meta.clone(),
                Arc::clone(&data),
                Arc::clone(&metrics),
                Arc::clone(&recaller),
                client_name.clone(),
            )
            .map_err(|e| DaemonError::Other(format!("persistent client cache: {e}")))?;
            let p = Arc::new(p);
            // Find the cache again: keep what is valid, write back what this client owns.
            // This runs before the mount serves anything or any worker starts (so nothing can
            // drop dirty data first), with the session heartbeating meanwhile: a long
            // write-back must not make this returning owner look down to other clients.
            beating(
                meta.as_ref(),
                session.id(),
                Duration::from_secs(cfg.heartbeat_secs),
                || p.recover(),
            );
            Some(p)
        }
        None => None,
    };
    let notifier: Arc<OnceLock<Notifier>> = Arc::new(OnceLock::new());
    let mut fs = TierFs::new(
        meta.clone(),
        Arc::clone(&data),
        Arc::clone(&metrics),
        Arc::clone(&session),
        Duration::from_secs_f64(cfg.attr_ttl),
        Duration::from_secs_f64(cfg.entry_ttl),
        recaller,
    );
    fs.notifier = Arc::clone(&notifier);
    let xattr_hint = Arc::clone(&fs.xattr_hint);
    fs.pcc = pcc.clone();
    // ACLs are extended attributes: without xattrs there are none.
    fs.posix_acl = cfg.posix_acl && cfg.xattrs;
    fs.xattrs = cfg.xattrs;
    fs.readdirplus = cfg.readdir_plus().map_err(DaemonError::Other)?;
    if cfg.writeback_cache && pcc.is_some() {
        // Passthrough and cached files bypass the page cache the kernel would trust for size
        // and times: one mount has one or the other (docs/configuration.md).
        tracing::warn!(
            "writeback_cache = true is ignored on a mount with a persistent client cache \
             (cache_dir): writes are not cached by the kernel"
        );
    }
    fs.writeback_cache = cfg.writeback_cache && pcc.is_none();
    fs.fuse_uring = cfg.fuse_uring;

    // Following the other clients' changes: the reader is registered before anything is
    // served, so no change made after the mount is missed.
    let follow = if cfg.follow_changes {
        match crate::workers::follow::register(meta.as_ref(), &client_name) {
            Ok(reader) => {
                let state = crate::workers::follow::FollowState::new(Duration::from_secs_f64(
                    cfg.follow_ttl,
                ));
                state.set_reader(reader);
                fs.follow = Some(Arc::clone(&state));
                tracing::info!(
                    "following other clients' changes (changelog reader cl{reader}): names and \
                     attributes cached for {} s while the follower keeps up",
                    cfg.follow_ttl
                );
                Some((reader, state))
            }
            Err(e) => {
                tracing::warn!(
                    "follow_changes: cannot register a changelog reader ({e}); the kernel \
                     caches for attr_ttl/entry_ttl only"
                );
                None
            }
        }
    } else {
        None
    };
    fs.pcc_attach = cfg.attach_policy().map_err(DaemonError::Other)?;
    fs.callers = crate::caller::Callers::new(cfg.jobid_source().map_err(DaemonError::Other)?);
    fs.info_json = serde_json::json!({
        // Readable by every user of the machine: never the database password.
        "meta": tierfs_meta::postgres::without_password(&req.meta_url),
        "name": info.name,
        "client": client_name,
        "session": first_session,
        "mountpoint": mountpoint.display().to_string(),
        "pid": std::process::id(),
    })
    .to_string();
    let fcfg = fuse_config(
        format!("tierfs:{}", info.name),
        "tierfs".into(),
        cfg.fuse_threads,
    );
    let mut fsession = match fuser::Session::new(fs, &mountpoint, &fcfg) {
        Ok(s) => s,
        Err(e) => {
            let _ = meta.unregister_session(session.id());
            return Err(DaemonError::Mount(
                mountpoint.display().to_string(),
                e.to_string(),
            ));
        }
    };
    let _ = notifier.set(fsession.notifier());
    let mut unmounter = fsession.unmount_callable();

    // The background workers, each on its own thread (see workers.rs).
    let mut workers = start_workers(
        &cfg,
        &session,
        &meta,
        &data,
        pcc.as_ref(),
        &metrics,
        publish_reports(meta.clone(), Arc::clone(&session)),
    )?;
    if let Some((reader, state)) = follow {
        workers
            .spawn(crate::workers::follow::Follower::new(
                meta.clone(),
                Arc::clone(&notifier),
                state,
                client_name.clone(),
                reader,
                Arc::clone(&xattr_hint),
                Arc::clone(&data),
            ))
            .map_err(|e| DaemonError::Other(format!("cannot start a worker: {e}")))?;
    }

    // Signals: unmount cleanly.
    {
        let mp = mountpoint.clone();
        std::thread::Builder::new()
            .name("tierfs-signals".into())
            .spawn(move || {
                let sig = sigs.wait();
                tracing::info!("signal {sig}: unmounting {}", mp.display());
                if unmounter.unmount().is_err() {
                    let _ = detach(&mp);
                }
            })
            .map_err(|e| DaemonError::Other(e.to_string()))?;
    }

    tracing::info!(
        "mounted {} at {} as client '{}' (session {first_session})",
        info.name,
        mountpoint.display(),
        client_name
    );
    ready(Ok(()));
    let result = fsession.run();
    stop_workers(workers, &data, pcc.as_ref());
    if let Err(e) = meta.unregister_session(session.id()) {
        tracing::warn!("could not end the session: {e}");
    }
    drop(rt);
    tracing::info!("unmounted {}", mountpoint.display());
    result.map_err(|e| DaemonError::Other(format!("FUSE session ended with an error: {e}")))
}

/// Names of the workers that stop first at unmount: those that move data or clean up, so that
/// no unit of theirs runs once the final write-backs begin.
const STOP_FIRST: &[&str] = &[
    "change-follower",
    "hsm-mover",
    "pcc-recall",
    "pcc",
    "pcc-writeback",
    "compactor",
    "purge",
    "commit-retry",
    "gc",
    "maintenance",
];

/// Starts the daemon's workers; `publish` is where `worker-reports` sends their status.
fn start_workers(
    cfg: &ClientConfig,
    session: &Arc<Session>,
    meta: &Arc<dyn tierfs_meta::MetaEngine>,
    data: &Arc<DataPath>,
    pcc: Option<&Arc<Pcc>>,
    metrics: &Arc<Metrics>,
    publish: jobs::Publish,
) -> Result<Workers, DaemonError> {
    let spawn_err = |e: std::io::Error| DaemonError::Other(format!("cannot start a worker: {e}"));
    let mut w = Workers::with_metrics(cfg.tranquility, Arc::clone(metrics));
    let health = jobs::Health::new();
    let heartbeat = Duration::from_secs(cfg.heartbeat_secs);
    let gc_every = Duration::from_secs(cfg.gc_interval_secs);
    w.spawn(jobs::Heartbeat {
        meta: meta.clone(),
        session: Arc::clone(session),
        every: heartbeat,
        health: Arc::clone(&health),
    })
    .map_err(spawn_err)?;
    w.spawn(jobs::SessionReaper {
        meta: meta.clone(),
        every: heartbeat,
        timeout: Duration::from_secs(cfg.session_timeout_secs),
        health: Arc::clone(&health),
    })
    .map_err(spawn_err)?;
    w.spawn(jobs::CloseRecorder::new(
        Arc::clone(data),
        meta.clone(),
        cfg.client_name.clone().unwrap_or_else(hostname),
    ))
    .map_err(spawn_err)?;
    w.spawn(jobs::CommitRetry {
        data: Arc::clone(data),
    })
    .map_err(spawn_err)?;
    if let Some(p) = pcc {
        w.spawn(jobs::PccUpkeep { pcc: Arc::clone(p) })
            .map_err(spawn_err)?;
        if !p.cfg.open_cache.is_zero() {
            w.spawn(jobs::PccKeptOpens {
                pcc: Arc::clone(p),
                meta: meta.clone(),
                health: Arc::clone(&health),
                // a kept open is served only while the last heartbeat is younger than this
                fresh: Duration::from_secs(cfg.session_timeout_secs) / 2,
            })
            .map_err(spawn_err)?;
        }
        w.spawn(jobs::PccWriteback::new(Arc::clone(p)))
            .map_err(spawn_err)?;
        w.spawn(jobs::PccRoCopy { pcc: Arc::clone(p) })
            .map_err(spawn_err)?;
        w.spawn(jobs::PccSpares { pcc: Arc::clone(p) })
            .map_err(spawn_err)?;
        // Another client's open waits on recalls: never behind a write-back.
        w.spawn(jobs::PccRecall {
            pcc: Arc::clone(p),
            metrics: Arc::clone(metrics),
        })
        .map_err(spawn_err)?;
    }
    w.spawn(jobs::Gc {
        data: Arc::clone(data),
        every: gc_every,
    })
    .map_err(spawn_err)?;
    w.spawn(jobs::Compactor::new(Arc::clone(data), gc_every))
        .map_err(spawn_err)?;
    w.spawn(jobs::Purge::new(meta.clone(), gc_every))
        .map_err(spawn_err)?;
    if !cfg.hsm_mover_archives.is_empty() {
        w.spawn(crate::mover::MoverWorker::new(
            Arc::clone(data),
            crate::mover::AgentConfig {
                info: tierfs_meta::hsm::HsmAgentInfo {
                    name: format!("{}:{}", hostname(), std::process::id()),
                    host: hostname(),
                    pid: std::process::id(),
                    archives: cfg.hsm_mover_archives.clone(),
                    max_requests: 1,
                },
                parallel: 1,
                ..Default::default()
            },
            cfg.tranquility,
        ))
        .map_err(spawn_err)?;
    }
    w.spawn(jobs::Maintenance {
        meta: meta.clone(),
        every: gc_every,
    })
    .map_err(spawn_err)?;
    let registry = w.registry();
    w.spawn(jobs::Reports { registry, publish })
        .map_err(spawn_err)?;
    Ok(w)
}

/// Unmount, after FUSE has stopped: the data movers and cleaners stop (each ends the unit it
/// is in); buffered writes are flushed; the close recorder records the last closes (so that
/// files deleted while open are gone before the write-back: their cache entries are dropped,
/// not written back to an orphan); every dirty RW-PCC file is written back while the session
/// still heartbeats; the reports stop; heartbeat and session reaper stop last, just before the
/// session ends.
fn stop_workers(mut workers: Workers, data: &DataPath, pcc: Option<&Arc<Pcc>>) {
    workers.stop(STOP_FIRST);
    data.flush_all();
    if let Some(p) = pcc {
        // FUSE has stopped: no handle is left, every kept open's close is queued now
        p.unkeep_all();
    }
    workers.stop(&["close-recorder"]);
    if let Some(p) = pcc {
        p.write_back_all();
    }
    workers.stop(&["worker-reports"]);
    workers.stop(&["session-reaper", "heartbeat"]);
}

/// Where `worker-reports` publishes: the metadata database, for `tierfs status`.
fn publish_reports(meta: Arc<dyn tierfs_meta::MetaEngine>, session: Arc<Session>) -> jobs::Publish {
    Box::new(move |snapshot| {
        let reports: Vec<tierfs_meta::WorkerReport> =
            snapshot.iter().map(crate::workers::report_of).collect();
        // under the current session (a fenced client's new one)
        meta.report_workers(session.id(), &reports)
            .map_err(|e| e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_connection_errnos() {
        assert!(dead_connection(Some(libc::ENOTCONN)));
        assert!(dead_connection(Some(libc::ECONNABORTED)));
        assert!(!dead_connection(Some(libc::ENOENT)));
        assert!(!dead_connection(Some(libc::EIO)));
        assert!(!dead_connection(None));
    }
}
