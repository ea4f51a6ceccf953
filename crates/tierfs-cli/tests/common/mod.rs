//! Shared harness for the FUSE integration tests.
//!
//! `TestFs` formats a fresh filesystem (SQLite metadata, two `file://` targets) in a unique
//! temporary directory, mounts N clients (`c0`, `c1`, ...) at `<tmp>/mnt<i>` and, on drop,
//! unmounts everything under that directory (`tierfs umount`, then `fusermount3 -uz`) and kills
//! any `tierfs` daemon still serving it. A watchdog bounds every test: when it fires it tears
//! the mounts down (so blocked FUSE calls fail with ENOTCONN instead of hanging) and, if the
//! test is still stuck long after, aborts the test binary.
//!
//! **Cluster mode** (`scripts/cluster-test.sh` sets it up): with `TIERFS_IT_PG_ADMIN` (a
//! PostgreSQL URL of a role that may create databases; password from `PGPASSWORD`) each
//! filesystem gets a fresh database there, dropped at the end; with `TIERFS_IT_S3_ENDPOINT` and
//! `TIERFS_IT_S3_BUCKET` (credentials from `TIERFS_S3_CREDENTIALS`) its targets are prefixes of
//! that bucket; with `TIERFS_IT_NETNS=ns1,ns2,...` client `k` mounts from network namespace
//! `ns[k % n]` (the daemon talks to the database and the store over that host's network, and
//! the mount is visible here).
//!
//! **An extra client setting for every mount** of `mount_client`/`mount_with`: the TOML lines
//! of `TIERFS_IT_CLIENT_CONFIG` (e.g. `TIERFS_IT_CLIENT_CONFIG='writeback_cache = true'`) are
//! added to each client's `--config` file, so the same tests run on mounts with that setting.
#![allow(dead_code)]

pub mod faulty;

use std::ffi::CString;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_tierfs");

/// Default bound on one external command (format, mount, umount, ...).
pub const CMD_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Running the tierfs binary
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct CmdOut {
    pub args: Vec<String>,
    /// Exit code; `None` if killed by a signal.
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CmdOut {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    pub fn describe(&self) -> String {
        format!(
            "`tierfs {}` -> code {:?} signal {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.args.join(" "),
            self.code,
            self.signal,
            self.stdout,
            self.stderr
        )
    }

    #[track_caller]
    pub fn assert_ok(&self) -> &Self {
        assert!(self.ok(), "command failed: {}", self.describe());
        self.assert_no_panic();
        self
    }

    #[track_caller]
    pub fn assert_no_panic(&self) {
        assert!(
            self.code != Some(101) && !self.stderr.contains("panicked"),
            "tierfs panicked: {}",
            self.describe()
        );
        assert!(
            self.signal.is_none(),
            "tierfs died of a signal: {}",
            self.describe()
        );
    }

    /// Bad input contract: non-zero exit, exactly one non-empty line on stderr (a trailing
    /// newline allowed), never a panic.
    #[track_caller]
    pub fn assert_clean_error(&self) {
        self.assert_no_panic();
        assert!(
            self.code.is_some() && self.code != Some(0),
            "expected a non-zero exit: {}",
            self.describe()
        );
        let err = self.stderr.strip_suffix('\n').unwrap_or(&self.stderr);
        assert!(
            !err.trim().is_empty(),
            "expected one line on stderr, got nothing: {}",
            self.describe()
        );
        assert!(
            !err.contains('\n'),
            "expected exactly one line on stderr, got {}: {}",
            err.lines().count(),
            self.describe()
        );
    }
}

static CMD_SEQ: AtomicU64 = AtomicU64::new(0);

/// Run `tierfs ARGS` with a time bound. stdout/stderr go to files (not pipes), so a daemon that
/// inherits them cannot keep us waiting for EOF.
pub fn tierfs_in<S: AsRef<str>>(scratch: &Path, args: &[S], timeout: Duration) -> CmdOut {
    tierfs_as(scratch, args, timeout, None)
}

/// Like `tierfs_in`, optionally as another uid/gid.
pub fn tierfs_as<S: AsRef<str>>(
    scratch: &Path,
    args: &[S],
    timeout: Duration,
    cred: Option<(u32, u32)>,
) -> CmdOut {
    tierfs_run(scratch, args, timeout, cred, None)
}

/// Like `tierfs_in`, in network namespace `netns` (`/run/netns/<netns>`) when given: only the
/// network changes, so a mount made there is visible here.
pub fn tierfs_run<S: AsRef<str>>(
    scratch: &Path,
    args: &[S],
    timeout: Duration,
    cred: Option<(u32, u32)>,
    netns: Option<&str>,
) -> CmdOut {
    tierfs_run_env(scratch, args, timeout, cred, netns, &[])
}

/// Like `tierfs_run`, with `env` (name, value) added to the command's environment (a daemon
/// that `tierfs mount` starts inherits it).
pub fn tierfs_run_env<S: AsRef<str>>(
    scratch: &Path,
    args: &[S],
    timeout: Duration,
    cred: Option<(u32, u32)>,
    netns: Option<&str>,
    env: &[(String, String)],
) -> CmdOut {
    use std::os::unix::process::CommandExt;
    let args: Vec<String> = args.iter().map(|s| s.as_ref().to_string()).collect();
    let seq = CMD_SEQ.fetch_add(1, Ordering::SeqCst);
    let out_path = scratch.join(format!(".cmd-{}-{seq}.out", std::process::id()));
    let err_path = scratch.join(format!(".cmd-{}-{seq}.err", std::process::id()));
    let out_f = fs::File::create(&out_path).expect("create stdout file");
    let err_f = fs::File::create(&err_path).expect("create stderr file");
    if cred.is_some() {
        // readable by the unprivileged child
        fs::set_permissions(&out_path, fs::Permissions::from_mode(0o666)).unwrap();
        fs::set_permissions(&err_path, fs::Permissions::from_mode(0o666)).unwrap();
    }
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{ns}")).arg("--").arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    cmd.args(&args)
        .stdin(Stdio::null())
        .stdout(out_f)
        .stderr(err_f)
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "0")
        .envs(env.iter().map(|(k, v)| (k, v)));
    if let Some((uid, gid)) = cred {
        // std drops the supplementary groups when root sets a uid
        cmd.uid(uid).gid(gid);
    }
    let mut child = cmd.spawn().expect("spawn tierfs");
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = fs::read_to_string(&err_path).unwrap_or_default();
            panic!(
                "`tierfs {}` did not finish within {:?}; stderr so far:\n{}",
                args.join(" "),
                timeout,
                stderr
            );
        }
        thread::sleep(Duration::from_millis(10));
    };
    let stdout = String::from_utf8_lossy(&fs::read(&out_path).unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&fs::read(&err_path).unwrap_or_default()).into_owned();
    let _ = fs::remove_file(&out_path);
    let _ = fs::remove_file(&err_path);
    CmdOut {
        args,
        code: status.code(),
        signal: status.signal(),
        stdout,
        stderr,
    }
}

// ---------------------------------------------------------------------------------------------
// Mount table and daemon bookkeeping
// ---------------------------------------------------------------------------------------------

fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// (mount point, fstype) of every mount in our namespace.
pub fn mounts() -> Vec<(PathBuf, String)> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut v = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < 5 || sep + 1 >= fields.len() {
            continue;
        }
        v.push((
            PathBuf::from(unescape_mountinfo(fields[4])),
            fields[sep + 1].to_string(),
        ));
    }
    v
}

pub fn is_fuse_mounted(p: &Path) -> bool {
    mounts()
        .iter()
        .any(|(m, t)| m == p && (t.starts_with("fuse") || t == "fuseblk"))
}

/// Pids of `tierfs` processes (other than us) whose command line mentions `needle`.
pub fn daemons_mentioning(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut pids = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return pids;
    };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !cmdline.contains(needle) {
            continue;
        }
        let exe = fs::read_link(e.path().join("exe")).unwrap_or_default();
        let exe = exe.to_string_lossy();
        if exe.contains("tierfs") || cmdline.contains(BIN) {
            pids.push(pid);
        }
    }
    pids
}

fn run_quiet(prog: &str, args: &[&str], timeout: Duration) -> bool {
    let Ok(mut child) = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return st.success(),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}

/// Unmount everything under `root` and kill every tierfs process that mentions `root`.
/// `graceful`: try `tierfs umount` first.
pub fn teardown_under(root: &Path, graceful: bool) {
    let root_s = root.to_string_lossy().to_string();
    let under: Vec<PathBuf> = mounts()
        .into_iter()
        .filter(|(m, _)| m.starts_with(root))
        .map(|(m, _)| m)
        .collect();
    for m in under.iter().rev() {
        let ms = m.to_string_lossy().to_string();
        if graceful {
            run_quiet(BIN, &["umount", &ms], Duration::from_secs(15));
        }
        if mounts().iter().any(|(x, _)| x == m) {
            run_quiet("fusermount3", &["-uz", &ms], Duration::from_secs(10));
        }
        if mounts().iter().any(|(x, _)| x == m) {
            run_quiet("umount", &["-l", &ms], Duration::from_secs(10));
        }
    }
    // give daemons a moment to exit after their unmount, then kill the rest by pid
    let deadline = Instant::now() + Duration::from_secs(if graceful { 5 } else { 0 });
    loop {
        let pids = daemons_mentioning(&root_s);
        if pids.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            for p in &pids {
                unsafe { libc::kill(*p, libc::SIGTERM) };
            }
            thread::sleep(Duration::from_millis(500));
            for p in daemons_mentioning(&root_s) {
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------------
// Watchdog
// ---------------------------------------------------------------------------------------------

pub struct Watchdog {
    tx: Option<mpsc::Sender<()>>,
    handle: Option<thread::JoinHandle<()>>,
}

impl Watchdog {
    /// After `limit`, tear down every mount under `root` (blocked calls then fail); if the
    /// test is still running 60 s later, abort the test binary rather than hang forever.
    pub fn new(root: PathBuf, limit: Duration, what: String) -> Self {
        let (tx, rx) = mpsc::channel::<()>();
        let handle = thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!(
                    "WATCHDOG: test `{what}` exceeded {limit:?}; tearing down mounts under {}",
                    root.display()
                );
                teardown_under(&root, false);
                if let Err(mpsc::RecvTimeoutError::Timeout) =
                    rx.recv_timeout(Duration::from_secs(60))
                {
                    eprintln!("WATCHDOG: test `{what}` still stuck after teardown; aborting");
                    std::process::abort();
                }
            }
        });
        Watchdog {
            tx: Some(tx),
            handle: Some(handle),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// TestFs
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct Opts {
    pub clients: usize,
    /// `--attr-ttl` for the mounts; `None` leaves the default.
    pub attr_ttl: Option<f64>,
    pub stripe_count: Option<u32>,
    pub stripe_size: Option<String>,
    /// `?capacity=` on each target URL.
    pub target_capacity: Option<String>,
    /// `--inline-threshold`; by default `64K`, not the format's default (256K): the tests'
    /// file sizes were chosen around 64 KiB (below it inline, above it objects a failing
    /// target or an fsync acts on). `None` leaves the format's default.
    pub inline_threshold: Option<String>,
    /// Format at all (bad-input tests may want a bare directory).
    pub format: bool,
    pub timeout: Duration,
    /// Metadata in a fresh database of this PostgreSQL server (a role that may create
    /// databases, e.g. [`PgServer::url`]), dropped at the end; overrides cluster mode's.
    pub pg_admin: Option<String>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            clients: 1,
            attr_ttl: None,
            stripe_count: None,
            stripe_size: None,
            target_capacity: None,
            inline_threshold: Some("64K".into()),
            format: true,
            timeout: Duration::from_secs(180),
            pg_admin: None,
        }
    }
}

/// Where cluster-mode filesystems live (see the module doc); `None` outside cluster mode.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    pub pg_admin: Option<String>,
    pub s3_endpoint: Option<String>,
    pub s3_bucket: Option<String>,
    pub s3_region: Option<String>,
    pub netns: Vec<String>,
}

impl Cluster {
    pub fn from_env() -> Cluster {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Cluster {
            pg_admin: var("TIERFS_IT_PG_ADMIN"),
            s3_endpoint: var("TIERFS_IT_S3_ENDPOINT"),
            s3_bucket: var("TIERFS_IT_S3_BUCKET"),
            s3_region: var("TIERFS_IT_S3_REGION"),
            netns: var("TIERFS_IT_NETNS")
                .map(|v| v.split(',').map(str::to_string).collect())
                .unwrap_or_default(),
        }
    }

    /// Whether the filesystem keeps its data on local directories (tests that look at target
    /// files directly need that).
    pub fn local_targets(&self) -> bool {
        self.s3_endpoint.is_none()
    }
}

static DB_SEQ: AtomicU64 = AtomicU64::new(0);

/// A database for one test, created on the cluster's server and dropped at the end.
struct TestDb {
    admin: String,
    name: String,
    url: String,
}

impl TestDb {
    fn create(admin: &str) -> TestDb {
        let name = format!(
            "tierfs_it_{}_{}",
            std::process::id(),
            DB_SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let mut c = postgres::Client::connect(admin, postgres::NoTls)
            .unwrap_or_else(|e| panic!("connect to TIERFS_IT_PG_ADMIN: {e}"));
        c.batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        let mut u = url::Url::parse(admin).expect("TIERFS_IT_PG_ADMIN is a URL");
        u.set_path(&format!("/{name}"));
        // tierfs takes the password from PGPASSWORD, as a user would, not from its command line
        let _ = u.set_password(None);
        TestDb {
            admin: admin.to_string(),
            name,
            url: u.to_string(),
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.admin, postgres::NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

pub struct TestFs {
    // field order matters for drop: mounts are torn down in Drop::drop, the watchdog stops,
    // then the directory goes.
    pub opts: Opts,
    pub mnts: Vec<PathBuf>,
    pub cluster: Cluster,
    /// Environment (name, value) added to the `tierfs mount` commands from now on (the
    /// daemons' test hooks, e.g. `TIERFS_TEST_WRITEBACK_STALL_MS`); empty by default.
    pub mount_env: Vec<(String, String)>,
    _watchdog: Watchdog,
    db: Option<TestDb>,
    dir: tempfile::TempDir,
}

impl TestFs {
    pub fn new(clients: usize) -> Self {
        Self::with(Opts {
            clients,
            ..Opts::default()
        })
    }

    pub fn with(opts: Opts) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("tierfs-it-")
            .tempdir()
            .expect("tempdir");
        // traversable by the unprivileged users of the permission tests
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let what = thread::current().name().unwrap_or("?").to_string();
        let watchdog = Watchdog::new(dir.path().to_path_buf(), opts.timeout, what);
        let cluster = Cluster::from_env();
        let db = opts
            .pg_admin
            .as_deref()
            .or(cluster.pg_admin.as_deref())
            .map(TestDb::create);
        let mut t = TestFs {
            opts: opts.clone(),
            mnts: Vec::new(),
            cluster,
            mount_env: Vec::new(),
            _watchdog: watchdog,
            db,
            dir,
        };
        if opts.format {
            t.format(&[]).assert_ok();
        }
        for i in 0..opts.clients {
            t.mount_client(&format!("c{i}"), opts.attr_ttl);
        }
        t
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn meta_path(&self) -> PathBuf {
        self.root().join("meta.db")
    }

    pub fn meta_url(&self) -> String {
        match &self.db {
            Some(db) => db.url.clone(),
            None => format!("sqlite://{}", self.meta_path().display()),
        }
    }

    pub fn target_dir(&self, i: usize) -> PathBuf {
        self.root().join(format!("ost{i}"))
    }

    pub fn target_url(&self, i: usize) -> String {
        let mut q = Vec::new();
        let mut u = match (&self.cluster.s3_endpoint, &self.cluster.s3_bucket) {
            (Some(ep), Some(bucket)) => {
                q.push(format!("endpoint={ep}"));
                if let Some(r) = &self.cluster.s3_region {
                    q.push(format!("region={r}"));
                }
                let test = self
                    .root()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .to_string();
                format!("s3://{bucket}/{}/ost{i}", test.to_lowercase())
            }
            _ => format!("file://{}", self.target_dir(i).display()),
        };
        if let Some(c) = &self.opts.target_capacity {
            q.push(format!("capacity={c}"));
        }
        if !q.is_empty() {
            u.push('?');
            u.push_str(&q.join("&"));
        }
        u
    }

    /// The network namespace client `idx` mounts from (cluster mode), if any.
    pub fn netns_of(&self, idx: usize) -> Option<&str> {
        let ns = &self.cluster.netns;
        (!ns.is_empty()).then(|| ns[idx % ns.len()].as_str())
    }

    /// Runs `tierfs mount ARGS` for client `idx`, from its network namespace in cluster mode.
    fn run_mount(&self, args: &[String], idx: usize) -> CmdOut {
        tierfs_run_env(
            self.root(),
            args,
            CMD_TIMEOUT,
            None,
            self.netns_of(idx),
            &self.mount_env,
        )
    }

    pub fn mnt(&self, i: usize) -> &Path {
        &self.mnts[i]
    }

    /// Path `rel` inside client `i`'s mount.
    pub fn p(&self, i: usize, rel: &str) -> PathBuf {
        self.mnts[i].join(rel)
    }

    pub fn tierfs<S: AsRef<str>>(&self, args: &[S]) -> CmdOut {
        tierfs_in(self.root(), args, CMD_TIMEOUT)
    }

    /// `tierfs format` with this fs's options plus `extra`.
    pub fn format(&self, extra: &[&str]) -> CmdOut {
        let mut args: Vec<String> = vec!["format".into(), "--meta".into(), self.meta_url()];
        for i in 0..2 {
            args.push("--target".into());
            args.push(self.target_url(i));
        }
        if let Some(c) = self.opts.stripe_count {
            args.push("--stripe-count".into());
            args.push(c.to_string());
        }
        if let Some(s) = &self.opts.stripe_size {
            args.push("--stripe-size".into());
            args.push(s.clone());
        }
        if let Some(s) = &self.opts.inline_threshold {
            args.push("--inline-threshold".into());
            args.push(s.clone());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        self.tierfs(&args)
    }

    /// Mount one more client at `<tmp>/mnt<k>`; returns its index.
    pub fn mount_client(&mut self, name: &str, ttl: Option<f64>) -> usize {
        let idx = self.mnts.len();
        let mnt = self.root().join(format!("mnt{idx}"));
        fs::create_dir_all(&mnt).unwrap();
        let mut args: Vec<String> = vec![
            "mount".into(),
            "--meta".into(),
            self.meta_url(),
            mnt.to_string_lossy().into(),
            "--client-name".into(),
            name.into(),
        ];
        if let Some(t) = ttl {
            args.push("--attr-ttl".into());
            args.push(format!("{t}"));
        }
        if let Some(p) = self.config_file(name, None) {
            args.push("--config".into());
            args.push(p.to_string_lossy().into());
        }
        self.finish_mount(&args, mnt)
    }

    /// Mount one more client with `co` at `<tmp>/mnt<k>`; returns its index.
    pub fn mount_with(&mut self, co: &ClientOpts) -> usize {
        let idx = self.mnts.len();
        let mnt = self.root().join(format!("mnt{idx}"));
        fs::create_dir_all(&mnt).unwrap();
        let args = self.mount_args(&mnt, co);
        self.finish_mount(&args, mnt)
    }

    /// Mount again at client `idx`'s mount point (after an unmount or a killed daemon: `tierfs
    /// mount` detaches a dead mount first), asserting success.
    pub fn remount_with(&mut self, idx: usize, co: &ClientOpts) {
        let mnt = self.mnts[idx].clone();
        let args = self.mount_args(&mnt, co);
        let out = self.run_mount(&args, idx);
        out.assert_ok();
        assert!(
            is_fuse_mounted(&mnt),
            "`tierfs mount` returned 0 but {} is not a FUSE mount: {}",
            mnt.display(),
            out.describe()
        );
    }

    /// `tierfs mount` arguments for `co` at `mnt`; writes `co.config` to `<tmp>/<name>.toml`.
    pub fn mount_args(&self, mnt: &Path, co: &ClientOpts) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "mount".into(),
            "--meta".into(),
            self.meta_url(),
            mnt.to_string_lossy().into(),
            "--client-name".into(),
            co.name.clone(),
        ];
        if let Some(t) = co.attr_ttl {
            args.push("--attr-ttl".into());
            args.push(format!("{t}"));
        }
        if let Some(d) = &co.cache_dir {
            args.push("--cache-dir".into());
            args.push(d.to_string_lossy().into());
        }
        if let Some(s) = &co.cache_size {
            args.push("--cache-size".into());
            args.push(s.clone());
        }
        if let Some(p) = self.config_file(&co.name, co.config.as_deref()) {
            args.push("--config".into());
            args.push(p.to_string_lossy().into());
        }
        let log = match &co.log_file {
            Some(l) => l.clone(),
            None => {
                let d = std::env::temp_dir().join("tierfs-it-logs");
                let _ = fs::create_dir_all(&d);
                let base = self
                    .root()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .to_string();
                d.join(format!("{base}-{}.log", co.name))
            }
        };
        args.push("--log-file".into());
        args.push(log.to_string_lossy().into());
        args
    }

    /// The `--config` file of client `name`, written to `<tmp>/<name>.toml`: `text` and the
    /// lines of `TIERFS_IT_CLIENT_CONFIG` (but those of a key `text` sets: the test's own
    /// setting wins), if any; None when there are neither.
    fn config_file(&self, name: &str, text: Option<&str>) -> Option<PathBuf> {
        let extra = std::env::var("TIERFS_IT_CLIENT_CONFIG").ok();
        let key = |l: &str| l.split('=').next().unwrap_or("").trim().to_string();
        let text = match (text, extra.as_deref()) {
            (None, None) => return None,
            (Some(t), None) | (None, Some(t)) => t.to_string(),
            (Some(t), Some(e)) => {
                let own: Vec<String> = t.lines().filter(|l| l.contains('=')).map(key).collect();
                let mut text = format!("{t}\n");
                for l in e.lines().filter(|l| !own.contains(&key(l))) {
                    text.push_str(l);
                    text.push('\n');
                }
                text
            }
        };
        let p = self.root().join(format!("{name}.toml"));
        fs::write(&p, text).expect("write client config");
        Some(p)
    }

    /// Where the daemon of a `mount_with` client without `log_file` logs.
    pub fn log_path(&self, name: &str) -> PathBuf {
        let base = self
            .root()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        std::env::temp_dir()
            .join("tierfs-it-logs")
            .join(format!("{base}-{name}.log"))
    }

    /// Runs `tierfs mount ARGS` for one more client at `mnt`, asserting that it mounted;
    /// returns its index.
    pub fn finish_mount(&mut self, args: &[String], mnt: PathBuf) -> usize {
        let idx = self.mnts.len();
        let out = self.run_mount(args, idx);
        out.assert_ok();
        assert!(
            is_fuse_mounted(&mnt),
            "`tierfs mount` returned 0 but {} is not a FUSE mount yet: {}",
            mnt.display(),
            out.describe()
        );
        self.mnts.push(mnt);
        idx
    }

    /// Pid of client `i`'s daemon, from the mount's `.tierfs-info` JSON.
    pub fn daemon_pid(&self, i: usize) -> i32 {
        let p = self.mnts[i].join(".tierfs-info");
        let text = fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON ({e}): {text}", p.display()));
        v.get("pid")
            .and_then(|x| x.as_i64())
            .unwrap_or_else(|| panic!("no pid in {}: {text}", p.display())) as i32
    }

    /// The changelog reader (`cl<N>`) client `i`'s change follower reads with now, from the
    /// mount's `.tierfs-info`; None when the client does not follow (`follow_changes`).
    pub fn follow_reader(&self, i: usize) -> Option<String> {
        let p = self.mnts[i].join(".tierfs-info");
        let text = fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON ({e}): {text}", p.display()));
        v["follow_reader"].as_str().map(str::to_string)
    }

    /// kill -9 client `i`'s daemon and wait until it is gone and its mount is dead (ENOTCONN:
    /// every thread has exited and closed its /dev/fuse descriptor). The probe is a `statfs`,
    /// which the kernel always sends to the daemon, whereas a `stat` of the mount's root is
    /// answered from the kernel's cache for as long as the attribute TTL (with
    /// `follow_changes`, `follow_ttl`: 30 s) even after the connection is gone.
    pub fn kill9(&self, i: usize) {
        let pid = self.daemon_pid(i);
        unsafe { libc::kill(pid, libc::SIGKILL) };
        assert!(
            wait_until(Duration::from_secs(10), || !process_alive(pid)),
            "daemon {pid} still alive 10 s after SIGKILL"
        );
        let mnt = self.mnts[i].clone();
        let t0 = Instant::now();
        let c = CString::new(mnt.as_os_str().as_bytes()).unwrap();
        let dead = wait_until(Duration::from_secs(20), || {
            let mut st: libc::statfs = unsafe { std::mem::zeroed() };
            let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
            r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOTCONN)
        });
        let threads = fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert!(
            dead,
            "{} still answers {:?} after its daemon {pid} was killed ({threads} threads left)",
            mnt.display(),
            t0.elapsed()
        );
    }

    /// Unmount client `i` with `tierfs umount`, asserting success.
    pub fn umount(&mut self, i: usize) {
        let m = self.mnts[i].to_string_lossy().to_string();
        self.tierfs(&["umount", &m]).assert_ok();
        assert!(
            !is_fuse_mounted(&self.mnts[i]),
            "{m} still mounted after tierfs umount"
        );
    }

    /// Sum of the sizes of all regular files under target `i`.
    pub fn target_usage(&self, i: usize) -> u64 {
        dir_usage(&self.target_dir(i))
    }

    pub fn total_target_usage(&self) -> u64 {
        self.target_usage(0) + self.target_usage(1)
    }
}

/// One client's mount options for `TestFs::mount_with`.
#[derive(Clone, Debug, Default)]
pub struct ClientOpts {
    pub name: String,
    pub attr_ttl: Option<f64>,
    /// `--cache-dir` (enables the persistent client cache).
    pub cache_dir: Option<PathBuf>,
    /// `--cache-size`.
    pub cache_size: Option<String>,
    /// Text of a `--config` TOML file.
    pub config: Option<String>,
    /// `--log-file`; default: `$TMPDIR/tierfs-it-logs/<test dir>-<name>.log` (kept after the
    /// test, for post-mortems).
    pub log_file: Option<PathBuf>,
}

/// Whether `pid` runs (a zombie does not).
pub fn process_alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// Value of the Prometheus sample `name` (exactly, labels included) in a mount's stats file;
/// 0 when absent.
pub fn stat_value(mnt: &Path, name: &str) -> u64 {
    let text = fs::read_to_string(mnt.join(".tierfs-stats")).unwrap_or_default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(name) {
            if let Some(v) = rest.strip_prefix(' ') {
                return v.trim().parse::<f64>().map(|f| f as u64).unwrap_or(0);
            }
        }
    }
    0
}

/// FUSE operations of kind `op` (read, write, open, ...) the daemon of `mnt` handled.
pub fn fuse_ops(mnt: &Path, op: &str) -> u64 {
    stat_value(mnt, &format!("tierfs_fuse_ops_total{{op=\"{op}\"}}"))
}

impl Drop for TestFs {
    fn drop(&mut self) {
        teardown_under(self.dir.path(), true);
        // the database goes once no client uses it (TestDb's drop)
        self.db.take();
    }
}

pub fn dir_usage(p: &Path) -> u64 {
    let mut total = 0;
    let Ok(rd) = fs::read_dir(p) else {
        return 0;
    };
    for e in rd.flatten() {
        let Ok(md) = fs::symlink_metadata(e.path()) else {
            continue;
        };
        if md.is_dir() {
            total += dir_usage(&e.path());
        } else if md.is_file() {
            total += md.len();
        }
    }
    total
}

// ---------------------------------------------------------------------------------------------
// Waiting
// ---------------------------------------------------------------------------------------------

/// Poll `f` every 50 ms until it returns true or `limit` passes; returns whether it did.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------------
// libc helpers
// ---------------------------------------------------------------------------------------------

pub fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path with NUL")
}

pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Turn a libc return value into Ok(value) / Err(errno).
pub fn check<T: Copy + PartialOrd + Default>(r: T) -> Result<T, i32> {
    if r < T::default() {
        Err(errno())
    } else {
        Ok(r)
    }
}

pub fn err_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

pub fn errname(e: i32) -> String {
    format!("{} ({})", io::Error::from_raw_os_error(e), e)
}

/// Assert that `r` is the error `want` (an errno).
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(r: io::Result<T>, want: i32, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected {}, got Ok({v:?})", errname(want)),
        Err(e) => assert_eq!(
            err_of(&e),
            want,
            "{what}: expected {}, got {}",
            errname(want),
            e
        ),
    }
}

pub fn lstat(p: &Path) -> io::Result<libc::stat> {
    let c = cstr(p);
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::lstat(c.as_ptr(), &mut st) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(st)
    }
}

pub fn stat(p: &Path) -> io::Result<libc::stat> {
    let c = cstr(p);
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::stat(c.as_ptr(), &mut st) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(st)
    }
}

pub fn statvfs(p: &Path) -> io::Result<libc::statvfs> {
    let c = cstr(p);
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    io_res(unsafe { libc::statvfs(c.as_ptr(), &mut st) })?;
    Ok(st)
}

pub fn fstat(fd: i32) -> io::Result<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::fstat(fd, &mut st) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(st)
    }
}

pub fn io_res(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub fn mtime(st: &libc::stat) -> (i64, i64) {
    (st.st_mtime, st.st_mtime_nsec)
}

pub fn ctime(st: &libc::stat) -> (i64, i64) {
    (st.st_ctime, st.st_ctime_nsec)
}

pub fn atime(st: &libc::stat) -> (i64, i64) {
    (st.st_atime, st.st_atime_nsec)
}

// ---------------------------------------------------------------------------------------------
// Deterministic data
// ---------------------------------------------------------------------------------------------

pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fill `buf` with the pattern bytes for file offsets `off..off+buf.len()`: every byte is a
/// function of (seed, absolute offset), so any range can be checked on its own.
pub fn fill_pattern(seed: u64, off: u64, buf: &mut [u8]) {
    let mut i = 0usize;
    while i < buf.len() {
        let pos = off + i as u64;
        let word = splitmix64(seed ^ (pos >> 3).wrapping_mul(0x2545_F491_4F6C_DD1D));
        let bytes = word.to_le_bytes();
        let start = (pos & 7) as usize;
        let n = (8 - start).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&bytes[start..start + n]);
        i += n;
    }
}

pub fn pattern(seed: u64, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_pattern(seed, off, &mut v);
    v
}

/// Compare `got` with `want`, reporting the first differing absolute offset.
#[track_caller]
pub fn assert_same_bytes(got: &[u8], want: &[u8], base: u64, what: &str) {
    if got == want {
        return;
    }
    let n = got.len().min(want.len());
    let first = (0..n).find(|&i| got[i] != want[i]);
    match first {
        Some(i) => {
            let bad = (0..n).filter(|&j| got[j] != want[j]).count();
            panic!(
                "{what}: first mismatch at offset {} (got {:#04x}, want {:#04x}); {bad} bytes \
                 differ; lengths got {} want {}",
                base + i as u64,
                got[i],
                want[i],
                got.len(),
                want.len()
            )
        }
        None => panic!(
            "{what}: length differs: got {} want {}",
            got.len(),
            want.len()
        ),
    }
}

/// Read exactly `len` bytes at `off` (short reads retried; EOF is an error).
pub fn pread_exact(f: &fs::File, off: u64, len: usize) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut v = vec![0u8; len];
    f.read_exact_at(&mut v, off)?;
    Ok(v)
}

pub fn read_all(p: &Path) -> io::Result<Vec<u8>> {
    let mut f = fs::File::open(p)?;
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// Running code as another user
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Cred {
    pub fn new(uid: u32, gid: u32) -> Self {
        Cred {
            uid,
            gid,
            groups: vec![],
        }
    }
    pub fn groups(mut self, g: &[u32]) -> Self {
        self.groups = g.to_vec();
        self
    }
}

/// Run `f` in a forked child with the given credentials (setgroups, setgid, setuid; no system
/// user needed). A panic in `f` (an assertion) becomes a panic here, with its message. The child
/// is bounded by `limit`.
#[track_caller]
pub fn as_user<F: FnOnce()>(cred: &Cred, f: F) {
    as_user_for(cred, Duration::from_secs(60), f)
}

#[track_caller]
pub fn as_user_for<F: FnOnce()>(cred: &Cred, limit: Duration, f: F) {
    let mut fds = [0i32; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (rfd, wfd) = (fds[0], fds[1]);
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // child
        unsafe { libc::close(rfd) };
        let report = move |msg: &str| {
            let b = msg.as_bytes();
            unsafe { libc::write(wfd, b.as_ptr().cast(), b.len()) };
        };
        std::panic::set_hook(Box::new(move |info| {
            let m = format!("{info}");
            let b = m.as_bytes();
            unsafe { libc::write(wfd, b.as_ptr().cast(), b.len()) };
        }));
        let groups: Vec<libc::gid_t> = cred.groups.clone();
        unsafe {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                report(&format!("setgroups: {}", io::Error::last_os_error()));
                libc::_exit(2);
            }
            if libc::setresgid(cred.gid, cred.gid, cred.gid) != 0 {
                report(&format!("setgid: {}", io::Error::last_os_error()));
                libc::_exit(2);
            }
            if libc::setresuid(cred.uid, cred.uid, cred.uid) != 0 {
                report(&format!("setuid: {}", io::Error::last_os_error()));
                libc::_exit(2);
            }
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        unsafe { libc::_exit(if r.is_ok() { 0 } else { 1 }) };
    }
    unsafe { libc::close(wfd) };
    let deadline = Instant::now() + limit;
    let mut status = 0;
    loop {
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if Instant::now() > deadline {
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
                libc::close(rfd);
            }
            panic!("child as uid {} did not finish within {limit:?}", cred.uid);
        }
        thread::sleep(Duration::from_millis(5));
    }
    let mut msg = Vec::new();
    let mut f = unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(rfd) };
    let _ = f.read_to_end(&mut msg);
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    assert!(
        ok,
        "as uid {} gid {} groups {:?}: {}",
        cred.uid,
        cred.gid,
        cred.groups,
        String::from_utf8_lossy(&msg)
    );
}

/// Tokens of `s` split on anything but ASCII alphanumerics, lowercased.
pub fn tokens(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(|t| t.to_ascii_lowercase())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// A child process for system calls that block (lock waits, opens waiting for a recall)
// ---------------------------------------------------------------------------------------------

/// A forked child process that makes raw system calls only (the test process has threads: after
/// fork only async-signal-safe calls are safe). It reports numbers through a pipe. Dropped, it
/// is killed and reaped (bounded: a child stuck in an uninterruptible FUSE wait is left).
pub struct RawChild {
    pid: i32,
    rfd: i32,
}

impl RawChild {
    /// Forks; the child runs `f` with the pipe's write end and must never return.
    pub fn spawn(f: impl FnOnce(i32)) -> RawChild {
        let mut fds = [0i32; 2];
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            unsafe { libc::close(fds[0]) };
            f(fds[1]);
            unsafe { libc::_exit(3) };
        }
        unsafe { libc::close(fds[1]) };
        RawChild { pid, rfd: fds[0] }
    }

    /// The next number the child reports, or None if none comes within `limit`.
    pub fn report(&self, limit: Duration) -> Option<i32> {
        let mut p = libc::pollfd {
            fd: self.rfd,
            events: libc::POLLIN,
            revents: 0,
        };
        if unsafe { libc::poll(&mut p, 1, limit.as_millis() as i32) } != 1 {
            return None;
        }
        let mut b = [0u8; 4];
        let n = unsafe { libc::read(self.rfd, b.as_mut_ptr().cast(), 4) };
        (n == 4).then(|| i32::from_ne_bytes(b))
    }

    /// Whether the child was reaped within `limit` (after a kill).
    pub fn reaped_within(&mut self, limit: Duration) -> bool {
        if self.pid == 0 {
            return true;
        }
        let deadline = Instant::now() + limit;
        loop {
            let mut st = 0;
            if unsafe { libc::waitpid(self.pid, &mut st, libc::WNOHANG) } == self.pid {
                self.pid = 0;
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn kill(&self, sig: i32) {
        if self.pid != 0 {
            unsafe { libc::kill(self.pid, sig) };
        }
    }
}

impl Drop for RawChild {
    fn drop(&mut self) {
        self.kill(libc::SIGKILL);
        let _ = self.reaped_within(Duration::from_secs(5));
        unsafe { libc::close(self.rfd) };
    }
}

/// Child side: writes a number to the pipe.
pub fn tell(wfd: i32, v: i32) {
    let b = v.to_ne_bytes();
    unsafe { libc::write(wfd, b.as_ptr().cast(), 4) };
}

// ---------------------------------------------------------------------------------------------
// A private PostgreSQL server
// ---------------------------------------------------------------------------------------------

pub fn pg_script() -> String {
    script("postgres-test-server.sh")
}

/// The path of `scripts/NAME`.
fn script(name: &str) -> String {
    format!("{}/../../scripts/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The `KEY=value` lines a test server's `start` printed.
struct ServerVars(String);

impl ServerVars {
    fn get(&self, k: &str) -> String {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no {k} in {}", self.0))
    }
}

/// `scripts/NAME start` of a test server; `None` when it exits 3 (`what` is not available:
/// the test `test` is skipped with a message, except under CI, where it fails).
fn start_server(name: &str, test: &str, what: &str, limit: Duration) -> Option<ServerVars> {
    let (code, out, err) = run_script(&script(name), &["start"], limit);
    if code == 3 {
        let in_ci = std::env::var("CI").map(|v| v == "true").unwrap_or(false);
        assert!(!in_ci, "{what} is not available and CI=true: {err}");
        eprintln!("SKIPPED: {test}: {what} is not installed and could not be installed");
        return None;
    }
    assert_eq!(code, 0, "{name} start failed: {err}");
    Some(ServerVars(out))
}

/// Runs the script with a time limit; (exit code, stdout, stderr).
pub fn run_pg_script(args: &[&str], limit: Duration) -> (i32, String, String) {
    run_script(&pg_script(), args, limit)
}

/// Runs a bash script with a time limit; (exit code, stdout, stderr).
pub fn run_script(script: &str, args: &[&str], limit: Duration) -> (i32, String, String) {
    let mut child = Command::new("bash")
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run bash");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{script} {args:?} took longer than {limit:?}");
        }
        thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An S3 server for tests: the one named by `TIERFS_S3_ENDPOINT` and `TIERFS_S3_CREDENTIALS`
/// (buckets tierfs-a and tierfs-b, region `TIERFS_S3_REGION`, default garage), else a private
/// Garage from `scripts/s3-test-server.sh`, stopped and removed when dropped.
pub struct S3Server {
    pub endpoint: String,
    pub region: String,
    /// The credentials file (`tierfs --s3-credentials`, `TIERFS_S3_CREDENTIALS`).
    pub credentials: String,
    dir: Option<String>,
}

impl S3Server {
    /// `None` when no server is named and Garage is not installed and cannot be built (the
    /// test is then skipped, except under CI).
    pub fn start(test: &str) -> Option<S3Server> {
        if let (Ok(endpoint), Ok(credentials)) = (
            std::env::var("TIERFS_S3_ENDPOINT"),
            std::env::var("TIERFS_S3_CREDENTIALS"),
        ) {
            return Some(S3Server {
                endpoint,
                region: std::env::var("TIERFS_S3_REGION").unwrap_or_else(|_| "garage".into()),
                credentials,
                dir: None,
            });
        }
        // Garage is built from crates.io when missing (about 10 minutes).
        let v = start_server(
            "s3-test-server.sh",
            test,
            "Garage (no TIERFS_S3_ENDPOINT)",
            Duration::from_secs(1500),
        )?;
        Some(S3Server {
            endpoint: v.get("TIERFS_S3_ENDPOINT"),
            region: v.get("TIERFS_S3_REGION"),
            credentials: v.get("TIERFS_S3_CREDENTIALS"),
            dir: Some(v.get("TIERFS_S3_DIR")),
        })
    }

    /// `s3://BUCKET/PREFIX?endpoint=..&region=..` on this server.
    pub fn url(&self, bucket: &str, prefix: &str) -> String {
        format!(
            "s3://{bucket}/{prefix}?endpoint={}&region={}",
            self.endpoint, self.region
        )
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let (code, _, err) = run_script(
                &script("s3-test-server.sh"),
                &["stop", dir],
                Duration::from_secs(60),
            );
            if code != 0 {
                eprintln!("stopping the test S3 server: {err}");
            }
        }
    }
}

/// A private PostgreSQL server from `scripts/postgres-test-server.sh` (which installs PostgreSQL
/// from Debian packages when it is missing); stopped and removed when dropped.
pub struct PgServer {
    pub url: String,
    pub dir: String,
}

impl PgServer {
    /// `None` when PostgreSQL is not available (the test is then skipped).
    pub fn start(test: &str) -> Option<PgServer> {
        let v = start_server(
            "postgres-test-server.sh",
            test,
            "PostgreSQL",
            Duration::from_secs(600),
        )?;
        Some(PgServer {
            url: v.get("TIERFS_PG_URL"),
            dir: v.get("TIERFS_PG_DIR"),
        })
    }

    /// Stops the server abruptly (as a crash would), keeping its data.
    pub fn down(&self) {
        let (code, _, err) = run_pg_script(&["down", &self.dir], Duration::from_secs(60));
        assert_eq!(code, 0, "postgres-test-server.sh down: {err}");
    }

    /// Starts it again on the same port.
    pub fn up(&self) {
        let (code, _, err) = run_pg_script(&["up", &self.dir], Duration::from_secs(120));
        assert_eq!(code, 0, "postgres-test-server.sh up: {err}");
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let (code, _, err) = run_pg_script(&["stop", &self.dir], Duration::from_secs(60));
        if code != 0 {
            eprintln!("stopping the test PostgreSQL server: {err}");
        }
    }
}
