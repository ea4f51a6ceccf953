//! Test harness: finds (or builds) the tierfs binary, runs a bench session in a fresh work dir
//! with a time limit, and checks that nothing stays mounted.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use tierfs_bench::fixture::{mounts_under, EnvConfig};
use tierfs_bench::runner::RunOptions;
use tierfs_bench::{execute, Mode, Report, Session, Workload};

/// The tierfs binary: $TIERFS_BIN, else target/<profile>/tierfs beside the test binary (built
/// with cargo when missing).
pub fn tierfs_bin() -> PathBuf {
    if let Ok(p) = std::env::var("TIERFS_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> -> target/<profile>/tierfs
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let bin = profile_dir.join("tierfs");
    static BUILD: std::sync::Once = std::sync::Once::new();
    BUILD.call_once(|| {
        if !bin.exists() {
            let release = profile_dir.ends_with("release");
            let mut c = std::process::Command::new(env!("CARGO"));
            c.args(["build", "-p", "tierfs-cli", "--bin", "tierfs"]);
            if release {
                c.arg("--release");
            }
            let st = c.status().expect("run cargo build");
            assert!(st.success(), "building tierfs failed");
        }
    });
    bin
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A work dir on the disk the benchmarks use.
pub fn workdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tierfs-bench-test-")
        .tempdir_in("/var/tmp")
        .expect("temp dir")
}

/// Runs `workloads` in native and tierfs modes, once each, within `limit`.
pub fn run(workloads: Vec<Box<dyn Workload + Send>>, limit: Duration) -> Report {
    run_modes(workloads, vec![Mode::Native, Mode::Tierfs], 1, limit)
}

pub fn run_modes(
    workloads: Vec<Box<dyn Workload + Send>>,
    modes: Vec<Mode>,
    reps: u32,
    limit: Duration,
) -> Report {
    let dir = workdir();
    let path = dir.path().to_path_buf();
    let tierfs = tierfs_bin();
    let session = Session {
        env: EnvConfig {
            tierfs: tierfs.clone(),
            workdir: path.clone(),
            targets: 2,
            stripe_count: 1,
            keep: false,
            pcc: false,
            meta: None,
            target_urls: vec![],
            client_netns: vec![],
        },
        run: RunOptions {
            modes,
            reps,
            drop_caches: false,
            run_timeout: limit,
            mount_stats: None,
        },
        progress: false,
        command_line: "cargo test".into(),
        notes: vec![],
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let ws: Vec<Box<dyn Workload>> = workloads
            .into_iter()
            .map(|w| w as Box<dyn Workload>)
            .collect();
        let _ = tx.send(execute(&ws, &session));
    });
    let res = match rx.recv_timeout(limit) {
        Ok(r) => r,
        Err(_) => {
            for m in mounts_under(&path) {
                let _ = std::process::Command::new(&tierfs)
                    .arg("umount")
                    .arg(&m)
                    .status();
            }
            panic!("benchmark did not finish within {limit:?}");
        }
    };
    let report = res.expect("bench session");
    assert!(
        mounts_under(&path).is_empty(),
        "mounts left behind under {}",
        path.display()
    );
    report
}

/// Every row of the report is ok and has a positive median (rates) or a figure.
pub fn assert_all_ok(r: &Report) {
    assert!(!r.rows.is_empty(), "no rows");
    for row in &r.rows {
        assert_eq!(
            row.status, "ok",
            "{} {} {} {}: {:?}",
            row.name, row.mode, row.test, row.metric, row.error
        );
        let s = row.summary.expect("summary");
        if row.unit.higher_is_better() {
            assert!(
                s.median > 0.0,
                "{} {} {}: {}",
                row.name,
                row.mode,
                row.test,
                s.median
            );
        }
    }
    for m in [Mode::Native, Mode::Tierfs] {
        assert!(r.rows.iter().any(|row| row.mode == m), "no rows for {m}");
    }
}
