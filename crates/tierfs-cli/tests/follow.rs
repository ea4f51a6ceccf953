//! Long kernel TTLs made safe (issue 14): with `follow_changes`, each client follows the other
//! clients' changes (its `change-follower` worker reads the changelog) and invalidates the
//! names and attributes they make stale, so the kernel may cache for `follow_ttl` (here 600 s)
//! while another client's rename, unlink, chmod, create, setxattr or write is still seen within
//! the follower's bound (docs/semantics.md, "Following other clients"). The engine hiccup case
//! is in tests/faults.rs (`the_follower_catches_up_after_an_engine_hiccup`).

mod common;

use common::*;
use std::ffi::CString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::thread;
use std::time::Duration;

/// The documented bound (the follower's lag, at most 1 s while it keeps up) plus scheduling
/// slack on a busy machine. Far below `follow_ttl`: without the follower nothing would show
/// before 600 s.
const BOUND: Duration = Duration::from_millis(2500);

fn following(name: &str) -> ClientOpts {
    ClientOpts {
        name: name.into(),
        config: Some("follow_changes = true\nfollow_ttl = 600.0\n".into()),
        ..ClientOpts::default()
    }
}

fn setxattr(p: &Path, name: &str, val: &[u8]) -> io::Result<()> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    // SAFETY: valid C strings and a buffer of the given length.
    io_res(unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), val.as_ptr().cast(), val.len(), 0) })
}

fn getxattr(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: valid C strings and a buffer of the given length.
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

fn exists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok()
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0)
}

fn size(p: &Path) -> u64 {
    fs::metadata(p).map(|m| m.len()).unwrap_or(u64::MAX)
}

/// One visibility check of a change, run until it holds.
type Check<'a> = Box<dyn Fn() -> bool + 'a>;

/// Requests that reach the daemon when a name is stat'ed.
fn stat_requests(mnt: &Path) -> u64 {
    fuse_ops(mnt, "lookup") + fuse_ops(mnt, "getattr")
}

#[test]
fn changes_on_one_client_are_seen_on_the_other_within_the_followers_bound() {
    let mut t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    let a = t.mount_with(&following("a"));
    let b = t.mount_with(&following("b"));
    fs::create_dir(t.p(a, "d")).unwrap();
    for f in ["r", "u", "m", "x", "w"] {
        fs::write(t.p(a, &format!("d/{f}")), b"12345").unwrap();
    }
    let names = ["d", "d/r", "d/u", "d/m", "d/x", "d/w"];
    // A caches every name and its attributes, and that "d/new" does not exist.
    let warm = |t: &TestFs| {
        for n in names {
            fs::metadata(t.p(a, n)).unwrap();
        }
        assert!(!exists(&t.p(a, "d/new")));
    };
    warm(&t);
    // Past the short TTL (1 s) A's kernel still answers alone: the long TTL is in force (so
    // what follows is seen through the invalidations, not through an expiry).
    thread::sleep(Duration::from_millis(1500));
    warm(&t);
    let before = stat_requests(t.mnt(a));
    warm(&t);
    assert_eq!(
        stat_requests(t.mnt(a)),
        before,
        "a stat of a cached name reached the daemon: the long TTL is not in force"
    );

    // B changes each of them.
    fs::rename(t.p(b, "d/r"), t.p(b, "d/r2")).unwrap();
    fs::remove_file(t.p(b, "d/u")).unwrap();
    fs::set_permissions(t.p(b, "d/m"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(t.p(b, "d/new"), b"new").unwrap();
    setxattr(&t.p(b, "d/x"), "user.k", b"v").unwrap();
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(t.p(b, "d/w"))
        .unwrap();
    f.write_all(b"67890").unwrap();
    drop(f);

    let checks: Vec<(&str, Check)> = vec![
        (
            "rename: the old name gone",
            Box::new(|| !exists(&t.p(a, "d/r"))),
        ),
        (
            "rename: the new name there",
            Box::new(|| exists(&t.p(a, "d/r2"))),
        ),
        ("unlink", Box::new(|| !exists(&t.p(a, "d/u")))),
        ("chmod", Box::new(|| mode(&t.p(a, "d/m")) == 0o600)),
        (
            "create (a cached absent name)",
            Box::new(|| exists(&t.p(a, "d/new"))),
        ),
        (
            "setxattr",
            Box::new(|| getxattr(&t.p(a, "d/x"), "user.k").ok().as_deref() == Some(b"v")),
        ),
        (
            "close after an append: the size",
            Box::new(|| size(&t.p(a, "d/w")) == 10),
        ),
    ];
    let t0 = std::time::Instant::now();
    for (what, check) in &checks {
        let left = BOUND.saturating_sub(t0.elapsed());
        assert!(
            wait_until(left, check),
            "{what} on client b not seen on client a within {BOUND:?} (follow_ttl 600 s)"
        );
    }
    assert_eq!(
        fs::read(t.p(a, "d/w")).unwrap(),
        b"1234567890",
        "the appended data"
    );
    drop(checks);
    t.umount(b);
    t.umount(a);
}

/// A follower whose changelog reader is gone (deregistered by hand here; in real life dropped
/// after 10 minutes without a read) registers a new one and goes on following; what it may have
/// missed meanwhile is covered by giving replies the short TTL for the next `follow_ttl`.
#[test]
fn a_follower_whose_reader_is_gone_registers_again_and_goes_on() {
    let mut t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    let a = t.mount_with(&following("a"));
    let b = t.mount_with(&ClientOpts {
        name: "b".into(),
        ..ClientOpts::default()
    });
    fs::write(t.p(b, "m"), b"m").unwrap();
    // A caches that "n" does not exist, with the long TTL (its follower keeps up). (B may
    // follow too, with a reader of its own, when TIERFS_IT_CLIENT_CONFIG or the default says
    // so: A's reader is the one its .tierfs-info names.)
    let listed = |r: &str| {
        let out = t.tierfs(&["changelog", "readers", "--meta", &t.meta_url()]);
        out.stdout
            .lines()
            .any(|l| l.split_whitespace().next() == Some(r))
    };
    let old = t.follow_reader(a).expect("A follows");
    assert!(listed(&old));
    thread::sleep(Duration::from_millis(300));
    assert!(!exists(&t.p(a, "n")));

    t.tierfs(&["changelog", "deregister", &old, "--meta", &t.meta_url()])
        .assert_ok();
    let mut new = None;
    assert!(
        wait_until(Duration::from_secs(5), || {
            new = t.follow_reader(a).filter(|r| *r != old && listed(r));
            new.is_some()
        }),
        "the follower did not register a new reader"
    );
    // Following goes on: B's create is seen although A cached the name as absent for 600 s.
    fs::write(t.p(b, "n"), b"n").unwrap();
    assert!(
        wait_until(BOUND, || exists(&t.p(a, "n"))),
        "a create after the new registration was not seen within {BOUND:?}"
    );
    // And replies carry the short TTL meanwhile: a name looked up now is asked again once
    // 1 s has passed.
    fs::metadata(t.p(a, "m")).unwrap();
    thread::sleep(Duration::from_millis(1500));
    let before = stat_requests(t.mnt(a));
    fs::metadata(t.p(a, "m")).unwrap();
    assert!(
        stat_requests(t.mnt(a)) > before,
        "a name looked up after the reader was lost kept the long TTL"
    );
    t.umount(b);
    t.umount(a);
}

/// A client alone on a filesystem writes no changelog records for its own follower (schema
/// v10: a follower's reader does not want its own client's records); once a second client
/// follows, the first one's changes are recorded for it.
#[test]
fn a_lone_client_records_nothing_and_a_second_follower_gets_its_changes() {
    let mut t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    let url = t.meta_url();
    let a = t.mount_with(&following("a"));
    let records = |t: &TestFs| {
        let o = t.tierfs(&["changelog", "--meta", &url]);
        o.assert_ok();
        o.stdout
    };
    fs::create_dir(t.p(a, "d")).unwrap();
    fs::write(t.p(a, "d/f"), b"12345").unwrap();
    fs::set_permissions(t.p(a, "d/f"), fs::Permissions::from_mode(0o600)).unwrap();
    setxattr(&t.p(a, "d/f"), "user.k", b"v").unwrap();
    fs::rename(t.p(a, "d/f"), t.p(a, "d/g")).unwrap();
    assert_eq!(records(&t), "", "a alone: no records");
    let readers = t.tierfs(&["changelog", "readers", "--meta", &url]);
    readers.assert_ok();
    assert!(
        readers.stdout.contains("(change follower of client a)"),
        "{}",
        readers.stdout
    );

    let b = t.mount_with(&following("b"));
    fs::write(t.p(a, "d/h"), b"1").unwrap();
    let text = records(&t);
    assert!(
        text.lines()
            .any(|l| l.contains("CREAT") && l.contains(" h")),
        "a's create once b follows:\n{text}"
    );
    assert!(text.lines().all(|l| l.contains("c=a")), "{text}");
    // and b sees it (through its follower or its TTL)
    assert!(wait_until(Duration::from_secs(5), || exists(
        &t.p(b, "d/h")
    )));
}
