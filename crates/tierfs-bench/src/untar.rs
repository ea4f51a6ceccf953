//! untar: extract a tarball of many small files with the system's `tar` (timed), then compare
//! the extracted tree with the archive (`tar --compare`, which reads every file back; not
//! timed). Differing contents, sizes or missing files fail the run; differing modification
//! times, modes or owners are counted (figure `metadata_diffs`). The default tarball is made once from /usr/include (or `--source`).

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

/// Splits `tar --compare` output into metadata-only differences (modification time, mode,
/// owner: counted and reported, since they are not data loss) and the first data difference
/// (contents, size, a missing file, anything else: the run fails).
pub fn classify_compare(text: &str) -> (u64, Option<String>) {
    let mut meta = 0;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let metadata_only = [
            "Mod time differs",
            "Mode differs",
            "Uid differs",
            "Gid differs",
        ]
        .iter()
        .any(|m| line.ends_with(m));
        if metadata_only {
            meta += 1;
        } else if !line.starts_with("tar: Exiting with failure status") {
            return (meta, Some(line.to_string()));
        }
    }
    (meta, None)
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
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        let (meta_diffs, data_diff) = classify_compare(&text);
        if let Some(line) = data_diff {
            return Err(BenchError::Verify {
                path: dest,
                offset: 0,
                detail: format!("extracted tree differs from the tarball: {line}"),
            });
        }
        if !out.status.success() && meta_diffs == 0 {
            return Err(BenchError::Command {
                command: "tar --compare".into(),
                detail: format!("{}", out.status),
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
            Measurement::new("extract", "metadata_diffs", Unit::Count, meta_diffs as f64),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::classify_compare;

    #[test]
    fn compare_output_is_classified() {
        assert_eq!(classify_compare(""), (0, None));
        assert_eq!(
            classify_compare("linux/a.h: Mod time differs\nlinux/b.h: Mode differs\n"),
            (2, None)
        );
        let (n, bad) = classify_compare(
            "linux/a.h: Mod time differs\nlinux/c.h: Contents differ\ntar: Exiting with failure status due to previous errors",
        );
        assert_eq!(n, 1);
        assert_eq!(bad.as_deref(), Some("linux/c.h: Contents differ"));
        assert!(classify_compare(
            "tar: linux/d.h: Warning: Cannot stat: No such file or directory"
        )
        .1
        .is_some());
    }
}
