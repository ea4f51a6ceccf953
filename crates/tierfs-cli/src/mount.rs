//! `tierfs mount`, `tierfs umount` and `tierfs up`.
//!
//! Without `--foreground`, `mount` starts itself again as a background daemon (own process
//! group, log to a file) and waits for it to report, on a pipe, that the mount is ready or why
//! it failed.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tierfs_client::daemon::{detach, is_dead_mount, mounted_fs_type, MountRequest};
use tierfs_client::ClientConfig;
use tierfs_meta::{open_engine, MetaError, MetaUrl};

use crate::cli::{FormatArgs, MountArgs, UmountArgs, UpArgs};
use crate::error::{CliError, Result};
use crate::locate;

const READY_ENV: &str = "TIERFS_READY_PIPE";

pub(crate) fn load_config(a: &MountArgs) -> Result<ClientConfig> {
    let mut cfg = match &a.config {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).map_err(|e| CliError::Io(p.display().to_string(), e))?;
            ClientConfig::from_toml(&text)
                .map_err(|e| CliError::Config(p.display().to_string(), e))?
        }
        None => ClientConfig::default(),
    };
    if let Some(n) = &a.client_name {
        cfg.client_name = Some(n.clone());
    }
    if let Some(t) = a.attr_ttl {
        cfg.attr_ttl = t;
        cfg.entry_ttl = t;
    }
    if let Some(m) = &a.metrics {
        cfg.metrics = Some(m.clone());
    }
    if let Some(d) = &a.cache_dir {
        cfg.cache_dir = Some(d.clone());
    }
    if let Some(s) = &a.cache_size {
        cfg.cache_size = s.clone();
    }
    if let Some(j) = &a.jobid_var {
        cfg.jobid_var = j.clone();
    }
    cfg.validate()
        .map_err(|e| CliError::Usage(format!("invalid option: {e}")))?;
    Ok(cfg)
}

/// Opens (creating, mode 0600) the daemon's log file for appending, safely in a directory other
/// users can write to such as /tmp: a symbolic link planted at the path is not followed
/// (O_NOFOLLOW), the descriptor does not leak into other programs (O_CLOEXEC), and a file that
/// is not a regular file or belongs to another user is refused, so root's daemon cannot be
/// made to write elsewhere or into a file another user controls.
pub fn open_log(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                CliError::Other(format!(
                    "{}: the log file is a symbolic link; refusing to follow it (use --log-file)",
                    path.display()
                ))
            } else {
                CliError::Io(path.display().to_string(), e)
            }
        })?;
    let md = f
        .metadata()
        .map_err(|e| CliError::Io(path.display().to_string(), e))?;
    if !md.file_type().is_file() {
        return Err(CliError::Other(format!(
            "{}: the log file is not a regular file",
            path.display()
        )));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me {
        return Err(CliError::Other(format!(
            "{}: the log file belongs to another user (uid {}); refusing to write to it (use \
             --log-file)",
            path.display(),
            md.uid()
        )));
    }
    Ok(f)
}

pub fn mount(a: MountArgs, log_level: &str) -> Result<()> {
    let cfg = load_config(&a)?;
    MetaUrl::parse(&a.meta)?;
    if a.foreground {
        let to_parent = std::env::var_os(READY_ENV).is_some();
        let req = MountRequest {
            meta_url: a.meta.clone(),
            mountpoint: a.mountpoint.clone(),
            config: cfg,
            engine: None,
        };
        let mut reported = false;
        let r = tierfs_client::mount(req, |res| {
            reported = true;
            if to_parent {
                let line = match res {
                    Ok(()) => "OK".to_string(),
                    Err(e) => format!("ERR {e}"),
                };
                let mut out = std::io::stdout();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
                // Nothing else goes to the parent's pipe.
                if let Ok(devnull) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
                    use std::os::fd::AsRawFd;
                    // SAFETY: dup2 onto stdout with a valid, open descriptor.
                    unsafe { libc::dup2(devnull.as_raw_fd(), 1) };
                }
            }
        });
        if let Err(e) = &r {
            if to_parent && !reported {
                println!("ERR {}", e.to_string().replace('\n', " "));
            }
        }
        return r.map_err(CliError::from);
    }

    if cfg.writeback_cache && cfg.cache_dir.is_some() {
        // (the daemon logs it too)
        eprintln!(
            "tierfs mount: writeback_cache = true is ignored with a persistent client cache \
             (cache_dir): this mount does not use the kernel's writeback cache"
        );
    }
    // Check what we can before starting a daemon, for clear errors.
    let engine = open_engine(&a.meta)?;
    drop(engine);
    let mp = tierfs_client::daemon::prepare_mountpoint(&a.mountpoint)?;
    let client = cfg.client_name.clone().unwrap_or_else(|| "client".into());
    let log_file = a
        .log_file
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/tierfs-{client}.log")));
    let log = open_log(&log_file)?;
    let exe = std::env::current_exe().map_err(|e| CliError::Io("tierfs binary".into(), e))?;
    let mut cmd = Command::new(exe);
    cmd.arg("--log-level")
        .arg(if log_level == "warn" {
            "info"
        } else {
            log_level
        })
        .arg("mount")
        .arg("--foreground")
        .arg("--meta")
        .arg(&a.meta)
        .arg(&mp);
    if let Some(c) = &a.config {
        cmd.arg("--config").arg(c);
    }
    if let Some(n) = &a.client_name {
        cmd.arg("--client-name").arg(n);
    }
    if let Some(t) = a.attr_ttl {
        cmd.arg("--attr-ttl").arg(t.to_string());
    }
    if let Some(m) = &a.metrics {
        cmd.arg("--metrics").arg(m);
    }
    if let Some(d) = &a.cache_dir {
        std::fs::create_dir_all(d).map_err(|e| CliError::Io(d.display().to_string(), e))?;
        let abs = std::fs::canonicalize(d).map_err(|e| CliError::Io(d.display().to_string(), e))?;
        cmd.arg("--cache-dir").arg(abs);
    }
    if let Some(s) = &a.cache_size {
        cmd.arg("--cache-size").arg(s);
    }
    if let Some(j) = &a.jobid_var {
        cmd.arg("--jobid-var").arg(j);
    }
    cmd.env(READY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| CliError::Io("starting the mount daemon".into(), e))?;
    let out = child
        .stdout
        .take()
        .ok_or_else(|| CliError::Other("no pipe to the daemon".into()))?;
    let mut line = String::new();
    let _ = BufReader::new(out).read_line(&mut line);
    let line = line.trim();
    if line == "OK" {
        return Ok(());
    }
    if let Some(msg) = line.strip_prefix("ERR ") {
        let _ = child.wait();
        return Err(CliError::Other(msg.to_string()));
    }
    let status = child.wait().ok();
    Err(CliError::Other(format!(
        "the mount daemon exited ({}) before the mount was ready; see {}",
        status
            .map(|s| s.to_string())
            .unwrap_or_else(|| "unknown".into()),
        log_file.display()
    )))
}

fn wait_unmounted(mp: &Path, timeout: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if mounted_fs_type(mp).is_none() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

pub fn umount(a: UmountArgs) -> Result<()> {
    let shown = a.mountpoint.display().to_string();
    if is_dead_mount(&a.mountpoint) {
        detach(&a.mountpoint).map_err(|e| CliError::Io(shown.clone(), e))?;
        return Ok(());
    }
    let mp = std::fs::canonicalize(&a.mountpoint).map_err(|e| CliError::Io(shown.clone(), e))?;
    match mounted_fs_type(&mp) {
        None => return Err(CliError::NotMounted(shown)),
        Some(t) if !t.contains("tierfs") => {
            return Err(CliError::Usage(format!(
                "{shown} is a {t} mount, not tierfs"
            )))
        }
        Some(_) => {}
    }
    let info = std::fs::read_to_string(mp.join(tierfs_client::fs::INFO_NAME))
        .ok()
        .and_then(|t| serde_json::from_str::<locate::MountInfo>(&t).ok());
    if let Some(mi) = info {
        if pid_alive(mi.pid) {
            // SAFETY: plain kill(2) of the daemon's pid.
            unsafe { libc::kill(mi.pid as i32, libc::SIGTERM) };
            if wait_unmounted(&mp, Duration::from_secs(30)) {
                // Let the daemon finish its session cleanly.
                let t = Instant::now();
                while pid_alive(mi.pid) && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                return Ok(());
            }
        }
    }
    detach(&mp).map_err(|e| CliError::Io(shown, e))?;
    Ok(())
}

pub fn up(a: UpArgs, log_level: &str) -> Result<()> {
    std::fs::create_dir_all(&a.dir).map_err(|e| CliError::Io(a.dir.display().to_string(), e))?;
    let dir =
        std::fs::canonicalize(&a.dir).map_err(|e| CliError::Io(a.dir.display().to_string(), e))?;
    let meta = format!("sqlite://{}", dir.join("meta.db").display());
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).map_err(|e| CliError::Io(mnt.display().to_string(), e))?;
    match open_engine(&meta) {
        Ok(_) => println!("using the existing filesystem in {}", dir.display()),
        Err(MetaError::NotFormatted(_)) => {
            crate::format::format(FormatArgs {
                meta: meta.clone(),
                targets: vec![
                    format!("file://{}", dir.join("ost0").display()),
                    format!("file://{}", dir.join("ost1").display()),
                ],
                stripe_count: 1,
                stripe_size: "1M".into(),
                inline_threshold: "256K".into(),
                name: "demo".into(),
                fs_name: None,
                s3_endpoint: None,
                s3_region: None,
                force: false,
            })?;
        }
        Err(e) => return Err(e.into()),
    }
    if mounted_fs_type(&mnt).is_some() && !is_dead_mount(&mnt) {
        println!("already mounted at {}", mnt.display());
    } else {
        mount(
            MountArgs {
                meta: meta.clone(),
                mountpoint: mnt.clone(),
                client_name: Some("demo".into()),
                foreground: false,
                config: None,
                attr_ttl: None,
                metrics: None,
                log_file: Some(dir.join("mount.log")),
                cache_dir: None,
                cache_size: None,
                jobid_var: None,
            },
            log_level,
        )?;
        println!("mounted at {}", mnt.display());
    }
    let m = mnt.display();
    println!("next steps:");
    println!("  echo hello > {m}/hello.txt && cat {m}/hello.txt");
    println!("  tierfs df -h {m}");
    println!("  tierfs setstripe -c 2 -S 1M {m}/striped && tierfs getstripe {m}/striped");
    println!("  tierfs status {m}");
    println!("  tierfs mount --meta {meta} /mnt/b --client-name b   # a second client");
    println!("  tierfs umount {m}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::open_log;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn log_file_is_private_and_never_a_planted_link_or_another_users_file() {
        let dir = tempfile::tempdir().unwrap();
        // a new log: a regular file of this user, mode 0600
        let new = dir.path().join("new.log");
        drop(open_log(&new).unwrap());
        let md = std::fs::metadata(&new).unwrap();
        assert_eq!(md.permissions().mode() & 0o777, 0o600);
        // SAFETY: geteuid has no preconditions.
        assert_eq!(md.uid(), unsafe { libc::geteuid() });
        // an existing log of this user is appended to
        std::fs::write(&new, b"before\n").unwrap();
        {
            use std::io::Write;
            let mut f = open_log(&new).unwrap();
            f.write_all(b"after\n").unwrap();
        }
        assert_eq!(std::fs::read(&new).unwrap(), b"before\nafter\n");
        // a symbolic link planted at the path: refused, its target untouched
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let link = dir.path().join("planted.log");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = open_log(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        // a dangling link is not followed to create its target either
        let dangling = dir.path().join("dangling.log");
        let nowhere = dir.path().join("created-through-link");
        std::os::unix::fs::symlink(&nowhere, &dangling).unwrap();
        assert!(open_log(&dangling).is_err());
        assert!(!nowhere.exists(), "the link's target was created");
        // the descriptor is close-on-exec
        {
            use std::os::fd::AsRawFd;
            let f = open_log(&new).unwrap();
            // SAFETY: F_GETFD on an open descriptor.
            let fl = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFD) };
            assert!(fl & libc::FD_CLOEXEC != 0, "O_CLOEXEC missing");
        }
        // not a regular file
        let sub = dir.path().join("dir.log");
        std::fs::create_dir(&sub).unwrap();
        assert!(open_log(&sub).is_err());
        // a file of another user (root can chown): refused
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let theirs = dir.path().join("theirs.log");
            std::fs::write(&theirs, b"").unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let e = open_log(&theirs).unwrap_err().to_string();
            assert!(e.contains("another user"), "{e}");
        }
    }
}
