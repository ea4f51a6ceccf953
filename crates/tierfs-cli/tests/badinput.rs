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
