//! Results that cannot lie: corrupted data fails the run, and a failed run carries no rate.

mod common;

use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::{is_root, run_modes};
use tierfs_bench::error::BenchError;
use tierfs_bench::pattern;
use tierfs_bench::runner::{Measurement, RunCtx, Unit, Workload};
use tierfs_bench::util;
use tierfs_bench::Mode;

/// Writes a pattern file through client 0, corrupts one byte on disk (through the same path),
/// then reads it back through the last client with the harness's verification.
struct Corrupting {
    clients: usize,
    corrupt: bool,
}

impl Workload for Corrupting {
    fn workload(&self) -> &'static str {
        "ior"
    }
    fn name(&self) -> String {
        format!("corrupt-{}", self.corrupt)
    }
    fn label(&self) -> String {
        self.name()
    }
    fn equivalent(&self) -> String {
        String::new()
    }
    fn config(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    fn clients(&self) -> usize {
        self.clients
    }
    fn run(&self, ctx: &RunCtx) -> Result<Vec<Measurement>, BenchError> {
        let path = ctx.roots[0].join("data");
        let mut buf = vec![0u8; 256 << 10];
        pattern::fill(&mut buf, 42, 0);
        std::fs::write(&path, &buf).unwrap();
        if self.corrupt {
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(b"X", 100_000).unwrap();
        }
        let reader = ctx.roots[ctx.roots.len() - 1].join("data");
        let f = std::fs::File::open(&reader).unwrap();
        let mut back = vec![0u8; buf.len()];
        util::pread_exact(&f, &mut back, 0, &reader)?;
        pattern::verify(&back, 42, 0, &mut Vec::new(), &reader)?;
        // and a read past the end is a short read
        let mut more = vec![0u8; 16];
        util::pread_exact(&f, &mut more, buf.len() as u64 - 8, &reader)?;
        Ok(vec![Measurement::new("read", "bw", Unit::MibPerSec, 1.0)])
    }
}

#[test]
fn corrupted_file_fails_the_run_and_reports_no_rate() {
    if !is_root() {
        eprintln!("skipped: needs root (FUSE)");
        return;
    }
    let r = run_modes(
        vec![Box::new(Corrupting {
            clients: 2,
            corrupt: true,
        })],
        vec![Mode::Native, Mode::Tierfs],
        1,
        Duration::from_secs(120),
    );
    assert_eq!(r.rows.len(), 2);
    for row in &r.rows {
        assert_eq!(row.status, "failed");
        assert!(row.summary.is_none() && row.values.is_empty() && row.ratio_to_native.is_none());
        let e = row.error.as_deref().unwrap();
        assert!(
            e.contains("data mismatch") && e.contains("at offset 100000"),
            "{e}"
        );
    }
    assert!(r.table().contains("FAILED"));
    assert!(r.markdown(&[]).contains("FAILED"));
}

#[test]
fn short_file_fails_the_run() {
    if !is_root() {
        eprintln!("skipped: needs root (FUSE)");
        return;
    }
    // Without corruption the only failure is the deliberate read past the end.
    let r = run_modes(
        vec![Box::new(Corrupting {
            clients: 1,
            corrupt: false,
        })],
        vec![Mode::Native, Mode::Tierfs],
        1,
        Duration::from_secs(120),
    );
    for row in &r.rows {
        assert_eq!(row.status, "failed");
        assert!(
            row.error.as_deref().unwrap().contains("short read"),
            "{:?}",
            row.error
        );
    }
}
