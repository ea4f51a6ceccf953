//! Directory listings (issue 14): READDIRPLUS gives names and attributes in one round trip;
//! what `ls -l` shows must be what `stat` of each entry shows, changes made on another client
//! must show within the documented TTL, and a listing of a large directory that changes while
//! it is read must give each stable entry exactly once.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const TTL: f64 = 0.5;
/// Scheduling slack on top of the TTL before a change must be visible.
const SLACK: Duration = Duration::from_millis(700);

/// `ls -ln` of `dir` as name → (mode string, links, uid, gid, size, mtime in seconds).
fn ls_ln(dir: &Path) -> BTreeMap<String, (String, u64, u32, u32, u64, i64)> {
    let out = Command::new("ls")
        .args(["-lna", "--time-style=+%s"])
        .arg(dir)
        .env("LC_ALL", "C")
        .output()
        .expect("ls");
    assert!(out.status.success(), "ls -l {dir:?}: {out:?}");
    let mut m = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // mode links uid gid size mtime name [-> target]
        let name = f[6].to_string();
        if name == "." || name == ".." {
            continue;
        }
        let v = (
            f[0].trim_end_matches(['+', '.']).to_string(),
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
            f[4].parse().unwrap(),
            f[5].parse().unwrap(),
        );
        m.insert(name, v);
    }
    m
}

/// What `ls -ln` prints for `p`, from `lstat`.
fn as_ls(p: &Path) -> (String, u64, u32, u32, u64, i64) {
    let md = fs::symlink_metadata(p).unwrap();
    let mode = md.mode();
    let kind = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFIFO => 'p',
        _ => '-',
    };
    let mut s = String::from(kind);
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        let bit = 0o400 >> i;
        s.push(if mode & bit != 0 { c } else { '-' });
    }
    let mut b: Vec<char> = s.chars().collect();
    for (special, at, on_x, on_no_x) in [
        (libc::S_ISUID, 3, 's', 'S'),
        (libc::S_ISGID, 6, 's', 'S'),
        (libc::S_ISVTX, 9, 't', 'T'),
    ] {
        if mode & special != 0 {
            b[at] = if b[at] == 'x' || b[at] == 's' || b[at] == 't' {
                on_x
            } else {
                on_no_x
            };
        }
    }
    (
        b.into_iter().collect(),
        md.nlink(),
        md.uid(),
        md.gid(),
        md.size(),
        md.mtime(),
    )
}

fn make_tree(d: &Path, n: usize) {
    fs::create_dir(d).unwrap();
    for i in 0..n {
        let p = d.join(format!("f{i:05}"));
        fs::write(&p, vec![b'x'; i % 3000]).unwrap();
        let c = cstr(&p);
        io_res(unsafe { libc::chmod(c.as_ptr(), 0o600 + (i as u32 % 0o100)) }).unwrap();
        if i % 7 == 0 {
            io_res(unsafe { libc::chown(c.as_ptr(), 1000 + i as u32, 2000 + i as u32) }).unwrap();
        }
    }
    fs::create_dir(d.join("sub")).unwrap();
    fs::create_dir(d.join("sub/inner")).unwrap();
    std::os::unix::fs::symlink("f00001", d.join("link")).unwrap();
    fs::hard_link(d.join("f00002"), d.join("hard")).unwrap();
    let c = cstr(&d.join("f00003"));
    io_res(unsafe { libc::chmod(c.as_ptr(), 0o4755) }).unwrap();
}

#[test]
fn ls_l_shows_what_stat_of_each_entry_shows() {
    let t = TestFs::new(2);
    // More entries than one engine page (512) and one kernel reply buffer hold.
    make_tree(&t.p(0, "d"), 1300);
    // Client 1 has never looked at d: its `ls -l` is a cold listing.
    let (plus0, lookups0) = (
        fuse_ops(t.mnt(1), "readdirplus"),
        fuse_ops(t.mnt(1), "lookup"),
    );
    let listed = ls_ln(&t.p(1, "d"));
    let (plus1, lookups1) = (
        fuse_ops(t.mnt(1), "readdirplus"),
        fuse_ops(t.mnt(1), "lookup"),
    );
    assert_eq!(
        listed.len(),
        1303,
        "entries listed (1300 files, sub, link, hard)"
    );
    for (name, seen) in &listed {
        // client 0 made them: its stat is the truth
        assert_eq!(
            seen,
            &as_ls(&t.p(0, &format!("d/{name}"))),
            "ls -l of {name}"
        );
        // and client 1's own stat agrees with its listing
        assert_eq!(
            seen,
            &as_ls(&t.p(1, &format!("d/{name}"))),
            "stat of {name}"
        );
    }
    assert!(
        plus1 > plus0,
        "the kernel listed with READDIRPLUS ({plus0} -> {plus1} requests)"
    );
    // the names and attributes came with the listing, not with one LOOKUP per entry
    // (d itself is looked up, and ls may look up a few names again)
    assert!(
        lookups1 - lookups0 < 100,
        "{} LOOKUPs for an ls -l of 1303 entries",
        lookups1 - lookups0
    );
}

/// A listing asks the engine for pages of 512 entries and ends at the first short page:
/// directories of sizes around that boundary list every name once, with "." and "..", both
/// with READDIR (`ls -f`, no attributes) and READDIRPLUS (`ls -la`), and so does a directory
/// read again through the same open handle after a rewind.
#[test]
fn listings_end_at_page_boundaries() {
    let t = TestFs::new(1);
    for n in [0usize, 1, 511, 512, 513, 1024, 1025] {
        let d = t.p(0, &format!("d{n}"));
        fs::create_dir(&d).unwrap();
        for i in 0..n {
            fs::write(d.join(format!("f{i:05}")), b"").unwrap();
        }
        let mut want: Vec<String> = (0..n).map(|i| format!("f{i:05}")).collect();
        want.extend([".".to_string(), "..".to_string()]);
        want.sort();
        for args in [&["-1fa"][..], &["-1a", "--sort=none", "-l"][..]] {
            let out = Command::new("ls").args(args).arg(&d).output().unwrap();
            assert!(out.status.success(), "ls {args:?}");
            let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.starts_with("total "))
                .map(|l| l.rsplit(' ').next().unwrap().to_string())
                .collect();
            got.sort();
            assert_eq!(got, want, "ls {args:?} of a directory of {n} files");
        }
        // the same handle, read to its end twice (rewinddir between)
        let dir = cstr(&d);
        let dp = unsafe { libc::opendir(dir.as_ptr()) };
        assert!(!dp.is_null());
        for round in 0..2 {
            let mut count = 0;
            loop {
                let e = unsafe { libc::readdir(dp) };
                if e.is_null() {
                    break;
                }
                count += 1;
            }
            assert_eq!(count, n + 2, "round {round} of d{n} through one handle");
            unsafe { libc::rewinddir(dp) };
        }
        unsafe { libc::closedir(dp) };
    }
}

#[test]
fn listing_on_one_client_shows_changes_of_another_within_the_ttl() {
    let t = TestFs::with(Opts {
        clients: 2,
        attr_ttl: Some(TTL),
        ..Opts::default()
    });
    fs::create_dir(t.p(0, "d")).unwrap();
    for n in ["a", "b", "c", "u"] {
        fs::write(t.p(0, &format!("d/{n}")), b"12345").unwrap();
    }
    // client 1 lists (READDIRPLUS fills its caches with names and attributes)
    let before = ls_ln(&t.p(1, "d"));
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        ["a", "b", "c", "u"],
        "first listing"
    );
    assert!(fuse_ops(t.mnt(1), "readdirplus") > 0);
    // client 0: chmod, chown, a larger size, a rename, an unlink
    let a = cstr(&t.p(0, "d/a"));
    io_res(unsafe { libc::chmod(a.as_ptr(), 0o640) }).unwrap();
    io_res(unsafe { libc::chown(a.as_ptr(), 4321, 8765) }).unwrap();
    fs::write(t.p(0, "d/b"), vec![b'y'; 9000]).unwrap();
    fs::rename(t.p(0, "d/c"), t.p(0, "d/c2")).unwrap();
    fs::remove_file(t.p(0, "d/u")).unwrap();
    thread::sleep(Duration::from_secs_f64(TTL) + SLACK);
    let after = ls_ln(&t.p(1, "d"));
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        ["a", "b", "c2"],
        "rename and unlink on client 0, listed on client 1 after the TTL"
    );
    assert_eq!(
        (after["a"].0.as_str(), after["a"].2, after["a"].3),
        ("-rw-r-----", 4321, 8765),
        "chmod/chown on client 0, listed on client 1 after the TTL"
    );
    assert_eq!(after["b"].4, 9000, "new size, listed on client 1");
    for n in ["a", "b", "c2"] {
        assert_eq!(
            as_ls(&t.p(1, &format!("d/{n}"))),
            as_ls(&t.p(0, &format!("d/{n}"))),
            "stat of {n} on both clients"
        );
    }
    assert!(stat(&t.p(1, "d/u")).is_err() && stat(&t.p(1, "d/c")).is_err());
}

#[test]
fn listing_a_large_directory_while_it_changes_gives_each_stable_entry_once() {
    let t = TestFs::new(2);
    const STABLE: usize = 3000;
    let d = t.p(0, "d");
    fs::create_dir(&d).unwrap();
    for i in 0..STABLE {
        fs::write(d.join(format!("s{i:05}")), b"").unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    // churn: creates and unlinks of other names from both clients
    let churn: Vec<_> = (0..2)
        .map(|c| {
            let dir = t.p(c, "d");
            let stop = stop.clone();
            thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let p = dir.join(format!("t{c}-{i}"));
                    fs::write(&p, b"x").unwrap();
                    if i >= 20 {
                        let _ = fs::remove_file(dir.join(format!("t{c}-{}", i - 20)));
                    }
                    i += 1;
                }
                i
            })
        })
        .collect();
    let stable: BTreeSet<String> = (0..STABLE).map(|i| format!("s{i:05}")).collect();
    for round in 0..6 {
        // alternately the listing client's own view and the other client's
        let dir = t.p(round % 2, "d");
        let mut seen = BTreeSet::new();
        let mut dups = Vec::new();
        if round < 4 {
            for e in fs::read_dir(&dir).unwrap() {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                if !seen.insert(name.clone()) {
                    dups.push(name);
                }
            }
        } else {
            // ls -l: listing plus a stat of each name (READDIRPLUS when the kernel chooses it)
            let out = Command::new("ls")
                .args(["-1", "-l", "-a"])
                .arg(&dir)
                .env("LC_ALL", "C")
                .output()
                .unwrap();
            for line in String::from_utf8_lossy(&out.stdout).lines().skip(1) {
                let name = line.split_whitespace().last().unwrap_or("").to_string();
                if !seen.insert(name.clone()) {
                    dups.push(name);
                }
            }
        }
        assert!(dups.is_empty(), "round {round}: listed twice: {dups:?}");
        let missing: Vec<_> = stable.difference(&seen).take(10).collect();
        assert!(
            missing.is_empty(),
            "round {round}: stable entries missing: {missing:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for h in churn {
        let n = h.join().unwrap();
        assert!(n > 0, "the churn ran");
    }
}
