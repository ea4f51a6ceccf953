//! Report generation: JSON, CSV, markdown and PNG files exist and parse; aggregation over
//! repetitions and clients follows IOR's summary; failures never show as rates.

use tierfs_bench::fixture::FsUnderTest;
use tierfs_bench::report::{build_rows, Disk, Machine, Report};
use tierfs_bench::runner::{Measurement, Outcome, Sample, Unit, WorkloadResult};
use tierfs_bench::stats::{aggregate, TaskTiming};
use tierfs_bench::Mode;

fn sample(rep: u32, mode: Mode, values: &[(&str, &str, Unit, f64)]) -> Sample {
    Sample {
        rep,
        mode,
        outcome: Outcome::Ok {
            measurements: values
                .iter()
                .map(|(t, m, u, v)| Measurement::new(t, m, *u, *v))
                .collect(),
        },
    }
}

fn synthetic() -> Report {
    let bw = |v: f64, w: f64| {
        vec![
            ("write", "bw", Unit::MibPerSec, v),
            ("read", "bw", Unit::MibPerSec, w),
        ]
    };
    let ior = WorkloadResult {
        workload: "ior".into(),
        name: "ior-fpp".into(),
        label: "IOR file per process".into(),
        equivalent: "ior -w -r -F".into(),
        config: serde_json::json!({"clients": 3}),
        samples: vec![
            sample(0, Mode::Native, &bw(100.0, 300.0)),
            sample(0, Mode::Tierfs, &bw(50.0, 100.0)),
            sample(1, Mode::Tierfs, &bw(70.0, 140.0)),
            sample(1, Mode::Native, &bw(200.0, 500.0)),
            sample(2, Mode::Native, &bw(300.0, 400.0)),
            sample(2, Mode::Tierfs, &bw(60.0, 120.0)),
        ],
    };
    let ops = |v: f64| vec![("create", "ops", Unit::OpsPerSec, v)];
    let md = WorkloadResult {
        workload: "mdtest".into(),
        name: "mdtest-empty-shared".into(),
        label: "mdtest".into(),
        equivalent: "mdtest -F -n 10".into(),
        config: serde_json::Value::Null,
        samples: vec![
            sample(0, Mode::Native, &ops(1000.0)),
            Sample {
                rep: 0,
                mode: Mode::Tierfs,
                outcome: Outcome::Failed {
                    error: "data mismatch in f at offset 3".into(),
                },
            },
            sample(0, Mode::TierfsRwPcc, &ops(900.0)),
        ],
    };
    let fio = WorkloadResult {
        workload: "fio".into(),
        name: "fio-rand-read-4k-qd1".into(),
        label: "fio".into(),
        equivalent: "fio".into(),
        config: serde_json::Value::Null,
        samples: vec![
            Sample {
                rep: 0,
                mode: Mode::Native,
                outcome: Outcome::Skipped {
                    reason: "fio is not installed".into(),
                },
            },
            Sample {
                rep: 0,
                mode: Mode::Tierfs,
                outcome: Outcome::Skipped {
                    reason: "fio is not installed".into(),
                },
            },
        ],
    };
    let modes = vec![Mode::Native, Mode::Tierfs, Mode::TierfsRwPcc];
    let workloads = vec![ior, md, fio];
    let rows = build_rows(&workloads, &modes);
    Report {
        tool: "tierfs bench".into(),
        tierfs_version: "tierfs 0.1.0".into(),
        command_line: "tierfs bench suite --quick".into(),
        date: "2026-01-01T00:00:00Z".into(),
        duration_s: 1.0,
        machine: Machine {
            hostname: "h".into(),
            kernel: "6.9".into(),
            cpu_model: "cpu".into(),
            cores: 2,
            memory_bytes: 1 << 34,
            disk: Disk::detect(std::path::Path::new("/var/tmp")),
        },
        fs: FsUnderTest {
            engine: "postgresql".into(),
            meta: "postgres://tierfs@127.0.0.1:5432/bench".into(),
            target_kind: "s3".into(),
            targets: vec!["s3://tierfs-a/bench/run1?region=garage".into()],
            stripe_count: 1,
        },
        modes,
        reps: 3,
        drop_caches: true,
        notes: vec![],
        workloads,
        rows,
    }
}

#[test]
fn medians_ratios_and_failures() {
    let r = synthetic();
    let get = |name: &str, test: &str, mode: Mode| {
        r.rows
            .iter()
            .find(|x| x.name == name && x.test == test && x.mode == mode)
            .unwrap()
    };
    let n = get("ior-fpp", "write", Mode::Native);
    let s = n.summary.unwrap();
    assert_eq!(
        (s.median, s.min, s.max, s.mean),
        (200.0, 100.0, 300.0, 200.0)
    );
    assert!((s.stddev - 81.649_658_092_772_6).abs() < 1e-9);
    let t = get("ior-fpp", "write", Mode::Tierfs);
    assert_eq!(t.summary.unwrap().median, 60.0);
    assert!((t.ratio_to_native.unwrap() - 0.3).abs() < 1e-12);
    assert_eq!(
        get("ior-fpp", "read", Mode::Tierfs).ratio_to_native,
        Some(0.3)
    );
    let f = get("mdtest-empty-shared", "create", Mode::Tierfs);
    assert_eq!(f.status, "failed");
    assert!(f.summary.is_none() && f.values.is_empty() && f.ratio_to_native.is_none());
    assert!(f.error.as_deref().unwrap().contains("data mismatch"));
    assert_eq!(
        get("mdtest-empty-shared", "create", Mode::TierfsRwPcc).ratio_to_native,
        Some(0.9)
    );
    let sk: Vec<_> = r
        .rows
        .iter()
        .filter(|x| x.name.starts_with("fio"))
        .collect();
    assert_eq!(sk.len(), 2);
    assert!(sk
        .iter()
        .all(|x| x.status == "skipped" && x.summary.is_none()));
    let table = r.table();
    assert!(table.contains("FAILED") && table.contains("skipped") && table.contains("0.30x"));
}

#[test]
fn multi_client_aggregation_is_total_bytes_over_the_whole_span() {
    use std::time::{Duration, Instant};
    let t0 = Instant::now();
    // 3 clients x 2 tasks, each 64 MiB; the slowest ends at 2 s, the earliest starts at 0
    let tasks: Vec<TaskTiming> = (0..6)
        .map(|i| TaskTiming {
            start: t0 + Duration::from_millis(50 * i),
            end: t0 + Duration::from_millis(1000 + 200 * i),
            bytes: 64 << 20,
            ops: 64,
        })
        .collect();
    let a = aggregate(&tasks).unwrap();
    assert!((a.seconds - 2.0).abs() < 1e-9);
    assert!((a.mib_per_sec - 192.0).abs() < 1e-9);
    assert!((a.ops_per_sec - 192.0).abs() < 1e-9);
}

#[test]
fn json_csv_markdown_and_png_files_are_written_and_parse() {
    let r = synthetic();
    let dir = tempfile::tempdir().unwrap();
    let files = r.write_all(dir.path()).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    for want in [
        "results.json",
        "results.csv",
        "report.md",
        "ior-bw.png",
        "mdtest-ops.png",
        "ratio-to-native.png",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
    // JSON round trip
    let back: Report =
        serde_json::from_slice(&std::fs::read(dir.path().join("results.json")).unwrap()).unwrap();
    assert_eq!(back, r);
    // CSV: header plus one record per row, each with the same fields
    let mut rd = csv::Reader::from_path(dir.path().join("results.csv")).unwrap();
    let headers = rd.headers().unwrap().clone();
    assert_eq!(&headers[0], "workload");
    let recs: Vec<csv::StringRecord> = rd.records().map(|x| x.unwrap()).collect();
    assert_eq!(recs.len(), r.rows.len());
    let failed = recs.iter().find(|x| &x[6] == "failed").unwrap();
    assert_eq!(&failed[8], "", "a failed row has no median");
    // markdown: context and tables
    let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    for want in [
        "tierfs bench suite --quick",
        "tierfs 0.1.0",
        "2 cores",
        "| write | bw (MiB/s) |",
        "![ior-bw.png](ior-bw.png)",
        "FAILED",
        "| tierfs under test | postgresql metadata, 1 s3 target, stripe count 1:",
    ] {
        assert!(md.contains(want), "{want} not in report.md");
    }
    assert!(r
        .table()
        .starts_with("tierfs under test: postgresql metadata, 1 s3 target"));
    // a results.json written before the field existed still reads
    let mut v: serde_json::Value = serde_json::to_value(&r).unwrap();
    v.as_object_mut().unwrap().remove("fs");
    let old: Report = serde_json::from_value(v).unwrap();
    assert_eq!(old.fs, FsUnderTest::default());
    assert!(!old.markdown(&[]).contains("tierfs under test"));
    // PNG: signature, and the IHDR dimensions are sane
    for f in files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
    {
        let b = std::fs::read(f).unwrap();
        assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "{}", f.display());
        let w = u32::from_be_bytes(b[16..20].try_into().unwrap());
        let h = u32::from_be_bytes(b[20..24].try_into().unwrap());
        assert!(w >= 600 && h >= 400, "{w}x{h}");
        assert!(b.len() > 5000, "{} is nearly empty", f.display());
    }
}
