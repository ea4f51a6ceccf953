//! `tierfs bench --remote PROFILE` (issue 15, required item 4): an unknown profile, a machine
//! without `tc`, network namespaces that are missing or may not be entered, and a server that
//! is not up each give one line on stderr and a non-zero exit before any work starts (the
//! work dir stays empty). Needs root (it makes a network namespace); skips otherwise.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const META: &str = "postgres://tierfs@127.0.0.1:1/bench";
const S3: &str = "s3://tierfs-a/b?endpoint=http://127.0.0.1:2&region=garage";

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn scratch() -> TestFs {
    let t = TestFs::with(Opts {
        clients: 0,
        format: false,
        ..Opts::default()
    });
    fs::set_permissions(t.root(), fs::Permissions::from_mode(0o755)).unwrap();
    t
}

/// A network namespace of its own, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("tfbt{tag}{}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "ip netns add {name}");
        let _ = Command::new("ip")
            .args(["-n", &name, "link", "set", "lo", "up"])
            .status();
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// `tierfs bench --workdir WORK EXTRA... --meta META --target-url S3 mdtest -n 1`.
fn bench(
    t: &TestFs,
    extra: &[&str],
    cred: Option<(u32, u32)>,
    env: &[(String, String)],
) -> (CmdOut, PathBuf) {
    let work = t.root().join("work");
    fs::create_dir_all(&work).unwrap();
    fs::set_permissions(&work, fs::Permissions::from_mode(0o777)).unwrap();
    let mut args: Vec<String> = vec!["bench".into(), "--workdir".into(), s(&work)];
    args.extend(extra.iter().map(|a| a.to_string()));
    for a in ["--meta", META, "--target-url", S3, "mdtest", "-n", "1"] {
        args.push(a.into());
    }
    let out = tierfs_run_env(t.root(), &args, Duration::from_secs(60), cred, None, env);
    (out, work)
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[track_caller]
fn assert_one_line_before_work(out: &CmdOut, work: &Path, wanted: &str) {
    out.assert_clean_error();
    assert!(
        out.stderr.contains(wanted),
        "expected {wanted:?} in stderr: {}",
        out.describe()
    );
    let left: Vec<_> = fs::read_dir(work).unwrap().collect();
    assert!(
        left.is_empty(),
        "work started: {left:?} in {}",
        work.display()
    );
}

#[test]
fn an_unknown_profile_is_one_line() {
    let t = scratch();
    let (out, work) = bench(&t, &["--remote", "10gbe"], None, &[]);
    assert_one_line_before_work(
        &out,
        &work,
        "--remote 10gbe: unknown network profile (known: 1gbe, ib, wan)",
    );
    let p = t.tierfs(&["bench", "profile", "10gbe"]);
    p.assert_clean_error();
    let p = t.tierfs(&["bench", "profile", "1gbe"]);
    assert!(p.ok(), "{}", p.describe());
    assert_eq!(p.stdout.trim(), "1gbe: 0.1 ms one way added, 1 Gbit/s");
}

#[test]
fn a_machine_without_tc_is_one_line() {
    let t = scratch();
    let env = [("PATH".to_string(), "/nonexistent".to_string())];
    let (out, work) = bench(&t, &["--remote", "1gbe"], None, &env);
    assert_one_line_before_work(&out, &work, "`tc` (iproute2) is not installed");
}

#[test]
fn missing_namespaces_are_one_line() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let t = scratch();
    let name = format!("tfbtnone{}", std::process::id());
    let (out, work) = bench(
        &t,
        &[
            "--remote",
            "1gbe",
            "--server-netns",
            &name,
            "--client-netns",
            &name,
        ],
        None,
        &[],
    );
    assert_one_line_before_work(
        &out,
        &work,
        &format!("network namespace {name} does not exist"),
    );
}

/// `bench --remote 1gbe` with a fresh namespace as the server and the client host.
fn bench_in_own_netns(
    tag: &str,
    cred: Option<(u32, u32)>,
) -> Option<(CmdOut, PathBuf, Netns, TestFs)> {
    if !is_root() {
        eprintln!("skipped: needs root");
        return None;
    }
    let t = scratch();
    let ns = Netns::new(tag);
    let extra = [
        "--remote",
        "1gbe",
        "--server-netns",
        &ns.0,
        "--client-netns",
        &ns.0,
    ];
    let (out, work) = bench(&t, &extra, cred, &[]);
    Some((out, work, ns, t))
}

#[test]
fn no_rights_to_enter_a_namespace_is_one_line() {
    let Some((out, work, ns, _t)) = bench_in_own_netns("r", Some((65534, 65534))) else {
        return;
    };
    assert_one_line_before_work(&out, &work, &format!("network namespace {}", ns.0));
    assert!(out.stderr.contains("run as root"), "{}", out.describe());
}

#[test]
fn a_server_that_is_not_up_is_one_line() {
    let Some((out, work, _ns, _t)) = bench_in_own_netns("s", None) else {
        return;
    };
    assert_one_line_before_work(&out, &work, "the server 127.0.0.1:1 is not up");
}
