//! fio, driven as the real binary (Debian package `fio`) with JSON output. Data is verified by
//! fio itself with an offset pattern (`--verify=pattern --verify_pattern=%o`: every block holds
//! its own offset): read jobs read a file laid out with that pattern and check every block they
//! read; write jobs write it on a fresh file (random writes touch every block once) and a
//! verification pass reads the whole file back afterwards. If fio is not installed the workload
//! is reported as skipped.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::error::BenchError;
use crate::runner::{Measurement, RunCtx, Unit, Workload};
use crate::util::{self, fmt_size, parse_duration, parse_size};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FioJob {
    SeqWrite,
    SeqRead,
    RandRead,
    RandWrite,
}

impl FioJob {
    fn rw(self) -> &'static str {
        match self {
            FioJob::SeqWrite => "write",
            FioJob::SeqRead => "read",
            FioJob::RandRead => "randread",
            FioJob::RandWrite => "randwrite",
        }
    }

    fn name(self) -> &'static str {
        match self {
            FioJob::SeqWrite => "seq-write",
            FioJob::SeqRead => "seq-read",
            FioJob::RandRead => "rand-read",
            FioJob::RandWrite => "rand-write",
        }
    }

    fn is_read(self) -> bool {
        matches!(self, FioJob::SeqRead | FioJob::RandRead)
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct FioArgs {
    /// The job: seq-write, seq-read, rand-read or rand-write.
    #[arg(long, value_enum)]
    pub job: FioJob,
    /// Block size of each I/O.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    pub bs: u64,
    /// I/Os in flight (libaio; asynchronous only with --direct, as in the seeds).
    #[arg(long, default_value_t = 1)]
    pub iodepth: u32,
    /// O_DIRECT.
    #[arg(long)]
    pub direct: bool,
    /// File size.
    #[arg(long, default_value = "256m", value_parser = parse_size)]
    pub size: u64,
    /// Run time of rand-read (time based); the other jobs move the whole file once.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub runtime: Duration,
}

#[derive(Debug, Clone)]
pub struct Fio {
    pub job: FioJob,
    pub bs: u64,
    pub iodepth: u32,
    pub direct: bool,
    pub size: u64,
    pub runtime: Duration,
}

impl Fio {
    pub fn new(a: &FioArgs) -> Result<Fio, BenchError> {
        if a.bs == 0 || !a.bs.is_multiple_of(512) || a.bs > 64 << 20 {
            return Err(BenchError::Args(
                "--bs must be a multiple of 512 up to 64m".into(),
            ));
        }
        if a.direct && !a.bs.is_multiple_of(4096) {
            return Err(BenchError::Args(
                "--direct needs --bs a multiple of 4k".into(),
            ));
        }
        if a.iodepth == 0 || a.iodepth > 1024 {
            return Err(BenchError::Args("--iodepth must be 1 to 1024".into()));
        }
        if a.size < a.bs || !a.size.is_multiple_of(a.bs) {
            return Err(BenchError::Args("--size must be a multiple of --bs".into()));
        }
        if a.runtime.is_zero() {
            return Err(BenchError::Args("--runtime must be positive".into()));
        }
        Ok(Fio {
            job: a.job,
            bs: a.bs,
            iodepth: a.iodepth,
            direct: a.direct,
            size: a.size,
            runtime: a.runtime,
        })
    }

    fn base(&self, name: &str, file: &Path) -> Command {
        let mut c = Command::new("fio");
        c.arg(format!("--name={name}"))
            .arg(format!("--filename={}", file.display()))
            .arg(format!("--size={}", self.size))
            .arg(format!("--bs={}", self.bs))
            .arg("--verify=pattern")
            .arg("--verify_pattern=%o")
            // no *-verify.state files in the current directory
            .arg("--verify_state_save=0")
            .arg("--output-format=json");
        c
    }

    /// Lays the file out sequentially with the verify pattern (not timed).
    fn layout(&self, file: &Path) -> Result<(), BenchError> {
        let mut c = self.base("layout", file);
        c.arg("--rw=write")
            .arg("--do_verify=0")
            .arg("--end_fsync=1");
        util::run_checked(&mut c, "fio (layout)")?;
        Ok(())
    }

    /// Reads the whole file back through fio's verifier (not timed).
    fn verify_all(&self, file: &Path) -> Result<(), BenchError> {
        let mut c = self.base("verify", file);
        c.arg("--rw=read");
        let out = util::run_command(&mut c, "fio (verify)")?;
        if !out.status.success() {
            let text = String::from_utf8_lossy(&out.stderr);
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            return Err(BenchError::Verify {
                path: file.to_path_buf(),
                offset: 0,
                detail: format!("fio verification failed: {first}"),
            });
        }
        Ok(())
    }
}

/// The figures of the main direction of a fio JSON report; a run that moved fewer bytes than
/// `expect_bytes` (when given) or reported an error is a failure, never a rate.
pub fn parse_fio_json(
    text: &str,
    read: bool,
    expect_bytes: Option<u64>,
) -> Result<(f64, f64, f64), BenchError> {
    let bad = |d: String| BenchError::Command {
        command: "fio".into(),
        detail: d,
    };
    let start = text
        .find('{')
        .ok_or_else(|| bad("no JSON in fio's output".into()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text[start..]).map_err(|e| bad(format!("unreadable JSON: {e}")))?;
    let job = v
        .get("jobs")
        .and_then(|j| j.get(0))
        .ok_or_else(|| bad("no job in fio's JSON".into()))?;
    let err = job.get("error").and_then(|e| e.as_i64()).unwrap_or(0);
    if err != 0 {
        return Err(bad(format!("job error {err}")));
    }
    let d = job
        .get(if read { "read" } else { "write" })
        .ok_or_else(|| bad("no figures in fio's JSON".into()))?;
    let num = |k: &str| d.get(k).and_then(|x| x.as_f64());
    let io_bytes = num("io_bytes").unwrap_or(0.0);
    let bw = num("bw_bytes").unwrap_or(0.0);
    let iops = num("iops").unwrap_or(0.0);
    let lat_ns = d
        .get("clat_ns")
        .and_then(|c| c.get("mean"))
        .and_then(|x| x.as_f64())
        .unwrap_or(0.0);
    if io_bytes <= 0.0 || bw <= 0.0 {
        return Err(bad("fio moved no data".into()));
    }
    if let Some(e) = expect_bytes {
        if (io_bytes as u64) < e {
            return Err(bad(format!("short run: {io_bytes} of {e} bytes")));
        }
    }
    Ok((bw / crate::stats::MIB, iops, lat_ns / 1000.0))
}

impl Workload for Fio {
    fn workload(&self) -> &'static str {
        "fio"
    }

    fn name(&self) -> String {
        format!(
            "fio-{}-{}-qd{}{}",
            self.job.name(),
            fmt_size(self.bs)
                .replace(' ', "")
                .replace("iB", "")
                .to_lowercase(),
            self.iodepth,
            if self.direct { "-direct" } else { "" }
        )
    }

    fn label(&self) -> String {
        format!(
            "fio {} bs {} iodepth {}{}, {} file",
            self.job.name(),
            fmt_size(self.bs),
            self.iodepth,
            if self.direct { " O_DIRECT" } else { "" },
            fmt_size(self.size)
        )
    }

    fn equivalent(&self) -> String {
        let mut s = format!(
            "fio --rw={} --bs={} --ioengine=libaio --iodepth={} --direct={} --size={}",
            self.job.rw(),
            self.bs,
            self.iodepth,
            u8::from(self.direct),
            self.size
        );
        if self.job == FioJob::RandRead {
            s.push_str(&format!(
                " --time_based --runtime={}",
                self.runtime.as_secs()
            ));
        }
        s
    }

    fn config(&self) -> serde_json::Value {
        json!({
            "job": self.job.name(), "bs": self.bs, "iodepth": self.iodepth, "direct": self.direct,
            "size": self.size, "runtime_s": self.runtime.as_secs_f64(),
        })
    }

    fn clients(&self) -> usize {
        1
    }

    fn preflight(&self, _scratch: &Path) -> Result<(), BenchError> {
        match Command::new("fio").arg("--version").output() {
            Ok(o) if o.status.success() => Ok(()),
            _ => Err(BenchError::Missing(
                "fio is not installed (Debian package fio): skipped".into(),
            )),
        }
    }

    fn run(&self, ctx: &RunCtx) -> Result<Vec<Measurement>, BenchError> {
        let file = ctx.roots[0].join("fio.dat");
        if self.job.is_read() {
            ctx.progress.phase("fio layout", 1);
            self.layout(&file)?;
            if ctx.drop_caches {
                util::drop_caches();
            }
        }
        ctx.progress.phase(&format!("fio {}", self.job.name()), 1);
        let mut c = self.base(self.job.name(), &file);
        c.arg(format!("--rw={}", self.job.rw()))
            .arg("--ioengine=libaio")
            .arg(format!("--iodepth={}", self.iodepth))
            .arg(format!("--direct={}", u8::from(self.direct)));
        let expect = match self.job {
            FioJob::RandRead => {
                c.arg("--time_based")
                    .arg(format!("--runtime={}ms", self.runtime.as_millis()));
                None
            }
            FioJob::SeqRead => Some(self.size),
            FioJob::SeqWrite | FioJob::RandWrite => {
                c.arg("--do_verify=0").arg("--end_fsync=1");
                Some(self.size)
            }
        };
        let out = util::run_command(&mut c, "fio")?;
        if !out.status.success() {
            let text = String::from_utf8_lossy(&out.stderr);
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            return Err(BenchError::Command {
                command: "fio".into(),
                detail: format!("{}: {first}", out.status),
            });
        }
        let (bw, iops, lat) = parse_fio_json(
            &String::from_utf8_lossy(&out.stdout),
            self.job.is_read(),
            expect,
        )?;
        if !self.job.is_read() {
            ctx.progress.phase("fio verify", 1);
            if ctx.drop_caches {
                util::drop_caches();
            }
            self.verify_all(&file)?;
        }
        let t = self.job.name();
        Ok(vec![
            Measurement::new(t, "bw", Unit::MibPerSec, bw),
            Measurement::new(t, "iops", Unit::OpsPerSec, iops),
            Measurement::new(t, "lat", Unit::Micros, lat),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fio_json_parsing_refuses_failed_and_short_runs() {
        let ok = r#"note: something
{"jobs":[{"error":0,"read":{"io_bytes":1048576,"bw_bytes":2097152,"iops":512.0,"clat_ns":{"mean":2000.0}},"write":{"io_bytes":0,"bw_bytes":0,"iops":0}}]}"#;
        let (bw, iops, lat) = parse_fio_json(ok, true, Some(1048576)).unwrap();
        assert_eq!(bw, 2.0);
        assert_eq!(iops, 512.0);
        assert_eq!(lat, 2.0);
        assert!(parse_fio_json(ok, true, Some(2 << 20)).is_err());
        assert!(parse_fio_json(ok, false, None).is_err());
        assert!(parse_fio_json(&ok.replace("\"error\":0", "\"error\":5"), true, None).is_err());
        assert!(parse_fio_json("garbage", true, None).is_err());
    }
}

#[cfg(test)]
mod verify_tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn fio_verification_catches_a_corrupted_block() {
        if Command::new("fio").arg("--version").output().is_err() {
            eprintln!("skipped: fio not installed");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        let fio = Fio::new(&FioArgs {
            job: FioJob::SeqRead,
            bs: 4096,
            iodepth: 1,
            direct: false,
            size: 1 << 20,
            runtime: Duration::from_secs(1),
        })
        .unwrap();
        fio.layout(&file).unwrap();
        fio.verify_all(&file).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all_at(b"XXXX", 123_456).unwrap();
        assert!(matches!(
            fio.verify_all(&file),
            Err(BenchError::Verify { .. })
        ));
    }
}
