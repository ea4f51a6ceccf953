//! Bad input (issue 2, "Required behaviour 5"): one line on stderr, a non-zero exit, no panic,
//! and nothing damaged.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn bare() -> TestFs {
    TestFs::with(Opts {
        clients: 0,
        format: false,
        ..Opts::default()
    })
}

fn formatted() -> TestFs {
    TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    })
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn file_url(p: &Path) -> String {
    format!("file://{}", p.display())
}

#[track_caller]
fn assert_not_mounted(p: &Path) {
    assert!(
        !is_fuse_mounted(p),
        "{} is mounted after a failed command",
        p.display()
    );
}

#[test]
fn unknown_url_scheme() {
    let t = bare();
    let r = t.root();
    let ost = file_url(&r.join("ost0"));
    t.tierfs(&["format", "--meta", "foo:///x/meta.db", "--target", &ost])
        .assert_clean_error();
    t.tierfs(&["format", "--meta", "not a url", "--target", &ost])
        .assert_clean_error();
    t.tierfs(&[
        "format",
        "--meta",
        &t.meta_url(),
        "--target",
        "ftp://example.invalid/x",
    ])
    .assert_clean_error();
    assert!(
        !r.join("meta.db").exists()
            || t.tierfs(&["status", "--meta", &t.meta_url()]).code != Some(0),
        "a failed format must not leave a usable filesystem behind"
    );
    let mnt = r.join("mnt");
    fs::create_dir(&mnt).unwrap();
    t.tierfs(&["mount", "--meta", "bogus:///x", &s(&mnt)])
        .assert_clean_error();
    assert_not_mounted(&mnt);
    t.tierfs(&["status", "--meta", "nope://x"])
        .assert_clean_error();
}

#[test]
fn format_twice_without_force() {
    let mut t = formatted();
    let m = t.mount_client("c0", None);
    fs::write(t.p(m, "precious"), b"keep me").unwrap();
    t.umount(m);
    t.format(&[]).assert_clean_error();
    // the filesystem and its data are untouched
    let m = t.mount_client("c1", None);
    assert_eq!(read_all(&t.p(m, "precious")).unwrap(), b"keep me");
    t.umount(m);
    // with --force it is formatted anew
    t.format(&["--force"]).assert_ok();
    let m = t.mount_client("c2", None);
    assert!(
        !t.p(m, "precious").exists(),
        "--force gives an empty filesystem"
    );
}

#[test]
fn mount_unformatted_filesystem() {
    let t = bare();
    let mnt = t.root().join("mnt");
    fs::create_dir(&mnt).unwrap();
    t.tierfs(&["mount", "--meta", &t.meta_url(), &s(&mnt)])
        .assert_clean_error();
    assert_not_mounted(&mnt);
    // an empty database file is not a filesystem either
    fs::write(t.meta_path(), b"").unwrap();
    t.tierfs(&["mount", "--meta", &t.meta_url(), &s(&mnt)])
        .assert_clean_error();
    assert_not_mounted(&mnt);
    // nor is garbage
    fs::write(t.meta_path(), b"this is not sqlite").unwrap();
    t.tierfs(&["mount", "--meta", &t.meta_url(), &s(&mnt)])
        .assert_clean_error();
    assert_not_mounted(&mnt);
    t.tierfs(&["status", "--meta", &t.meta_url()])
        .assert_clean_error();
}

#[test]
fn target_that_cannot_be_created() {
    let t = bare();
    let file = t.root().join("plainfile");
    fs::write(&file, b"x").unwrap();
    let bad = file_url(&file.join("ost0"));
    let good = file_url(&t.root().join("ost1"));
    t.tierfs(&[
        "format",
        "--meta",
        &t.meta_url(),
        "--target",
        &good,
        "--target",
        &bad,
    ])
    .assert_clean_error();
    // no targets at all
    t.tierfs(&["format", "--meta", &t.meta_url()])
        .assert_clean_error();
}

#[test]
fn unwritable_target_as_non_root() {
    let t = bare();
    // a directory nobody may write to, and a meta directory that nobody may
    let locked = t.root().join("locked");
    fs::create_dir(&locked).unwrap();
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o755)).unwrap();
    let open = t.root().join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let meta = format!("sqlite://{}", open.join("meta.db").display());
    let nobody = Some((65534, 65534));
    let out = tierfs_as(
        &open,
        &[
            "format",
            "--meta",
            &meta,
            "--target",
            &file_url(&open.join("ost0")),
            "--target",
            &file_url(&locked),
        ],
        CMD_TIMEOUT,
        nobody,
    );
    out.assert_clean_error();
    // meta database in a directory we cannot write
    let out = tierfs_as(
        &open,
        &[
            "format",
            "--meta",
            &format!("sqlite://{}", locked.join("meta.db").display()),
            "--target",
            &file_url(&open.join("ost2")),
        ],
        CMD_TIMEOUT,
        nobody,
    );
    out.assert_clean_error();
}

#[test]
fn mount_with_missing_target() {
    let mut t = formatted();
    let m = t.mount_client("c0", None);
    fs::write(t.p(m, "f"), vec![7u8; 300_000]).unwrap();
    t.umount(m);
    fs::remove_dir_all(t.target_dir(1)).unwrap();
    let mnt = t.root().join("mnt-missing");
    fs::create_dir(&mnt).unwrap();
    t.tierfs(&["mount", "--meta", &t.meta_url(), &s(&mnt)])
        .assert_clean_error();
    assert_not_mounted(&mnt);
}

#[test]
fn missing_mount_point() {
    let t = formatted();
    let mnt = t.root().join("does/not/exist");
    t.tierfs(&["mount", "--meta", &t.meta_url(), &s(&mnt)])
        .assert_clean_error();
    // a regular file is not a mount point either
    let file = t.root().join("file");
    fs::write(&file, b"x").unwrap();
    t.tierfs(&["mount", "--meta", &t.meta_url(), &s(&file)])
        .assert_clean_error();
    assert_not_mounted(&file);
}

#[test]
fn mount_point_already_mounted() {
    let mut t = formatted();
    let m = t.mount_client("c0", None);
    let mnt = t.mnt(m).to_path_buf();
    let out = t.tierfs(&[
        "mount",
        "--meta",
        &t.meta_url(),
        &s(&mnt),
        "--client-name",
        "dup",
    ]);
    out.assert_clean_error();
    // exactly one mount there, and it still works
    let n = mounts().iter().filter(|(p, _)| *p == mnt).count();
    assert_eq!(n, 1, "mount table has {n} mounts on {}", mnt.display());
    fs::write(mnt.join("f"), b"still fine").unwrap();
    assert_eq!(read_all(&mnt.join("f")).unwrap(), b"still fine");
}

#[test]
fn invalid_stripe_count_and_size_at_format() {
    let t = bare();
    let base = |extra: &[&str]| {
        let mut a: Vec<String> = vec![
            "format".into(),
            "--meta".into(),
            t.meta_url(),
            "--target".into(),
            file_url(&t.target_dir(0)),
            "--target".into(),
            file_url(&t.target_dir(1)),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    for extra in [
        &["--stripe-count", "0"][..],
        &["--stripe-count", "abc"],
        &["--stripe-count", "-7"],
        &["--stripe-size", "0"],
        &["--stripe-size", "12Q"],
        &["--stripe-size", "-1M"],
        &["--stripe-size", "99999999999999999999"],
    ] {
        let out = t.tierfs(&base(extra));
        out.assert_clean_error();
    }
    // the filesystem can still be formatted properly afterwards
    t.tierfs(&base(&[])).assert_ok();
}

#[test]
fn invalid_setstripe() {
    let mut t = formatted();
    let m = t.mount_client("c0", None);
    let d = t.p(m, "d");
    fs::create_dir(&d).unwrap();
    let ds = s(&d);
    for args in [
        &["setstripe", "-c", "abc", "-S", "1M", &ds][..],
        &["setstripe", "-c", "2", "-S", "0", &ds],
        &["setstripe", "-c", "2", "-S", "lots", &ds],
        &["setstripe", "-c", "2", "-S", "-4M", &ds],
    ] {
        t.tierfs(args).assert_clean_error();
    }
    // setstripe / getstripe on paths outside tierfs or missing
    let outside = s(t.root());
    t.tierfs(&["setstripe", "-c", "1", "-S", "1M", &outside])
        .assert_clean_error();
    t.tierfs(&["getstripe", &s(&t.p(m, "missing"))])
        .assert_clean_error();
    t.tierfs(&["getstripe", &outside]).assert_clean_error();
    // the directory is still usable
    fs::write(d.join("f"), b"ok").unwrap();
}

#[test]
fn unknown_config_keys() {
    let t = formatted();
    let mnt = t.root().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let cfg = t.root().join("client.toml");
    fs::write(&cfg, "bogus_key = 1\n").unwrap();
    t.tierfs(&[
        "mount",
        "--meta",
        &t.meta_url(),
        &s(&mnt),
        "--config",
        &s(&cfg),
    ])
    .assert_clean_error();
    assert_not_mounted(&mnt);
    fs::write(&cfg, "[no-such-section]\nx = \"y\"\n").unwrap();
    t.tierfs(&[
        "mount",
        "--meta",
        &t.meta_url(),
        &s(&mnt),
        "--config",
        &s(&cfg),
    ])
    .assert_clean_error();
    assert_not_mounted(&mnt);
    fs::write(&cfg, "this is = = not toml [").unwrap();
    t.tierfs(&[
        "mount",
        "--meta",
        &t.meta_url(),
        &s(&mnt),
        "--config",
        &s(&cfg),
    ])
    .assert_clean_error();
    assert_not_mounted(&mnt);
    let missing = t.root().join("missing.toml");
    t.tierfs(&[
        "mount",
        "--meta",
        &t.meta_url(),
        &s(&mnt),
        "--config",
        &s(&missing),
    ])
    .assert_clean_error();
    assert_not_mounted(&mnt);
}

#[test]
fn bad_command_lines() {
    let t = bare();
    t.tierfs(&["frobnicate"]).assert_clean_error();
    t.tierfs(&["format"]).assert_clean_error();
    t.tierfs(&["mount", "--meta", &t.meta_url()])
        .assert_clean_error();
    t.tierfs(&["format", "--no-such-flag"]).assert_clean_error();
    let mnt = t.root().join("mnt");
    fs::create_dir(&mnt).unwrap();
    t.tierfs(&[
        "mount",
        "--meta",
        &t.meta_url(),
        &s(&mnt),
        "--attr-ttl",
        "soon",
    ])
    .assert_clean_error();
    t.tierfs(&["umount", &s(&mnt)]).assert_clean_error();
    t.tierfs(&["df", &s(&t.root().join("nowhere"))])
        .assert_clean_error();
    t.tierfs(&["stats", &s(&mnt)]).assert_clean_error();
    t.tierfs(&["project", "-p", "notanumber", &s(&mnt)])
        .assert_clean_error();
}

/// The `user.*` extended attributes of `p` (named ones only).
fn user_xattrs(p: &Path) -> Vec<String> {
    let c = cstr(p);
    let mut buf = vec![0u8; 4096];
    // SAFETY: a valid path and a buffer of the given length.
    let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "listxattr {}: errno {}", p.display(), errno());
    buf.truncate(n as usize);
    buf.split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .filter(|n| n.starts_with("user."))
        .collect()
}

#[test]
fn pcc_commands_on_a_file_outside_tierfs() {
    // Issue 10, item 9: `pcc attach -w` on a file of another filesystem succeeded and left a
    // `user.tierfs.pcc.attach` attribute on it.
    let t = bare();
    let f = t.root().join("not-tierfs.dat");
    fs::write(&f, b"local data").unwrap();
    for args in [
        vec!["pcc", "attach", "-w"],
        vec!["pcc", "attach", "-r"],
        vec!["pcc", "attach"],
        vec!["pcc", "detach"],
        vec!["pcc", "detach", "--keep"],
        vec!["pcc", "state"],
        vec!["pcc", "pin"],
        vec!["pcc", "unpin"],
    ] {
        let mut a: Vec<String> = args.iter().map(|x| x.to_string()).collect();
        a.push(s(&f));
        let out = t.tierfs(&a);
        out.assert_clean_error();
        assert!(
            out.stderr.contains("not in a tierfs mount") && out.stderr.contains(&s(&f)),
            "{args:?}: {}",
            out.describe()
        );
        assert_eq!(
            user_xattrs(&f),
            Vec::<String>::new(),
            "{args:?} left an attribute on a file outside tierfs"
        );
    }
    assert_eq!(fs::read(&f).unwrap(), b"local data");
}

/// `tierfs format` of a filesystem at `meta` on `targets`.
fn format_on(t: &TestFs, meta: &str, targets: &[String], extra: &[&str]) -> CmdOut {
    let mut a: Vec<String> = vec!["format".into(), "--meta".into(), meta.into()];
    for u in targets {
        a.push("--target".into());
        a.push(u.clone());
    }
    a.extend(extra.iter().map(|x| x.to_string()));
    t.tierfs(&a)
}

#[track_caller]
fn assert_error_says(out: &CmdOut, what: &str) {
    out.assert_clean_error();
    assert!(
        out.stderr.contains(what),
        "want {what:?}: {}",
        out.describe()
    );
}

#[test]
fn format_refuses_one_target_listed_twice() {
    // Issue 10, item 3: the same directory given twice was accepted, and both "targets" then
    // used the same object names.
    let t = bare();
    let r = t.root();
    let meta = t.meta_url();
    let sqlite = |name: &str| format!("sqlite://{}", r.join(name).display());
    fs::create_dir(r.join("ost0")).unwrap();
    std::os::unix::fs::symlink(r.join("ost0"), r.join("alias")).unwrap();
    let ost0 = file_url(&r.join("ost0"));
    for other in [
        ost0.clone(),
        format!("{ost0}/"),
        format!("{ost0}?capacity=1G"),
        file_url(&r.join("x/../ost0")),
        file_url(&r.join("./ost0/.")),
        file_url(&r.join("alias")),
    ] {
        let out = format_on(&t, &meta, &[ost0.clone(), other.clone()], &[]);
        assert_error_says(&out, "listed twice");
        let out = format_on(&t, &meta, &[ost0.clone(), other], &["--force"]);
        assert_error_says(&out, "listed twice");
    }
    // one inside the other (not created yet)
    let out = format_on(
        &t,
        &meta,
        &[file_url(&r.join("new")), file_url(&r.join("alias/sub"))],
        &[],
    );
    out.assert_ok();
    let out = format_on(
        &t,
        &sqlite("m2.db"),
        &[file_url(&r.join("o1")), file_url(&r.join("o1/inner"))],
        &[],
    );
    assert_error_says(&out, "overlap");
    // S3 spellings of one bucket and prefix (refused before any request is made)
    let out = format_on(
        &t,
        &sqlite("m3.db"),
        &[
            "s3://bkt/p/?endpoint=http://127.0.0.1:9".into(),
            "s3://bkt/p?endpoint=http://127.0.0.1:9/&region=x".into(),
        ],
        &[],
    );
    assert_error_says(&out, "listed twice");
    for m in ["m2.db", "m3.db"] {
        assert!(
            t.tierfs(&["status", "--meta", &sqlite(m)]).code != Some(0),
            "a refused format left a filesystem in {m}"
        );
    }
}

#[test]
fn format_refuses_a_target_of_another_filesystem() {
    // Issue 10, item 3: a target formatted for another filesystem that holds no objects yet
    // was accepted; both filesystems then used the same object names.
    let mut t = formatted();
    let r = t.root().to_path_buf();
    let other_meta = format!("sqlite://{}", r.join("other.db").display());
    let fresh = file_url(&r.join("fresh"));
    for force in [false, true] {
        let extra: &[&str] = if force { &["--force"] } else { &[] };
        let out = format_on(&t, &other_meta, &[fresh.clone(), t.target_url(1)], extra);
        assert_error_says(&out, "belongs to filesystem");
    }
    // nor was anything written: the other database is not formatted, `fresh` holds nothing
    assert!(t.tierfs(&["status", "--meta", &other_meta]).code != Some(0));
    assert!(
        fs::read_dir(r.join("fresh"))
            .map(|d| d.count() == 0)
            .unwrap_or(true),
        "a refused format wrote to another target"
    );
    // the first filesystem still works
    let m = t.mount_client("c0", None);
    fs::write(t.p(m, "f"), b"mine").unwrap();
    t.umount(m);
    // a directory holding other files is not a target either
    let busy = r.join("busy");
    fs::create_dir(&busy).unwrap();
    fs::write(busy.join("thesis.tex"), b"precious").unwrap();
    for force in [false, true] {
        let extra: &[&str] = if force { &["--force"] } else { &[] };
        let out = format_on(&t, &other_meta, &[file_url(&busy)], extra);
        assert_error_says(&out, "not empty");
    }
    assert_eq!(fs::read(busy.join("thesis.tex")).unwrap(), b"precious");
    // format --force of the filesystem's own database takes its own targets back
    t.format(&["--force"]).assert_ok();
    let m = t.mount_client("c1", None);
    assert!(!t.p(m, "f").exists());
}

#[test]
fn mount_refuses_a_target_of_another_filesystem() {
    // Issue 10, item 3: each mount checks that each target is the one it was formatted as.
    let t = formatted();
    if !t.cluster.local_targets() {
        return;
    }
    let r = t.root().to_path_buf();
    let other_meta = format!("sqlite://{}", r.join("other.db").display());
    let out = format_on(
        &t,
        &other_meta,
        &[file_url(&r.join("b0")), file_url(&r.join("b1"))],
        &[],
    );
    out.assert_ok();
    let mnt = r.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let mount = || {
        t.tierfs(&[
            "mount",
            "--meta",
            &t.meta_url(),
            &s(&mnt),
            "--client-name",
            "c0",
        ])
    };
    // target 1 of this filesystem replaced by target 0 of the other one
    fs::rename(t.target_dir(1), r.join("ost1.saved")).unwrap();
    fs::rename(r.join("b0"), t.target_dir(1)).unwrap();
    let out = mount();
    assert_error_says(&out, "belongs to filesystem");
    assert_not_mounted(&mnt);
    // the two targets of this filesystem swapped
    fs::rename(t.target_dir(1), r.join("b0")).unwrap();
    fs::rename(t.target_dir(0), t.target_dir(1).with_extension("tmp")).unwrap();
    fs::rename(r.join("ost1.saved"), t.target_dir(0)).unwrap();
    fs::rename(t.target_dir(1).with_extension("tmp"), t.target_dir(1)).unwrap();
    let out = mount();
    assert_error_says(&out, "targets swapped");
    assert_not_mounted(&mnt);
    // put back: mounts
    fs::rename(t.target_dir(0), r.join("tmp")).unwrap();
    fs::rename(t.target_dir(1), t.target_dir(0)).unwrap();
    fs::rename(r.join("tmp"), t.target_dir(1)).unwrap();
    mount().assert_ok();
    assert!(is_fuse_mounted(&mnt));
}

/// A database password in a URL on the command line (readable by every user in /proc, and
/// handed on to the mount daemon's own command line) is refused by every command that takes
/// `--meta`, and by the mount helper's source, with one line saying to use PGPASSWORD or
/// ~/.pgpass; the password itself is not echoed. Nothing is tried against the database (the
/// port here would only refuse), and nothing is mounted.
#[test]
fn passwords_on_the_command_line_are_refused() {
    let t = bare();
    let mnt = t.root().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let m = s(&mnt);
    let url = "postgres://tierfs:s3cretpw@127.0.0.1:1/tierfs";
    let query = "postgresql://tierfs@127.0.0.1:1/tierfs?password=s3cretpw";
    let cmds: Vec<Vec<String>> = vec![
        vec!["mount".into(), "--meta".into(), url.into(), m.clone()],
        vec!["mount".into(), format!("--meta={url}"), m.clone()],
        vec!["mount".into(), "--meta".into(), query.into(), m.clone()],
        vec![
            "format".into(),
            "--meta".into(),
            url.into(),
            "--target".into(),
            file_url(&t.root().join("ost0")),
        ],
        vec!["df".into(), "--meta".into(), url.into()],
        vec!["status".into(), "--meta".into(), url.into()],
        vec![
            "pcc".into(),
            "rule".into(),
            "list".into(),
            "--meta".into(),
            url.into(),
        ],
        vec!["mount-helper".into(), url.into(), m.clone()],
    ];
    for c in &cmds {
        let out = t.tierfs(c);
        out.assert_clean_error();
        let line = out.stderr.trim();
        assert!(
            line.contains("PGPASSWORD") && line.contains(".pgpass"),
            "{c:?}: {}",
            out.describe()
        );
        assert!(
            !line.contains("s3cretpw"),
            "{c:?} echoed the password: {line}"
        );
        assert_not_mounted(&mnt);
    }
    // without a password the same URL is tried (and fails to connect, not for the password)
    let out = t.tierfs(&["df", "--meta", "postgres://tierfs@127.0.0.1:1/tierfs"]);
    out.assert_clean_error();
    assert!(!out.stderr.contains("PGPASSWORD or"), "{}", out.describe());
}

/// The daemon's log file is opened without following a symbolic link planted at its path (in
/// /tmp, anyone can plant one) and is refused when another user owns it: `tierfs mount` fails
/// with one line and mounts nothing, and the link's target is untouched.
#[test]
fn planted_log_symlink_or_another_users_log_is_refused() {
    let t = formatted();
    let mnt = t.root().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let victim = t.root().join("victim");
    fs::write(&victim, b"precious\n").unwrap();
    let link = t.root().join("planted.log");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let out = t.tierfs(&[
        "mount",
        "--meta",
        &t.meta_url(),
        &s(&mnt),
        "--log-file",
        &s(&link),
    ]);
    out.assert_clean_error();
    assert!(out.stderr.contains("symbolic link"), "{}", out.describe());
    assert_not_mounted(&mnt);
    assert_eq!(fs::read(&victim).unwrap(), b"precious\n");
    // a log another user made (root could be made to append to a file that user reads)
    let theirs = t.root().join("theirs.log");
    fs::write(&theirs, b"").unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let out = t.tierfs(&[
        "mount",
        "--meta",
        &t.meta_url(),
        &s(&mnt),
        "--log-file",
        &s(&theirs),
    ]);
    out.assert_clean_error();
    assert!(out.stderr.contains("another user"), "{}", out.describe());
    assert_not_mounted(&mnt);
    assert_eq!(fs::metadata(&theirs).unwrap().len(), 0);
}
