//! Mount lifecycle (issue 2, "What a user can do"): signals unmount cleanly, a crashed daemon's
//! dead mount is cleaned up by `tierfs umount` or the next `tierfs mount`, data survives a
//! remount; `--foreground`, `--metrics`, `tierfs project`.

mod common;

use common::*;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

fn daemon_pid(mnt: &Path) -> i32 {
    let pids = daemons_mentioning(&mnt.to_string_lossy());
    assert_eq!(
        pids.len(),
        1,
        "expected one daemon serving {}, found {pids:?}",
        mnt.display()
    );
    pids[0]
}

fn pid_alive(pid: i32) -> bool {
    // a zombie is not alive for our purposes
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

fn status_lists(t: &TestFs, name: &str) -> bool {
    let out = t.tierfs(&["status", "--meta", &t.meta_url()]);
    out.ok() && tokens(&out.stdout).iter().any(|x| x == name)
}

#[test]
fn sigterm_unmounts_cleanly() {
    let t = TestFs::new(2);
    fs::write(t.p(0, "f"), b"before sigterm").unwrap();
    let mnt = t.mnt(0).to_path_buf();
    let pid = daemon_pid(&mnt);
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert!(
        wait_until(Duration::from_secs(10), || !is_fuse_mounted(&mnt)),
        "mount still there 10 s after SIGTERM"
    );
    assert!(
        wait_until(Duration::from_secs(10), || !pid_alive(pid)),
        "daemon still running 10 s after SIGTERM"
    );
    assert!(
        wait_until(Duration::from_secs(10), || !status_lists(&t, "c0")),
        "status still lists c0 after its daemon exited on SIGTERM"
    );
    assert_eq!(read_all(&t.p(1, "f")).unwrap(), b"before sigterm");
}

#[test]
fn sigint_unmounts_cleanly() {
    let t = TestFs::new(1);
    let mnt = t.mnt(0).to_path_buf();
    let pid = daemon_pid(&mnt);
    unsafe { libc::kill(pid, libc::SIGINT) };
    assert!(
        wait_until(Duration::from_secs(10), || !is_fuse_mounted(&mnt)),
        "mount still there 10 s after SIGINT"
    );
    assert!(wait_until(Duration::from_secs(10), || !pid_alive(pid)));
}

#[test]
fn killed_daemon_dead_mount_cleaned_by_umount() {
    let t = TestFs::new(2);
    fs::write(t.p(0, "f"), b"closed before the crash").unwrap();
    let mnt = t.mnt(0).to_path_buf();
    let pid = daemon_pid(&mnt);
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(wait_until(Duration::from_secs(10), || !pid_alive(pid)));
    // data closed before the crash is safe
    assert_eq!(read_all(&t.p(1, "f")).unwrap(), b"closed before the crash");
    let out = t.tierfs(&["umount", &mnt.to_string_lossy()]);
    out.assert_ok();
    assert!(
        !is_fuse_mounted(&mnt),
        "dead mount still present after tierfs umount"
    );
    assert!(fs::read_dir(&mnt).is_ok(), "mount point usable again");
}

#[test]
fn killed_daemon_dead_mount_replaced_by_next_mount() {
    let t = TestFs::new(1);
    fs::write(t.p(0, "f"), b"survives").unwrap();
    let mnt = t.mnt(0).to_path_buf();
    let pid = daemon_pid(&mnt);
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(wait_until(Duration::from_secs(10), || !pid_alive(pid)));
    let out = t.tierfs(&[
        "mount",
        "--meta",
        &t.meta_url(),
        &mnt.to_string_lossy(),
        "--client-name",
        "again",
    ]);
    out.assert_ok();
    assert!(is_fuse_mounted(&mnt));
    let n = mounts().iter().filter(|(p, _)| *p == mnt).count();
    assert_eq!(n, 1, "{n} mounts stacked on {}", mnt.display());
    assert_eq!(read_all(&mnt.join("f")).unwrap(), b"survives");
    fs::write(mnt.join("g"), b"new").unwrap();
}

#[test]
fn data_survives_umount_and_remount() {
    let mut t = TestFs::new(1);
    let big = pattern(90, 0, 5 * 1024 * 1024 + 17);
    fs::write(t.p(0, "big"), &big).unwrap();
    fs::write(t.p(0, "small"), b"tiny").unwrap();
    fs::create_dir(t.p(0, "d")).unwrap();
    std::os::unix::fs::symlink("big", t.p(0, "d/link")).unwrap();
    let c = cstr(&t.p(0, "small"));
    io_res(unsafe { libc::chmod(c.as_ptr(), 0o640) }).unwrap();
    t.umount(0);
    let m = t.mount_client("c0-again", None);
    assert_same_bytes(
        &read_all(&t.p(m, "big")).unwrap(),
        &big,
        0,
        "big after remount",
    );
    assert_eq!(read_all(&t.p(m, "small")).unwrap(), b"tiny");
    assert_eq!(stat(&t.p(m, "small")).unwrap().st_mode & 0o7777, 0o640);
    assert_eq!(
        fs::read_link(t.p(m, "d/link")).unwrap(),
        Path::new("big"),
        "symlink after remount"
    );
}

#[test]
fn foreground_mount_stays_attached_and_sigint_ends_it() {
    let t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    let mnt = t.root().join("fg");
    fs::create_dir(&mnt).unwrap();
    let mut child = Command::new(BIN)
        .args([
            "mount",
            "--meta",
            &t.meta_url(),
            &mnt.to_string_lossy(),
            "--foreground",
            "--client-name",
            "fg",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up = wait_until(Duration::from_secs(20), || is_fuse_mounted(&mnt));
    if !up {
        let _ = child.kill();
        let _ = child.wait();
        panic!("--foreground mount did not come up within 20 s");
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "--foreground returned while mounted"
    );
    fs::write(mnt.join("f"), b"fg").unwrap();
    assert_eq!(read_all(&mnt.join("f")).unwrap(), b"fg");
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("--foreground daemon did not exit within 15 s of SIGINT");
        }
        thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit after SIGINT: {status:?}");
    assert!(!is_fuse_mounted(&mnt), "still mounted after SIGINT");
}

fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // one write: the server may answer and close as soon as it has the request line
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if let Err(e) = s.write_all(req.as_bytes()) {
        return format!("(write failed: {e})");
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn metrics_endpoint_serves_prometheus_text() {
    let mut t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let mnt = t.root().join("m");
    fs::create_dir(&mnt).unwrap();
    t.tierfs(&[
        "mount",
        "--meta",
        &t.meta_url(),
        &mnt.to_string_lossy(),
        "--metrics",
        &addr,
    ])
    .assert_ok();
    // writes through the metrics mount; reads of data written by another client, so they
    // cannot come from this mount's page cache
    fs::write(mnt.join("w"), pattern(92, 0, 2 * 1024 * 1024)).unwrap();
    let other = t.mount_client("writer", None);
    let data = pattern(91, 0, 3 * 1024 * 1024);
    fs::write(t.p(other, "f"), &data).unwrap();
    assert_same_bytes(&read_all(&mnt.join("f")).unwrap(), &data, 0, "read back");
    let mut body = String::new();
    let ok = wait_until(Duration::from_secs(10), || {
        body = http_get(&addr, "/metrics");
        body.starts_with("HTTP/1.") && body.contains(" 200")
    });
    assert!(ok, "GET /metrics on {addr}:\n{body}");
    assert!(
        body.contains("# TYPE") || body.contains("# HELP"),
        "not Prometheus text:\n{body}"
    );
    // a sample line mentioning all of `words` with a value > 0
    let has = |words: &[&str]| {
        body.lines().filter(|l| !l.starts_with('#')).any(|l| {
            let low = l.to_ascii_lowercase();
            words.iter().all(|w| low.contains(w))
                && l.rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|v| v > 0.0)
        })
    };
    assert!(has(&["op", "write"]), "no write operation count:\n{body}");
    assert!(has(&["op", "read"]), "no read operation count:\n{body}");
    assert!(has(&["seconds"]), "no latencies:\n{body}");
    assert!(
        has(&["target", "bytes", "writ"]),
        "no bytes written per target:\n{body}"
    );
    assert!(
        has(&["target", "bytes", "read"]),
        "no bytes read per target:\n{body}"
    );
}

#[test]
fn project_id_inherited_with_s() {
    let t = TestFs::new(1);
    let d = t.p(0, "proj");
    fs::create_dir(&d).unwrap();
    let ds = d.to_string_lossy().to_string();
    t.tierfs(&["project", "-p", "500", "-s", &ds]).assert_ok();
    fs::write(d.join("new"), b"x").unwrap();
    fs::create_dir(d.join("sub")).unwrap();
    fs::write(d.join("sub/deeper"), b"y").unwrap();
    for p in [&d, &d.join("new"), &d.join("sub"), &d.join("sub/deeper")] {
        let out = t.tierfs(&["project", &p.to_string_lossy()]);
        out.assert_ok();
        assert_eq!(
            out.stdout.split_whitespace().next(),
            Some("500"),
            "project id of {}:\n{}",
            p.display(),
            out.stdout
        );
    }
    // without -s children do not inherit
    let e = t.p(0, "plain");
    fs::create_dir(&e).unwrap();
    let es = e.to_string_lossy().to_string();
    t.tierfs(&["project", "-p", "700", &es]).assert_ok();
    fs::write(e.join("child"), b"z").unwrap();
    let out = t.tierfs(&["project", &e.join("child").to_string_lossy()]);
    out.assert_ok();
    assert_ne!(
        out.stdout.split_whitespace().next(),
        Some("700"),
        "project id inherited without -s:\n{}",
        out.stdout
    );
    let out = t.tierfs(&["project", &es]);
    assert_eq!(out.stdout.split_whitespace().next(), Some("700"));
}

#[test]
fn fsynced_data_survives_daemon_kill() {
    let t = TestFs::new(2);
    let data = pattern(93, 0, 3 * 1024 * 1024 + 5);
    let h = fs::File::create(t.p(0, "f")).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&h, &data, 0).unwrap();
    h.sync_all().unwrap();
    fs::create_dir(t.p(0, "d")).unwrap();
    let mnt = t.mnt(0).to_path_buf();
    let pid = daemon_pid(&mnt);
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(wait_until(Duration::from_secs(10), || !pid_alive(pid)));
    drop(h);
    thread::sleep(Duration::from_millis(1500));
    assert_same_bytes(
        &read_all(&t.p(1, "f")).unwrap(),
        &data,
        0,
        "fsynced data after the writer's daemon was killed",
    );
    assert!(t.p(1, "d").is_dir(), "directory made before the kill");
}

#[test]
fn targets_formatted_before_identity_markers_get_one_at_first_mount() {
    // Issue 10, item 3: filesystems formatted before targets carried an identity have no
    // marker; the first mount writes it (with a log line), after which the target is this
    // filesystem's like any other.
    let mut t = TestFs::new(0);
    if !t.cluster.local_targets() {
        return;
    }
    let m = t.mount_with(&ClientOpts {
        name: "c0".into(),
        ..Default::default()
    });
    fs::write(t.p(m, "old"), vec![7u8; 300 << 10]).unwrap();
    t.umount(m);
    let dirs = [t.target_dir(0), t.target_dir(1)];
    let marker = |i: usize| dirs[i].join(".tierfs-target");
    let before = fs::read_to_string(marker(0)).expect("format writes a marker");
    // what an older tierfs left: no markers, target 1 never written to
    fs::remove_file(marker(0)).unwrap();
    fs::remove_file(marker(1)).unwrap();
    assert!(dirs[0].join("objects").exists() || dirs[1].join("objects").exists());
    let m = t.mount_with(&ClientOpts {
        name: "c1".into(),
        ..Default::default()
    });
    assert_eq!(fs::read(t.p(m, "old")).unwrap(), vec![7u8; 300 << 10]);
    let after = fs::read_to_string(marker(0)).expect("the mount writes the marker back");
    let field = |text: &str, k: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{k} =")))
            .map(str::to_string)
    };
    assert_eq!(field(&before, "fs_uuid"), field(&after, "fs_uuid"));
    assert_eq!(field(&after, "target").as_deref(), Some("target = 0"));
    let one = fs::read_to_string(marker(1)).unwrap();
    assert_eq!(field(&one, "target").as_deref(), Some("target = 1"));
    let log = fs::read_to_string(t.log_path("c1")).unwrap_or_default();
    assert!(
        log.contains("had no identity marker"),
        "no log line about the marker: {log}"
    );
    t.umount(m);
    // now another filesystem cannot take it
    let other = format!("sqlite://{}", t.root().join("other.db").display());
    let out = t.tierfs(&["format", "--meta", &other, "--target", &t.target_url(1)]);
    out.assert_clean_error();
    assert!(
        out.stderr.contains("belongs to filesystem"),
        "{}",
        out.describe()
    );
    // a marker-less target holding foreign files is not taken at mount
    fs::remove_file(marker(1)).unwrap();
    fs::write(t.target_dir(1).join("stray.txt"), b"not tierfs").unwrap();
    let mnt = t.root().join("mnt-x");
    fs::create_dir(&mnt).unwrap();
    let out = t.tierfs(&["mount", "--meta", &t.meta_url(), &mnt.to_string_lossy()]);
    out.assert_clean_error();
    assert!(out.stderr.contains("stray.txt"), "{}", out.describe());
    assert!(!marker(1).exists());
}

/// F_SETLK of a write lock on all of `f`.
fn try_write_lock(f: &fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: a valid descriptor and flock.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &mut fl) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[test]
fn one_client_name_is_mounted_once() {
    // Issue 10, item 6: the same --client-name could be mounted twice at once, silently.
    let mut t = TestFs::new(1);
    let mnt = t.root().join("second");
    fs::create_dir(&mnt).unwrap();
    let args = t.mount_args(
        &mnt,
        &ClientOpts {
            name: "c0".into(),
            ..Default::default()
        },
    );
    let out = t.tierfs(&args);
    out.assert_clean_error();
    assert!(
        out.stderr.contains("'c0' is already mounted") && out.stderr.contains("mnt0"),
        "{}",
        out.describe()
    );
    assert!(!is_fuse_mounted(&mnt));
    // once the first is unmounted the name is free
    t.umount(0);
    t.tierfs(&args).assert_ok();
    assert!(is_fuse_mounted(&mnt));
    t.mnts.push(mnt);
}

#[test]
fn a_client_killed_on_this_host_is_dead_at_once() {
    // Issue 10, item 6: a client killed with kill -9 stayed "mounted" in `tierfs status`, its
    // name taken and its locks held, for the whole session timeout (30 s) although its pid was
    // dead on this very host.
    let mut t = TestFs::new(2);
    fs::write(t.p(0, "f"), b"x").unwrap();
    let held = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.p(1, "f"))
        .unwrap();
    try_write_lock(&held).expect("c1 locks f");
    let mine = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.p(0, "f"))
        .unwrap();
    assert!(try_write_lock(&mine).is_err(), "c1's lock conflicts");
    t.kill9(1);
    let killed = Instant::now();
    // status tells at once: c1 is not counted as mounted
    let out = t.tierfs(&["status", "--meta", &t.meta_url()]);
    out.assert_ok();
    let c1_line = out
        .stdout
        .lines()
        .find(|l| tokens(l).first().map(String::as_str) == Some("c1"));
    assert!(
        out.stdout.contains("clients:    1 mounted") && c1_line.is_none_or(|l| l.contains("DEAD")),
        "status right after kill -9 of c1:\n{}",
        out.stdout
    );
    // its lock goes within a heartbeat of c0 (2 s), not after the 30 s session timeout
    assert!(
        wait_until(Duration::from_secs(10), || try_write_lock(&mine).is_ok()),
        "c1's lock still held {:?} after its daemon was killed",
        killed.elapsed()
    );
    assert!(!status_lists(&t, "c1"), "the dead session has ended");
    // and its name may be mounted again at once
    t.remount_with(
        1,
        &ClientOpts {
            name: "c1".into(),
            ..Default::default()
        },
    );
    assert!(killed.elapsed() < Duration::from_secs(25));
    assert_eq!(fs::read(t.p(1, "f")).unwrap(), b"x");
    drop(held);
}
