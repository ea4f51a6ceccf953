//! FUSE over io_uring (client config `fuse_uring`, issue 14): with the kernel's
//! `fuse.enable_uring` on, requests reach the daemon through io_uring ring entries (counted in
//! `.tierfs-stats` as `tierfs_fuse_uring_requests_total`), replies sent later from another
//! thread (a flock wait's) land in their entry, and the daemon stops cleanly at unmount; with
//! it off, the same mount falls back to /dev/fuse with one log line.
//!
//! The module parameter is global: the test sets it (root) and puts the old value back. It
//! only matters to daemons that ask for io_uring; a connection that has the ring keeps it.

mod common;

use common::faulty::FaultyMount;
use common::*;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};
use tierfs_client::config::ClientConfig;
use tierfs_meta::faulty::Fault;

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
const COUNTER: &str = "tierfs_fuse_uring_requests_total";

/// Sets the module parameter for one scope and puts it back as it was. The parameter is one
/// for the machine and the tests of this file run in parallel, so a `Param` also holds a lock
/// for its scope: one test switching it off must not make another's mount fall back, and the
/// value restored must be the one from before either test.
struct Param {
    old: Option<String>,
    _serial: std::sync::MutexGuard<'static, ()>,
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Param {
    fn set(on: bool) -> Param {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let old = fs::read_to_string(PARAM).ok();
        if old.is_some() {
            fs::write(PARAM, if on { "Y" } else { "N" }).expect("write enable_uring (root)");
        }
        Param {
            old,
            _serial: serial,
        }
    }
}

impl Drop for Param {
    fn drop(&mut self) {
        if let Some(old) = &self.old {
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
        // Each ring thread runs on its queue's CPU only (the kernel queues a request on the
        // queue of the CPU its caller runs on); unpinned, a cold `ls -l` of 10,000 files took
        // 0.85 s here against 0.23 s pinned.
        let rings = ring_threads_cpus(pid);
        assert!(!rings.is_empty(), "no fuser-uring threads in the daemon");
        for (name, cpus) in &rings {
            let qid = name
                .trim_start_matches("fuser-uring-")
                .split('-')
                .next()
                .unwrap();
            assert_eq!(cpus, qid, "{name} may run on CPUs {cpus}");
        }
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

/// The daemon `pid`'s ring threads (`fuser-uring-QUEUE-N`) with the CPUs each may run on
/// (`Cpus_allowed_list` of /proc). The name is cut by the kernel to 15 bytes, which keeps
/// "fuser-uring-Q-N" whole for queues and threads under 10.
fn ring_threads_cpus(pid: i32) -> Vec<(String, String)> {
    let mut v = Vec::new();
    for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = fs::read_to_string(task.unwrap().path().join("status")).unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|x| x.trim().to_string())
                .unwrap_or_default()
        };
        let name = field("Name:");
        if name.starts_with("fuser-uring-") {
            v.push((name, field("Cpus_allowed_list:")));
        }
    }
    v
}

/// Pins the calling thread to CPU 0 (the kernel puts its FUSE requests on ring queue 0).
fn pin_to_cpu0() {
    // SAFETY: a zeroed cpu_set_t with one bit set, for the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "sched_setaffinity"
        );
    }
}

/// More flock waits on one CPU than that CPU's queue has entries at first (each waiting
/// request holds its entry until its reply): the unlock from the same CPU still gets through
/// and every waiter gets the lock in turn. With a fixed number of entries the unlock waited
/// in the kernel behind the waits for ever.
#[test]
fn many_lock_waits_on_one_cpu_do_not_starve_the_unlock() {
    if fs::metadata(PARAM).is_err() {
        eprintln!("skipped: this kernel has no FUSE over io_uring");
        return;
    }
    let mut t = TestFs::new(0);
    let _param = Param::set(true);
    let i = t.mount_with(&uring("c0"));
    let mnt = t.mnt(i).to_path_buf();
    // (read now: once requests are stuck, so would be the read of .tierfs-info)
    let pid = t.daemon_pid(i);
    let p = mnt.join("lockfile");
    fs::write(&p, b"x").unwrap();
    // fuse_threads (8) / queues threads per queue, 4 entries each: at most 16 on queue 0.
    const WAITERS: usize = 40;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let run = {
        let p = p.clone();
        thread::spawn(move || {
            pin_to_cpu0();
            let a = fs::File::open(&p).unwrap();
            // SAFETY: flock on open descriptors throughout.
            assert_eq!(unsafe { libc::flock(a.as_raw_fd(), libc::LOCK_EX) }, 0);
            let waiters: Vec<_> = (0..WAITERS)
                .map(|_| {
                    let p = p.clone();
                    thread::spawn(move || {
                        pin_to_cpu0();
                        let b = fs::File::open(&p).unwrap();
                        let r = unsafe { libc::flock(b.as_raw_fd(), libc::LOCK_EX) };
                        let u = unsafe { libc::flock(b.as_raw_fd(), libc::LOCK_UN) };
                        (r, u)
                    })
                })
                .collect();
            thread::sleep(Duration::from_secs(2));
            let unlocked = unsafe { libc::flock(a.as_raw_fd(), libc::LOCK_UN) };
            let results: Vec<(i32, i32)> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
            let _ = done_tx.send((unlocked, results));
        })
    };
    let got = done_rx.recv_timeout(Duration::from_secs(60));
    let Ok((unlocked, results)) = got else {
        // Killing the daemon aborts the connection: the stuck requests fail, so the threads
        // end before the test does (an unmount would wait behind them).
        // SAFETY: a signal to the test's own daemon.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let _ = run.join();
        panic!("the unlock or the waiters were still stuck after 60 s");
    };
    run.join().unwrap();
    assert_eq!(unlocked, 0, "the unlock failed");
    assert_eq!(results.len(), WAITERS);
    assert!(
        results.iter().all(|&(r, u)| r == 0 && u == 0),
        "{results:?}"
    );
    let log = fs::read_to_string(t.log_path("c0")).unwrap();
    assert!(log.contains("FUSE over io_uring: "), "{log}");
}

/// A request that blocks on its ring thread (an engine call that hangs: here a LOOKUP whose
/// answer the engine holds) holds up no other request of that CPU. One ring thread per queue
/// (`fuse_threads = 2` on this 2-queue machine, or 1 per queue on more CPUs), every request
/// from CPU 0: the kernel can only put the next requests on entries of the thread that is
/// stuck, and without the rescuer (crate `fuser`'s `uring::Rescuer`) they waited for it.
#[test]
fn a_request_that_hangs_on_its_ring_thread_holds_up_no_other() {
    if fs::metadata(PARAM).is_err() {
        eprintln!("skipped: this kernel has no FUSE over io_uring");
        return;
    }
    let t = TestFs::new(0);
    let _param = Param::set(true);
    let config = ClientConfig {
        client_name: Some("ring".into()),
        fuse_threads: 2,
        fuse_uring: true,
        ..ClientConfig::default()
    };
    let m = FaultyMount::with_config(&t, "ring", config);
    fs::write(m.p("a"), b"alpha").unwrap();
    // (a lookup holds its directory's kernel lock shared: the create below, in another
    // directory, must not need that one)
    fs::create_dir(m.p("d")).unwrap();
    assert!(
        stat_value(&m.mnt, COUNTER) > 0,
        "the mount does not use the ring"
    );
    m.plan.fail_next("lookup", 1, Fault::HoldReply);
    let p = m.p("d/held");
    let held = thread::spawn(move || {
        pin_to_cpu0();
        fs::metadata(p).is_err()
    });
    assert!(
        m.plan.wait_held(Duration::from_secs(10)),
        "the LOOKUP of 'held' did not reach the engine"
    );
    // Requests from the same CPU while that one is held: lookups of new names, an open,
    // a read, a create.
    let (tx, rx) = std::sync::mpsc::channel();
    let (a, dir) = (m.p("a"), m.mnt.clone());
    thread::spawn(move || {
        pin_to_cpu0();
        for i in 0..20 {
            assert!(fs::metadata(dir.join(format!("none-{i}"))).is_err());
        }
        let read = fs::read(&a).unwrap();
        fs::write(dir.join("b"), b"beta").unwrap();
        let _ = tx.send(read);
    });
    let got = rx.recv_timeout(Duration::from_secs(5));
    m.plan.release();
    assert!(held.join().unwrap(), "'held' does not exist");
    assert_eq!(
        got.expect("requests from the same CPU waited for the held LOOKUP"),
        b"alpha"
    );
    assert_eq!(fs::read(m.p("b")).unwrap(), b"beta");
}
