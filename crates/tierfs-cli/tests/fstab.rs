//! Mounting from /etc/fstab (the mount(8) helper convention): `mount -t fuse.tierfs` through
//! fuse3's `mount.fuse` (which runs `tierfs SOURCE DIR -o OPTS` found on the shell's default
//! PATH) and through `mount.fuse.tierfs` (`tierfs install-helper`) with an fstab line given to
//! `mount -T`; `-o` options mapped onto `tierfs mount`'s flags, `ro`/`nosuid`/`nodev` applied,
//! `mount -a` on a mounted line, `umount DIR`; bad options refused in one line.
//!
//! mount(8) looks for helpers only in /sbin and runs them with PATH cleared, so the mounts are
//! made in a private mount namespace of the test (`unshare --mount`) where the helper is laid
//! over /usr/sbin (overlayfs) or /usr/local/sbin (a bind mount): the machine's own /sbin is
//! never touched, and whatever is left mounted there goes away with the namespace. Files in
//! those mounts are reached through `/proc/<namespace holder>/root`.

mod common;

use common::*;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn fs_with_no_client() -> TestFs {
    TestFs::with(Opts {
        clients: 0,
        timeout: Duration::from_secs(150),
        ..Opts::default()
    })
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Runs `prog ARGS` (optionally under `nsenter` into a mount namespace) with a time bound;
/// stdout and stderr go to files, so a daemon the command starts cannot hold us up.
fn run(scratch: &Path, ns: Option<i32>, prog: &str, args: &[&str], timeout: Duration) -> CmdOut {
    let seq = SEQ.fetch_add(1, Ordering::SeqCst);
    let out_p = scratch.join(format!(".run-{seq}.out"));
    let err_p = scratch.join(format!(".run-{seq}.err"));
    let mut cmd = match ns {
        Some(pid) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--mount=/proc/{pid}/ns/mnt"))
                .arg("--")
                .arg(prog);
            c
        }
        None => Command::new(prog),
    };
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_p).unwrap())
        .stderr(fs::File::create(&err_p).unwrap())
        .env_remove("RUST_LOG")
        .env_remove("TIERFS_LOG")
        .env("RUST_BACKTRACE", "0");
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {prog}: {e}"));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`{prog} {}` did not finish within {timeout:?}; stderr:\n{}",
                args.join(" "),
                fs::read_to_string(&err_p).unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(10));
    };
    let out = CmdOut {
        args: std::iter::once(prog.to_string())
            .chain(args.iter().map(|a| a.to_string()))
            .collect(),
        code: status.code(),
        signal: status.signal(),
        stdout: fs::read_to_string(&out_p).unwrap_or_default(),
        stderr: fs::read_to_string(&err_p).unwrap_or_default(),
    };
    let _ = fs::remove_file(&out_p);
    let _ = fs::remove_file(&err_p);
    out
}

/// A private mount namespace, held by a shell that waits on its stdin: it ends when the test
/// does, however the test ends.
struct Ns {
    holder: Child,
    stdin: Option<ChildStdin>,
    pid: i32,
    scratch: PathBuf,
}

impl Ns {
    fn new(scratch: &Path) -> Ns {
        let mut holder = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                "read _",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("unshare");
        let stdin = holder.stdin.take();
        let pid = holder.id() as i32;
        let mine = fs::read_link("/proc/self/ns/mnt").unwrap();
        assert!(
            wait_until(Duration::from_secs(10), || {
                fs::read_link(format!("/proc/{pid}/ns/mnt")).is_ok_and(|n| n != mine)
            }),
            "unshare --mount did not make a mount namespace"
        );
        Ns {
            holder,
            stdin,
            pid,
            scratch: scratch.to_path_buf(),
        }
    }

    /// `prog ARGS` inside the namespace.
    fn run(&self, prog: &str, args: &[&str]) -> CmdOut {
        run(&self.scratch, Some(self.pid), prog, args, CMD_TIMEOUT)
    }

    /// Where `p` of the namespace is seen from here.
    fn path(&self, p: &Path) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{}", self.pid, p.display()))
    }

    /// The namespace's mountinfo line for mount point `p`.
    fn mount_line(&self, p: &Path) -> Option<String> {
        let text = fs::read_to_string(format!("/proc/{}/mountinfo", self.pid)).ok()?;
        let want = s(p);
        text.lines()
            .rev()
            .find(|l| l.split(' ').nth(4) == Some(want.as_str()))
            .map(str::to_string)
    }

    /// The pid of the daemon serving `mnt`, from its info file.
    fn daemon_pid(&self, mnt: &Path) -> i32 {
        let text = fs::read_to_string(self.path(mnt).join(".tierfs-info")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["pid"].as_i64().unwrap() as i32
    }

    /// `umount DIR` in the namespace, then wait for the daemon to finish its session.
    fn umount(&self, mnt: &Path) {
        let pid = self.daemon_pid(mnt);
        self.run("umount", &[&s(mnt)]).assert_ok();
        assert!(self.mount_line(mnt).is_none(), "{mnt:?} still mounted");
        assert!(
            wait_until(Duration::from_secs(20), || !process_alive(pid)),
            "daemon {pid} still running 20 s after umount"
        );
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        // Unmount what a failed test left (lazily, so the daemons end by themselves), then
        // let the holder go.
        let text = fs::read_to_string(format!("/proc/{}/mountinfo", self.pid)).unwrap_or_default();
        let scratch = s(&self.scratch);
        for line in text.lines() {
            if let Some(mp) = line.split(' ').nth(4).filter(|m| m.starts_with(&scratch)) {
                let _ = run(
                    Path::new("/tmp"),
                    Some(self.pid),
                    "umount",
                    &["-l", mp],
                    Duration::from_secs(10),
                );
            }
        }
        drop(self.stdin.take());
        // SAFETY: kill(2) of the holder we started.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        let _ = self.holder.wait();
    }
}

fn status_lists(t: &TestFs, client: &str) -> bool {
    let out = t.tierfs(&["status", "--meta", &t.meta_url()]);
    out.assert_ok();
    tokens(&out.stdout).iter().any(|x| x == client)
}

#[test]
fn fuse3_mount_fuse_runs_tierfs_from_the_default_path() {
    let t = fs_with_no_client();
    let root = t.root().to_path_buf();
    // fuse3's mount.fuse runs `tierfs` through /bin/sh with PATH cleared by mount(8): the
    // shell's default PATH starts with /usr/local/sbin.
    let bin = root.join("pathbin");
    fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(BIN, bin.join("tierfs")).unwrap();
    assert!(
        Path::new("/sbin/mount.fuse").exists() && Path::new("/usr/local/sbin").is_dir(),
        "needs fuse3's /sbin/mount.fuse and a /usr/local/sbin directory"
    );
    let ns = Ns::new(&root);
    ns.run("mount", &["--bind", &s(&bin), "/usr/local/sbin"])
        .assert_ok();

    let mnt = root.join("mnt-a");
    fs::create_dir(&mnt).unwrap();
    let log = root.join("a.log");
    let opts = format!(
        "_netdev,nofail,client_name=fuse3,attr_ttl=0.5,nosuid,nodev,log_file={}",
        log.display()
    );
    let url = t.meta_url();
    ns.run("mount", &["-t", "fuse.tierfs", "-o", &opts, &url, &s(&mnt)])
        .assert_ok();
    let line = ns.mount_line(&mnt).expect("mounted in the namespace");
    let vfs_opts = line.split(' ').nth(5).unwrap_or("");
    assert!(
        vfs_opts.split(',').any(|o| o == "nosuid") && vfs_opts.split(',').any(|o| o == "nodev"),
        "nosuid,nodev not applied: {line}"
    );
    assert!(status_lists(&t, "fuse3"), "client_name= not used");
    assert!(log.exists(), "log_file= not used");

    let data = pattern(7, 0, 200_000);
    let f = ns.path(&mnt).join("hello");
    fs::write(&f, &data).unwrap();
    assert_same_bytes(
        &fs::read(&f).unwrap(),
        &data,
        0,
        "read back through the fstab mount",
    );

    // Bad options: one line from the helper, nothing mounted.
    let mnt_b = root.join("mnt-b");
    fs::create_dir(&mnt_b).unwrap();
    let out = ns.run(
        "mount",
        &[
            "-t",
            "fuse.tierfs",
            "-o",
            "client_name=b,frobnicate",
            &url,
            &s(&mnt_b),
        ],
    );
    out.assert_clean_error();
    assert!(out.stderr.contains("'frobnicate'"), "{}", out.describe());
    assert!(ns.mount_line(&mnt_b).is_none());

    ns.umount(&mnt);
    assert!(
        !status_lists(&t, "fuse3"),
        "session left behind after umount"
    );
}

#[test]
fn fstab_line_mounts_with_mount_fuse_tierfs() {
    let t = fs_with_no_client();
    let root = t.root().to_path_buf();
    let helpers = root.join("helpers");
    fs::create_dir(&helpers).unwrap();
    t.tierfs(&["install-helper", "--dir", &s(&helpers)])
        .assert_ok();
    let link = helpers.join("mount.fuse.tierfs");
    assert_eq!(
        fs::read_link(&link).unwrap(),
        fs::canonicalize(BIN).unwrap(),
        "install-helper made a wrong link"
    );
    let ns = Ns::new(&root);
    // /sbin is /usr/sbin here or a directory of its own: lay the helper over whichever holds
    // mount.fuse.
    let sbin = fs::canonicalize("/sbin").unwrap();
    let lower = format!("lowerdir={}:{}", helpers.display(), sbin.display());
    let out = ns.run(
        "mount",
        &["-t", "overlay", "overlay", "-o", &lower, &s(&sbin)],
    );
    assert!(
        out.ok(),
        "overlayfs is needed for this test: {}",
        out.describe()
    );

    let mnt = root.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let cache = root.join("pcc");
    // What the fstab line's env_file= names: the database password and such (unused by SQLite;
    // checked in the daemon's environment below).
    let env_file = root.join("tierfs.env");
    fs::write(&env_file, "# secrets\nPGPASSWORD=\"not-for-sqlite\"\n").unwrap();
    fs::set_permissions(&env_file, fs::Permissions::from_mode(0o600)).unwrap();
    let fstab = root.join("fstab");
    let line = format!(
        "{}  {}  fuse.tierfs  _netdev,nofail,client_name=node17,cache_dir={},cache_size=1G,env_file={},log_file={},x-systemd.mount-timeout=30  0 0\n",
        t.meta_url(),
        mnt.display(),
        cache.display(),
        env_file.display(),
        root.join("node17.log").display()
    );
    fs::write(&fstab, line).unwrap();

    ns.run("mount", &["-T", &s(&fstab), &s(&mnt)]).assert_ok();
    assert!(ns.mount_line(&mnt).is_some(), "not mounted");
    let info = fs::read_to_string(ns.path(&mnt).join(".tierfs-info")).unwrap();
    assert!(info.contains("\"client\":\"node17\""), "{info}");
    assert!(cache.is_dir(), "cache_dir= not used");
    let pid = ns.daemon_pid(&mnt);
    let environ = fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        environ
            .split(|b| *b == 0)
            .any(|v| v == b"PGPASSWORD=not-for-sqlite"),
        "env_file= did not reach the daemon"
    );

    let data = pattern(11, 0, 300_000);
    let f = ns.path(&mnt).join("data");
    fs::write(&f, &data).unwrap();
    assert_same_bytes(&fs::read(&f).unwrap(), &data, 0, "read back");

    // `mount -a` cannot tell that the line is mounted (the kernel names the mount tierfs:NAME):
    // asking again is not an error.
    let out = ns.run("mount", &["-a", "-T", &s(&fstab)]);
    out.assert_ok();
    assert!(out.stderr.contains("already mounted"), "{}", out.describe());
    ns.umount(&mnt);

    // The same line read-only: writes fail with EROFS, the data is there.
    ns.run("mount", &["-T", &s(&fstab), "-o", "ro", &s(&mnt)])
        .assert_ok();
    let line = ns.mount_line(&mnt).expect("mounted read-only");
    assert!(line.split(' ').nth(5).unwrap().starts_with("ro"), "{line}");
    let e = fs::write(ns.path(&mnt).join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_same_bytes(&fs::read(&f).unwrap(), &data, 0, "read-only mount");
    ns.umount(&mnt);
}

#[test]
fn helper_invocations_and_bad_options() {
    let t = fs_with_no_client();
    let root = t.root().to_path_buf();
    let url = t.meta_url();
    let mnt = root.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let m = s(&mnt);
    let helper = root.join("mount.fuse.tierfs");
    std::os::unix::fs::symlink(BIN, &helper).unwrap();
    let h = s(&helper);
    let direct = |prog: &str, args: &[&str]| run(&root, None, prog, args, CMD_TIMEOUT);

    // Unknown, valueless, relative, malformed: one line, exit 1, nothing mounted.
    for (prog, args, want) in [
        (
            h.as_str(),
            vec![url.as_str(), &m, "-o", "rw,frobnicate=1"],
            "'frobnicate=1'",
        ),
        (
            BIN,
            vec![url.as_str(), &m, "-o", "cache_size"],
            "needs a value",
        ),
        (
            BIN,
            vec!["mount-helper", &url, &m, "-o", "log_file=x.log"],
            "absolute path",
        ),
        (h.as_str(), vec![url.as_str(), &m, "-o", "sync"], "'sync'"),
        (h.as_str(), vec!["postgres://", &m], "postgres://"),
    ] {
        let out = direct(prog, &args);
        out.assert_clean_error();
        assert_eq!(out.code, Some(1), "{}", out.describe());
        assert!(out.stderr.contains(want), "{}", out.describe());
        assert!(!is_fuse_mounted(&mnt));
    }

    // A group-readable env file is refused without showing what is in it.
    let env_file = root.join("tierfs.env");
    fs::write(&env_file, "PGPASSWORD=hush\n").unwrap();
    fs::set_permissions(&env_file, fs::Permissions::from_mode(0o640)).unwrap();
    let opt = format!("env_file={}", env_file.display());
    let out = direct(&h, &[&url, &m, "-o", &opt]);
    out.assert_clean_error();
    assert!(
        out.stderr.contains("chmod 600") && !out.stderr.contains("hush"),
        "{}",
        out.describe()
    );

    // A mount that fails (no such mount point) exits 32, as mount(8) expects of a helper.
    let out = direct(&h, &[&url, &s(&root.join("missing"))]);
    out.assert_clean_error();
    assert_eq!(out.code, Some(32), "{}", out.describe());

    // -s (sloppy) warns about an unknown option and goes on; -f (fake) checks but does not
    // mount; -v shows the `tierfs mount` command the options stand for.
    let out = direct(
        &h,
        &[
            &url,
            &m,
            "-s",
            "-f",
            "-v",
            "-o",
            "frobnicate,client_name=x,cache_size=2G",
        ],
    );
    out.assert_ok();
    assert!(out.stderr.contains("'frobnicate'"), "{}", out.describe());
    assert!(
        out.stdout.contains("--client-name x") && out.stdout.contains("--cache-size 2G"),
        "{}",
        out.describe()
    );
    assert!(!is_fuse_mounted(&mnt));

    // install-helper does not replace someone else's file without --force.
    let dir = root.join("sbin");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("mount.fuse.tierfs"), b"#!/bin/sh\n").unwrap();
    let out = t.tierfs(&["install-helper", "--dir", &s(&dir)]);
    out.assert_clean_error();
    assert!(out.stderr.contains("--force"), "{}", out.describe());
    t.tierfs(&["install-helper", "--dir", &s(&dir), "--force"])
        .assert_ok();
    assert!(fs::read_link(dir.join("mount.fuse.tierfs")).is_ok());

    // The helper spelling mounts for real too (here, without mount(8)); stopped by `tierfs
    // umount`.
    let log = format!("log_file={}", root.join("direct.log").display());
    let out = direct(&h, &[&url, &m, "-o", &format!("client_name=direct,{log}")]);
    out.assert_ok();
    assert!(is_fuse_mounted(&mnt));
    let mut f = fs::File::create(mnt.join("x")).unwrap();
    f.write_all(b"direct").unwrap();
    drop(f);
    assert_eq!(fs::read(mnt.join("x")).unwrap(), b"direct");
    t.tierfs(&["umount", &m]).assert_ok();
    assert!(!is_fuse_mounted(&mnt));
}
