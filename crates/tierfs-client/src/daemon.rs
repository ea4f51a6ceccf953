//! The client daemon: opens the filesystem, registers a session, mounts FUSE, keeps the session
//! alive (heartbeat, dead-client reaping, garbage collection) and unmounts cleanly on
//! SIGTERM/SIGINT.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fuser::{MountOption, Notifier, SessionACL};
use thiserror::Error;

use tierfs_meta::{open_engine, MetaError, SessionInfo};
use tierfs_store::{StoreError, TargetSet};

use crate::config::ClientConfig;
use crate::data::{DataConfig, DataPath};
use crate::fs::TierFs;
use crate::lease::Recaller;
use crate::metrics::Metrics;
use crate::pcc::{Pcc, PccConfig};

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
#[derive(Clone, Debug)]
pub struct MountRequest {
    pub meta_url: String,
    pub mountpoint: PathBuf,
    pub config: ClientConfig,
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

/// A FUSE mount whose daemon is gone answers ENOTCONN.
pub fn is_dead_mount(path: &Path) -> bool {
    match std::fs::metadata(path) {
        Err(e) => e.raw_os_error() == Some(libc::ENOTCONN),
        Ok(_) => false,
    }
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

fn block_signals() -> nix_signals::SigSet {
    nix_signals::block()
}

/// Tiny wrapper around sigprocmask/sigwait so the daemon can wait for signals on a thread.
mod nix_signals {
    pub struct SigSet(libc::sigset_t);

    pub fn block() -> SigSet {
        // SAFETY: plain libc signal-set manipulation on a local sigset_t.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGHUP);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            SigSet(set)
        }
    }

    // SAFETY: sigset_t is plain data.
    unsafe impl Send for SigSet {}

    impl SigSet {
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

/// Mounts and serves until unmounted. `ready` is called once the mount is up (or failed).
pub fn mount(req: MountRequest, ready: impl FnOnce(Result<(), String>)) -> Result<(), DaemonError> {
    let sigs = block_signals();
    let cfg = req.config.clone();
    let mountpoint = prepare_mountpoint(&req.mountpoint)?;
    let meta = open_engine(&req.meta_url)?;
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
    let session = meta.register_session_unique(
        &SessionInfo {
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
    // Every client recalls other clients' RW-PCC leases before it opens or truncates a file.
    let recaller = Arc::new(Recaller::new(
        meta.clone(),
        Arc::clone(&metrics),
        client_name.clone(),
        cfg.cache_dir.is_some(),
        Duration::from_secs(cfg.pcc_recall_timeout_secs),
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
                background_copy: 64 << 20,
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
            p.recover();
            Some(p)
        }
        None => None,
    };
    let notifier: Arc<OnceLock<Notifier>> = Arc::new(OnceLock::new());
    let mut fs = TierFs::new(
        meta.clone(),
        Arc::clone(&data),
        Arc::clone(&metrics),
        session,
        Duration::from_secs_f64(cfg.attr_ttl),
        Duration::from_secs_f64(cfg.entry_ttl),
        recaller,
    );
    fs.notifier = Arc::clone(&notifier);
    fs.pcc = pcc.clone();
    fs.posix_acl = cfg.posix_acl;
    fs.callers = crate::caller::Callers::new(cfg.jobid_source().map_err(DaemonError::Other)?);
    fs.info_json = serde_json::json!({
        // Readable by every user of the machine: never the database password.
        "meta": tierfs_meta::postgres::without_password(&req.meta_url),
        "name": info.name,
        "client": client_name,
        "session": session,
        "mountpoint": mountpoint.display().to_string(),
        "pid": std::process::id(),
    })
    .to_string();
    let mut fcfg = fuser::Config::default();
    fcfg.mount_options = vec![
        MountOption::FSName(format!("tierfs:{}", info.name)),
        MountOption::Subtype("tierfs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
        MountOption::Dev,
        MountOption::Suid,
    ];
    fcfg.acl = SessionACL::All;
    fcfg.n_threads = Some(cfg.fuse_threads);
    fcfg.clone_fd = true;
    let mut fsession = match fuser::Session::new(fs, &mountpoint, &fcfg) {
        Ok(s) => s,
        Err(e) => {
            let _ = meta.unregister_session(session);
            return Err(DaemonError::Mount(
                mountpoint.display().to_string(),
                e.to_string(),
            ));
        }
    };
    let _ = notifier.set(fsession.notifier());
    let mut unmounter = fsession.unmount_callable();
    let stop = Arc::new(AtomicBool::new(false));

    // Heartbeat, reaping of dead clients, garbage collection.
    let bg = {
        let stop = Arc::clone(&stop);
        let meta = meta.clone();
        let data = Arc::clone(&data);
        let cfg = cfg.clone();
        let pcc = pcc.clone();
        std::thread::Builder::new()
            .name("tierfs-session".into())
            .spawn(move || {
                let tick = Duration::from_millis(50);
                let mut since_hb = Duration::ZERO;
                // Since when heartbeats have succeeded without a break (mounting counts as one).
                let mut healthy_since = std::time::Instant::now();
                let mut since_gc = Duration::ZERO;
                let mut ticks = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    if let Err(e) = data.drain_closes(session) {
                        tracing::warn!("recording closes failed: {e}");
                    }
                    ticks += 1;
                    if let Some(p) = &pcc {
                        if ticks.is_multiple_of(4) {
                            p.tick();
                        }
                    }
                    since_hb += tick;
                    since_gc += tick;
                    if since_hb >= Duration::from_secs(cfg.heartbeat_secs) {
                        since_hb = Duration::ZERO;
                        let timeout = Duration::from_secs(cfg.session_timeout_secs);
                        match meta.heartbeat(session) {
                            Ok(()) => {}
                            Err(e) => {
                                tracing::warn!("heartbeat failed: {e}");
                                healthy_since = std::time::Instant::now();
                            }
                        }
                        // Reap only after this client has itself been heartbeating for a whole
                        // session timeout: after a database outage nobody could heartbeat, and
                        // the first client back must not take the others for dead before they
                        // had the chance to heartbeat again.
                        // Daemons that ran on this machine and are gone: at once.
                        match crate::liveness::end_gone_sessions(meta.as_ref()) {
                            Ok(0) => {}
                            Ok(n) => tracing::info!("ended {n} session(s) of dead local daemons"),
                            Err(e) => tracing::warn!("ending dead local sessions failed: {e}"),
                        }
                        if healthy_since.elapsed() >= timeout {
                            match meta.reap_sessions(timeout.as_nanos() as i64) {
                                Ok(0) => {}
                                Ok(n) => tracing::info!("reaped {n} dead client session(s)"),
                                Err(e) => tracing::warn!("reaping sessions failed: {e}"),
                            }
                        }
                    }
                    if since_gc >= Duration::from_secs(cfg.gc_interval_secs) {
                        since_gc = Duration::ZERO;
                        if let Err(e) = data.collect_garbage() {
                            tracing::warn!("garbage collection failed: {e}");
                        }
                        match data.compact(64) {
                            Ok(0) => {}
                            Ok(n) => tracing::debug!("compacted {n} chunk(s)"),
                            Err(e) => tracing::warn!("compaction failed: {e}"),
                        }
                        if let Err(e) = meta.maintain() {
                            tracing::warn!("metadata maintenance failed: {e}");
                        }
                    }
                }
            })
            .map_err(|e| DaemonError::Other(e.to_string()))?
    };

    // PCC recalls on a thread of their own: another client's open waits on them, and a long
    // write-back must not hold up heartbeats. Woken by the engine's notifications where it has
    // them, polling otherwise (see recall.rs).
    let recalls = match &pcc {
        Some(p) => {
            let p = Arc::clone(p);
            let stop = Arc::clone(&stop);
            let metrics = Arc::clone(&metrics);
            Some(
                std::thread::Builder::new()
                    .name("tierfs-pcc-recall".into())
                    .spawn(move || {
                        crate::recall::run(&*p, &metrics, &stop, &crate::recall::Timing::default())
                    })
                    .map_err(|e| DaemonError::Other(e.to_string()))?,
            )
        }
        None => None,
    };

    // Signals: unmount cleanly.
    {
        let stop = Arc::clone(&stop);
        let mp = mountpoint.clone();
        std::thread::Builder::new()
            .name("tierfs-signals".into())
            .spawn(move || {
                let sig = sigs.wait();
                tracing::info!("signal {sig}: unmounting {}", mp.display());
                stop.store(true, Ordering::Relaxed);
                if unmounter.unmount().is_err() {
                    let _ = detach(&mp);
                }
            })
            .map_err(|e| DaemonError::Other(e.to_string()))?;
    }

    tracing::info!(
        "mounted {} at {} as client '{}' (session {session})",
        info.name,
        mountpoint.display(),
        client_name
    );
    ready(Ok(()));
    let result = fsession.run();
    stop.store(true, Ordering::Relaxed);
    let _ = bg.join();
    if let Some(r) = recalls {
        let _ = r.join();
    }
    data.flush_all();
    if let Some(p) = &pcc {
        p.write_back_all();
    }
    let _ = data.drain_closes(session);
    if let Err(e) = meta.unregister_session(session) {
        tracing::warn!("could not end the session: {e}");
    }
    drop(rt);
    tracing::info!("unmounted {}", mountpoint.display());
    result.map_err(|e| DaemonError::Other(format!("FUSE session ended with an error: {e}")))
}
