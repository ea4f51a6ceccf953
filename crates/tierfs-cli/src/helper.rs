//! The mount(8) helper convention, so that a tierfs filesystem can be one line of /etc/fstab:
//!
//! ```text
//! postgres://tierfs@db1/tierfs  /mnt/tierfs  fuse.tierfs  _netdev,client_name=node17,cache_dir=/nvme/pcc,cache_size=200G  0 0
//! ```
//!
//! `mount -t fuse.tierfs SOURCE DIR` runs `/sbin/mount.fuse.tierfs SOURCE DIR [-sfnv] [-o
//! OPTS]` when that exists (`tierfs install-helper` makes it, a symlink to this binary);
//! otherwise fuse3's `/sbin/mount.fuse`, which runs `tierfs SOURCE
//! DIR -o OPTS,dev,suid` through `/bin/sh`, finding `tierfs` on the shell's default PATH
//! (mount(8) clears PATH). Both arrive here, as does `tierfs mount-helper SOURCE DIR -o OPTS`:
//! the `-o` options become `tierfs mount`'s flags, and the command returns once the mount is
//! ready, as `tierfs mount` does.
//!
//! The daemon always mounts read-write with `dev`, `suid` and `noatime`; `ro`, `nosuid`,
//! `nodev` and `noexec` are applied to the new mount right after (a bind remount, which
//! changes the mount point's flags, not the filesystem).

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use clap::Args;
use tierfs_meta::MetaUrl;

use crate::cli::{MountArgs, UmountArgs};
use crate::error::{CliError, Result};

/// Options of ours and the `tierfs mount` flag each one stands for.
const OURS: &[&str] = &[
    "client_name",
    "config",
    "attr_ttl",
    "metrics",
    "log_file",
    "cache_dir",
    "cache_size",
    "jobid_var",
    "s3_credentials",
    "env_file",
    "log_level",
];

/// Generic options mount(8) or habit puts in fstab that need nothing from us: mount(8)'s own
/// (`defaults`, `auto`, `_netdev`, `nofail`, `user`...), what the daemon does anyway (`rw`,
/// `dev`, `suid`, `exec`, `async`, FUSE's `allow_other` and `default_permissions`), and the
/// atime family (a tierfs mount is always `noatime`).
const IGNORED: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "rw",
    "dev",
    "suid",
    "exec",
    "async",
    "allow_other",
    "default_permissions",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
    "diratime",
    "nodiratime",
    "silent",
    "loud",
];

#[derive(Debug, Args)]
pub struct MountHelperArgs {
    /// Metadata URL (the fstab "device" field), e.g. postgres://tierfs@db1/tierfs or
    /// sqlite:///srv/tfs/meta.db. The password comes from PGPASSWORD or the password file
    /// (PGPASSFILE, ~/.pgpass; see env_file=), never from here.
    pub source: String,
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// Options, comma-separated (repeatable): client_name=, config=, attr_ttl=, metrics=,
    /// log_file=, cache_dir=, cache_size=, jobid_var=, s3_credentials=, env_file=, log_level=; ro, nosuid,
    /// nodev, noexec; generic ones (rw, defaults, _netdev, nofail, noauto, x-*, ...) are
    /// ignored.
    #[arg(short = 'o', value_name = "OPTS", action = clap::ArgAction::Append)]
    pub options: Vec<String>,
    /// Sloppy: warn about unknown options and go on instead of failing (mount -s).
    #[arg(short = 's')]
    pub sloppy: bool,
    /// Fake: check the source and the options, do not mount (mount -f).
    #[arg(short = 'f')]
    pub fake: bool,
    /// Do not write /etc/mtab (accepted; there is nothing to write).
    #[arg(short = 'n')]
    pub no_mtab: bool,
    /// Print the `tierfs mount` command the options stand for.
    #[arg(short = 'v')]
    pub verbose: bool,
    /// Filesystem type as mount(8) passes it to a generic helper (fuse.tierfs); ignored.
    #[arg(short = 't', value_name = "TYPE")]
    pub fstype: Option<String>,
}

#[derive(Debug, Args)]
pub struct InstallHelperArgs {
    /// Directory mount(8) looks in for helpers.
    #[arg(long, default_value = "/sbin")]
    pub dir: PathBuf,
    /// Replace files of those names that point elsewhere.
    #[arg(long)]
    pub force: bool,
}

/// Names under which this binary is the mount(8) helper.
const MOUNT_NAMES: &[&str] = &["mount.fuse.tierfs", "mount.tierfs"];

fn is_meta_url(s: &std::ffi::OsStr) -> bool {
    let b = s.as_bytes();
    [&b"sqlite://"[..], b"postgres://", b"postgresql://"]
        .iter()
        .any(|p| b.starts_with(p))
}

/// The command line as clap should see it: called as `mount.fuse.tierfs ARGS` (or
/// `mount.tierfs`), or as `tierfs SOURCE DIR ...` by fuse3's mount.fuse, it becomes `tierfs
/// mount-helper ARGS`.
pub fn rewrite_args(args: Vec<OsString>) -> Vec<OsString> {
    let Some(argv0) = args.first() else {
        return args;
    };
    let base = Path::new(argv0)
        .file_name()
        .map(|b| b.to_string_lossy().into_owned())
        .unwrap_or_default();
    if MOUNT_NAMES.contains(&base.as_str()) || args.get(1).is_some_and(|a| is_meta_url(a)) {
        let mut out: Vec<OsString> = vec!["tierfs".into(), "mount-helper".into()];
        out.extend(args.into_iter().skip(1));
        return out;
    }
    args
}

/// What the `-o` options ask for.
#[derive(Debug, Default, PartialEq)]
pub struct HelperOptions {
    pub client_name: Option<String>,
    pub config: Option<PathBuf>,
    pub attr_ttl: Option<f64>,
    pub metrics: Option<String>,
    pub log_file: Option<PathBuf>,
    pub cache_dir: Option<PathBuf>,
    pub cache_size: Option<String>,
    pub jobid_var: Option<String>,
    pub s3_credentials: Option<PathBuf>,
    pub env_file: Option<PathBuf>,
    pub log_level: Option<String>,
    pub ro: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
    /// Unknown options skipped under `-s`.
    pub skipped: Vec<String>,
}

impl HelperOptions {
    /// Mount-point flags (MS_*) to add after the mount.
    fn vfs_flags(&self) -> libc::c_ulong {
        let mut f = 0;
        for (on, flag) in [
            (self.ro, libc::MS_RDONLY),
            (self.nosuid, libc::MS_NOSUID),
            (self.nodev, libc::MS_NODEV),
            (self.noexec, libc::MS_NOEXEC),
        ] {
            if on {
                f |= flag;
            }
        }
        f
    }

    fn vfs_names(&self) -> String {
        let names: Vec<&str> = [
            (self.ro, "ro"),
            (self.nosuid, "nosuid"),
            (self.nodev, "nodev"),
            (self.noexec, "noexec"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
        names.join(",")
    }
}

fn unknown(opt: &str) -> CliError {
    CliError::Usage(format!(
        "unknown mount option '{opt}'; tierfs takes {}= and ro, nosuid, nodev, noexec, \
         besides the generic ones (rw, defaults, _netdev, nofail, noauto, x-*, ...)",
        OURS.join("=, ")
    ))
}

/// Parses the `-o` lists, in order (a later `rw` undoes an earlier `ro`, and so on).
pub fn parse_options(lists: &[String], sloppy: bool) -> Result<HelperOptions> {
    let mut o = HelperOptions::default();
    for opt in lists.iter().flat_map(|l| l.split(',')) {
        let opt = opt.trim();
        if opt.is_empty() {
            continue;
        }
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let ours = key.replace('-', "_");
        if OURS.contains(&ours.as_str()) {
            let Some(v) = value.filter(|v| !v.is_empty()) else {
                return Err(CliError::Usage(format!(
                    "mount option {ours} needs a value ({ours}=...)"
                )));
            };
            let path = || -> Result<PathBuf> {
                if v.starts_with('/') {
                    Ok(PathBuf::from(v))
                } else {
                    Err(CliError::Usage(format!(
                        "mount option {ours}={v}: needs an absolute path"
                    )))
                }
            };
            match ours.as_str() {
                "client_name" => o.client_name = Some(v.to_string()),
                "config" => o.config = Some(path()?),
                "attr_ttl" => {
                    o.attr_ttl = Some(v.parse::<f64>().ok().filter(|t| t.is_finite()).ok_or_else(
                        || CliError::Usage(format!("mount option attr_ttl={v}: not a number")),
                    )?)
                }
                "metrics" => o.metrics = Some(v.to_string()),
                "log_file" => o.log_file = Some(path()?),
                "cache_dir" => o.cache_dir = Some(path()?),
                "cache_size" => o.cache_size = Some(v.to_string()),
                "jobid_var" => o.jobid_var = Some(v.to_string()),
                "s3_credentials" => o.s3_credentials = Some(path()?),
                "env_file" => o.env_file = Some(path()?),
                "log_level" => o.log_level = Some(v.to_string()),
                _ => unreachable!("every name in OURS has a case"),
            }
            continue;
        }
        match (key, value) {
            ("ro", None) => o.ro = true,
            ("rw", None) => o.ro = false,
            ("nosuid", None) => o.nosuid = true,
            ("suid", None) => o.nosuid = false,
            ("nodev", None) => o.nodev = true,
            ("dev", None) => o.nodev = false,
            ("noexec", None) => o.noexec = true,
            ("exec", None) => o.noexec = false,
            (k, None) if IGNORED.contains(&k) => {}
            (k, _) if k.starts_with("x-") || k == "comment" => {}
            _ if sloppy => o.skipped.push(opt.to_string()),
            _ => return Err(unknown(opt)),
        }
    }
    Ok(o)
}

/// Reads an environment file (`KEY=VALUE` lines, `#` comments, optional quotes: what a
/// systemd `EnvironmentFile=` holds). It carries secrets such as `PGPASSWORD`, so it must be
/// a regular file no other user can read; values never appear in errors.
pub fn read_env_file(path: &Path) -> Result<Vec<(String, String)>> {
    let bad = |why: String| CliError::Usage(format!("env_file {}: {why}", path.display()));
    let text = tierfs_store::credentials::read_private_file(path).map_err(bad)?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') || l.starts_with(';') {
            continue;
        }
        let l = l.strip_prefix("export ").unwrap_or(l);
        let Some((k, v)) = l.split_once('=') else {
            return Err(bad(format!("line {}: expected KEY=VALUE", i + 1)));
        };
        let k = k.trim();
        let valid = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(bad(format!("line {}: not a variable name", i + 1)));
        }
        let v = v.trim();
        let v = ['"', '\'']
            .iter()
            .find_map(|q| v.strip_prefix(*q).and_then(|r| r.strip_suffix(*q)))
            .unwrap_or(v);
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

/// Whether `mp` is a live tierfs mount of the filesystem at `source` (per its info file).
fn already_mounted(mp: &Path, source: &str) -> bool {
    let Ok(abs) = std::fs::canonicalize(mp) else {
        return false;
    };
    if tierfs_client::daemon::mounted_fs_type(&abs).is_none() {
        return false;
    }
    std::fs::read_to_string(abs.join(tierfs_client::fs::INFO_NAME))
        .ok()
        .and_then(|t| serde_json::from_str::<crate::locate::MountInfo>(&t).ok())
        .is_some_and(|mi| {
            mi.meta == tierfs_meta::postgres::without_password(source)
                && Path::new(&mi.mountpoint) == abs
        })
}

/// The home directory of the effective user, from the password database.
fn home_of_euid() -> Option<PathBuf> {
    // SAFETY: getpwuid returns a pointer into static storage or NULL; it is read at once,
    // before anything else could call it (single-threaded here).
    unsafe {
        let pw = libc::getpwuid(libc::geteuid());
        if pw.is_null() || (*pw).pw_dir.is_null() {
            return None;
        }
        let dir = std::ffi::CStr::from_ptr((*pw).pw_dir);
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(dir.to_bytes())))
    }
}

/// Adds `flags` (MS_RDONLY, MS_NOSUID, ...) to the mount at `mp`, keeping the flags it has.
fn restrict_mount(mp: &Path, flags: libc::c_ulong) -> std::io::Result<()> {
    let c = CString::new(mp.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs into a zeroed struct, with a valid NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut all = libc::MS_REMOUNT | libc::MS_BIND | flags;
    for (st_bit, ms_bit) in [
        (libc::ST_RDONLY, libc::MS_RDONLY),
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if st.f_flag & st_bit != 0 {
            all |= ms_bit;
        }
    }
    // SAFETY: a bind remount changes only the flags of the mount at `c`.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            c.as_ptr(),
            std::ptr::null(),
            all,
            std::ptr::null(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `mount.fuse.tierfs SOURCE DIR [-sfnv] [-o OPTS]`.
pub fn mount_helper(a: MountHelperArgs, log_level: &str) -> Result<()> {
    let o = parse_options(&a.options, a.sloppy)?;
    for s in &o.skipped {
        eprintln!("tierfs: ignoring unknown mount option '{s}' (sloppy mount)");
    }
    MetaUrl::parse(&a.source).map_err(|e| CliError::Usage(e.to_string()))?;
    if std::env::var_os("HOME").is_none() {
        // mount(8) clears HOME; the password file is ~/.pgpass of the mounting user (as
        // fuse3's mount.fuse and libpq assume).
        if let Some(home) = home_of_euid() {
            // SAFETY: the command is single-threaded until the mount daemon starts.
            unsafe { std::env::set_var("HOME", home) };
        }
    }
    if let Some(p) = &o.env_file {
        for (k, v) in read_env_file(p)? {
            // SAFETY: the command is single-threaded until the mount daemon starts.
            unsafe { std::env::set_var(k, v) };
        }
    }
    if let Some(p) = &o.s3_credentials {
        // SAFETY: as above; the daemon inherits it.
        unsafe { std::env::set_var(tierfs_store::credentials::CREDENTIALS_ENV, p) };
    }
    let level = o.log_level.clone().unwrap_or_else(|| log_level.to_string());
    let margs = MountArgs {
        meta: a.source.clone(),
        mountpoint: a.mountpoint.clone(),
        client_name: o.client_name.clone(),
        foreground: false,
        config: o.config.clone(),
        attr_ttl: o.attr_ttl,
        metrics: o.metrics.clone(),
        log_file: o.log_file.clone(),
        cache_dir: o.cache_dir.clone(),
        cache_size: o.cache_size.clone(),
        jobid_var: o.jobid_var.clone(),
    };
    if a.verbose {
        println!("{}", equivalent_command(&margs, &o, &level));
    }
    crate::mount::load_config(&margs)?;
    if a.fake {
        return Ok(());
    }
    if already_mounted(&a.mountpoint, &a.source) {
        // The kernel names the mount `tierfs:NAME`, not by the fstab source, so `mount -a`
        // cannot tell that this line is mounted and asks again: not an error.
        eprintln!(
            "tierfs: {} is already mounted from {}",
            a.mountpoint.display(),
            tierfs_meta::postgres::without_password(&a.source)
        );
        return Ok(());
    }
    crate::mount::mount(margs, &level)?;
    let flags = o.vfs_flags();
    if flags != 0 {
        let shown = a.mountpoint.display().to_string();
        let mp =
            std::fs::canonicalize(&a.mountpoint).map_err(|e| CliError::Io(shown.clone(), e))?;
        if let Err(e) = restrict_mount(&mp, flags) {
            let _ = crate::mount::umount(UmountArgs {
                mountpoint: mp.clone(),
            });
            return Err(CliError::Other(format!(
                "cannot make {shown} {}: {e} (unmounted again)",
                o.vfs_names()
            )));
        }
    }
    Ok(())
}

/// The `tierfs mount` command line the helper runs, without any password, for `-v`.
fn equivalent_command(m: &MountArgs, o: &HelperOptions, level: &str) -> String {
    let mut v = vec!["tierfs".to_string()];
    if level != "warn" {
        v.push(format!("--log-level {level}"));
    }
    if let Some(p) = &o.s3_credentials {
        v.push(format!("--s3-credentials {}", p.display()));
    }
    v.push("mount".into());
    v.push(format!(
        "--meta {}",
        tierfs_meta::postgres::without_password(&m.meta)
    ));
    v.push(m.mountpoint.display().to_string());
    let mut flag = |name: &str, val: Option<String>| {
        if let Some(x) = val {
            v.push(format!("--{name} {x}"));
        }
    };
    flag("client-name", m.client_name.clone());
    flag("config", m.config.as_ref().map(|p| p.display().to_string()));
    flag("attr-ttl", m.attr_ttl.map(|t| t.to_string()));
    flag("metrics", m.metrics.clone());
    flag(
        "log-file",
        m.log_file.as_ref().map(|p| p.display().to_string()),
    );
    flag(
        "cache-dir",
        m.cache_dir.as_ref().map(|p| p.display().to_string()),
    );
    flag("cache-size", m.cache_size.clone());
    flag("jobid-var", m.jobid_var.clone());
    let mut line = v.join(" ");
    if o.vfs_flags() != 0 {
        line.push_str(&format!("   # then {}", o.vfs_names()));
    }
    line
}

/// `tierfs install-helper`: `mount.fuse.tierfs` in `--dir`, a symlink to this binary.
pub fn install_helper(a: InstallHelperArgs) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| CliError::Io("tierfs binary".into(), e))?;
    {
        let link = a.dir.join("mount.fuse.tierfs");
        let shown = link.display().to_string();
        if let Ok(md) = std::fs::symlink_metadata(&link) {
            let points_to = std::fs::read_link(&link).ok();
            if points_to.as_deref() == Some(exe.as_path()) {
                println!("{shown} -> {} (already there)", exe.display());
                return Ok(());
            }
            if !a.force {
                let what = match points_to {
                    Some(t) => format!("a link to {}", t.display()),
                    None if md.is_dir() => "a directory".into(),
                    None => "a file".into(),
                };
                return Err(CliError::Usage(format!(
                    "{shown} exists ({what}); --force replaces it"
                )));
            }
            std::fs::remove_file(&link).map_err(|e| CliError::Io(shown.clone(), e))?;
        }
        std::os::unix::fs::symlink(&exe, &link).map_err(|e| CliError::Io(shown.clone(), e))?;
        println!("{shown} -> {}", exe.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn helper_names_and_the_fuse3_form_become_mount_helper() {
        let want = os(&[
            "tierfs",
            "mount-helper",
            "sqlite:///m.db",
            "/mnt",
            "-o",
            "rw",
        ]);
        for argv0 in ["/sbin/mount.fuse.tierfs", "mount.tierfs"] {
            assert_eq!(
                rewrite_args(os(&[argv0, "sqlite:///m.db", "/mnt", "-o", "rw"])),
                want
            );
        }
        assert_eq!(
            rewrite_args(os(&["tierfs", "sqlite:///m.db", "/mnt", "-o", "rw"])),
            want
        );
        let plain = os(&["tierfs", "mount", "--meta", "sqlite:///m.db", "/mnt"]);
        assert_eq!(rewrite_args(plain.clone()), plain);
    }

    #[test]
    fn options_map_onto_mount_flags() {
        let o = parse_options(
            &[
                "rw,_netdev,client_name=node17,cache_dir=/nvme/pcc,cache_size=200G".into(),
                "attr-ttl=2.5,x-systemd.automount,comment=x,nofail,nosuid,dev,suid".into(),
            ],
            false,
        )
        .unwrap();
        assert_eq!(o.client_name.as_deref(), Some("node17"));
        assert_eq!(o.cache_dir, Some(PathBuf::from("/nvme/pcc")));
        assert_eq!(o.cache_size.as_deref(), Some("200G"));
        assert_eq!(o.attr_ttl, Some(2.5));
        // the later `suid` undoes `nosuid`
        assert!(!o.nosuid && !o.nodev && !o.ro);
        let o = parse_options(&["ro,nosuid,nodev,noexec".into()], false).unwrap();
        assert_eq!(o.vfs_names(), "ro,nosuid,nodev,noexec");
    }

    #[test]
    fn bad_options_are_refused_in_one_line() {
        for (opts, want) in [
            ("rw,bogus=1", "unknown mount option 'bogus=1'"),
            ("sync", "unknown mount option 'sync'"),
            ("client_name", "client_name needs a value"),
            ("cache_dir=relative/dir", "needs an absolute path"),
            ("attr_ttl=soon", "attr_ttl=soon: not a number"),
        ] {
            let e = parse_options(&[opts.into()], false)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{opts}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let o = parse_options(&["bogus=1,client_name=a".into()], true).unwrap();
        assert_eq!(o.skipped, vec!["bogus=1".to_string()]);
        assert_eq!(o.client_name.as_deref(), Some("a"));
    }

    #[test]
    fn env_files_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("tierfs.env");
        std::fs::write(
            &p,
            "# secrets\nPGPASSWORD=\"s3cret\"\nexport TIERFS_S3_CREDENTIALS=/etc/tierfs/s3.toml\n\n",
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            read_env_file(&p).unwrap(),
            vec![
                ("PGPASSWORD".to_string(), "s3cret".to_string()),
                (
                    "TIERFS_S3_CREDENTIALS".to_string(),
                    "/etc/tierfs/s3.toml".to_string()
                ),
            ]
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_env_file(&p).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::write(&p, "PGPASSWORD s3cret\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = read_env_file(&p).unwrap_err().to_string();
        assert!(e.contains("line 1") && !e.contains("s3cret"), "{e}");
    }
}
