//! `tierfs gc` and `tierfs fsck` (issue 10): a client killed after uploading objects but before
//! their commit leaves leaked objects that gc removes (after its grace, and never while they
//! may still be committed); fsck reports missing objects by path, orphans and stale rows of
//! dead sessions in one table, repairs what it can, and exits 0 clean / 1 problems / 2 error.

mod common;

use common::*;
use std::fs;
use std::time::Duration;
use tierfs_meta::hsm::HsmFlags;

fn count_in(table: &str, kind: &str) -> u64 {
    table
        .lines()
        .find(|l| l.starts_with(kind))
        .and_then(|l| {
            l[kind.len()..]
                .split_whitespace()
                .find_map(|w| w.parse().ok())
        })
        .unwrap_or_else(|| panic!("no row {kind:?} in:\n{table}"))
}

#[test]
fn gc_reclaims_the_uploads_of_a_killed_client_and_fsck_reports_then_repairs() {
    if !Cluster::from_env().local_targets() {
        eprintln!("skipped: looks at target files directly");
        return;
    }
    let mut fs = TestFs::new(1);
    let meta = fs.meta_url();
    // Committed data, which must survive everything below.
    let keep = pattern(1, 0, 3 << 20);
    fs::write(fs.p(0, "kept"), &keep).unwrap();
    let committed = fs.total_target_usage();
    assert!(committed >= 3 << 20);
    // Full chunks are uploaded at once, committed only at close: kill the client in between.
    // The file is written and held open by a child process: a descriptor of this process would
    // be closed in the child of every other test's fork+exec, and each such close is a FUSE
    // flush that commits the file.
    // (Not a shell: a command writing through a redirection closes its descriptor at exit.)
    let mut holder = std::process::Command::new("python3")
        .args([
            "-c",
            "import os, sys, time\n\
             fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)\n\
             data = memoryview(os.urandom(4 << 20))\n\
             while data:\n    data = data[os.write(fd, data):]\n\
             time.sleep(600)\n",
        ])
        .arg(fs.p(0, "never-closed"))
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || fs.total_target_usage()
            >= committed + (3 << 20)),
        "the uploads of full chunks never reached the targets"
    );
    fs.kill9(0);
    let _ = holder.kill();
    let _ = holder.wait();
    let leaked = fs.total_target_usage() - committed;

    // While the uploads are younger than the grace they are in flight as far as anyone knows.
    let out = fs.tierfs(&["gc", "--meta", &meta]);
    out.assert_ok();
    assert!(
        out.stdout.contains("removed:         0"),
        "{}",
        out.describe()
    );
    assert_eq!(fs.total_target_usage(), committed + leaked);

    // fsck sees them as orphans once the grace is 0 (the killed client's process is gone, so
    // its session no longer protects them); exit 1.
    let out = fs.tierfs(&["fsck", "--meta", &meta, "--grace", "0"]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        count_in(&out.stdout, "orphan object") >= 3,
        "{}",
        out.stdout
    );
    assert_eq!(count_in(&out.stdout, "missing object"), 0, "{}", out.stdout);

    // A dry run lists and removes nothing.
    let out = fs.tierfs(&["gc", "--meta", &meta, "--grace", "0", "--dry-run"]);
    out.assert_ok();
    assert!(
        out.stdout.contains("would remove: target"),
        "{}",
        out.describe()
    );
    assert_eq!(fs.total_target_usage(), committed + leaked);

    let out = fs.tierfs(&["gc", "--meta", &meta, "--grace", "0"]);
    out.assert_ok();
    assert!(
        !out.stdout.contains("removed:         0"),
        "{}",
        out.describe()
    );
    assert_eq!(fs.total_target_usage(), committed, "{}", out.describe());

    // The dead session still holds its open of the file it never closed: reported once its
    // heartbeat is older than the timeout, repaired (the session goes), then clean.
    std::thread::sleep(Duration::from_millis(1500));
    let args = ["fsck", "--meta", &meta, "--session-timeout", "1s"];
    let out = fs.tierfs(&args);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert_eq!(
        count_in(&out.stdout, "open file of a dead session"),
        1,
        "{}",
        out.stdout
    );
    let mut repair = args.to_vec();
    repair.push("--repair");
    let out = fs.tierfs(&repair);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let out = fs.tierfs(&args);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.contains("clean"));

    // The acknowledged data is intact (the mount detaches the dead one first).
    fs.remount_with(
        0,
        &ClientOpts {
            name: "c0".into(),
            ..Default::default()
        },
    );
    assert_same_bytes(&fs::read(fs.p(0, "kept")).unwrap(), &keep, 0, "kept");
}

#[test]
fn fsck_names_the_files_of_missing_objects_and_leaves_foreign_names_alone() {
    if !Cluster::from_env().local_targets() {
        eprintln!("skipped: looks at target files directly");
        return;
    }
    let mut fs = TestFs::new(1);
    let meta = fs.meta_url();
    fs::create_dir(fs.p(0, "d")).unwrap();
    fs::write(fs.p(0, "d/lost"), pattern(3, 0, 2 << 20)).unwrap();
    fs.umount(0);
    // The target's identity marker (written by format, checked by fsck) and a foreign file
    // under objects/ are not objects.
    assert!(fs.target_dir(0).join(".tierfs-target").is_file());
    fs::create_dir_all(fs.target_dir(1).join("objects/0")).unwrap();
    fs::write(fs.target_dir(1).join("objects/0/README"), b"x").unwrap();
    let out = fs.tierfs(&["fsck", "--meta", &meta, "--grace", "0"]);
    assert_eq!(out.code, Some(0), "{}", out.describe());

    // Lose one object of the file.
    let mut objs = Vec::new();
    for t in 0..2 {
        let Ok(dirs) = fs::read_dir(fs.target_dir(t).join("objects")) else {
            continue;
        };
        for d in dirs {
            for f in fs::read_dir(d.unwrap().path()).unwrap() {
                let p = f.unwrap().path();
                if p.file_name().unwrap() != "README" {
                    objs.push(p);
                }
            }
        }
    }
    assert!(!objs.is_empty());
    fs::remove_file(&objs[0]).unwrap();
    let out = fs.tierfs(&["fsck", "--meta", &meta, "--grace", "0", "--repair"]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert_eq!(count_in(&out.stdout, "missing object"), 1, "{}", out.stdout);
    assert!(out.stdout.contains("/d/lost"), "{}", out.stdout);
    assert!(out.stderr.contains("data lost: /d/lost"), "{}", out.stderr);
    // Nothing to repair there: still reported, and the foreign names are still there.
    let out = fs.tierfs(&["fsck", "--meta", &meta, "--grace", "0"]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(fs.target_dir(0).join(".tierfs-target").exists());
    assert!(fs.target_dir(1).join("objects/0/README").exists());

    // Its own failure (no such database) exits 2, in one line.
    let bad = format!("sqlite://{}", fs.root().join("nope.db").display());
    let out = fs.tierfs(&["fsck", "--meta", &bad]);
    assert_eq!(out.code, Some(2), "{}", out.describe());
    out.assert_clean_error();
}

#[test]
fn gc_never_removes_uploads_a_running_client_may_still_commit() {
    if !Cluster::from_env().local_targets() {
        eprintln!("skipped: looks at target files directly");
        return;
    }
    let mut fs = TestFs::new(1);
    let meta = fs.meta_url();
    // The client takes object ids (1024 at a time) with its first upload.
    fs::write(fs.p(0, "first"), pattern(5, 0, 200 << 10)).unwrap();
    // An object of an upload that the running client has not committed yet (a file it keeps
    // open with a full chunk uploaded commits at its next flush, however late): planted, since
    // the kernel's timing decides when such a commit really happens.
    let dir = fs.target_dir(0).join("objects/0");
    fs::create_dir_all(&dir).unwrap();
    let planted = dir.join("900");
    fs::write(&planted, b"in flight").unwrap();
    for args in [
        vec!["gc", "--meta", &meta, "--grace", "0"],
        vec!["fsck", "--meta", &meta, "--grace", "0", "--repair"],
    ] {
        let out = fs.tierfs(&args);
        assert_eq!(out.code, Some(0), "{}", out.describe());
        assert!(planted.exists(), "{}", out.describe());
    }
    let out = fs.tierfs(&["gc", "--meta", &meta, "--grace", "0", "--dry-run"]);
    assert!(
        out.stdout
            .contains("kept:            1 (9B): written while a client still mounted was running"),
        "{}",
        out.describe()
    );
    // Once that client is gone, nobody can commit it: a leak.
    fs.umount(0);
    let out = fs.tierfs(&["gc", "--meta", &meta, "--grace", "0"]);
    out.assert_ok();
    assert!(!planted.exists(), "{}", out.describe());
    assert!(
        out.stdout.contains("removed:         1 (9B)"),
        "{}",
        out.describe()
    );
}

#[test]
fn gc_and_fsck_refuse_a_target_of_another_filesystem() {
    // Issue 10, item 3 with gc: a target swapped for another filesystem's holds objects this
    // filesystem never references; gc (and fsck --repair) would take them for orphans and
    // delete the other filesystem's data. They check each target's identity first.
    if !Cluster::from_env().local_targets() {
        eprintln!("skipped: swaps target directories");
        return;
    }
    let mut t = TestFs::new(1);
    for i in 0..4 {
        fs::write(t.p(0, &format!("a{i}")), pattern(10 + i, 0, 300 << 10)).unwrap();
    }
    t.umount(0);
    let r = t.root().to_path_buf();
    let other = format!("sqlite://{}", r.join("other.db").display());
    let b = |i: usize| format!("file://{}", r.join(format!("b{i}")).display());
    t.tierfs(&[
        "format",
        "--meta",
        &other,
        "--target",
        &b(0),
        "--target",
        &b(1),
    ])
    .assert_ok();
    let mnt = r.join("mnt-b");
    fs::create_dir(&mnt).unwrap();
    let m = mnt.to_string_lossy().to_string();
    t.tierfs(&["mount", "--meta", &other, &m, "--client-name", "b"])
        .assert_ok();
    for i in 0..4 {
        fs::write(mnt.join(format!("b{i}")), pattern(20 + i, 0, 300 << 10)).unwrap();
    }
    t.tierfs(&["umount", &m]).assert_ok();
    let b0 = r.join("b0");
    let theirs = dir_usage(&b0);
    assert!(theirs >= 300 << 10, "the other filesystem wrote to b0");
    // b0 takes the place of this filesystem's target 1
    fs::rename(t.target_dir(1), r.join("ost1.saved")).unwrap();
    fs::rename(&b0, t.target_dir(1)).unwrap();
    let meta = t.meta_url();
    for args in [
        vec!["gc", "--meta", &meta, "--grace", "0s"],
        vec!["fsck", "--meta", &meta, "--repair", "--grace", "0s"],
    ] {
        let out = t.tierfs(&args);
        out.assert_clean_error();
        assert!(
            out.stderr.contains("belongs to filesystem"),
            "{args:?}: {}",
            out.describe()
        );
        assert_eq!(
            dir_usage(&t.target_dir(1)),
            theirs,
            "{args:?} removed objects of another filesystem"
        );
    }
}

/// Whether the test can damage the filesystem's database by hand (SQLite, with the sqlite3
/// command); says why not when it cannot.
fn can_damage(meta: &str) -> bool {
    let can = meta.starts_with("sqlite://")
        && std::process::Command::new("sqlite3")
            .arg("-version")
            .output()
            .is_ok();
    if !can {
        eprintln!("skipped: damages the SQLite database with sqlite3");
    }
    can
}

/// Runs one statement on the filesystem's SQLite database (to make the damage fsck looks for).
fn sql(meta: &str, stmt: &str) {
    let db = meta.strip_prefix("sqlite://").unwrap();
    let out = std::process::Command::new("sqlite3")
        .args([db, stmt])
        .output()
        .expect("run sqlite3");
    assert!(
        out.status.success(),
        "{stmt}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// fsck's HSM checks (issue 13): files archived by a real `tierfs agent`, then each problem
/// made by hand in the database (or the archive), reported with what --repair does, repaired
/// where that is safe, and clean afterwards but for the released file whose copy is gone.
#[test]
fn fsck_checks_and_repairs_hsm_state() {
    let mut fs = TestFs::new(1);
    let meta = fs.meta_url();
    if !can_damage(&meta) {
        return;
    }
    let s = |p: std::path::PathBuf| p.to_string_lossy().into_owned();
    let archive = fs.root().join("a1");
    fs::create_dir(&archive).unwrap();
    let url = format!("file://{}", archive.display());
    let mnt = s(fs.mnt(0).to_path_buf());
    fs.tierfs(&["hsm", "archive-add", "1", &url, "--mount", &mnt])
        .assert_ok();
    for (i, n) in ["plain", "rel", "nocopy", "lostcopy", "relnocopy"]
        .iter()
        .enumerate()
    {
        fs::write(fs.p(0, n), pattern(i as u64, 0, 100_000)).unwrap();
    }
    let archived = ["rel", "nocopy", "lostcopy", "relnocopy"].map(|n| s(fs.p(0, n)));
    let mut args = vec!["hsm", "archive"];
    args.extend(archived.iter().map(String::as_str));
    fs.tierfs(&args).assert_ok();
    // (killed if the test fails before it is stopped)
    struct Agent(std::process::Child);
    impl Drop for Agent {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut agent = Agent(
        std::process::Command::new(BIN)
            .args(["agent", "--meta", &meta, "--archive", "1", "--poll", "0.1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let all_archived = wait_until(Duration::from_secs(30), || {
        archived
            .iter()
            .all(|p| fs.tierfs(&["hsm", "state", p]).stdout.contains(" archived"))
    });
    // SIGTERM: it unregisters, so none of its requests is left started
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let _ = agent.0.wait();
    assert!(all_archived, "the agent did not archive the files");
    for n in ["rel", "relnocopy"] {
        let p = s(fs.p(0, n));
        assert!(
            wait_until(Duration::from_secs(10), || fs
                .tierfs(&["hsm", "release", &p])
                .ok()),
            "release of {n}"
        );
    }
    let ino = |n: &str| {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(fs.p(0, n)).unwrap().ino()
    };
    let (plain, rel, nocopy, lostcopy, relnocopy) = (
        ino("plain"),
        ino("rel"),
        ino("nocopy"),
        ino("lostcopy"),
        ino("relnocopy"),
    );
    fs.umount(0);
    let out = fs.tierfs(&["fsck", "--meta", &meta, "--archives"]);
    assert_eq!(out.code, Some(0), "healthy HSM state: {}", out.describe());

    // The damage.
    sql(
        &meta,
        &format!("UPDATE inodes SET allocated = 4096 WHERE ino = {rel}"),
    );
    sql(
        &meta,
        &format!("DELETE FROM hsm_files WHERE ino IN ({nocopy}, {relnocopy})"),
    );
    sql(
        &meta,
        "INSERT INTO hsm_files (ino, archive_id, copy_key, data_version, size, checksum, archived_at) \
         VALUES (999999, 1, 'gone/copy', 1, 10, 'crc32:00000000', 0)",
    );
    let req = |ino: u64, action: i64, state: i64, agent: &str| {
        format!(
            "INSERT INTO hsm_requests (ino, action, archive_id, priority, state, agent, created, \
             updated) VALUES ({ino}, {action}, 1, 0, {state}, {agent}, 0, 0)"
        )
    };
    sql(&meta, &req(999998, 1, 0, "NULL"));
    sql(&meta, &req(plain, 1, 7, "NULL"));
    sql(&meta, &req(plain, 2, 0, "NULL"));
    sql(&meta, &req(plain, 1, 1, "4242"));
    let copy: String = fs::read_dir(&archive)
        .unwrap()
        .flat_map(|d| fs::read_dir(d.unwrap().path()).into_iter().flatten())
        .map(|f| f.unwrap().path())
        .find(|p| p.to_string_lossy().contains(&format!("{lostcopy:016x}")))
        .map(s)
        .unwrap_or_else(|| panic!("no copy of inode {lostcopy} under {}", archive.display()));
    fs::remove_file(&copy).unwrap();

    // Reported, each with what --repair would do; the archive only with --archives.
    let out = fs.tierfs(&["fsck", "--meta", &meta]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let t = &out.stdout;
    for (row, n) in [
        ("HSM: released file with data", 1),
        ("HSM: ARCHIVED flag without a copy", 1),
        ("HSM: released file without a copy", 1),
        ("HSM: copy of a file that is gone", 1),
        ("HSM: request of a file that is gone", 1),
        ("HSM: impossible request", 2),
        ("HSM: request held by a dead agent", 1),
        ("HSM: archive copy missing or bad size", 0),
    ] {
        assert_eq!(count_in(t, row), n, "{row}:\n{t}");
        if n > 0 {
            assert!(t.contains(&format!("{row}: --repair: ")), "{row}:\n{t}");
        }
    }
    let out = fs.tierfs(&["fsck", "--meta", &meta, "--archives"]);
    assert_eq!(
        count_in(&out.stdout, "HSM: archive copy missing or bad size"),
        1,
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("missing"), "{}", out.stdout);

    let out = fs.tierfs(&["fsck", "--meta", &meta, "--archives", "--repair"]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    // Afterwards only the released file whose copy is not recorded is left (its data is gone).
    let out = fs.tierfs(&["fsck", "--meta", &meta, "--archives"]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let t = &out.stdout;
    assert!(t.contains("1 problems found"), "{t}");
    assert_eq!(count_in(t, "HSM: released file without a copy"), 1, "{t}");

    let e = tierfs_meta::open_engine(&meta).unwrap();
    let flags = |ino| e.hsm_state(ino).unwrap().flags;
    assert!(flags(lostcopy).has(HsmFlags::LOST), "{}", flags(lostcopy));
    assert!(!flags(nocopy).archived(), "{}", flags(nocopy));
    let r = e.getattr(rel).unwrap();
    assert!(
        r.hsm.released() && r.hsm.archived() && r.allocated == 0,
        "{r:?}"
    );
    assert!(flags(relnocopy).released());
}

/// fsck compares each inode's recorded xattr count (schema v9, which clients trust to answer
/// getxattr without a read) with its xattrs, reports a difference either way by path, and
/// --repair recounts it; a healthy filesystem with xattrs is clean.
#[test]
fn fsck_checks_and_repairs_xattr_counts() {
    let mut fs = TestFs::new(1);
    let meta = fs.meta_url();
    if !can_damage(&meta) {
        return;
    }
    for n in ["hidden", "phantom", "fine"] {
        fs::write(fs.p(0, n), b"x").unwrap();
    }
    for (n, names) in [
        ("hidden", &["user.a", "user.b"][..]),
        ("fine", &["user.c"][..]),
    ] {
        let c = cstr(&fs.p(0, n));
        for name in names {
            let k = std::ffi::CString::new(*name).unwrap();
            // SAFETY: valid C strings and a buffer of the given length.
            io_res(unsafe { libc::setxattr(c.as_ptr(), k.as_ptr(), b"v".as_ptr().cast(), 1, 0) })
                .unwrap();
        }
    }
    let ino = |n: &str| {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(fs.p(0, n)).unwrap().ino()
    };
    let (hidden, phantom, fine) = (ino("hidden"), ino("phantom"), ino("fine"));
    fs.umount(0);
    let out = fs.tierfs(&["fsck", "--meta", &meta]);
    assert_eq!(
        out.code,
        Some(0),
        "healthy xattr counts: {}",
        out.describe()
    );

    // The damage: a count of 0 over two xattrs (they would be hidden), and a count over none.
    sql(
        &meta,
        &format!("UPDATE inodes SET xattr_count = 0 WHERE ino = {hidden}"),
    );
    sql(
        &meta,
        &format!("UPDATE inodes SET xattr_count = 3 WHERE ino = {phantom}"),
    );
    let out = fs.tierfs(&["fsck", "--meta", &meta]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let t = &out.stdout;
    assert_eq!(count_in(t, "xattr count differs from xattrs"), 2, "{t}");
    assert!(
        t.contains(&format!("/hidden (inode {hidden}): recorded 0, has 2")),
        "{t}"
    );

    let out = fs.tierfs(&["fsck", "--meta", &meta, "--repair"]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    // The row reads: kind, COUNT, BYTES, REPAIRED, example.
    let kind = "xattr count differs from xattrs";
    let line = out.stdout.lines().find(|l| l.starts_with(kind)).unwrap();
    assert_eq!(
        line[kind.len()..].split_whitespace().nth(2),
        Some("2"),
        "repaired count: {line}"
    );
    let out = fs.tierfs(&["fsck", "--meta", &meta]);
    assert_eq!(out.code, Some(0), "after --repair: {}", out.describe());
    let e = tierfs_meta::open_engine(&meta).unwrap();
    let counts: Vec<u32> = [hidden, phantom, fine]
        .iter()
        .map(|i| e.getattr(*i).unwrap().xattr_count)
        .collect();
    assert_eq!(counts, [2, 0, 1]);
}
