//! The changelog end to end (issue 11, requirement 3): two FUSE clients change the filesystem,
//! one registered reader sees both clients' records with their client names, uids and job
//! ids; `--follow` wakes for new records; bad input to the commands gets one clear line.

mod common;

use common::*;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

fn records(t: &TestFs, extra: &[&str]) -> Vec<serde_json::Value> {
    let url = t.meta_url();
    let mut args = vec!["changelog", "--meta", &url, "--json"];
    args.extend_from_slice(extra);
    let out = t.tierfs(&args);
    out.assert_ok();
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

fn has(v: &[serde_json::Value], typ: &str, ino: u64, client: &str) -> Option<serde_json::Value> {
    v.iter()
        .find(|r| r["type"] == typ && r["target"] == ino && r["client"] == client)
        .cloned()
}

/// The changelog readers of the mounts' change followers (`follow_changes`), from each
/// mount's `.tierfs-info`: none when the clients do not follow.
fn follower_readers(t: &TestFs) -> Vec<String> {
    (0..t.mnts.len())
        .filter_map(|i| t.follow_reader(i))
        .collect()
}

/// The names `tierfs changelog readers` lists.
fn listed_readers(t: &TestFs) -> Vec<String> {
    let out = t.tierfs(&["changelog", "readers", "--meta", &t.meta_url()]);
    out.assert_ok();
    out.stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.starts_with("cl") && w[2..].parse::<u64>().is_ok())
        .map(str::to_string)
        .collect()
}

/// With `follow_changes` on (`TIERFS_IT_CLIENT_CONFIG`), each client has a reader of its own
/// besides the test's: those are checked to exist and are told apart from the test's reader.
#[test]
fn two_clients_one_reader() {
    let mut t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    // c0 reads job ids from the writer's TIERFS_TEST_JOBID; c1 takes none.
    t.mount_with(&ClientOpts {
        name: "c0".into(),
        config: Some("jobid_var = \"TIERFS_TEST_JOBID\"\n".into()),
        ..Default::default()
    });
    t.mount_with(&ClientOpts {
        name: "c1".into(),
        ..Default::default()
    });
    let url = t.meta_url();
    // The clients' own readers, if they follow: registered at mount, so listed.
    let followers = follower_readers(&t);
    assert_eq!(listed_readers(&t), followers);
    // Before any reader (of the test's): what it reads starts after its registration.
    fs::write(t.p(0, "before"), b"x").unwrap();
    let reg = t.tierfs(&["changelog", "register", "--meta", &url]);
    reg.assert_ok();
    let cl = format!("cl{}", followers.len() + 1);
    assert_eq!(reg.stdout.trim(), cl);
    let cl = cl.as_str();

    // c0: a root process with a job id in its environment writes a file.
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!("echo hello > {}", t.p(0, "f0").display()))
        .env("TIERFS_TEST_JOBID", "job-42")
        .status()
        .unwrap();
    assert!(st.success());
    // c1: uid 1000 writes a file in a directory it may write to.
    fs::create_dir(t.p(1, "shared")).unwrap();
    fs::set_permissions(t.p(1, "shared"), fs::Permissions::from_mode(0o777)).unwrap();
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!("echo world > {}", t.p(1, "shared/f1").display()))
        .uid(1000)
        .gid(1000)
        .status()
        .unwrap();
    assert!(st.success());
    let f0 = fs::metadata(t.p(0, "f0")).unwrap().ino();
    let f1 = fs::metadata(t.p(1, "shared/f1")).unwrap().ino();

    // Closes reach the engine in batches: wait until both CLOSE records are there.
    let mut v = Vec::new();
    let seen = wait_until(Duration::from_secs(10), || {
        v = records(&t, &["--reader", cl]);
        has(&v, "CLOSE", f0, "c0").is_some() && has(&v, "CLOSE", f1, "c1").is_some()
    });
    assert!(seen, "both clients' closes never showed up: {v:#?}");
    // The creates, each with its client, uid, parent and name.
    let shared = fs::metadata(t.p(1, "shared")).unwrap().ino();
    let k0 = has(&v, "CREAT", f0, "c0").unwrap_or_else(|| panic!("no CREAT of f0: {v:#?}"));
    assert_eq!(
        (k0["parent"].as_u64(), k0["name"].as_str()),
        (Some(1), Some("f0"))
    );
    assert_eq!(k0["uid"].as_u64(), Some(0));
    assert_eq!(k0["jobid"], "job-42");
    let d1 = has(&v, "MKDIR", shared, "c1").unwrap_or_else(|| panic!("no MKDIR: {v:#?}"));
    assert_eq!(d1["name"], "shared");
    assert!(has(&v, "SATTR", shared, "c1").is_some(), "chmod: {v:#?}");
    let k1 = has(&v, "CREAT", f1, "c1").unwrap_or_else(|| panic!("no CREAT of f1: {v:#?}"));
    assert_eq!(
        (k1["parent"].as_u64(), k1["name"].as_str()),
        (Some(shared), Some("f1"))
    );
    assert_eq!(
        (k1["uid"].as_u64(), k1["gid"].as_u64()),
        (Some(1000), Some(1000))
    );
    assert!(k1["jobid"].is_null());
    // c0's write: data committed (MTIME) by root with the job id of its environment.
    let m0 = has(&v, "MTIME", f0, "c0").unwrap_or_else(|| panic!("no MTIME of f0: {v:#?}"));
    assert_eq!((m0["uid"].as_u64(), m0["gid"].as_u64()), (Some(0), Some(0)));
    assert_eq!(m0["jobid"], "job-42");
    let c0 = has(&v, "CLOSE", f0, "c0").unwrap();
    assert_eq!(c0["jobid"], "job-42", "CLOSE carries the opener's job id");
    // c1's write: uid 1000, no job id (c1 was not told where to read one).
    let m1 = has(&v, "MTIME", f1, "c1").unwrap_or_else(|| panic!("no MTIME of f1: {v:#?}"));
    assert_eq!(
        (m1["uid"].as_u64(), m1["gid"].as_u64()),
        (Some(1000), Some(1000))
    );
    assert!(m1["jobid"].is_null());
    let c1 = has(&v, "CLOSE", f1, "c1").unwrap();
    assert_eq!(
        c1["uid"].as_u64(),
        Some(1000),
        "CLOSE carries the opener's uid"
    );
    // One order for both clients' records, and nothing from before the reader.
    let idx: Vec<u64> = v.iter().map(|r| r["index"].as_u64().unwrap()).collect();
    assert!(idx.windows(2).all(|w| w[0] < w[1]), "{idx:?}");
    // (Its data committed before; its close, batched, may reach the engine just after.)
    let before = fs::metadata(t.p(0, "before")).unwrap().ino();
    assert!(
        v.iter()
            .all(|r| r["target"] != before || r["type"] == "CLOSE"),
        "{v:#?}"
    );

    // Text output: one line per record, Lustre's layout.
    let text = t.tierfs(&["changelog", "--meta", &url, "--reader", cl]);
    text.assert_ok();
    assert_eq!(text.stdout.lines().count(), v.len(), "{}", text.stdout);
    assert!(
        text.stdout.lines().any(|l| l.contains("MTIME")
            && l.contains(&format!("t={f0} "))
            && l.contains("c=c0 j=job-42")),
        "{}",
        text.stdout
    );

    // Clear everything: the reader reads nothing more, and once every reader has cleared
    // (the followers' too: cleared here by hand, as a follower clears only up to the last
    // record of its own mask), the records are purged.
    let clear = t.tierfs(&["changelog", "clear", cl, "0", "--meta", &url]);
    clear.assert_ok();
    assert!(records(&t, &["--reader", cl]).is_empty());
    for f in &followers {
        t.tierfs(&["changelog", "clear", f, "0", "--meta", &url])
            .assert_ok();
    }
    assert!(
        records(&t, &[]).is_empty(),
        "cleared by every reader: purged"
    );
    let mut all = followers.clone();
    all.push(cl.to_string());
    assert_eq!(listed_readers(&t), all);
    let status = t.tierfs(&["status", "--meta", &url]);
    status.assert_ok();
    let line = format!(
        "changelog:  {} reader{} ({})",
        all.len(),
        if all.len() == 1 { "" } else { "s" },
        all.join(", ")
    );
    assert!(status.stdout.contains(&line), "{line}:\n{}", status.stdout);

    // --follow prints a record committed after it started, from another client.
    let bin = env!("CARGO_BIN_EXE_tierfs");
    let mut child = Command::new(bin)
        .args([
            "changelog",
            "--meta",
            &url,
            "--reader",
            cl,
            "--json",
            "--follow",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    fs::write(t.p(1, "late"), b"late").unwrap();
    let late = fs::metadata(t.p(1, "late")).unwrap().ino();
    let mut got = None;
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(10)) {
        let r: serde_json::Value = serde_json::from_str(&line).unwrap();
        if r["target"] == late && r["client"] == "c1" {
            got = Some(r);
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(got.is_some(), "--follow never printed the new record");

    let dereg = t.tierfs(&["changelog", "deregister", cl, "--meta", &url]);
    dereg.assert_ok();
    let readers = t.tierfs(&["changelog", "readers", "--meta", &url]);
    readers.assert_ok();
    if followers.is_empty() {
        assert!(
            readers.stdout.contains("readers: none"),
            "{}",
            readers.stdout
        );
    } else {
        // the followers' readers stay
        assert_eq!(listed_readers(&t), followers, "{}", readers.stdout);
    }
}

#[test]
fn bad_input_gets_one_line() {
    let t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    let url = t.meta_url();
    let cl = |args: &[&str]| {
        let mut a = vec!["changelog"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["--meta", &url]);
        t.tierfs(&a)
    };
    // Unknown readers.
    for args in [
        &["clear", "cl9", "0"][..],
        &["deregister", "cl9"],
        &["--reader", "cl9"],
    ] {
        let o = cl(args);
        o.assert_clean_error();
        assert!(o.stderr.contains("cl9"), "{}", o.describe());
    }
    // Not a reader id at all.
    let o = cl(&["deregister", "reader-one"]);
    o.assert_clean_error();
    // An unknown type in a mask: refused, and no reader registered.
    let o = cl(&["register", "--mask", "CREAT,BOGUS"]);
    o.assert_clean_error();
    assert!(o.stderr.contains("BOGUS"), "{}", o.describe());
    let o = cl(&["--types", "NOPE"]);
    o.assert_clean_error();
    let r = cl(&["readers"]);
    r.assert_ok();
    assert!(r.stdout.contains("readers: none"), "{}", r.describe());
    // A clear past the last record.
    let reg = cl(&["register"]);
    reg.assert_ok();
    let o = cl(&["clear", "cl1", "1000"]);
    o.assert_clean_error();
    assert!(o.stderr.contains("last record is 0"), "{}", o.describe());
    // START after END.
    cl(&["5", "3"]).assert_clean_error();
    // No filesystem named: not in a tierfs mount.
    let o = t.tierfs(&["changelog", "readers", "--mount", "/"]);
    o.assert_clean_error();
}

/// A filesystem of schema v5 (before the changelog): refused with one line, and left at v5
/// (a command must not upgrade it behind older clients' backs).
#[test]
fn old_schema_is_refused_and_left_alone() {
    let t = TestFs::with(Opts {
        clients: 0,
        format: false,
        ..Opts::default()
    });
    if !t.cluster.local_targets() || t.cluster.pg_admin.is_some() {
        return; // the fixture is a SQLite file
    }
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tierfs-meta/src/core/testdata/v5.sqlite"
    );
    let db = t.root().join("v5.db");
    fs::copy(fixture, &db).unwrap();
    let url = format!("sqlite://{}", db.display());
    for _ in 0..2 {
        for args in [
            &["changelog", "readers", "--meta", &url][..],
            &["changelog", "register", "--meta", &url],
            &["changelog", "--meta", &url],
        ] {
            let o = t.tierfs(args);
            o.assert_clean_error();
            assert!(o.stderr.contains("schema v5"), "{}", o.describe());
        }
    }
}

/// A reader idle past its idle time is deregistered (by the next changelog command or a
/// client's housekeeping), `tierfs status` warns about it until it is deregistered by hand,
/// and its own commands say what happened.
#[test]
fn idle_reader_is_dropped_with_a_warning() {
    let t = TestFs::with(Opts {
        clients: 0,
        ..Opts::default()
    });
    let url = t.meta_url();
    let reg = t.tierfs(&["changelog", "register", "--idle", "1s", "--meta", &url]);
    reg.assert_ok();
    assert_eq!(reg.stdout.trim(), "cl1");
    let busy = t.tierfs(&["changelog", "register", "--meta", &url]);
    busy.assert_ok();
    let status = t.tierfs(&["status", "--meta", &url]);
    status.assert_ok();
    assert!(!status.stdout.contains("WARNING"), "{}", status.stdout);
    std::thread::sleep(Duration::from_millis(2500));
    let status = t.tierfs(&["status", "--meta", &url]);
    status.assert_ok();
    assert!(
        status.stdout.contains("changelog:  1 reader (cl2)"),
        "{}",
        status.stdout
    );
    assert!(
        status
            .stdout
            .lines()
            .any(|l| l.starts_with("WARNING: changelog reader cl1 was deregistered")),
        "{}",
        status.stdout
    );
    let o = t.tierfs(&["changelog", "--reader", "cl1", "--meta", &url]);
    o.assert_clean_error();
    assert!(o.stderr.contains("idle"), "{}", o.describe());
    t.tierfs(&["changelog", "deregister", "cl1", "--meta", &url])
        .assert_ok();
    let status = t.tierfs(&["status", "--meta", &url]);
    assert!(!status.stdout.contains("WARNING"), "{}", status.stdout);
    // Dismissed: from now on cl1 is simply unknown.
    t.tierfs(&["changelog", "deregister", "cl1", "--meta", &url])
        .assert_clean_error();
}

/// A read-only open is recorded with the client's next batch of closes, and an open and its
/// close in one batch cancel out, but only while no reader wants OPEN or CLOSE records: once
/// one does (at most a second after it registers), a quick open and close of a file leave both
/// records.
#[test]
fn quick_read_only_opens_are_recorded_while_a_reader_wants_them() {
    let t = TestFs::with(Opts {
        clients: 1,
        ..Opts::default()
    });
    fs::write(t.p(0, "g"), b"g").unwrap();
    let g = fs::metadata(t.p(0, "g")).unwrap().ino();
    let reg = t.tierfs(&[
        "changelog",
        "register",
        "--meta",
        &t.meta_url(),
        "--mask",
        "+OPEN",
    ]);
    reg.assert_ok();
    let cl = reg.stdout.trim().to_string();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(fs::read(t.p(0, "g")).unwrap(), b"g");
    let mut v = Vec::new();
    let seen = wait_until(Duration::from_secs(10), || {
        v = records(&t, &["--reader", &cl]);
        has(&v, "OPEN", g, "c0").is_some() && has(&v, "CLOSE", g, "c0").is_some()
    });
    assert!(
        seen,
        "the read-only open and its close left no records: {v:#?}"
    );
    // opened and closed in a loop, each open finding the last close still queued: every open
    // and close is recorded too (neither cancels out while the reader wants them)
    for _ in 0..5 {
        assert_eq!(fs::read(t.p(0, "g")).unwrap(), b"g");
    }
    let count = |v: &[serde_json::Value], typ: &str| {
        v.iter()
            .filter(|r| r["type"] == typ && r["target"] == g && r["client"] == "c0")
            .count()
    };
    let all = wait_until(Duration::from_secs(10), || {
        v = records(&t, &["--reader", &cl]);
        count(&v, "OPEN") >= 6 && count(&v, "CLOSE") >= 6
    });
    assert!(
        all,
        "6 opens and closes, recorded: {} OPEN, {} CLOSE",
        count(&v, "OPEN"),
        count(&v, "CLOSE")
    );
}
