//! Several clients on one machine (issue 2, "Required behaviour 2").

mod common;

use common::*;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

const TTL: f64 = 0.5;
/// Scheduling slack on top of the TTL before a change must be visible.
const SLACK: Duration = Duration::from_millis(700);

fn after_ttl(ttl: f64) {
    thread::sleep(Duration::from_secs_f64(ttl) + SLACK);
}

/// How long `f` took to become true (for failure messages), up to 10 s.
fn eventually(f: impl FnMut() -> bool) -> String {
    let t0 = Instant::now();
    if wait_until(Duration::from_secs(10), f) {
        format!("it became visible only after a further {:?}", t0.elapsed())
    } else {
        "it was still not visible 10 s later".to_string()
    }
}

fn names(p: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn namespace_changes_visible_after_ttl() {
    let t = TestFs::with(Opts {
        clients: 2,
        attr_ttl: Some(TTL),
        ..Opts::default()
    });
    // c1 looks first, so it may hold negative / stale entries
    assert!(stat(&t.p(1, "d")).is_err());
    assert!(names(t.mnt(1)).is_empty());

    fs::create_dir(t.p(0, "d")).unwrap();
    fs::write(t.p(0, "d/f"), b"hello").unwrap();
    after_ttl(TTL);
    let ok = stat(&t.p(1, "d/f")).is_ok();
    assert!(
        ok,
        "mkdir+create on c0 not visible on c1 after the TTL; {}",
        eventually(|| stat(&t.p(1, "d/f")).is_ok())
    );
    assert_eq!(names(t.mnt(1)), ["d"]);
    assert_eq!(names(&t.p(1, "d")), ["f"]);
    assert_eq!(read_all(&t.p(1, "d/f")).unwrap(), b"hello");

    // rename
    fs::rename(t.p(0, "d/f"), t.p(0, "d/g")).unwrap();
    after_ttl(TTL);
    let ok = stat(&t.p(1, "d/f")).is_err() && stat(&t.p(1, "d/g")).is_ok();
    assert!(
        ok,
        "rename on c0 not visible on c1 after the TTL; {}",
        eventually(|| stat(&t.p(1, "d/f")).is_err() && stat(&t.p(1, "d/g")).is_ok())
    );
    assert_eq!(names(&t.p(1, "d")), ["g"]);

    // chmod / chown (attributes)
    let c = cstr(&t.p(0, "d/g"));
    io_res(unsafe { libc::chmod(c.as_ptr(), 0o600) }).unwrap();
    io_res(unsafe { libc::chown(c.as_ptr(), 1234, 5678) }).unwrap();
    after_ttl(TTL);
    let st = stat(&t.p(1, "d/g")).unwrap();
    assert_eq!(
        (st.st_mode & 0o7777, st.st_uid, st.st_gid),
        (0o600, 1234, 5678),
        "chmod/chown on c0 not visible on c1 after the TTL"
    );

    // unlink and rmdir
    fs::remove_file(t.p(0, "d/g")).unwrap();
    after_ttl(TTL);
    assert!(
        stat(&t.p(1, "d/g")).is_err(),
        "unlink on c0 not visible on c1 after the TTL; {}",
        eventually(|| stat(&t.p(1, "d/g")).is_err())
    );
    assert!(names(&t.p(1, "d")).is_empty());
    fs::remove_dir(t.p(0, "d")).unwrap();
    after_ttl(TTL);
    assert!(
        stat(&t.p(1, "d")).is_err(),
        "rmdir on c0 not visible on c1 after the TTL"
    );
    assert!(names(t.mnt(1)).is_empty());

    // and the other way round, with a symlink and a hard link
    std::os::unix::fs::symlink("target", t.p(1, "sl")).unwrap();
    fs::write(t.p(1, "x"), b"x").unwrap();
    fs::hard_link(t.p(1, "x"), t.p(1, "y")).unwrap();
    after_ttl(TTL);
    assert_eq!(
        fs::read_link(t.p(0, "sl"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned()),
        Some("target".to_string()),
        "symlink made on c1, seen on c0"
    );
    assert_eq!(
        stat(&t.p(0, "y")).unwrap().st_nlink,
        2,
        "hard link made on c1"
    );
}

#[test]
fn namespace_change_visible_within_default_ttl() {
    // default TTL is 1 s
    let t = TestFs::new(2);
    assert!(stat(&t.p(1, "f")).is_err());
    fs::write(t.p(0, "f"), b"x").unwrap();
    after_ttl(1.0);
    assert!(
        stat(&t.p(1, "f")).is_ok(),
        "create on c0 not visible on c1 within the default 1 s TTL; {}",
        eventually(|| stat(&t.p(1, "f")).is_ok())
    );
}

#[test]
fn close_to_open_consistency() {
    let t = TestFs::new(2);
    fs::write(t.p(0, "f"), b"v1").unwrap();
    // c1 reads and caches the first version (attributes and pages)
    assert_eq!(read_all(&t.p(1, "f")).unwrap(), b"v1");
    assert_eq!(stat(&t.p(1, "f")).unwrap().st_size, 2);

    // c0 rewrites it with a longer content and closes; c1 opens right after
    fs::write(t.p(0, "f"), b"version-2 is longer").unwrap();
    assert_eq!(
        read_all(&t.p(1, "f")).unwrap(),
        b"version-2 is longer",
        "c1 opened after c0 closed: must see the new (longer) data"
    );

    // same length, different bytes
    fs::write(t.p(0, "f"), b"VERSION-3 is longer").unwrap();
    assert_eq!(
        read_all(&t.p(1, "f")).unwrap(),
        b"VERSION-3 is longer",
        "same-size rewrite: c1 must not serve stale cached pages"
    );

    // shorter
    fs::write(t.p(0, "f"), b"v4").unwrap();
    assert_eq!(read_all(&t.p(1, "f")).unwrap(), b"v4", "shorter rewrite");

    // in-place overwrite of part of a larger file, then append
    let big = pattern(11, 0, 3 * 1024 * 1024);
    fs::write(t.p(0, "g"), &big).unwrap();
    assert_same_bytes(&read_all(&t.p(1, "g")).unwrap(), &big, 0, "c1 first read");
    let mut want = big.clone();
    {
        let h = fs::OpenOptions::new()
            .write(true)
            .open(t.p(0, "g"))
            .unwrap();
        let patch = pattern(12, 0, 100_000);
        h.write_all_at(&patch, 1_500_000).unwrap();
        want[1_500_000..1_600_000].copy_from_slice(&patch);
    }
    assert_same_bytes(
        &read_all(&t.p(1, "g")).unwrap(),
        &want,
        0,
        "c1 after overwrite",
    );
    {
        let mut h = fs::OpenOptions::new()
            .append(true)
            .open(t.p(0, "g"))
            .unwrap();
        h.write_all(b"appended").unwrap();
        want.extend_from_slice(b"appended");
    }
    assert_same_bytes(
        &read_all(&t.p(1, "g")).unwrap(),
        &want,
        0,
        "c1 after append",
    );

    // and back from c1 to c0
    fs::write(t.p(1, "f"), b"from c1").unwrap();
    assert_eq!(read_all(&t.p(0, "f")).unwrap(), b"from c1", "c1 -> c0");
}

#[test]
fn truncate_on_one_client_seen_on_open_by_another() {
    let t = TestFs::new(2);
    let data = pattern(13, 0, 2 * 1024 * 1024);
    fs::write(t.p(0, "f"), &data).unwrap();
    assert_same_bytes(&read_all(&t.p(1, "f")).unwrap(), &data, 0, "c1 first read");
    fs::OpenOptions::new()
        .write(true)
        .open(t.p(0, "f"))
        .unwrap()
        .set_len(1000)
        .unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(t.p(0, "f"))
        .unwrap()
        .write_all_at(b"x", 5000)
        .unwrap();
    let got = read_all(&t.p(1, "f")).unwrap();
    let mut want = data[..1000].to_vec();
    want.resize(5000, 0);
    want.push(b'x');
    assert_same_bytes(&got, &want, 0, "c1 after truncate+write on c0");
}

/// Two clients: `a`, whose kernel keeps names and attributes for 600 s and which does not
/// follow the others' changes (so only what its own requests do can correct its kernel), and
/// `b`, as mounted by default. Returns the filesystem and their client numbers.
fn a_slow_to_learn_and_b() -> (TestFs, usize, usize) {
    let mut t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    let a = t.mount_with(&ClientOpts {
        name: "a".into(),
        attr_ttl: Some(600.0),
        config: Some("follow_changes = false\n".into()),
        ..ClientOpts::default()
    });
    let b = t.mount_with(&ClientOpts {
        name: "b".into(),
        ..ClientOpts::default()
    });
    (t, a, b)
}

/// Another client's commit landing between this client's last look at a file and its own
/// commit of it: the own commit's answer holds the other's change (its size too), which this
/// client's kernel never saw. The next open here must drop the kernel's size and pages though
/// the data version it finds is the one this client's commit made. (IOR "hard" in CI: this
/// client's read past the end it had written itself came back empty.) `a` neither follows the
/// others' changes nor lets its kernel's attributes expire during the test, so only the open
/// can make it right.
#[test]
fn a_commit_over_another_clients_change_does_not_keep_the_kernels_cache() {
    let (t, a, b) = a_slow_to_learn_and_b();

    // The size: a's kernel takes 100 (a's buffered write) for 600 s, b extends the file to
    // 1100, a's close commits on top of b's change.
    let ours = pattern(21, 0, 100);
    let theirs = pattern(22, 1000, 100);
    {
        let h = fs::File::create(t.p(a, "f")).unwrap();
        h.write_all_at(&ours, 0).unwrap();
        assert_eq!(h.metadata().unwrap().len(), 100);
        fs::OpenOptions::new()
            .write(true)
            .open(t.p(b, "f"))
            .unwrap()
            .write_all_at(&theirs, 1000)
            .unwrap();
    }
    let mut want = ours.clone();
    want.resize(1000, 0);
    want.extend_from_slice(&theirs);
    assert_same_bytes(
        &read_all(&t.p(a, "f")).unwrap(),
        &want,
        0,
        "a after its own close",
    );

    // The pages: a reads a file through a handle it keeps, b rewrites its first page, a writes
    // elsewhere through the kept handle and closes it.
    let old = pattern(23, 0, 12288);
    fs::write(t.p(a, "g"), &old).unwrap();
    let h = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.p(a, "g"))
        .unwrap();
    assert_same_bytes(
        &pread_exact(&h, 0, 12288).unwrap(),
        &old,
        0,
        "a's first read",
    );
    let page = pattern(24, 0, 4096);
    fs::OpenOptions::new()
        .write(true)
        .open(t.p(b, "g"))
        .unwrap()
        .write_all_at(&page, 0)
        .unwrap();
    let tail = pattern(25, 8192, 100);
    h.write_all_at(&tail, 8192).unwrap();
    drop(h);
    let mut want = old;
    want[..4096].copy_from_slice(&page);
    want[8192..8292].copy_from_slice(&tail);
    assert_same_bytes(
        &read_all(&t.p(a, "g")).unwrap(),
        &want,
        0,
        "a after its own close",
    );
}

/// IOR "hard": every client writes 47008-byte transfers into one shared file, interleaved
/// (transfer k of client r at offset (k * clients + r) * 47008), so neighbouring transfers from
/// different clients share every 1 MiB block boundary.
fn ior_hard(writers: usize, transfers: usize, lockstep: bool) {
    const XFER: usize = 47008;
    let t = TestFs::with(Opts {
        clients: writers + 1,
        timeout: Duration::from_secs(300),
        ..Opts::default()
    });
    fs::File::create(t.p(0, "shared")).unwrap();
    let seed = 0x10_5eed;
    let barrier = Arc::new(Barrier::new(writers));
    thread::scope(|s| {
        for r in 0..writers {
            let path = t.p(r, "shared");
            let barrier = barrier.clone();
            s.spawn(move || {
                let h = fs::OpenOptions::new().write(true).open(&path).unwrap();
                barrier.wait();
                for k in 0..transfers {
                    let off = ((k * writers + r) * XFER) as u64;
                    let buf = pattern(seed, off, XFER);
                    h.write_all_at(&buf, off)
                        .unwrap_or_else(|e| panic!("c{r} write at {off}: {e}"));
                    if lockstep {
                        barrier.wait();
                    }
                }
                h.sync_all().unwrap_or_else(|e| panic!("c{r} fsync: {e}"));
                drop(h);
            });
        }
    });
    let size = (transfers * writers * XFER) as u64;
    let want = pattern(seed, 0, size as usize);
    // the reader client opens after all writers closed; then every writer re-reads too
    for c in std::iter::once(writers).chain(0..writers) {
        let got = read_all(&t.p(c, "shared")).unwrap();
        assert_eq!(got.len() as u64, size, "c{c}: file size");
        if got != want {
            // name the lost transfers for the report
            let mut lost = Vec::new();
            for k in 0..transfers * writers {
                let r = k * XFER..(k + 1) * XFER;
                if got[r.clone()] != want[r] {
                    lost.push(format!("#{k} (c{} @{})", k % writers, k * XFER));
                }
            }
            panic!(
                "c{c}: {} of {} transfers differ: {}",
                lost.len(),
                transfers * writers,
                lost.iter().take(20).cloned().collect::<Vec<_>>().join(", ")
            );
        }
    }
}

#[test]
fn shared_file_ior_hard_3_clients_lockstep() {
    ior_hard(3, 40, true);
}

#[test]
fn shared_file_ior_hard_3_clients_free_running() {
    ior_hard(3, 40, false);
}

#[test]
fn shared_file_small_disjoint_writes_in_one_block() {
    // two clients writing alternate 512-byte pieces of the same 64 KiB region
    let t = TestFs::new(3);
    fs::write(t.p(0, "f"), vec![0u8; 1 << 20]).unwrap();
    let seed = 77;
    thread::scope(|s| {
        for r in 0..2usize {
            let path = t.p(r, "f");
            s.spawn(move || {
                let h = fs::OpenOptions::new().write(true).open(&path).unwrap();
                for k in 0..64usize {
                    let off = (1 << 19) + ((2 * k + r) * 512) as u64;
                    h.write_all_at(&pattern(seed, off, 512), off).unwrap();
                }
            });
        }
    });
    let got = read_all(&t.p(2, "f")).unwrap();
    let mut want = vec![0u8; 1 << 20];
    let lo = 1 << 19;
    fill_pattern(seed, lo as u64, &mut want[lo..lo + 64 * 1024]);
    assert_same_bytes(&got, &want, 0, "c2 reading both writers' pieces");
}

#[test]
fn status_lists_mounted_clients() {
    let mut t = TestFs::new(3);
    let out = t.tierfs(&["status", "--meta", &t.meta_url()]);
    out.assert_ok();
    let toks = tokens(&out.stdout);
    for c in ["c0", "c1", "c2"] {
        assert!(
            toks.iter().any(|x| x == c),
            "status does not list client {c}:\n{}",
            out.stdout
        );
    }
    t.umount(1);
    let mut last = String::new();
    let gone = wait_until(Duration::from_secs(10), || {
        let out = t.tierfs(&["status", "--meta", &t.meta_url()]);
        last = out.stdout.clone();
        let toks = tokens(&out.stdout);
        out.ok() && !toks.iter().any(|x| x == "c1") && toks.iter().any(|x| x == "c0")
    });
    assert!(
        gone,
        "c1 still listed (or c0 missing) after its umount:\n{last}"
    );
    // and status by path works too
    let out = t.tierfs(&["status", &t.mnt(0).to_string_lossy()]);
    out.assert_ok();
    assert!(
        tokens(&out.stdout).iter().any(|x| x == "c2"),
        "{}",
        out.stdout
    );
}

#[test]
fn concurrent_creates_in_one_directory_from_three_clients() {
    const PER: usize = 300;
    let t = TestFs::with(Opts {
        clients: 3,
        timeout: Duration::from_secs(300),
        ..Opts::default()
    });
    fs::create_dir(t.p(0, "d")).unwrap();
    after_ttl(1.0);
    thread::scope(|s| {
        for c in 0..3usize {
            let d = t.p(c, "d");
            s.spawn(move || {
                for i in 0..PER {
                    let p = d.join(format!("c{c}-{i:04}"));
                    fs::write(&p, format!("{c}/{i}"))
                        .unwrap_or_else(|e| panic!("c{c} create {}: {e}", p.display()));
                }
            });
        }
    });
    after_ttl(1.0);
    for c in 0..3usize {
        let got = names(&t.p(c, "d"));
        assert_eq!(got.len(), 3 * PER, "c{c} lists {} entries", got.len());
    }
    for c in 0..3usize {
        for i in (0..PER).step_by(37) {
            let p = t.p((c + 1) % 3, &format!("d/c{c}-{i:04}"));
            assert_eq!(read_all(&p).unwrap(), format!("{c}/{i}").as_bytes());
        }
    }
}

#[test]
fn exclusive_create_race_has_one_winner() {
    const NAMES: usize = 50;
    let t = TestFs::new(3);
    let barrier = Arc::new(Barrier::new(3));
    let wins: Vec<Vec<usize>> = thread::scope(|s| {
        let hs: Vec<_> = (0..3usize)
            .map(|c| {
                let root = t.mnt(c).to_path_buf();
                let barrier = barrier.clone();
                s.spawn(move || {
                    let mut won = Vec::new();
                    for i in 0..NAMES {
                        barrier.wait();
                        let p = root.join(format!("x{i}"));
                        match fs::OpenOptions::new().write(true).create_new(true).open(&p) {
                            Ok(mut f) => {
                                f.write_all(format!("c{c}").as_bytes()).unwrap();
                                won.push(i);
                            }
                            Err(e) => assert_eq!(
                                err_of(&e),
                                libc::EEXIST,
                                "c{c} O_EXCL on x{i}: want EEXIST, got {e}"
                            ),
                        }
                        let d = root.join(format!("dir{i}"));
                        if let Err(e) = fs::create_dir(&d) {
                            assert_eq!(err_of(&e), libc::EEXIST, "c{c} mkdir dir{i}: {e}");
                        }
                    }
                    won
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for i in 0..NAMES {
        let winners: Vec<usize> = (0..3).filter(|c| wins[*c].contains(&i)).collect();
        assert_eq!(winners.len(), 1, "x{i}: O_EXCL winners {winners:?}");
        let body = read_all(&t.p(0, &format!("x{i}"))).unwrap();
        assert_eq!(body, format!("c{}", winners[0]).as_bytes(), "x{i} content");
    }
}

#[test]
fn rename_replace_is_atomic_for_readers_on_another_client() {
    // the config-file pattern: write a temp file, rename it over the live name
    const ROUNDS: usize = 100;
    let t = TestFs::new(2);
    let body = |i: usize| format!("version {i:06} ").repeat(500);
    fs::write(t.p(0, "live"), body(0)).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            for i in 1..=ROUNDS {
                let tmp = t.p(0, &format!("tmp{i}"));
                fs::write(&tmp, body(i)).unwrap();
                fs::rename(&tmp, t.p(0, "live")).unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let reader = s.spawn(|| {
            let mut reads = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let got = read_all(&t.p(1, "live"))
                    .unwrap_or_else(|e| panic!("c1 read of the live name failed: {e}"));
                let text = String::from_utf8_lossy(&got).into_owned();
                let first = text.get(..15).unwrap_or("").to_string();
                assert!(
                    !text.is_empty() && text == first.repeat(500),
                    "c1 read a torn or mixed version ({} bytes, starts {first:?})",
                    got.len()
                );
                reads += 1;
            }
            reads
        });
        let reads = reader.join().unwrap();
        assert!(reads > 0);
    });
    after_ttl(1.0);
    assert_eq!(read_all(&t.p(1, "live")).unwrap(), body(ROUNDS).as_bytes());
}

#[test]
fn permission_change_on_one_client_enforced_on_another() {
    let t = TestFs::with(Opts {
        clients: 2,
        attr_ttl: Some(TTL),
        ..Opts::default()
    });
    fs::write(t.p(0, "f"), b"secret").unwrap();
    let c = cstr(&t.p(0, "f"));
    io_res(unsafe { libc::chmod(c.as_ptr(), 0o644) }).unwrap();
    let p1 = t.p(1, "f");
    let p = p1.clone();
    as_user(&Cred::new(1000, 1000), move || {
        assert_eq!(read_all(&p).unwrap(), b"secret", "0644 readable on c1");
    });
    io_res(unsafe { libc::chmod(c.as_ptr(), 0o600) }).unwrap();
    after_ttl(TTL);
    let p = p1.clone();
    as_user(&Cred::new(1000, 1000), move || {
        let r = fs::File::open(&p);
        assert!(
            matches!(&r, Err(e) if err_of(e) == libc::EACCES),
            "c1 still lets uid 1000 open after chmod 0600 on c0: {r:?}"
        );
    });
}

/// A directory removed and made again on another client while this client's kernel still
/// holds the old one's entry (a long TTL, and this client does not follow the others'
/// changes): the lookup under the old directory answers ESTALE, not "no such name", so the
/// kernel walks the path again and finds the new directory's file.
#[test]
fn a_path_through_a_directory_remade_elsewhere_finds_the_new_one() {
    let (t, a, b) = a_slow_to_learn_and_b();
    fs::create_dir(t.p(a, "d")).unwrap();
    fs::write(t.p(a, "d/old"), b"old").unwrap();
    let old = stat(&t.p(a, "d")).unwrap().st_ino;
    // b replaces the directory
    fs::remove_dir_all(t.p(b, "d")).unwrap();
    fs::create_dir(t.p(b, "d")).unwrap();
    fs::write(t.p(b, "d/new"), b"new").unwrap();
    assert_ne!(stat(&t.p(b, "d")).unwrap().st_ino, old);
    // a's kernel still has the old directory's entry (600 s) ...
    assert_eq!(lstat(&t.p(a, "d")).unwrap().st_ino, old);
    // ... yet a name under it is looked up in the new one
    assert_eq!(read_all(&t.p(a, "d/new")).unwrap(), b"new");
    assert_ne!(stat(&t.p(a, "d")).unwrap().st_ino, old);
}

/// Two clients with `attr_ttl` [`TTL`] and the kernel's writeback cache off (its SETATTRs of
/// mtime and ctime never wait), so a setattr of a file being written may wait for the commit.
fn two_without_writeback_cache() -> TestFs {
    let mut t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    for name in ["c0", "c1"] {
        t.mount_with(&ClientOpts {
            name: name.into(),
            attr_ttl: Some(TTL),
            config: Some("writeback_cache = false\n".into()),
            ..Default::default()
        });
    }
    t
}

fn deferred(t: &TestFs, i: usize) -> u64 {
    stat_value(t.mnt(i), "tierfs_setattrs_deferred_total")
}

/// tar's futimens, fchown and fchmod, and `cp -a`'s times and ACL, come while the file's data is
/// buffered on the writing client; they wait for its commit (docs/semantics.md, "Attribute
/// changes of a file being written"). The other client sees each file whole after the TTL:
/// data, mode, owner and mtime as in the source.
#[test]
fn tar_cp_a_and_rsync_attributes_reach_another_client_with_the_data() {
    let t = two_without_writeback_cache();
    let src = t.root().join("src");
    fs::create_dir(&src).unwrap();
    let files: [(&str, u32, u32, u32, i64); 3] = [
        ("plain", 0o644, 0, 0, 1_000_000_000),
        ("script", 0o755, 0, 0, 1_100_000_000),
        ("owned", 0o640, 1234, 5678, 1_200_000_000),
    ];
    for (name, mode, uid, gid, mtime) in files {
        let p = src.join(name);
        fs::write(&p, format!("contents of {name}\n").repeat(100)).unwrap();
        let c = cstr(&p);
        io_res(unsafe { libc::chown(c.as_ptr(), uid, gid) }).unwrap();
        io_res(unsafe { libc::chmod(c.as_ptr(), mode) }).unwrap();
        let times = [
            libc::timespec {
                tv_sec: mtime,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: mtime,
                tv_nsec: 0,
            },
        ];
        io_res(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) }).unwrap();
    }
    let tarball = t.root().join("src.tar");
    let ok = Command::new("tar")
        .arg("cf")
        .arg(&tarball)
        .arg("-C")
        .arg(t.root())
        .arg("src")
        .status()
        .unwrap()
        .success();
    assert!(ok, "tar cf");
    let before = deferred(&t, 0);
    let ok = Command::new("tar")
        .arg("xf")
        .arg(&tarball)
        .current_dir(t.mnt(0))
        .status()
        .unwrap()
        .success();
    assert!(ok, "tar xf into c0");
    let after_tar = deferred(&t, 0);
    assert!(
        after_tar >= before + 3 * files.len() as u64,
        "tar's futimens, fchown and fchmod of each file waited for its commit: {} of {}",
        after_tar - before,
        3 * files.len()
    );
    let ok = Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(t.p(0, "copy"))
        .status()
        .unwrap()
        .success();
    assert!(ok, "cp -a into c0");
    let after_cp = deferred(&t, 0);
    assert!(
        after_cp > after_tar,
        "cp -a's times or ACL waited for the commit of its copy"
    );
    // rsync: create O_EXCL 0600, fchmod 0600 (nothing written yet: waits for the close of the
    // handle open for writing), write, close, then times and mode after the close, rename.
    let ok = Command::new("rsync")
        .arg("-a")
        .arg(format!("{}/", src.display()))
        .arg(t.p(0, "synced"))
        .status()
        .unwrap()
        .success();
    assert!(ok, "rsync -a into c0");
    assert!(
        deferred(&t, 0) >= after_cp + files.len() as u64,
        "rsync's fchmod after its create waited for its writer's close: {} of {}",
        deferred(&t, 0) - after_cp,
        files.len()
    );
    after_ttl(TTL);
    for dir in ["src", "copy", "synced"] {
        for (name, mode, uid, gid, mtime) in files {
            let p = t.p(1, &format!("{dir}/{name}"));
            let st = stat(&p).unwrap();
            assert_eq!(
                (st.st_mode & 0o7777, st.st_uid, st.st_gid, st.st_mtime),
                (mode, uid, gid, mtime),
                "{dir}/{name} as c1 sees it"
            );
            assert_eq!(
                read_all(&p).unwrap(),
                format!("contents of {name}\n").repeat(100).into_bytes(),
                "{dir}/{name} read on c1"
            );
        }
    }
}

/// The writing client shows a waiting change at once; a change that takes permissions away
/// never waits: another client enforces it within the TTL while the writer still has the file
/// open with its data buffered.
#[test]
fn a_file_being_written_shows_its_changes_here_and_takes_permissions_away_at_once() {
    let t = two_without_writeback_cache();
    let p0 = t.p(0, "f");
    let f = fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&p0)
        .unwrap();
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    (&f).write_all(b"first").unwrap();
    let before = deferred(&t, 0);
    io_res(unsafe { libc::fchmod(fd, 0o644) }).unwrap();
    io_res(unsafe { libc::fchown(fd, 0, 0) }).unwrap();
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: 1_234_567_890,
            tv_nsec: 0,
        },
    ];
    io_res(unsafe { libc::futimens(fd, times.as_ptr()) }).unwrap();
    assert_eq!(deferred(&t, 0), before + 3, "all three waited");
    let st = stat(&p0).unwrap();
    assert_eq!((st.st_mode & 0o7777, st.st_mtime), (0o644, 1_234_567_890));
    // Past the TTL, this client's kernel asks again: still shown.
    after_ttl(TTL);
    let st = stat(&p0).unwrap();
    assert_eq!((st.st_mode & 0o7777, st.st_mtime), (0o644, 1_234_567_890));
    assert_eq!(st.st_size, 5);

    // Taking read away from others does not wait for the data.
    (&f).write_all(b" second").unwrap();
    io_res(unsafe { libc::fchmod(fd, 0o600) }).unwrap();
    assert_eq!(deferred(&t, 0), before + 3, "the chmod 0600 went at once");
    after_ttl(TTL);
    let p1 = t.p(1, "f");
    as_user(&Cred::new(1000, 1000), move || {
        let r = fs::File::open(&p1);
        assert!(
            matches!(&r, Err(e) if err_of(e) == libc::EACCES),
            "c1 lets uid 1000 open a file made 0600 on c0 (still open there): {r:?}"
        );
    });
    drop(f);
    after_ttl(TTL);
    let st = stat(&t.p(1, "f")).unwrap();
    assert_eq!(st.st_mode & 0o7777, 0o600);
    assert!(
        st.st_mtime > 1_234_567_890,
        "the later write moved the mtime"
    );
    assert_eq!(read_all(&t.p(1, "f")).unwrap(), b"first second");
}

/// A change kept for the commit of a file's buffered writes on one client gives way to a
/// change another client made after it: the other client's chmod 0640, made while c0 still had
/// its chmod 0644 waiting, is the file's mode after c0's close on both clients (before, c0's
/// commit applied its older 0644 over it, giving back the read the newer chmod took away).
#[test]
fn a_waiting_change_gives_way_to_a_newer_one_made_on_another_client() {
    let t = two_without_writeback_cache();
    let p0 = t.p(0, "f");
    let f = fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&p0)
        .unwrap();
    use std::os::fd::AsRawFd;
    (&f).write_all(b"data").unwrap();
    let before = deferred(&t, 0);
    io_res(unsafe { libc::fchmod(f.as_raw_fd(), 0o644) }).unwrap();
    assert_eq!(deferred(&t, 0), before + 1, "the chmod 0644 waited");
    fs::set_permissions(t.p(1, "f"), fs::Permissions::from_mode(0o640)).unwrap();
    drop(f);
    after_ttl(TTL);
    for c in 0..2 {
        let st = stat(&t.p(c, "f")).unwrap();
        assert_eq!(
            (st.st_mode & 0o7777, st.st_size),
            (0o640, 4),
            "client {c}: the newer chmod stays, the data landed"
        );
    }
    as_user(&Cred::new(1000, 1000), {
        let p1 = t.p(1, "f");
        move || {
            let r = fs::File::open(&p1);
            assert!(
                matches!(&r, Err(e) if err_of(e) == libc::EACCES),
                "uid 1000 opens the file c1 made 0640: {r:?}"
            );
        }
    });
}

fn opens_queued(t: &TestFs, i: usize) -> u64 {
    stat_value(t.mnt(i), "tierfs_opens_queued_total")
}

/// A read-only open is answered before its record reaches the engine (with the client's next
/// batch of closes; here held back for 30 s). Another client unlinks the file in between: the
/// reader still stats and reads it through its open (its getattr finds the file gone, records
/// the queued open, which keeps the file, and asks again), after the purge's grace too.
#[test]
fn a_read_only_open_recorded_later_keeps_a_file_another_client_unlinks() {
    let mut t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    // c0 records its opens and closes every 30 s; c1 as usual (its writer's close must land
    // before its unlink, or the unlink finds the file open and keeps it anyway)
    for (name, env) in [("c0", "30000"), ("c1", "")] {
        t.mount_env = if env.is_empty() {
            Vec::new()
        } else {
            vec![("TIERFS_TEST_CLOSE_INTERVAL_MS".into(), env.into())]
        };
        t.mount_with(&ClientOpts {
            name: name.into(),
            attr_ttl: Some(TTL),
            ..Default::default()
        });
    }
    let data = b"kept for the open reader\n".repeat(1000);
    fs::write(t.p(1, "f"), &data).unwrap();
    // (c1's close recorded: its batch every 50 ms)
    thread::sleep(Duration::from_millis(300));
    after_ttl(TTL);
    let before = opens_queued(&t, 0);
    let f = fs::File::open(t.p(0, "f")).unwrap();
    assert_eq!(opens_queued(&t, 0), before + 1, "the open was queued");
    fs::remove_file(t.p(1, "f")).unwrap();
    // past the TTL: the kernel asks the daemon, which finds the file gone until it records
    // the open
    after_ttl(TTL);
    assert_eq!(f.metadata().unwrap().len(), data.len() as u64);
    let mut got = vec![0; data.len()];
    f.read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, data);
    // past the purge's grace (tierfs_meta::UNLINK_GRACE, 5 s) and its next pass
    thread::sleep(Duration::from_secs(7));
    let mut again = vec![0; data.len()];
    f.read_exact_at(&mut again, 0).unwrap();
    assert_eq!(again, data, "read after the purge's grace");
    assert!(!t.p(0, "f").exists() && !t.p(1, "f").exists());
    drop(f);
}
