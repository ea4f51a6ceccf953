//! untar: extract a tarball of many small files with the system's `tar` (timed), then compare
//! the extracted tree with the archive (`tar --compare`, which reads every file back; not
//! timed). The default tarball is made once from /usr/include (or `--source`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::json;

use crate::error::BenchError;
use crate::runner::{Measurement, RunCtx, Unit, Workload};
use crate::stats::MIB;
use crate::util;

#[derive(Debug, Clone, clap::Args)]
pub struct UntarArgs {
    /// Tarball to extract (any compression tar detects); default: one made from --source.
    pub tarball: Option<PathBuf>,
    /// Directory the default tarball is made from.
    #[arg(long, default_value = "/usr/include")]
    pub source: PathBuf,
}

#[derive(Debug, Clone)]
pub struct Untar {
    pub tarball: Option<PathBuf>,
    pub source: PathBuf,
}

impl Untar {
    pub fn new(a: &UntarArgs) -> Result<Untar, BenchError> {
        if let Some(t) = &a.tarball {
            if !t.is_file() {
                return Err(BenchError::Args(format!(
                    "tarball {} is not a file",
                    t.display()
                )));
            }
        } else if !a.source.is_dir() {
            return Err(BenchError::Args(format!(
                "--source {} is not a directory",
                a.source.display()
            )));
        }
        Ok(Untar {
            tarball: a.tarball.clone(),
            source: a.source.clone(),
        })
    }

    fn tarball_path(&self, scratch: &Path) -> PathBuf {
        match &self.tarball {
            Some(t) => t.clone(),
            None => scratch.join("untar-source.tar"),
        }
    }
}

/// Regular files and their bytes under `dir`.
fn count_tree(dir: &Path) -> Result<(u64, u64), BenchError> {
    let mut files = 0;
    let mut bytes = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in
            std::fs::read_dir(&d).map_err(|e| BenchError::io(format!("list {}", d.display()), e))?
        {
            let e = e.map_err(|e| BenchError::io(format!("list {}", d.display()), e))?;
            let t = e
                .file_type()
                .map_err(|er| BenchError::io(format!("stat {}", e.path().display()), er))?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                files += 1;
                bytes += e.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    Ok((files, bytes))
}

impl Workload for Untar {
    fn workload(&self) -> &'static str {
        "untar"
    }

    fn name(&self) -> String {
        "untar".into()
    }

    fn label(&self) -> String {
        match &self.tarball {
            Some(t) => format!("untar {}", t.display()),
            None => format!("untar a tarball of {}", self.source.display()),
        }
    }

    fn equivalent(&self) -> String {
        "tar xf TARBALL -C DIR".into()
    }

    fn config(&self) -> serde_json::Value {
        json!({"tarball": self.tarball, "source": self.source})
    }

    fn clients(&self) -> usize {
        1
    }

    fn preflight(&self, scratch: &Path) -> Result<(), BenchError> {
        let tb = self.tarball_path(scratch);
        if self.tarball.is_none() && !tb.exists() {
            let parent = self.source.parent().unwrap_or(Path::new("/"));
            let name = self.source.file_name().ok_or_else(|| {
                BenchError::Args(format!("--source {} has no name", self.source.display()))
            })?;
            let mut c = Command::new("tar");
            c.arg("-cf").arg(&tb).arg("-C").arg(parent).arg(name);
            util::run_checked(&mut c, "tar (making the source tarball)")?;
        }
        Ok(())
    }

    fn run(&self, ctx: &RunCtx) -> Result<Vec<Measurement>, BenchError> {
        let tb = self.tarball_path(&ctx.scratch);
        let dest = ctx.roots[0].join("untar");
        std::fs::create_dir_all(&dest)
            .map_err(|e| BenchError::io(format!("create {}", dest.display()), e))?;
        if ctx.drop_caches {
            util::drop_caches();
        }
        ctx.progress.phase("tar xf", 1);
        let start = Instant::now();
        let mut c = Command::new("tar");
        c.arg("-xf").arg(&tb).arg("-C").arg(&dest);
        util::run_checked(&mut c, "tar xf")?;
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        ctx.progress.phase("tar --compare", 1);
        let mut c = Command::new("tar");
        c.arg("--compare").arg("-f").arg(&tb).arg("-C").arg(&dest);
        let out = util::run_command(&mut c, "tar --compare")?;
        if !out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            let first = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("differs");
            return Err(BenchError::Verify {
                path: dest,
                offset: 0,
                detail: format!("extracted tree differs from the tarball: {first}"),
            });
        }
        let (files, bytes) = count_tree(&dest)?;
        if files == 0 {
            return Err(BenchError::Setup("the tarball holds no files".into()));
        }
        Ok(vec![
            Measurement::new("extract", "files", Unit::OpsPerSec, files as f64 / secs),
            Measurement::new("extract", "bw", Unit::MibPerSec, bytes as f64 / MIB / secs),
            Measurement::new("extract", "time", Unit::Seconds, secs),
        ])
    }
}
