//! The filesystems under test: a plain directory on the work dir's disk (`native`) and a fresh
//! tierfs formatted in the work dir and mounted by N clients, each its own mount point, client
//! name and cache dir. Everything is unmounted and removed at the end, also on error (Drop) and
//! on Ctrl-C (the workloads stop at the next operation and unwind to here).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::util;

/// One way of storing the data a workload touches.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
pub enum Mode {
    /// A plain directory on the same disk: the physical limit.
    #[value(name = "native")]
    #[serde(rename = "native")]
    Native,
    /// tierfs without a client cache.
    #[value(name = "tierfs")]
    #[serde(rename = "tierfs")]
    Tierfs,
    /// tierfs with files attached to the read-write persistent client cache.
    #[value(name = "tierfs+rw-pcc")]
    #[serde(rename = "tierfs+rw-pcc")]
    TierfsRwPcc,
    /// tierfs with read-only cached copies.
    #[value(name = "tierfs+ro-pcc")]
    #[serde(rename = "tierfs+ro-pcc")]
    TierfsRoPcc,
}

impl Mode {
    pub const ALL: [Mode; 4] = [
        Mode::Native,
        Mode::Tierfs,
        Mode::TierfsRwPcc,
        Mode::TierfsRoPcc,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Native => "native",
            Mode::Tierfs => "tierfs",
            Mode::TierfsRwPcc => "tierfs+rw-pcc",
            Mode::TierfsRoPcc => "tierfs+ro-pcc",
        }
    }

    pub fn is_tierfs(self) -> bool {
        self != Mode::Native
    }

    pub fn is_pcc(self) -> bool {
        matches!(self, Mode::TierfsRwPcc | Mode::TierfsRoPcc)
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether this tierfs binary has `tierfs pcc attach` (the PCC modes need it).
pub fn pcc_available(tierfs: &Path) -> bool {
    Command::new(tierfs)
        .args(["pcc", "attach", "--help"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// How to build the environment.
#[derive(Debug, Clone)]
pub struct EnvConfig {
    /// The `tierfs` binary (the harness runs inside it: `current_exe`).
    pub tierfs: PathBuf,
    /// Parent of the work dir (default /var/tmp).
    pub workdir: PathBuf,
    /// Storage targets of the tierfs under test.
    pub targets: usize,
    /// Default stripe count of the tierfs under test (-1: all targets).
    pub stripe_count: i64,
    /// Keep the work dir (for debugging).
    pub keep: bool,
    /// Mount clients with a persistent client cache and install the PCC modes' attach rules.
    pub pcc: bool,
    /// Metadata database to format (with `--force`) instead of SQLite in the work dir, e.g.
    /// `postgres://tierfs@127.0.0.1:5432/bench` (the password from PGPASSWORD).
    pub meta: Option<String>,
    /// Storage target URLs instead of `targets` local directories in the work dir. Each run
    /// uses its own sub-directory or sub-prefix of each (see [`run_target_url`]).
    pub target_urls: Vec<String>,
    /// Network namespaces the clients mount in (`--remote`): client k in `client_netns[k % len]`;
    /// empty: this host's.
    pub client_netns: Vec<String>,
}

/// What the tierfs under test is made of, for the reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsUnderTest {
    /// Metadata engine: `sqlite` or `postgresql`.
    pub engine: String,
    /// The metadata URL, without a password.
    pub meta: String,
    /// Kind of the storage targets: `local`, `s3` or `mixed`.
    pub target_kind: String,
    /// The storage target URLs as formatted (this run's sub-directory or sub-prefix included).
    pub targets: Vec<String>,
    /// Default stripe count (-1: all targets).
    pub stripe_count: i64,
}

impl FsUnderTest {
    /// One line: "sqlite metadata, 2 local targets, stripe count 1".
    pub fn summary(&self) -> String {
        if self.engine.is_empty() {
            return "unknown".into();
        }
        format!(
            "{} metadata, {} {} target{}, stripe count {}",
            self.engine,
            self.targets.len(),
            self.target_kind,
            if self.targets.len() == 1 { "" } else { "s" },
            self.stripe_count
        )
    }
}

/// Checks a `--meta` URL: `sqlite:///PATH`, `postgres://...` or `postgresql://...`.
pub fn check_meta_url(url: &str) -> Result<(), BenchError> {
    let ok = match url.strip_prefix("sqlite://") {
        Some(rest) => rest.starts_with('/'),
        None => url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .is_some_and(|rest| !rest.is_empty()),
    };
    if ok {
        Ok(())
    } else {
        Err(BenchError::Args(format!(
            "--meta {}: expected sqlite:///PATH or postgres://USER@HOST[:PORT]/DB",
            redact_url(url)
        )))
    }
}

/// The metadata engine a URL names: `sqlite` or `postgresql`.
pub fn engine_name(url: &str) -> &'static str {
    if url.starts_with("sqlite://") {
        "sqlite"
    } else {
        "postgresql"
    }
}

/// Checks a `--target-url`: `file:///DIR` or `s3://BUCKET[/PREFIX][?endpoint=URL&region=NAME]`.
pub fn check_target_url(url: &str) -> Result<(), BenchError> {
    let (base, _) = url.split_once('?').unwrap_or((url, ""));
    let ok = if let Some(p) = base.strip_prefix("file://") {
        p.starts_with('/') && !url.contains('?')
    } else if let Some(rest) = base.strip_prefix("s3://") {
        let bucket = rest.split('/').next().unwrap_or("");
        !bucket.is_empty()
    } else {
        false
    };
    if ok {
        Ok(())
    } else {
        Err(BenchError::Args(format!(
            "--target-url {url}: expected file:///DIR or s3://BUCKET[/PREFIX][?endpoint=URL&region=NAME]"
        )))
    }
}

/// A target URL with this run's own sub-directory (file://) or key sub-prefix (s3://)
/// appended to its path, before any query: `s3://b/p?endpoint=E` becomes `s3://b/p/RUN?endpoint=E`.
/// Reruns never see each other's objects, and a directory or prefix that already holds data
/// is never formatted over.
pub fn run_target_url(url: &str, run: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let base = base.trim_end_matches('/');
    let mut out = format!("{base}/{run}");
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// The kind of a set of target URLs: `local`, `s3` or `mixed`.
pub fn target_kind(urls: &[String]) -> &'static str {
    let s3 = urls.iter().filter(|u| u.starts_with("s3://")).count();
    match s3 {
        0 => "local",
        n if n == urls.len() => "s3",
        _ => "mixed",
    }
}

/// A URL without the password of its user (`postgres://u:secret@h/db` becomes
/// `postgres://u:***@h/db`); anything else unchanged. Also used on every word of the
/// recorded command line.
pub fn redact_url(s: &str) -> String {
    let Some((scheme, rest)) = s.split_once("://") else {
        return s.to_string();
    };
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(auth_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return s.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
        None => s.to_string(),
    }
}

/// Project id whose files the RW-PCC mode's rule attaches at create.
pub const RW_PCC_PROJECT: u32 = 4701;
/// Project id whose files the RO-PCC mode's rule attaches at open.
pub const RO_PCC_PROJECT: u32 = 4702;

/// The work dir with its native directory and tierfs clients.
pub struct Env {
    pub cfg: EnvConfig,
    /// This run's own directory under `cfg.workdir`.
    pub dir: PathBuf,
    pub native: PathBuf,
    meta_url: String,
    /// The targets' URLs as formatted.
    target_urls: Vec<String>,
    /// Local directories made for this run outside the work dir (removed at teardown).
    extra_dirs: Vec<PathBuf>,
    formatted: bool,
    mounts: Vec<PathBuf>,
    torn_down: bool,
}

impl Env {
    /// Creates a fresh, uniquely named work dir.
    pub fn create(cfg: EnvConfig) -> Result<Env, BenchError> {
        std::fs::create_dir_all(&cfg.workdir)
            .map_err(|e| BenchError::io(format!("create {}", cfg.workdir.display()), e))?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = cfg
            .workdir
            .join(format!("tierfs-bench-{}-{stamp}", std::process::id()));
        let native = dir.join("native");
        std::fs::create_dir_all(&native)
            .map_err(|e| BenchError::io(format!("create {}", native.display()), e))?;
        let meta_url = match &cfg.meta {
            Some(u) => u.clone(),
            None => format!("sqlite://{}", dir.join("meta.db").display()),
        };
        let (target_urls, extra_dirs) = if cfg.target_urls.is_empty() {
            let urls = (0..cfg.targets.max(1))
                .map(|i| format!("file://{}", dir.join(format!("ost{i}")).display()))
                .collect();
            (urls, Vec::new())
        } else {
            let run = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "tierfs-bench".into());
            // Two URLs naming the same place would give two targets one directory.
            let mut urls: Vec<String> = Vec::new();
            for (i, u) in cfg.target_urls.iter().enumerate() {
                let sub = if cfg.target_urls[..i].contains(u) {
                    format!("{run}-{i}")
                } else {
                    run.clone()
                };
                urls.push(run_target_url(u, &sub));
            }
            let dirs = urls
                .iter()
                .filter_map(|u| u.strip_prefix("file://").map(PathBuf::from))
                .collect();
            (urls, dirs)
        };
        Ok(Env {
            cfg,
            dir,
            native,
            meta_url,
            target_urls,
            extra_dirs,
            formatted: false,
            mounts: Vec::new(),
            torn_down: false,
        })
    }

    fn tierfs(&self) -> Command {
        Command::new(&self.cfg.tierfs)
    }

    /// What the tierfs under test is made of.
    pub fn fs_under_test(&self) -> FsUnderTest {
        FsUnderTest {
            engine: engine_name(&self.meta_url).into(),
            meta: redact_url(&self.meta_url),
            target_kind: target_kind(&self.target_urls).into(),
            targets: self.target_urls.clone(),
            stripe_count: self.cfg.stripe_count,
        }
    }

    fn format(&mut self) -> Result<(), BenchError> {
        if self.formatted {
            return Ok(());
        }
        let mut cmd = self.tierfs();
        cmd.arg("format").arg("--meta").arg(&self.meta_url);
        if self.cfg.meta.is_some() {
            // A database given by URL is reused from run to run: it is formatted over.
            cmd.arg("--force");
        }
        for t in &self.target_urls {
            cmd.arg("--target").arg(t);
        }
        cmd.arg("--stripe-count")
            .arg(self.cfg.stripe_count.to_string())
            .arg("--name")
            .arg("bench");
        util::run_checked(&mut cmd, "tierfs format")?;
        if self.cfg.pcc {
            for (mode, proj) in [("rw", RW_PCC_PROJECT), ("ro", RO_PCC_PROJECT)] {
                let mut cmd = self.tierfs();
                cmd.args(["pcc", "rule", "add", "--meta"])
                    .arg(&self.meta_url)
                    .arg("--mode")
                    .arg(mode)
                    .arg(format!("projid={{{proj}}}"));
                util::run_checked(&mut cmd, "tierfs pcc rule add")?;
            }
        }
        self.formatted = true;
        Ok(())
    }

    /// Mounts clients until `n` are mounted; returns their mount points.
    pub fn ensure_clients(&mut self, n: usize) -> Result<Vec<PathBuf>, BenchError> {
        self.format()?;
        std::fs::create_dir_all(self.dir.join("logs"))
            .map_err(|e| BenchError::io("create logs dir", e))?;
        while self.mounts.len() < n {
            util::check_interrupt()?;
            let k = self.mounts.len();
            let mnt = self.dir.join(format!("mnt{k}"));
            let cache = self.dir.join(format!("cache{k}"));
            for d in [&mnt, &cache] {
                std::fs::create_dir_all(d)
                    .map_err(|e| BenchError::io(format!("create {}", d.display()), e))?;
            }
            let mut cmd = if self.cfg.client_netns.is_empty() {
                self.tierfs()
            } else {
                let ns = &self.cfg.client_netns[k % self.cfg.client_netns.len()];
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", crate::remote::netns_path(ns).display()))
                    .arg("--")
                    .arg(&self.cfg.tierfs);
                c
            };
            cmd.arg("mount")
                .arg("--meta")
                .arg(&self.meta_url)
                .arg(&mnt)
                .arg("--client-name")
                .arg(format!("bench-c{k}"))
                .arg("--log-file")
                .arg(self.dir.join("logs").join(format!("c{k}.log")));
            if self.cfg.pcc {
                cmd.arg("--cache-dir")
                    .arg(&cache)
                    .arg("--cache-size")
                    .arg("16G");
            }
            util::run_checked(&mut cmd, &format!("tierfs mount {}", mnt.display()))
                .map_err(|e| BenchError::Setup(e.to_string()))?;
            self.mounts.push(mnt);
        }
        Ok(self.mounts[..n].to_vec())
    }

    /// The per-client directories of one run: for tierfs, the same directory seen through each
    /// client's mount; for native, the same plain directory `clients` times.
    pub fn run_roots(
        &mut self,
        mode: Mode,
        clients: usize,
        run: &str,
    ) -> Result<Vec<PathBuf>, BenchError> {
        let bases: Vec<PathBuf> = if mode.is_tierfs() {
            self.ensure_clients(clients)?
        } else {
            vec![self.native.clone(); clients]
        };
        let roots: Vec<PathBuf> = bases.iter().map(|b| b.join(run)).collect();
        let _ = std::fs::remove_dir_all(&roots[0]);
        std::fs::create_dir_all(&roots[0])
            .map_err(|e| BenchError::io(format!("create {}", roots[0].display()), e))?;
        let project = match mode {
            Mode::TierfsRwPcc => Some(RW_PCC_PROJECT),
            Mode::TierfsRoPcc => Some(RO_PCC_PROJECT),
            _ => None,
        };
        if let Some(p) = project {
            // New files below inherit the project id, which the mode's attach rule matches.
            let mut cmd = self.tierfs();
            cmd.args(["project", "-s", "-p"])
                .arg(p.to_string())
                .arg(&roots[0]);
            util::run_checked(&mut cmd, "tierfs project")?;
        }
        Ok(roots)
    }

    /// The clients mounted now (for the watchdog).
    pub fn mounted(&self) -> Vec<PathBuf> {
        self.mounts.clone()
    }

    /// After a forced unmount: forget the clients, so the next run mounts them again.
    pub fn forget_clients(&mut self) {
        self.mounts.clear();
    }

    /// A scratch directory on the work dir's disk (not under test).
    pub fn scratch(&self) -> PathBuf {
        self.dir.join("scratch")
    }

    /// Unmounts every client and removes the work dir.
    pub fn teardown(&mut self) -> Result<(), BenchError> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        let mut errors = Vec::new();
        for mnt in self.mounts.drain(..) {
            let mut cmd = Command::new(&self.cfg.tierfs);
            cmd.arg("umount").arg(&mnt);
            // Not interruptible: a second Ctrl-C must not leave mounts behind.
            let ok = cmd
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok && is_mounted(&mnt) {
                let _ = Command::new("umount").arg("-l").arg(&mnt).status();
            }
            if is_mounted(&mnt) {
                errors.push(format!("could not unmount {}", mnt.display()));
            }
        }
        if !errors.is_empty() {
            return Err(BenchError::Setup(errors.join("; ")));
        }
        if !self.cfg.keep && mounts_under(&self.dir).is_empty() {
            std::fs::remove_dir_all(&self.dir)
                .map_err(|e| BenchError::io(format!("remove {}", self.dir.display()), e))?;
            for d in &self.extra_dirs {
                if d.exists() {
                    std::fs::remove_dir_all(d)
                        .map_err(|e| BenchError::io(format!("remove {}", d.display()), e))?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("tierfs bench: cleanup: {e}");
        }
    }
}

fn mount_points() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount(p)))
        .collect()
}

fn unescape_mount(p: &str) -> String {
    p.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Whether `p` is a mount point now.
pub fn is_mounted(p: &Path) -> bool {
    mount_points().iter().any(|m| m == p)
}

/// Mount points at or below `dir`.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    mount_points()
        .into_iter()
        .filter(|m| m.starts_with(dir))
        .collect()
}

/// Aborts the FUSE connections of `mounts` (every pending request fails with ENOTCONN, so
/// threads blocked in them return) and unmounts them: what the run watchdog does to a run
/// that hangs inside the filesystem.
pub fn force_unmount(tierfs: &Path, mounts: &[PathBuf]) {
    use std::os::unix::fs::MetadataExt;
    let conns = Path::new("/sys/fs/fuse/connections");
    if std::fs::read_dir(conns)
        .map(|mut d| d.next().is_none())
        .unwrap_or(true)
    {
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "none"])
            .arg(conns)
            .status();
    }
    for m in mounts {
        if let Ok(md) = std::fs::metadata(m) {
            let dev = md.dev();
            let minor = (dev & 0xff) | ((dev >> 12) & 0xfff00);
            let _ = std::fs::write(conns.join(minor.to_string()).join("abort"), "1");
        }
        let _ = Command::new(tierfs)
            .arg("umount")
            .arg(m)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        if is_mounted(m) {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_target_url_appends_before_the_query() {
        let run = "tierfs-bench-42-17";
        assert_eq!(
            run_target_url(
                "s3://tierfs-a/bench?endpoint=http://127.0.0.1:3900&region=garage",
                run
            ),
            "s3://tierfs-a/bench/tierfs-bench-42-17?endpoint=http://127.0.0.1:3900&region=garage"
        );
        assert_eq!(
            run_target_url("s3://tierfs-a", run),
            "s3://tierfs-a/tierfs-bench-42-17"
        );
        assert_eq!(
            run_target_url("s3://tierfs-a/p/?region=garage", run),
            "s3://tierfs-a/p/tierfs-bench-42-17?region=garage"
        );
        assert_eq!(
            run_target_url("file:///srv/ost0/", run),
            "file:///srv/ost0/tierfs-bench-42-17"
        );
    }

    #[test]
    fn checks_urls_and_names_their_kind() {
        for ok in [
            "sqlite:///var/tmp/m.db",
            "postgres://tierfs@127.0.0.1:5432/b1",
            "postgresql://tierfs:pw@db/b1",
        ] {
            assert!(check_meta_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "sqlite://",
            "sqlite://rel.db",
            "postgres://",
            "mysql://x/y",
            "",
        ] {
            assert!(check_meta_url(bad).is_err(), "{bad}");
        }
        assert_eq!(engine_name("sqlite:///m.db"), "sqlite");
        assert_eq!(engine_name("postgresql://u@h/d"), "postgresql");
        for ok in [
            "file:///srv/ost0",
            "s3://b/p?endpoint=http://h:1&region=r",
            "s3://b",
        ] {
            assert!(check_target_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "file://rel",
            "file:///d?capacity=1G",
            "s3://",
            "/srv/ost0",
            "gs://b",
        ] {
            assert!(check_target_url(bad).is_err(), "{bad}");
        }
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(target_kind(&s(&["file:///a", "file:///b"])), "local");
        assert_eq!(target_kind(&s(&["s3://a/x", "s3://b/x"])), "s3");
        assert_eq!(target_kind(&s(&["s3://a/x", "file:///b"])), "mixed");
    }

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redact_url("postgres://tierfs:s3cret@127.0.0.1:5432/db?sslmode=disable"),
            "postgres://tierfs:***@127.0.0.1:5432/db?sslmode=disable"
        );
        assert_eq!(
            redact_url("postgres://tierfs@127.0.0.1/db"),
            "postgres://tierfs@127.0.0.1/db"
        );
        assert_eq!(redact_url("--meta"), "--meta");
        assert_eq!(
            redact_url("s3://b/p?endpoint=http://h:1"),
            "s3://b/p?endpoint=http://h:1"
        );
        let err = check_meta_url("mysql://u:hunter2@h/db")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn env_formats_given_targets_in_a_sub_prefix_per_run() {
        let tmp = std::env::temp_dir().join(format!("tierfs-bench-unit-{}", std::process::id()));
        let cfg = EnvConfig {
            tierfs: PathBuf::from("/nonexistent/tierfs"),
            workdir: tmp.clone(),
            targets: 2,
            stripe_count: 1,
            keep: false,
            pcc: false,
            meta: Some("postgres://tierfs:pw@127.0.0.1:5432/b1".into()),
            client_netns: vec![],
            target_urls: vec![
                "s3://tierfs-a/bench?endpoint=http://127.0.0.1:3900&region=garage".into(),
                "s3://tierfs-a/bench?endpoint=http://127.0.0.1:3900&region=garage".into(),
            ],
        };
        let mut env = Env::create(cfg).unwrap();
        let run = env.dir.file_name().unwrap().to_string_lossy().into_owned();
        let fs = env.fs_under_test();
        assert_eq!(fs.engine, "postgresql");
        assert_eq!(fs.meta, "postgres://tierfs:***@127.0.0.1:5432/b1");
        assert_eq!(fs.target_kind, "s3");
        assert_eq!(
            fs.targets,
            vec![
                format!("s3://tierfs-a/bench/{run}?endpoint=http://127.0.0.1:3900&region=garage"),
                format!("s3://tierfs-a/bench/{run}-1?endpoint=http://127.0.0.1:3900&region=garage"),
            ]
        );
        assert_eq!(
            fs.summary(),
            "postgresql metadata, 2 s3 targets, stripe count 1"
        );
        env.teardown().unwrap();
        let default = Env::create(EnvConfig {
            meta: None,
            target_urls: vec![],
            ..env.cfg.clone()
        })
        .unwrap();
        let fs = default.fs_under_test();
        assert_eq!(fs.engine, "sqlite");
        assert_eq!(fs.target_kind, "local");
        assert_eq!(
            fs.targets,
            vec![
                format!("file://{}", default.dir.join("ost0").display()),
                format!("file://{}", default.dir.join("ost1").display()),
            ]
        );
        drop(default);
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
