//! `tierfs memfs`, the FUSE floor of issue 14 (docs/benchmarks.md, "The FUSE floor on this
//! machine"): it mounts, serves what the benchmark workloads need (files, directories,
//! symlinks, hard links, rename, xattrs, listings with attributes, removal of a tree) with the
//! right answers, and goes away cleanly at unmount.

mod common;

use common::*;
use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

fn getxattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| buf[..r as usize].to_vec())
}

fn setxattr(p: &Path, name: &str, v: &[u8]) -> i32 {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated strings and a value of the length given.
    unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) }
}

#[test]
fn memfs_refuses_a_mount_point_that_is_not_a_directory() {
    let t = TestFs::with(Opts {
        clients: 0,
        format: false,
        timeout: Duration::from_secs(30),
        ..Opts::default()
    });
    let f = t.root().join("file");
    fs::write(&f, b"").unwrap();
    let out = tierfs_in(
        t.root(),
        &["memfs", &f.to_string_lossy()],
        Duration::from_secs(10),
    );
    assert!(!out.ok(), "memfs mounted over a file: {}", out.describe());
    out.assert_clean_error();
    assert!(!is_fuse_mounted(&f));
}

#[test]
fn memfs_mounts_serves_the_workloads_operations_and_unmounts() {
    // A scratch directory with the harness's watchdog and teardown (nothing formatted).
    let t = TestFs::with(Opts {
        clients: 0,
        format: false,
        timeout: Duration::from_secs(60),
        ..Opts::default()
    });
    let m = t.root().join("m");
    fs::create_dir(&m).unwrap();
    let mut child = Command::new(BIN)
        .args(["memfs", &m.to_string_lossy(), "--ttl", "1"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tierfs memfs");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !is_fuse_mounted(&m) {
        assert!(Instant::now() < deadline, "memfs did not mount in 20 s");
        assert!(child.try_wait().unwrap().is_none(), "memfs exited early");
        thread::sleep(Duration::from_millis(20));
    }

    // Files: write, read back, overwrite in the middle, truncate.
    let f = m.join("a.txt");
    fs::write(&f, b"hello, floor").unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"hello, floor");
    let mut h = fs::OpenOptions::new().write(true).open(&f).unwrap();
    h.seek(SeekFrom::Start(7)).unwrap();
    h.write_all(b"FLOOR").unwrap();
    drop(h);
    assert_eq!(fs::read(&f).unwrap(), b"hello, FLOOR");
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(5)
        .unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"hello");
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o600);

    // A directory tree, a symlink, a hard link.
    fs::create_dir_all(m.join("d/e")).unwrap();
    fs::write(m.join("d/e/f"), vec![7u8; 300_000]).unwrap();
    std::os::unix::fs::symlink("e/f", m.join("d/link")).unwrap();
    assert_eq!(fs::read_link(m.join("d/link")).unwrap(), Path::new("e/f"));
    assert_eq!(fs::read(m.join("d/link")).unwrap().len(), 300_000);
    fs::hard_link(m.join("d/e/f"), m.join("d/hard")).unwrap();
    let a = fs::metadata(m.join("d/hard")).unwrap();
    assert_eq!(a.nlink(), 2);
    assert_eq!(a.ino(), fs::metadata(m.join("d/e/f")).unwrap().ino());
    assert_eq!(
        fs::metadata(m.join("d")).unwrap().nlink(),
        3,
        "d has . , .. of e"
    );

    // Listing: every name, with its attributes (READDIRPLUS).
    let mut names: Vec<String> = fs::read_dir(m.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["e", "hard", "link"]);
    let many = m.join("many");
    fs::create_dir(&many).unwrap();
    for i in 0..500 {
        fs::write(many.join(format!("f{i:04}")), b"").unwrap();
    }
    assert_eq!(fs::read_dir(&many).unwrap().count(), 500);

    // Rename: over an existing file, and of a directory to another parent.
    fs::write(m.join("b.txt"), b"old").unwrap();
    fs::rename(&f, m.join("b.txt")).unwrap();
    assert!(!f.exists());
    assert_eq!(fs::read(m.join("b.txt")).unwrap(), b"hello");
    fs::rename(m.join("d/e"), m.join("many/e")).unwrap();
    assert_eq!(fs::read(m.join("many/e/f")).unwrap().len(), 300_000);
    assert_eq!(fs::metadata(m.join("d")).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(&many).unwrap().nlink(), 3);

    // Extended attributes.
    assert_eq!(setxattr(&m.join("b.txt"), "user.k", b"v1"), 0);
    assert_eq!(
        getxattr(&m.join("b.txt"), "user.k").as_deref(),
        Some(&b"v1"[..])
    );
    assert_eq!(getxattr(&m.join("b.txt"), "user.none"), None);

    // An unlinked file stays readable through its open handle.
    let mut open = fs::File::open(m.join("d/hard")).unwrap();
    fs::remove_file(m.join("d/hard")).unwrap();
    assert_eq!(fs::metadata(m.join("many/e/f")).unwrap().nlink(), 1);
    let mut got = Vec::new();
    open.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), 300_000);
    drop(open);

    // A non-empty directory cannot be removed; the whole tree can.
    assert!(fs::remove_dir(&many).is_err());
    fs::remove_dir_all(&many).unwrap();
    fs::remove_dir_all(m.join("d")).unwrap();
    fs::remove_file(m.join("b.txt")).unwrap();
    assert_eq!(fs::read_dir(&m).unwrap().count(), 0);

    // What would not fit in memory is refused, and the filesystem carries on.
    let big = fs::File::create(m.join("big")).unwrap();
    let e = big.set_len(1 << 40).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
    let e = std::os::unix::fs::FileExt::write_at(&big, b"x", 1 << 40).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
    drop(big);
    assert_eq!(fs::metadata(m.join("big")).unwrap().len(), 0);
    fs::remove_file(m.join("big")).unwrap();

    // Unmount: the process ends on its own, successfully.
    assert!(Command::new("fusermount3")
        .args(["-u", &m.to_string_lossy()])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "memfs still running 10 s after unmount"
        );
        thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "memfs exited with {status}: {err}");
    assert!(!is_fuse_mounted(&m));
}
