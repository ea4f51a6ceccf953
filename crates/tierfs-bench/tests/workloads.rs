//! Each workload on a small size against native and tierfs (FUSE mounts: run as root).

mod common;

use std::time::Duration;

use common::{assert_all_ok, is_root, run};
use tierfs_bench::external::Engine;
use tierfs_bench::filebench::{Filebench, FilebenchArgs, Personality};
use tierfs_bench::fio::{Fio, FioArgs, FioJob};
use tierfs_bench::ior::{Ior, IorArgs};
use tierfs_bench::mdtest::{Mdtest, MdtestArgs};
use tierfs_bench::untar::{Untar, UntarArgs};
use tierfs_bench::Workload;

const LIMIT: Duration = Duration::from_secs(240);

fn ior(clients: usize, tasks: usize, b: u64, fpp: bool, hard: bool) -> Box<dyn Workload + Send> {
    Box::new(
        Ior::new(&IorArgs {
            clients,
            tasks,
            transfer: 256 << 10,
            block: b,
            segments: 2,
            fpp,
            reorder: true,
            fsync: true,
            direct: false,
            hard,
            engine: Engine::Builtin,
        })
        .unwrap(),
    )
}

macro_rules! need_root {
    () => {
        if !is_root() {
            eprintln!("skipped: needs root (FUSE)");
            return;
        }
    };
}

#[test]
fn ior_file_per_process_and_shared_file_on_three_clients() {
    need_root!();
    let r = run(
        vec![
            ior(3, 2, 1 << 20, true, false),
            ior(3, 1, 1 << 20, false, false),
        ],
        LIMIT,
    );
    assert_all_ok(&r);
    assert!(r
        .rows
        .iter()
        .any(|x| x.name == "ior-fpp" && x.test == "read"));
    assert!(r
        .rows
        .iter()
        .any(|x| x.name == "ior-ssf" && x.test == "write"));
}

#[test]
fn ior_hard_and_direct() {
    need_root!();
    let direct = Box::new(
        Ior::new(&IorArgs {
            clients: 2,
            tasks: 1,
            transfer: 64 << 10,
            block: 512 << 10,
            segments: 1,
            fpp: true,
            reorder: true,
            fsync: false,
            direct: true,
            hard: false,
            engine: Engine::Builtin,
        })
        .unwrap(),
    );
    let r = run(vec![ior(2, 1, 256 << 10, false, true), direct], LIMIT);
    assert_all_ok(&r);
    assert!(r.rows.iter().any(|x| x.name == "ior-hard"));
    assert!(r.rows.iter().any(|x| x.name == "ior-fpp-direct"));
}

#[test]
fn mdtest_empty_shared_and_32k_unique_remote() {
    need_root!();
    let mk = |w: u64, unique: bool, remote: bool| -> Box<dyn Workload + Send> {
        Box::new(
            Mdtest::new(&MdtestArgs {
                clients: 2,
                tasks: 2,
                items: 40,
                write_bytes: w,
                unique_dir: unique,
                other_client: remote,
                engine: Engine::Builtin,
            })
            .unwrap(),
        )
    };
    let r = run(vec![mk(0, false, false), mk(32 << 10, true, true)], LIMIT);
    assert_all_ok(&r);
    for phase in tierfs_bench::mdtest::PHASES {
        assert!(r.rows.iter().any(|x| x.test == phase));
    }
}

#[test]
fn fio_jobs_or_skipped_without_fio() {
    need_root!();
    let mk = |job, bs: u64, iodepth, direct| -> Box<dyn Workload + Send> {
        Box::new(
            Fio::new(&FioArgs {
                job,
                bs,
                iodepth,
                direct,
                size: 4 << 20,
                runtime: Duration::from_secs(1),
            })
            .unwrap(),
        )
    };
    let r = run(
        vec![
            mk(FioJob::SeqWrite, 1 << 20, 1, false),
            mk(FioJob::SeqRead, 1 << 20, 1, false),
            mk(FioJob::RandRead, 4096, 8, true),
            mk(FioJob::RandWrite, 4096, 8, true),
        ],
        LIMIT,
    );
    let have_fio = std::process::Command::new("fio")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if have_fio {
        assert_all_ok(&r);
    } else {
        assert!(r
            .rows
            .iter()
            .all(|x| x.status == "skipped" && x.summary.is_none()));
    }
}

#[test]
fn filebench_personalities() {
    need_root!();
    let ws: Vec<Box<dyn Workload + Send>> = [
        Personality::Fileserver,
        Personality::Webserver,
        Personality::Varmail,
    ]
    .into_iter()
    .map(|p| {
        Box::new(
            Filebench::new(&FilebenchArgs {
                personality: p,
                files: 24,
                duration: Duration::from_millis(1500),
                clients: 2,
                threads: 2,
                mean_size: None,
                append_size: 16 << 10,
                iosize: 1 << 20,
                engine: Engine::Builtin,
            })
            .unwrap(),
        ) as Box<dyn Workload + Send>
    })
    .collect();
    let r = run(ws, LIMIT);
    assert_all_ok(&r);
    assert_eq!(
        r.workloads
            .iter()
            .map(|w| w.name.as_str())
            .collect::<Vec<_>>(),
        [
            "filebench-fileserver",
            "filebench-webserver",
            "filebench-varmail"
        ]
    );
}

#[test]
fn untar_of_a_small_tree() {
    need_root!();
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    for d in 0..4 {
        let dir = tree.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..25 {
            std::fs::write(
                dir.join(format!("f{f}.h")),
                format!("/* {d} {f} */\n").repeat(f + 1),
            )
            .unwrap();
        }
    }
    let w = Box::new(
        Untar::new(&UntarArgs {
            tarball: None,
            source: tree,
        })
        .unwrap(),
    );
    let r = run(vec![w], LIMIT);
    for row in &r.rows {
        assert_eq!(row.status, "ok", "{:?}", row.error);
    }
    let files = r
        .rows
        .iter()
        .find(|x| x.metric == "files" && x.mode == tierfs_bench::Mode::Tierfs)
        .unwrap();
    assert!(files.summary.unwrap().median > 0.0);
}
