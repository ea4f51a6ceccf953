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
        let meta_url = format!("sqlite://{}", dir.join("meta.db").display());
        Ok(Env {
            cfg,
            dir,
            native,
            meta_url,
            formatted: false,
            mounts: Vec::new(),
            torn_down: false,
        })
    }

    fn tierfs(&self) -> Command {
        Command::new(&self.cfg.tierfs)
    }

    fn format(&mut self) -> Result<(), BenchError> {
        if self.formatted {
            return Ok(());
        }
        let mut cmd = self.tierfs();
        cmd.arg("format").arg("--meta").arg(&self.meta_url);
        for i in 0..self.cfg.targets.max(1) {
            cmd.arg("--target").arg(format!(
                "file://{}",
                self.dir.join(format!("ost{i}")).display()
            ));
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
            let mut cmd = self.tierfs();
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
