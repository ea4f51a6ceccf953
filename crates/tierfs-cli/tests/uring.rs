//! FUSE over io_uring (client config `fuse_uring`, issue 14): with the kernel's
//! `fuse.enable_uring` on, requests reach the daemon through io_uring ring entries (counted in
//! `.tierfs-stats` as `tierfs_fuse_uring_requests_total`), replies sent later from another
//! thread (a flock wait's) land in their entry, and the daemon stops cleanly at unmount; with
//! it off, the same mount falls back to /dev/fuse with one log line.
//!
//! The module parameter is global: the test sets it (root) and puts the old value back. It
//! only matters to daemons that ask for io_uring; a connection that has the ring keeps it.

mod common;

use common::*;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
const COUNTER: &str = "tierfs_fuse_uring_requests_total";

/// Puts the module parameter back as it was.
struct Param(Option<String>);

impl Param {
    fn set(on: bool) -> Param {
        let old = fs::read_to_string(PARAM).ok();
        if old.is_some() {
            fs::write(PARAM, if on { "Y" } else { "N" }).expect("write enable_uring (root)");
        }
        Param(old)
    }
}

impl Drop for Param {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = fs::write(PARAM, old.trim());
        }
    }
}

fn uring(name: &str) -> ClientOpts {
    ClientOpts {
        name: name.into(),
        config: Some("fuse_uring = true\n".into()),
        ..ClientOpts::default()
    }
}

/// Namespace and data work on `mnt`, checked: creates, writes, reads back, renames, lists,
/// removes.
fn some_work(mnt: &Path) {
    let d = mnt.join("dir");
    fs::create_dir(&d).unwrap();
    for i in 0..20 {
        let data = vec![i as u8; 1000 * (i + 1)];
        fs::write(d.join(format!("f{i}")), &data).unwrap();
    }
    // a write larger than one page, and reads of it in pieces
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(d.join("big"), &big).unwrap();
    let mut back = Vec::new();
    fs::File::open(d.join("big"))
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert!(back == big, "big file read back differs");
    for i in 0..20 {
        fs::rename(d.join(format!("f{i}")), d.join(format!("g{i}"))).unwrap();
        let got = fs::read(d.join(format!("g{i}"))).unwrap();
        assert_eq!(got, vec![i as u8; 1000 * (i + 1)], "g{i}");
    }
    let mut names: Vec<String> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 21, "{names:?}");
    fs::remove_dir_all(&d).unwrap();
    assert!(fs::symlink_metadata(&d).is_err());
}

/// A flock wait: answered later, from the daemon's lock-wait thread, not the ring's.
fn deferred_reply(mnt: &Path) {
    let p = mnt.join("lockfile");
    fs::File::create(&p).unwrap().write_all(b"x").unwrap();
    let a = fs::File::open(&p).unwrap();
    // SAFETY: flock on an open descriptor.
    assert_eq!(unsafe { libc::flock(a.as_raw_fd(), libc::LOCK_EX) }, 0);
    let p2 = p.clone();
    let waiter = thread::spawn(move || {
        let b = fs::File::open(&p2).unwrap();
        let t = Instant::now();
        // SAFETY: as above; blocks until `a` lets go.
        let r = unsafe { libc::flock(b.as_raw_fd(), libc::LOCK_EX) };
        (r, t.elapsed())
    });
    thread::sleep(Duration::from_millis(500));
    assert!(!waiter.is_finished(), "the second flock did not wait");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::flock(a.as_raw_fd(), libc::LOCK_UN) }, 0);
    let (r, waited) = waiter.join().unwrap();
    assert_eq!(r, 0, "the waiting flock failed");
    assert!(waited >= Duration::from_millis(400), "waited {waited:?}");
}

#[test]
fn requests_go_over_the_ring_and_fall_back_to_dev_fuse_without_it() {
    let mut t = TestFs::new(0);
    let offered = fs::metadata(PARAM).is_ok();

    if offered {
        // The ring: every request of the work below but FORGET/INTERRUPT comes through it.
        let param = Param::set(true);
        let i = t.mount_with(&uring("c0"));
        let mnt = t.mnt(i).to_path_buf();
        let before = stat_value(&mnt, COUNTER);
        assert!(before > 0, "no request came over the ring at mount");
        some_work(&mnt);
        deferred_reply(&mnt);
        let after = stat_value(&mnt, COUNTER);
        // 20 creates, 20 renames, 40 opens, 41 releases, ... far more than 100 requests
        assert!(
            after > before + 100,
            "only {} requests over the ring during the work",
            after - before
        );
        let log = fs::read_to_string(t.log_path("c0")).unwrap();
        assert!(log.contains("FUSE over io_uring: "), "{log}");
        let pid = t.daemon_pid(i);
        t.umount(i);
        assert!(
            wait_until(Duration::from_secs(20), || !process_alive(pid)),
            "the daemon of a ring mount did not exit after unmount"
        );
        drop(param);
    }

    // No ring offered: the mount works over /dev/fuse and says so once.
    let _param = Param::set(false);
    let i = t.mount_with(&uring("c1"));
    let mnt = t.mnt(i).to_path_buf();
    some_work(&mnt);
    deferred_reply(&mnt);
    assert_eq!(
        stat_value(&mnt, COUNTER),
        0,
        "requests over a ring not offered"
    );
    let log = fs::read_to_string(t.log_path("c1")).unwrap();
    assert_eq!(
        log.matches("does not offer FUSE over io_uring").count(),
        1,
        "{log}"
    );
    let pid = t.daemon_pid(i);
    t.umount(i);
    assert!(wait_until(Duration::from_secs(20), || !process_alive(pid)));
}
