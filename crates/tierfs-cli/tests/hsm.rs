//! HSM from the user's side (issue 13): the `tierfs hsm` commands through real mounts, and
//! transparent restore (an open of a released file queues a restore, shared by several
//! openers; a write open, a truncate, and a read-only open's reads of bytes not restored yet
//! wait for it off the FUSE request thread: interruptible, EIO when it fails).
//!
//! No agent runs here (the copytool is `tierfs agent`, tested with the movers): where a test
//! needs a request carried out, it plays the mover itself through the engine's API (register,
//! take, complete / restore_slices / fail), as docs/hsm.md's protocol says. Its restore
//! commits the data as one inline slice, which the read path serves as any other slice.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tierfs_meta::hsm::{
    HsmAction, HsmAgentInfo, HsmDone, HsmListFilter, HsmOutcome, HsmRequest, Progress, RequestState,
};
use tierfs_meta::{open_engine, MetaEngine, Slice, SliceData};

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn engine(t: &TestFs) -> Arc<dyn MetaEngine> {
    open_engine(&t.meta_url()).expect("open the engine")
}

fn ino(p: &Path) -> u64 {
    fs::metadata(p).unwrap().ino()
}

fn hsm(t: &TestFs, args: &[&str]) -> CmdOut {
    let mut v = vec!["hsm"];
    v.extend_from_slice(args);
    t.tierfs(&v)
}

/// Archive 1, a file:// URL under the test's directory (nothing reads it: no agent runs).
fn add_archive(t: &TestFs) {
    let url = format!("file://{}", t.root().join("a1").display());
    hsm(t, &["archive-add", "1", &url, "--mount", &s(t.mnt(0))]).assert_ok();
}

/// A stand-in mover serving archive 1.
fn agent(e: &dyn MetaEngine) -> u64 {
    e.hsm_agent_register(&HsmAgentInfo {
        name: "test-mover".into(),
        host: "test".into(),
        pid: std::process::id(),
        archives: vec![1],
        max_requests: 0,
    })
    .unwrap()
}

/// Takes the waiting request of `action` on `ino` (failing the test when there is none).
fn take(e: &dyn MetaEngine, agent: u64, ino: u64, action: HsmAction) -> tierfs_meta::hsm::HsmTask {
    let tasks = e.hsm_take(agent, 16).unwrap();
    tasks
        .into_iter()
        .find(|k| k.request.ino == ino && k.request.action == action)
        .unwrap_or_else(|| panic!("no waiting {action:?} request of inode {ino} to take"))
}

/// Archives `p` as a mover would, after `tierfs hsm archive` queued it.
fn archive_by_hand(t: &TestFs, e: &dyn MetaEngine, p: &Path) {
    hsm(t, &["archive", &s(p)]).assert_ok();
    let a = agent(e);
    let k = take(e, a, ino(p), HsmAction::Archive);
    let done = HsmDone {
        key: format!("copy-{}", k.request.ino),
        data_version: k.data_version,
        size: k.size,
        checksum: "none:0".into(),
        bytes_moved: k.size,
    };
    assert_eq!(
        e.hsm_complete(a, k.request.id, &done).unwrap(),
        HsmOutcome::Done
    );
    e.hsm_agent_unregister(a).unwrap();
}

/// The active RESTORE requests of `ino`.
fn restores(e: &dyn MetaEngine, ino: u64) -> Vec<HsmRequest> {
    e.hsm_list(&HsmListFilter {
        ino: Some(ino),
        ..Default::default()
    })
    .unwrap()
    .into_iter()
    .filter(|r| r.action == HsmAction::Restore && r.state.is_active())
    .collect()
}

/// Restores released `ino` as a mover would: its bytes `data` committed as one inline slice.
fn restore_by_hand(e: &dyn MetaEngine, ino: u64, data: &[u8]) {
    let a = agent(e);
    let k = take(e, a, ino, HsmAction::Restore);
    let slice = Slice {
        seq: 0,
        chunk: 0,
        off: 0,
        len: data.len() as u64,
        data: SliceData::Inline(data.to_vec()),
    };
    assert_eq!(
        e.hsm_restore_slices(a, k.request.id, &[slice]).unwrap(),
        Progress::Continue
    );
    let done = HsmDone {
        data_version: k.data_version,
        bytes_moved: data.len() as u64,
        ..Default::default()
    };
    assert_eq!(
        e.hsm_complete(a, k.request.id, &done).unwrap(),
        HsmOutcome::Done
    );
    e.hsm_agent_unregister(a).unwrap();
}

/// Archive 1 and file `f` of mount 0 (`len` bytes of pattern `seed`) archived by hand and
/// released: the engine, the file's path and its data.
fn released_file(t: &TestFs, seed: u64, len: usize) -> (Arc<dyn MetaEngine>, PathBuf, Vec<u8>) {
    add_archive(t);
    let e = engine(t);
    let f = t.p(0, "f");
    let data = pattern(seed, 0, len);
    fs::write(&f, &data).unwrap();
    archive_by_hand(t, &*e, &f);
    hsm(t, &["release", &s(&f)]).assert_ok();
    (e, f, data)
}

/// Bad input and the queue, with no mover: archives, archive requests (deduplicated, visible
/// in `hsm action` and `hsm list`), cancel, flags, state, and refusals as one clean line.
#[test]
fn hsm_commands_queue_flags_and_refusals_without_a_mover() {
    let t = TestFs::new(1);
    let f = t.p(0, "f");
    fs::write(&f, pattern(1, 0, 200_000)).unwrap();
    let fs_ = s(&f);

    // no archive yet, then an unknown one
    let out = hsm(&t, &["archive", &fs_]);
    out.assert_clean_error();
    assert!(
        out.stderr.contains("no archive is registered"),
        "{}",
        out.describe()
    );
    add_archive(&t);
    let out = hsm(&t, &["archive", "--archive", "7", &fs_]);
    out.assert_clean_error();
    assert!(
        out.stderr.contains("unknown archive id 7"),
        "{}",
        out.describe()
    );
    // archive ids and URLs
    let url = format!("file://{}", t.root().join("a1").display());
    hsm(&t, &["archive-add", "1", &url, "--mount", &s(t.mnt(0))]).assert_clean_error();
    hsm(&t, &["archive-add", "0", &url, "--mount", &s(t.mnt(0))]).assert_clean_error();
    hsm(&t, &["archive-add", "70000", &url, "--mount", &s(t.mnt(0))]).assert_clean_error();
    hsm(
        &t,
        &["archive-add", "2", "relative/dir", "--mount", &s(t.mnt(0))],
    )
    .assert_clean_error();
    let out = hsm(&t, &["archive-list", "--mount", &s(t.mnt(0))]);
    out.assert_ok();
    assert_eq!(out.stdout.trim(), format!("1 {url}"), "{}", out.describe());

    // a file outside tierfs
    let outside = t.root().join("outside");
    fs::write(&outside, b"x").unwrap();
    let out = hsm(&t, &["state", &s(&outside)]);
    out.assert_clean_error();
    assert!(
        out.stderr.contains("not in a tierfs mount"),
        "{}",
        out.describe()
    );

    // a fresh file: no flags; release refused (not archived), cancel of nothing refused
    let out = hsm(&t, &["state", &fs_]);
    out.assert_ok();
    assert_eq!(out.stdout.trim(), format!("{fs_}: (0x00000000)"));
    let out = hsm(&t, &["release", &fs_]);
    out.assert_clean_error();
    assert!(out.stderr.contains("not archived"), "{}", out.describe());
    let out = hsm(&t, &["cancel", &fs_]);
    out.assert_clean_error();
    assert!(
        out.stderr.contains("nothing to cancel"),
        "{}",
        out.describe()
    );
    let out = hsm(&t, &["action", &fs_]);
    out.assert_ok();
    assert_eq!(out.stdout.trim(), format!("{fs_}: NOOP"));

    // archive: queued once however often asked, EXISTS at once
    hsm(&t, &["archive", &fs_]).assert_ok();
    hsm(&t, &["archive", "--archive", "1", &fs_]).assert_ok();
    let out = hsm(&t, &["state", &fs_]);
    assert_eq!(out.stdout.trim(), format!("{fs_}: (0x00000001) exists"));
    let out = hsm(&t, &["action", &fs_]);
    assert_eq!(
        out.stdout.trim(),
        format!("{fs_}: ARCHIVE WAITING (0 bytes moved)")
    );
    let out = hsm(&t, &["list", "--mount", &s(t.mnt(0))]);
    out.assert_ok();
    let lines: Vec<&str> = out.stdout.lines().skip(1).collect();
    assert_eq!(lines.len(), 1, "{}", out.describe());
    assert!(
        lines[0].contains("ARCHIVE") && lines[0].contains("WAITING") && lines[0].ends_with("/f"),
        "{}",
        out.describe()
    );

    // cancel acts at once; the request stays visible as canceled
    hsm(&t, &["cancel", &fs_]).assert_ok();
    let out = hsm(&t, &["action", &fs_]);
    assert_eq!(
        out.stdout.trim(),
        format!("{fs_}: ARCHIVE CANCELED (0 bytes moved)")
    );
    let out = hsm(&t, &["list", "--mount", &s(t.mnt(0))]);
    assert_eq!(out.stdout.lines().count(), 1, "{}", out.describe());
    let out = hsm(&t, &["list", "--all", "--mount", &s(t.mnt(0))]);
    assert!(out.stdout.contains("CANCELED"), "{}", out.describe());
    hsm(&t, &["cancel", &fs_]).assert_clean_error();

    // flags by hand
    hsm(&t, &["set", "--norelease", "--noarchive", &fs_]).assert_ok();
    let out = hsm(&t, &["state", &fs_]);
    assert_eq!(
        out.stdout.trim(),
        format!("{fs_}: (0x00000031) exists no_release no_archive")
    );
    let out = hsm(&t, &["archive", &fs_]);
    out.assert_clean_error();
    assert!(out.stderr.contains("noarchive"), "{}", out.describe());
    hsm(&t, &["clear", "--noarchive", &fs_]).assert_ok();
    let out = hsm(&t, &["state", &fs_]);
    assert_eq!(
        out.stdout.trim(),
        format!("{fs_}: (0x00000011) exists no_release")
    );
    hsm(&t, &["set", &fs_]).assert_clean_error();
    // several files: each failure a line, then the count; the good ones done
    let g = t.p(0, "g");
    fs::write(&g, b"g").unwrap();
    let out = hsm(&t, &["set", "--dirty", &fs_, "/nonexistent/x", &s(&g)]);
    assert!(!out.ok());
    assert!(
        out.stderr.contains("1 of 3 file(s) failed"),
        "{}",
        out.describe()
    );
    for p in [&fs_, &s(&g)] {
        let out = hsm(&t, &["state", p]);
        assert!(out.stdout.contains(" dirty"), "{}", out.describe());
    }
    // a directory is not a file
    hsm(&t, &["archive", &s(t.mnt(0))]).assert_clean_error();
    // data untouched by all of it
    assert_eq!(fs::read(&f).unwrap(), pattern(1, 0, 200_000));
}

/// Release of an archived, clean file keeps size and times and frees its capacity-tier space;
/// a write makes an archived file dirty, and a dirty file's release is refused.
#[test]
fn release_keeps_stat_and_is_refused_for_a_dirty_file() {
    let t = TestFs::new(1);
    add_archive(&t);
    let e = engine(&t);
    let f = t.p(0, "f");
    let data = pattern(2, 0, 300_000);
    fs::write(&f, &data).unwrap();
    let before = fs::metadata(&f).unwrap();
    archive_by_hand(&t, &*e, &f);
    let out = hsm(&t, &["state", &s(&f)]);
    assert_eq!(
        out.stdout.trim(),
        format!("{}: (0x00000009) exists archived, archive_id:1", s(&f))
    );
    hsm(&t, &["release", &s(&f)]).assert_ok();
    let out = hsm(&t, &["state", &s(&f)]);
    assert_eq!(
        out.stdout.trim(),
        format!(
            "{}: (0x0000000d) released exists archived, archive_id:1",
            s(&f)
        )
    );
    let a = e.getattr(ino(&f)).unwrap();
    assert_eq!(a.size, data.len() as u64);
    assert_eq!(
        a.mtime,
        before.mtime() * 1_000_000_000 + before.mtime_nsec()
    );
    // a release of a released file changes nothing
    hsm(&t, &["release", &s(&f)]).assert_ok();

    // dirty after a write; release refused (EBUSY: one line, non-zero)
    let g = t.p(0, "g");
    fs::write(&g, pattern(3, 0, 100_000)).unwrap();
    archive_by_hand(&t, &*e, &g);
    fs::OpenOptions::new()
        .append(true)
        .open(&g)
        .and_then(|mut h| std::io::Write::write_all(&mut h, b"more"))
        .unwrap();
    let out = hsm(&t, &["state", &s(&g)]);
    assert!(out.stdout.contains(" dirty "), "{}", out.describe());
    let out = hsm(&t, &["release", &s(&g)]);
    out.assert_clean_error();
    assert!(out.stderr.contains("dirty"), "{}", out.describe());
    // nothing lost
    let mut want = pattern(3, 0, 100_000);
    want.extend_from_slice(b"more");
    assert_eq!(fs::read(&g).unwrap(), want);
}

extern "C" fn on_alarm(_: libc::c_int) {}

/// In a forked child: SIGALRM interrupts a blocked system call (EINTR, no SA_RESTART).
unsafe fn alarm_interrupts() {
    let mut sa: libc::sigaction = std::mem::zeroed();
    sa.sa_sigaction = on_alarm as *const () as usize;
    sa.sa_flags = 0; // no SA_RESTART
    libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
}

/// With no agent, a write open of a released file waits for its restore (queued at top
/// priority) without holding up the mount: other requests are answered meanwhile; a signal
/// interrupts the wait (EINTR), and the restore stays queued. A read-only open returns at once
/// (it follows the restore); its read of bytes not restored yet waits the same way, and is
/// interrupted the same way.
#[test]
fn open_of_a_released_file_waits_interruptibly_and_the_mount_keeps_answering() {
    let t = TestFs::new(1);
    add_archive(&t);
    let e = engine(&t);
    let f = t.p(0, "f");
    fs::write(&f, pattern(4, 0, 150_000)).unwrap();
    fs::write(t.p(0, "other"), b"other data").unwrap();
    archive_by_hand(&t, &*e, &f);
    hsm(&t, &["release", &s(&f)]).assert_ok();
    let n = ino(&f);

    let path = cstr(&f);
    let child = RawChild::spawn(|wfd| unsafe {
        alarm_interrupts();
        libc::alarm(3);
        let fd = libc::open(path.as_ptr(), libc::O_RDWR);
        tell(wfd, if fd < 0 { *libc::__errno_location() } else { 0 });
        loop {
            libc::pause();
        }
    });
    // the open queued one restore, at a higher priority than archives
    assert!(
        wait_until(Duration::from_secs(2), || restores(&*e, n).len() == 1),
        "no restore queued by the open"
    );
    let r = &restores(&*e, n)[0];
    assert!(r.priority > HsmAction::Archive.default_priority(), "{r:?}");
    // meanwhile the mount answers others
    let t0 = Instant::now();
    assert_eq!(fs::read(t.p(0, "other")).unwrap(), b"other data");
    assert!(fs::read_dir(t.mnt(0)).unwrap().count() >= 2);
    fs::write(t.p(0, "new"), b"new").unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let got = child
        .report(Duration::from_secs(10))
        .expect("the open of the released file was not interrupted by SIGALRM within 10 s");
    assert_eq!(got, libc::EINTR, "interrupted open: {}", errname(got));
    drop(child);
    // A read-only open returns at once; its read waits, and a signal interrupts it.
    let path = cstr(&f);
    let child = RawChild::spawn(|wfd| unsafe {
        alarm_interrupts();
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY);
        if fd < 0 {
            tell(wfd, 1000 + *libc::__errno_location());
        } else {
            libc::alarm(2);
            let mut buf = [0u8; 4096];
            let r = libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            tell(wfd, if r < 0 { *libc::__errno_location() } else { 0 });
        }
        loop {
            libc::pause();
        }
    });
    let got = child
        .report(Duration::from_secs(10))
        .expect("the read of the released file was not interrupted by SIGALRM within 10 s");
    assert_eq!(got, libc::EINTR, "interrupted read: {got}");
    drop(child);
    // the restore stays queued for whoever opens next (or an agent)
    assert_eq!(restores(&*e, n).len(), 1);
    let out = hsm(&t, &["action", &s(&f)]);
    assert!(out.stdout.contains("RESTORE WAITING"), "{}", out.describe());
}

/// Openers of a released file on two clients share one restore and read the data once a
/// mover completed it; the file is no longer released.
#[test]
fn openers_on_two_clients_share_one_restore_and_read_the_data() {
    let t = TestFs::new(2);
    add_archive(&t);
    let e = engine(&t);
    let f0 = t.p(0, "f");
    let data = pattern(5, 0, 180_000);
    fs::write(&f0, &data).unwrap();
    archive_by_hand(&t, &*e, &f0);
    hsm(&t, &["release", &s(&f0)]).assert_ok();
    let n = ino(&f0);
    let readers: Vec<_> = [t.p(0, "f"), t.p(1, "f")]
        .into_iter()
        .map(|p| thread::spawn(move || fs::read(p)))
        .collect();
    // both wait: one restore between them
    thread::sleep(Duration::from_millis(700));
    assert_eq!(restores(&*e, n).len(), 1, "{:?}", restores(&*e, n));
    assert!(
        readers.iter().all(|r| !r.is_finished()),
        "a reader did not wait"
    );
    restore_by_hand(&*e, n, &data);
    for r in readers {
        let got = r.join().unwrap().expect("read after the restore");
        assert!(got == data, "restored data differs ({} bytes)", got.len());
    }
    let out = hsm(&t, &["state", &s(&f0)]);
    assert_eq!(
        out.stdout.trim(),
        format!("{}: (0x00000009) exists archived, archive_id:1", s(&f0))
    );
    let out = hsm(&t, &["action", &s(&f0)]);
    assert!(
        out.stdout.contains("RESTORE SUCCEEDED"),
        "{}",
        out.describe()
    );
}

/// A restore that fails for good gives the waiting opener (a write open) and the waiting
/// reader (of a read-only open, which returned at once) EIO, and `tierfs hsm action` says why.
#[test]
fn a_failed_restore_gives_eio_and_action_shows_why() {
    let t = TestFs::new(1);
    add_archive(&t);
    let e = engine(&t);
    let f = t.p(0, "f");
    fs::write(&f, pattern(6, 0, 90_000)).unwrap();
    archive_by_hand(&t, &*e, &f);
    hsm(&t, &["release", &s(&f)]).assert_ok();
    let n = ino(&f);
    let p = f.clone();
    let opener = thread::spawn(move || {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .map(|_| ())
    });
    let p = f.clone();
    let reader = thread::spawn(move || fs::read(p).map(|_| ()));
    assert!(
        wait_until(Duration::from_secs(5), || restores(&*e, n).len() == 1),
        "no restore queued by the open"
    );
    thread::sleep(Duration::from_millis(300));
    assert!(
        !opener.is_finished() && !reader.is_finished(),
        "the write open or the read did not wait"
    );
    let a = agent(&*e);
    let k = take(&*e, a, n, HsmAction::Restore);
    let st = e
        .hsm_fail(a, k.request.id, "archive copy checksum mismatch", false)
        .unwrap();
    assert_eq!(st, RequestState::Failed);
    let got = opener.join().unwrap();
    let err = got.expect_err("the open succeeded after a failed restore");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let got = reader.join().unwrap();
    let err = got.expect_err("the read succeeded after a failed restore");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let out = hsm(&t, &["action", &s(&f)]);
    assert!(
        out.stdout.contains("RESTORE FAILED") && out.stdout.contains("checksum mismatch"),
        "{}",
        out.describe()
    );
    // still released, nothing lost: a later restore can succeed
    let out = hsm(&t, &["state", &s(&f)]);
    assert!(out.stdout.contains("released"), "{}", out.describe());
}

/// `tierfs hsm config` shows and changes the coordinator's settings; with
/// `remove_archive_on_last_unlink` on, unlinking an archived file queues removal of its copy
/// (off, the default: it does not).
#[test]
fn unlink_queues_removal_of_the_copy_only_when_configured() {
    let t = TestFs::new(1);
    add_archive(&t);
    let e = engine(&t);
    let m = s(t.mnt(0));
    let out = hsm(&t, &["config", "--mount", &m]);
    out.assert_ok();
    assert!(
        out.stdout.contains("remove_archive_on_last_unlink = off")
            && out.stdout.contains("max_per_agent = 4"),
        "{}",
        out.describe()
    );
    hsm(
        &t,
        &[
            "config",
            "--mount",
            &m,
            "--remove-archive-on-last-unlink",
            "maybe",
        ],
    )
    .assert_clean_error();
    hsm(&t, &["config", "--mount", &m, "--max-per-agent", "0"]).assert_clean_error();
    let removes = |n: u64| {
        e.hsm_list(&HsmListFilter {
            include_done: true,
            ino: Some(n),
            ..Default::default()
        })
        .unwrap()
        .into_iter()
        .filter(|r| r.action == HsmAction::Remove)
        .count()
    };
    let (f, g) = (t.p(0, "f"), t.p(0, "g"));
    for p in [&f, &g] {
        fs::write(p, pattern(7, 0, 70_000)).unwrap();
        archive_by_hand(&t, &*e, p);
    }
    let (nf, ng) = (ino(&f), ino(&g));
    fs::remove_file(&g).unwrap();
    // The file goes (and a REMOVE would be queued) once its last close is recorded: closes
    // reach the engine in batches, so wait until g is gone before the setting changes.
    assert!(
        wait_until(Duration::from_secs(10), || e.getattr(ng).is_err()),
        "g was not purged after its unlink"
    );
    assert_eq!(removes(ng), 0, "off: no REMOVE queued");
    let out = hsm(
        &t,
        &[
            "config",
            "--mount",
            &m,
            "--remove-archive-on-last-unlink",
            "on",
        ],
    );
    out.assert_ok();
    assert!(out.stdout.contains("remove_archive_on_last_unlink = on"));
    fs::remove_file(&f).unwrap();
    // (the same batch of closes: f's REMOVE is queued when f is purged)
    assert!(
        wait_until(Duration::from_secs(10), || removes(nf) == 1),
        "on: one REMOVE queued (found {})",
        removes(nf)
    );
    // g went the same way, long enough ago, with the setting off.
    assert_eq!(removes(ng), 0, "off: no REMOVE queued");
}

/// `tierfs hsm import` makes a file:// archive's tree released files (size, mtime, mode from
/// the archive, no data copied); an open restores one from its key in the archive.
#[test]
fn import_makes_released_files_that_restore_on_open() {
    let t = TestFs::new(1);
    add_archive(&t);
    let e = engine(&t);
    let arch = t.root().join("a1");
    fs::create_dir_all(arch.join("tree/sub")).unwrap();
    let x = pattern(8, 0, 5000);
    fs::write(arch.join("tree/x"), &x).unwrap();
    fs::write(arch.join("tree/sub/y"), b"why").unwrap();
    fs::set_permissions(
        arch.join("tree/x"),
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .unwrap();
    let dest = t.p(0, "imported");
    fs::create_dir(&dest).unwrap();
    let out = hsm(&t, &["import", "--archive", "1", "tree", &s(&dest)]);
    out.assert_ok();
    assert!(
        out.stdout.contains("imported 2 files (5003 bytes)"),
        "{}",
        out.describe()
    );
    // bad input: unknown archive, a destination outside tierfs
    hsm(&t, &["import", "--archive", "9", "tree", &s(&dest)]).assert_clean_error();
    hsm(&t, &["import", "--archive", "1", "tree", &s(t.root())]).assert_clean_error();

    let f = dest.join("x");
    let m = fs::metadata(&f).unwrap();
    let am = fs::metadata(arch.join("tree/x")).unwrap();
    assert_eq!((m.len(), m.mode() & 0o7777), (5000, 0o640));
    assert_eq!((m.mtime(), m.mtime_nsec()), (am.mtime(), am.mtime_nsec()));
    let out = hsm(&t, &["state", &s(&f)]);
    assert_eq!(
        out.stdout.trim(),
        format!(
            "{}: (0x0000000d) released exists archived, archive_id:1",
            s(&f)
        )
    );
    assert_eq!(fs::metadata(dest.join("sub/y")).unwrap().len(), 3);

    let n = ino(&f);
    let p = f.clone();
    let reader = thread::spawn(move || fs::read(p));
    assert!(
        wait_until(Duration::from_secs(5), || restores(&*e, n).len() == 1),
        "no restore queued by the open"
    );
    // the mover reads the copy at its key
    let st = e.hsm_state(n).unwrap();
    let key = st.copy.expect("an imported file has a copy").key;
    let data = fs::read(arch.join(&key)).unwrap();
    restore_by_hand(&*e, n, &data);
    assert!(
        reader.join().unwrap().unwrap() == x,
        "imported file reads back"
    );
}

/// PCC and HSM: a released file is not attached to a client's cache by hand (its data would
/// be missing); an open restores it into the capacity tier first, and the attach works then.
#[test]
fn a_released_file_is_restored_before_the_cache_gets_it() {
    let mut t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    let co = ClientOpts {
        name: "c0".into(),
        cache_dir: Some(t.root().join("cache0")),
        cache_size: Some("1G".into()),
        ..Default::default()
    };
    t.mount_with(&co);
    add_archive(&t);
    let e = engine(&t);
    let f = t.p(0, "f");
    let data = pattern(9, 0, 120_000);
    fs::write(&f, &data).unwrap();
    archive_by_hand(&t, &*e, &f);
    hsm(&t, &["release", &s(&f)]).assert_ok();
    let out = t.tierfs(&["pcc", "attach", "-r", &s(&f)]);
    out.assert_clean_error();
    let out = hsm(&t, &["state", &s(&f)]);
    assert!(out.stdout.contains("released"), "{}", out.describe());
    let n = ino(&f);
    let p = f.clone();
    let reader = thread::spawn(move || fs::read(p));
    assert!(
        wait_until(Duration::from_secs(5), || restores(&*e, n).len() == 1),
        "no restore queued by the open"
    );
    restore_by_hand(&*e, n, &data);
    assert!(reader.join().unwrap().unwrap() == data);
    t.tierfs(&["pcc", "attach", "-r", &s(&f)]).assert_ok();
    assert!(fs::read(&f).unwrap() == data, "read through the cache");
}

/// A truncate of a released file restores it first (waiting off the request thread), then
/// truncates the restored data.
#[test]
fn truncate_of_a_released_file_restores_it_first() {
    let t = TestFs::new(1);
    let (e, f, data) = released_file(&t, 10, 100_000);
    let n = ino(&f);
    let p = f.clone();
    let truncater = thread::spawn(move || {
        let c = cstr(&p);
        // truncate(2) by path: no open, a setattr of the size
        if unsafe { libc::truncate(c.as_ptr(), 1000) } == 0 {
            0
        } else {
            errno()
        }
    });
    assert!(
        wait_until(Duration::from_secs(5), || restores(&*e, n).len() == 1),
        "no restore queued by the truncate"
    );
    assert!(!truncater.is_finished(), "the truncate did not wait");
    restore_by_hand(&*e, n, &data);
    assert_eq!(truncater.join().unwrap(), 0, "truncate after the restore");
    assert!(
        fs::read(&f).unwrap() == data[..1000],
        "truncated restored data"
    );
}

/// A read-only handle of a released file (direct I/O while it follows the restore) can be
/// mapped shared (FUSE_DIRECT_IO_ALLOW_MMAP): a page fault waits for the restore like a read,
/// and the mapping shows the restored data.
#[test]
fn mmap_of_a_file_being_restored_shows_the_restored_data() {
    use std::os::fd::AsRawFd;
    let t = TestFs::new(1);
    let (e, f, data) = released_file(&t, 11, 70_000);
    let n = ino(&f);
    let file = fs::File::open(&f).expect("read-only open of a released file");
    let len = data.len();
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap: {}", errname(errno()));
    let addr = p as usize;
    let reader = thread::spawn(move || {
        let m = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        m.to_vec()
    });
    thread::sleep(Duration::from_millis(500));
    assert!(!reader.is_finished(), "the page fault did not wait");
    restore_by_hand(&*e, n, &data);
    let got = reader.join().unwrap();
    unsafe { libc::munmap(p, len) };
    assert!(got == data, "the mapping shows other bytes");
}
