//! Reports: every run's figures (or failure), summarised per mode as medians with IOR's
//! max/min/mean/stddev, ratios to native, and the context needed to trust them (command line,
//! tierfs version, machine, date). Written as JSON, CSV, markdown and a terminal table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::fixture::{FsUnderTest, Mode};
use crate::runner::{Outcome, Unit, WorkloadResult};
use crate::stats::{summarize, Summary};

/// The machine the figures come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub hostname: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cores: usize,
    pub memory_bytes: u64,
    pub disk: Disk,
}

/// The disk under the work dir (native mode and tierfs's targets and database).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Disk {
    pub path: PathBuf,
    pub mount_point: String,
    pub device: String,
    pub fstype: String,
    pub model: String,
    pub rotational: Option<bool>,
    pub size_bytes: Option<u64>,
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

impl Machine {
    /// Reads /proc and /sys; fields that cannot be read are left empty.
    pub fn detect(workdir: &Path) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let memory_bytes = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|k| k.parse::<u64>().ok())
            .map(|k| k * 1024)
            .unwrap_or(0);
        Machine {
            hostname: read_trim("/proc/sys/kernel/hostname"),
            kernel: read_trim("/proc/sys/kernel/osrelease"),
            cpu_model,
            cores,
            memory_bytes,
            disk: Disk::detect(workdir),
        }
    }
}

impl Disk {
    pub fn detect(path: &Path) -> Disk {
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        // the longest mount point that is a prefix of path
        let mut best: Option<(String, String, String)> = None;
        for line in std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
        {
            let f: Vec<&str> = line.split(' ').collect();
            let Some(sep) = f.iter().position(|x| *x == "-") else {
                continue;
            };
            if f.len() < sep + 3 || f.len() < 5 {
                continue;
            }
            let mp = f[4].replace("\\040", " ");
            if path.starts_with(&mp) && best.as_ref().is_none_or(|b| mp.len() >= b.0.len()) {
                best = Some((mp, f[sep + 2].to_string(), f[sep + 1].to_string()));
            }
        }
        let (mount_point, device, fstype) = best.unwrap_or_default();
        let dev_name = device.trim_start_matches("/dev/").to_string();
        // a partition's disk: /sys/class/block/<part>/.. is the disk
        let mut sys = PathBuf::from(format!("/sys/class/block/{dev_name}"));
        if sys.join("partition").exists() {
            if let Ok(real) = std::fs::canonicalize(&sys) {
                if let Some(p) = real.parent() {
                    sys = p.to_path_buf();
                }
            }
        }
        let s = |rel: &str| read_trim(&sys.join(rel).to_string_lossy());
        let model = [s("device/model"), s("device/vendor")]
            .into_iter()
            .find(|m| !m.is_empty())
            .unwrap_or_else(|| {
                if dev_name.starts_with("vd") {
                    "virtio disk".into()
                } else {
                    String::new()
                }
            });
        let rotational = match s("queue/rotational").as_str() {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        };
        let size_bytes = s("size").parse::<u64>().ok().map(|sectors| sectors * 512);
        Disk {
            path,
            mount_point,
            device,
            fstype,
            model,
            rotational,
            size_bytes,
        }
    }
}

/// One figure of one configuration in one mode, over repetitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub workload: String,
    pub name: String,
    pub test: String,
    pub metric: String,
    pub unit: Unit,
    pub mode: Mode,
    /// ok, failed or skipped: only ok rows carry figures.
    pub status: String,
    pub error: Option<String>,
    pub values: Vec<f64>,
    pub summary: Option<Summary>,
    /// This mode's median over native's median.
    pub ratio_to_native: Option<f64>,
}

/// A whole report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub tool: String,
    pub tierfs_version: String,
    pub command_line: String,
    pub date: String,
    pub duration_s: f64,
    pub machine: Machine,
    /// The tierfs under test: metadata engine and storage targets (empty in reports written
    /// before this field existed).
    #[serde(default)]
    pub fs: FsUnderTest,
    pub modes: Vec<Mode>,
    pub reps: u32,
    pub drop_caches: bool,
    pub notes: Vec<String>,
    pub workloads: Vec<WorkloadResult>,
    pub rows: Vec<Row>,
}

/// Summarises samples into rows: a mode with any failed (or skipped) run gets a failed (or
/// skipped) row and no figure.
pub fn build_rows(workloads: &[WorkloadResult], modes: &[Mode]) -> Vec<Row> {
    let mut rows = Vec::new();
    for w in workloads {
        let mut keys: Vec<(String, String, Unit)> = Vec::new();
        for s in &w.samples {
            if let Outcome::Ok { measurements } = &s.outcome {
                for m in measurements {
                    let k = (m.test.clone(), m.metric.clone(), m.unit);
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
            }
        }
        if keys.is_empty() {
            keys.push(("-".into(), "-".into(), Unit::OpsPerSec));
        }
        let mut medians: BTreeMap<(String, String), f64> = BTreeMap::new();
        let first = rows.len();
        for &mode in modes {
            let samples: Vec<_> = w.samples.iter().filter(|s| s.mode == mode).collect();
            if samples.is_empty() {
                continue;
            }
            let failed = samples.iter().find_map(|s| match &s.outcome {
                Outcome::Failed { error } => Some(format!("rep {}: {error}", s.rep + 1)),
                _ => None,
            });
            let skipped = samples.iter().find_map(|s| match &s.outcome {
                Outcome::Skipped { reason } => Some(reason.clone()),
                _ => None,
            });
            for (test, metric, unit) in &keys {
                let mut values = Vec::new();
                for s in &samples {
                    if let Outcome::Ok { measurements } = &s.outcome {
                        if let Some(m) = measurements
                            .iter()
                            .find(|m| &m.test == test && &m.metric == metric)
                        {
                            values.push(m.value);
                        }
                    }
                }
                let (status, error) = if let Some(e) = &failed {
                    ("failed", Some(e.clone()))
                } else if let Some(r) = &skipped {
                    ("skipped", Some(r.clone()))
                } else if values.len() != samples.len() {
                    ("failed", Some("figure missing in some runs".into()))
                } else {
                    ("ok", None)
                };
                let summary = if status == "ok" {
                    summarize(&values)
                } else {
                    None
                };
                let (status, error) = if status == "ok" && summary.is_none() {
                    ("failed", Some("no valid figure".to_string()))
                } else {
                    (status, error)
                };
                if let (Mode::Native, Some(s)) = (mode, &summary) {
                    medians.insert((test.clone(), metric.clone()), s.median);
                }
                rows.push(Row {
                    workload: w.workload.clone(),
                    name: w.name.clone(),
                    test: test.clone(),
                    metric: metric.clone(),
                    unit: *unit,
                    mode,
                    status: status.into(),
                    error,
                    values: if status == "ok" { values } else { Vec::new() },
                    summary,
                    ratio_to_native: None,
                });
            }
        }
        for r in &mut rows[first..] {
            if let (Some(s), Some(n)) =
                (&r.summary, medians.get(&(r.test.clone(), r.metric.clone())))
            {
                if *n > 0.0 {
                    r.ratio_to_native = Some(s.median / n);
                }
            }
        }
    }
    rows
}

/// A figure for a table cell.
pub fn fmt_value(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn cell(r: Option<&Row>) -> String {
    match r {
        None => "".into(),
        Some(r) => match (&r.summary, r.status.as_str()) {
            (Some(s), "ok") if s.n > 1 => {
                format!("{} ±{}", fmt_value(s.median), fmt_value(s.stddev))
            }
            (Some(s), "ok") => fmt_value(s.median),
            (_, "skipped") => "skipped".into(),
            _ => "FAILED".into(),
        },
    }
}

/// (name, test, metric, unit) groups in report order, with their row per mode.
type Group<'a> = ((String, String, String, Unit), Vec<&'a Row>);

fn groups(rows: &[Row]) -> Vec<Group<'_>> {
    let mut out: Vec<Group> = Vec::new();
    for r in rows {
        let k = (r.name.clone(), r.test.clone(), r.metric.clone(), r.unit);
        match out.iter_mut().find(|g| g.0 == k) {
            Some(g) => g.1.push(r),
            None => out.push((k, vec![r])),
        }
    }
    out
}

fn ratio_cells(report: &Report, rs: &[&Row]) -> Vec<String> {
    report
        .modes
        .iter()
        .filter(|m| **m != Mode::Native)
        .map(|m| {
            rs.iter()
                .find(|r| r.mode == *m)
                .and_then(|r| r.ratio_to_native)
                .map(|x| format!("{x:.2}x"))
                .unwrap_or_else(|| "-".into())
        })
        .collect()
}

fn header(report: &Report) -> Vec<String> {
    let mut h: Vec<String> = vec!["benchmark".into(), "test".into(), "metric".into()];
    h.extend(report.modes.iter().map(|m| m.name().to_string()));
    if report.modes.contains(&Mode::Native) {
        h.extend(
            report
                .modes
                .iter()
                .filter(|m| **m != Mode::Native)
                .map(|m| format!("{m}/native")),
        );
    }
    h
}

fn table_rows(report: &Report) -> Vec<Vec<String>> {
    groups(&report.rows)
        .into_iter()
        .map(|((name, test, metric, unit), rs)| {
            let mut line = vec![name, test, format!("{metric} ({})", unit.label())];
            line.extend(
                report
                    .modes
                    .iter()
                    .map(|m| cell(rs.iter().copied().find(|r| r.mode == *m))),
            );
            if report.modes.contains(&Mode::Native) {
                line.extend(ratio_cells(report, &rs));
            }
            line
        })
        .collect()
}

impl Report {
    /// Terminal table: medians (± stddev over repetitions) and ratios to native.
    pub fn table(&self) -> String {
        let h = header(self);
        let rows = table_rows(self);
        let mut out = String::new();
        if !self.fs.engine.is_empty() {
            out.push_str(&format!("tierfs under test: {}\n", self.fs.summary()));
        }
        let mut widths: Vec<usize> = h.iter().map(|c| c.chars().count()).collect();
        for r in &rows {
            for (i, c) in r.iter().enumerate() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if i < 3 {
                        format!("{c:<w$}", w = widths[i])
                    } else {
                        format!("{c:>w$}", w = widths[i])
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
        };
        out.push_str(&line(&h));
        out.push('\n');
        out.push_str(
            &widths
                .iter()
                .map(|w| "-".repeat(*w))
                .collect::<Vec<_>>()
                .join("  "),
        );
        out.push('\n');
        for r in &rows {
            out.push_str(&line(r));
            out.push('\n');
        }
        for f in self.failures() {
            out.push_str(&format!("{f}\n"));
        }
        out
    }

    /// One line per failed or skipped configuration and mode.
    pub fn failures(&self) -> Vec<String> {
        let mut seen = Vec::new();
        for r in &self.rows {
            if r.status != "ok" {
                let s = format!(
                    "{} {} {}: {}",
                    r.name,
                    r.mode,
                    r.status.to_uppercase(),
                    r.error.clone().unwrap_or_default()
                );
                if !seen.contains(&s) {
                    seen.push(s);
                }
            }
        }
        seen
    }

    pub fn markdown(&self, charts: &[PathBuf]) -> String {
        let mut s = String::new();
        let m = &self.machine;
        let _ = writeln!(s, "# tierfs bench results\n");
        let _ = writeln!(s, "| | |\n|---|---|");
        let _ = writeln!(s, "| date | {} |", self.date);
        let _ = writeln!(s, "| command | `{}` |", self.command_line);
        let _ = writeln!(s, "| tierfs | {} |", self.tierfs_version);
        let _ = writeln!(
            s,
            "| machine | {} ({}), {} cores ({}), {:.1} GiB memory |",
            m.hostname,
            m.kernel,
            m.cores,
            m.cpu_model,
            m.memory_bytes as f64 / (1u64 << 30) as f64
        );
        let _ = writeln!(
            s,
            "| disk | {} {} ({}{}{}) at {}, work dir {} |",
            m.disk.device,
            m.disk.fstype,
            if m.disk.model.is_empty() {
                "unknown model"
            } else {
                &m.disk.model
            },
            match m.disk.rotational {
                Some(true) => ", rotational",
                Some(false) => ", non-rotational",
                None => "",
            },
            m.disk
                .size_bytes
                .map(|b| format!(", {:.0} GiB", b as f64 / (1u64 << 30) as f64))
                .unwrap_or_default(),
            m.disk.mount_point,
            m.disk.path.display()
        );
        if !self.fs.engine.is_empty() {
            let _ = writeln!(
                s,
                "| tierfs under test | {}: metadata `{}`; targets {} |",
                self.fs.summary(),
                self.fs.meta,
                self.fs
                    .targets
                    .iter()
                    .map(|t| format!("`{t}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let _ = writeln!(
            s,
            "| modes | {} (interleaved per repetition) |",
            self.modes
                .iter()
                .map(|m| m.name())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let _ = writeln!(
            s,
            "| repetitions | {} (cells: median ± population stddev) |",
            self.reps
        );
        let _ = writeln!(
            s,
            "| page cache | {} |",
            if self.drop_caches {
                "dropped between writing and reading"
            } else {
                "not dropped"
            }
        );
        let _ = writeln!(s, "| wall time | {:.0} s |\n", self.duration_s);
        for n in &self.notes {
            let _ = writeln!(s, "- {n}");
        }
        if !self.notes.is_empty() {
            s.push('\n');
        }
        let h = header(self);
        for w in &self.workloads {
            let _ = writeln!(s, "## {}\n", w.name);
            let _ = writeln!(s, "{}  \nEquivalent: `{}`\n", w.label, w.equivalent);
            let _ = writeln!(s, "| {} |", h[1..].join(" | "));
            let _ = writeln!(s, "|{}", "---|".repeat(h.len() - 1));
            let rows: Vec<Row> = self
                .rows
                .iter()
                .filter(|r| r.name == w.name)
                .cloned()
                .collect();
            let sub = Report {
                rows,
                ..self.clone()
            };
            for r in table_rows(&sub) {
                let _ = writeln!(s, "| {} |", r[1..].join(" | "));
            }
            s.push('\n');
        }
        let f = self.failures();
        if !f.is_empty() {
            let _ = writeln!(s, "## Failed and skipped runs\n");
            for l in f {
                let _ = writeln!(s, "- {l}");
            }
            s.push('\n');
        }
        if !charts.is_empty() {
            let _ = writeln!(s, "## Charts\n");
            for c in charts {
                if let Some(n) = c.file_name() {
                    let n = n.to_string_lossy();
                    let _ = writeln!(s, "![{n}]({n})\n");
                }
            }
        }
        s
    }

    /// Summary rows as CSV.
    pub fn csv(&self) -> Result<String, BenchError> {
        let mut w = csv::Writer::from_writer(Vec::new());
        let e = |e: csv::Error| BenchError::Report(e.to_string());
        w.write_record([
            "workload",
            "name",
            "test",
            "metric",
            "unit",
            "mode",
            "status",
            "n",
            "median",
            "mean",
            "min",
            "max",
            "stddev",
            "ratio_to_native",
            "values",
            "error",
        ])
        .map_err(e)?;
        for r in &self.rows {
            let f = |x: Option<f64>| x.map(|v| format!("{v}")).unwrap_or_default();
            let s = r.summary;
            w.write_record([
                r.workload.clone(),
                r.name.clone(),
                r.test.clone(),
                r.metric.clone(),
                r.unit.label().to_string(),
                r.mode.name().to_string(),
                r.status.clone(),
                s.map(|s| s.n.to_string()).unwrap_or_default(),
                f(s.map(|s| s.median)),
                f(s.map(|s| s.mean)),
                f(s.map(|s| s.min)),
                f(s.map(|s| s.max)),
                f(s.map(|s| s.stddev)),
                f(r.ratio_to_native),
                r.values
                    .iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                r.error.clone().unwrap_or_default(),
            ])
            .map_err(e)?;
        }
        let bytes = w
            .into_inner()
            .map_err(|x| BenchError::Report(x.to_string()))?;
        String::from_utf8(bytes).map_err(|x| BenchError::Report(x.to_string()))
    }

    /// Writes results.json, results.csv, the charts and report.md into `dir`; returns the paths.
    pub fn write_all(&self, dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| BenchError::io(format!("create {}", dir.display()), e))?;
        let w = |name: &str, data: &[u8]| -> Result<PathBuf, BenchError> {
            let p = dir.join(name);
            std::fs::write(&p, data)
                .map_err(|e| BenchError::io(format!("write {}", p.display()), e))?;
            Ok(p)
        };
        let mut out = Vec::new();
        let json =
            serde_json::to_vec_pretty(self).map_err(|e| BenchError::Report(e.to_string()))?;
        out.push(w("results.json", &json)?);
        out.push(w("results.csv", self.csv()?.as_bytes())?);
        let charts = crate::plot::write_charts(self, dir)?;
        out.push(w("report.md", self.markdown(&charts).as_bytes())?);
        out.extend(charts);
        Ok(out)
    }
}
