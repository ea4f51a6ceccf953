//! `tierfs bench suite`: the seeds' workloads in one run. `--quick` uses sizes that finish in a
//! few minutes on a 2-core machine; the full suite uses the seeds' shapes at this machine's
//! scale.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::BenchError;
use crate::external::Engine;
use crate::filebench::{Filebench, FilebenchArgs, Personality};
use crate::fio::{Fio, FioArgs, FioJob};
use crate::ior::{Ior, IorArgs};
use crate::mdtest::{Mdtest, MdtestArgs};
use crate::runner::Workload;
use crate::untar::{Untar, UntarArgs};

#[derive(Debug, Clone, clap::Args)]
pub struct SuiteArgs {
    /// Small sizes: finishes within 10 minutes on a 2-core machine.
    #[arg(long)]
    pub quick: bool,
    /// Only these families, comma separated: ior, mdtest, fio, filebench, untar.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

const FAMILIES: [&str; 5] = ["ior", "mdtest", "fio", "filebench", "untar"];

fn ior(
    clients: usize,
    tasks: usize,
    t: u64,
    b: u64,
    fpp: bool,
    hard: bool,
    direct: bool,
) -> IorArgs {
    IorArgs {
        clients,
        tasks,
        transfer: t,
        block: b,
        segments: 1,
        fpp,
        reorder: true,
        fsync: true,
        direct,
        hard,
        engine: Engine::Auto,
    }
}

fn fio(job: FioJob, bs: u64, iodepth: u32, direct: bool, size: u64, runtime: u64) -> FioArgs {
    FioArgs {
        job,
        bs,
        iodepth,
        direct,
        size,
        runtime: Duration::from_secs(runtime),
    }
}

/// Notes for the report.
pub fn notes(a: &SuiteArgs) -> Vec<String> {
    vec![format!(
        "suite{}: IOR runs with -C (read another client's data) and -e (fsync); see docs/bench.md",
        if a.quick {
            " --quick (small sizes)"
        } else {
            ""
        }
    )]
}

/// The suite's workloads.
pub fn workloads(a: &SuiteArgs) -> Result<Vec<Box<dyn Workload>>, BenchError> {
    for f in &a.only {
        if !FAMILIES.contains(&f.as_str()) {
            return Err(BenchError::Args(format!(
                "--only: unknown benchmark '{f}' (ior, mdtest, fio, filebench, untar)"
            )));
        }
    }
    let want = |f: &str| a.only.is_empty() || a.only.iter().any(|o| o == f);
    let q = a.quick;
    const M: u64 = 1 << 20;
    const K: u64 = 1 << 10;
    let mut w: Vec<Box<dyn Workload>> = Vec::new();
    if want("ior") {
        let (c, t, b) = if q { (2, 1, 32 * M) } else { (3, 2, 256 * M) };
        w.push(Box::new(Ior::new(&ior(c, t, M, b, true, false, false))?));
        w.push(Box::new(Ior::new(&ior(c, t, M, b, false, false, false))?));
        w.push(Box::new(Ior::new(&ior(
            c,
            t,
            M,
            if q { 8 * M } else { 64 * M },
            false,
            true,
            false,
        ))?));
        if !q {
            w.push(Box::new(Ior::new(&ior(c, t, M, b, true, false, true))?));
        }
    }
    if want("mdtest") {
        let (c, t, n, n32) = if q {
            (2, 1, 500, 300)
        } else {
            (2, 2, 5000, 2000)
        };
        for (items, bytes, unique) in [(n, 0, false), (n32, 32 * K, true)] {
            w.push(Box::new(Mdtest::new(&MdtestArgs {
                clients: c,
                tasks: t,
                items,
                write_bytes: bytes,
                unique_dir: unique,
                other_client: true,
                engine: Engine::Auto,
            })?));
        }
    }
    if want("fio") {
        let (size, rt, wsize) = if q {
            (64 * M, 3, 16 * M)
        } else {
            (1024 * M, 10, 256 * M)
        };
        w.push(Box::new(Fio::new(&fio(
            FioJob::SeqWrite,
            M,
            1,
            false,
            size,
            rt,
        ))?));
        w.push(Box::new(Fio::new(&fio(
            FioJob::SeqRead,
            M,
            1,
            false,
            size,
            rt,
        ))?));
        w.push(Box::new(Fio::new(&fio(
            FioJob::RandRead,
            4 * K,
            1,
            true,
            size,
            rt,
        ))?));
        w.push(Box::new(Fio::new(&fio(
            FioJob::RandRead,
            4 * K,
            32,
            true,
            size,
            rt,
        ))?));
        w.push(Box::new(Fio::new(&fio(
            FioJob::RandWrite,
            4 * K,
            32,
            true,
            wsize,
            rt,
        ))?));
        if !q {
            w.push(Box::new(Fio::new(&fio(
                FioJob::RandWrite,
                4 * K,
                1,
                true,
                wsize,
                rt,
            ))?));
            w.push(Box::new(Fio::new(&fio(
                FioJob::RandRead,
                M,
                32,
                true,
                size,
                rt,
            ))?));
            w.push(Box::new(Fio::new(&fio(
                FioJob::RandWrite,
                M,
                32,
                true,
                size,
                rt,
            ))?));
        }
    }
    if want("filebench") {
        let (files, secs, threads) = if q { (200, 5, 2) } else { (1000, 30, 4) };
        for p in [
            Personality::Fileserver,
            Personality::Webserver,
            Personality::Varmail,
        ] {
            w.push(Box::new(Filebench::new(&FilebenchArgs {
                personality: p,
                files,
                duration: Duration::from_secs(secs),
                clients: 1,
                threads,
                mean_size: None,
                append_size: 16 * K,
                iosize: M,
                engine: Engine::Auto,
            })?));
        }
    }
    if want("untar") {
        let source = if q && PathBuf::from("/usr/include/linux").is_dir() {
            PathBuf::from("/usr/include/linux")
        } else {
            PathBuf::from("/usr/include")
        };
        w.push(Box::new(Untar::new(&UntarArgs {
            tarball: None,
            source,
        })?));
    }
    Ok(w)
}
