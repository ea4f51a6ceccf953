//! Aggregation as IOR's summary does it: one figure per repetition (aggregate bandwidth of all
//! tasks: total bytes over the span from the first task's start to the last task's end), then
//! max, min, mean and (population) standard deviation over repetitions, plus the median that the
//! side-by-side tables use.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// What one task did in one phase.
#[derive(Debug, Clone, Copy)]
pub struct TaskTiming {
    pub start: Instant,
    pub end: Instant,
    pub bytes: u64,
    pub ops: u64,
}

/// The aggregate of one phase over all tasks (IOR: one line of "Results").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aggregate {
    pub seconds: f64,
    pub bytes: u64,
    pub ops: u64,
    pub mib_per_sec: f64,
    pub ops_per_sec: f64,
}

/// Aggregates task timings: total bytes and operations over the span of the whole phase.
pub fn aggregate(tasks: &[TaskTiming]) -> Option<Aggregate> {
    let start = tasks.iter().map(|t| t.start).min()?;
    let end = tasks.iter().map(|t| t.end).max()?;
    let seconds = end.duration_since(start).as_secs_f64().max(1e-9);
    let bytes: u64 = tasks.iter().map(|t| t.bytes).sum();
    let ops: u64 = tasks.iter().map(|t| t.ops).sum();
    Some(Aggregate {
        seconds,
        bytes,
        ops,
        mib_per_sec: bytes as f64 / MIB / seconds,
        ops_per_sec: ops as f64 / seconds,
    })
}

pub const MIB: f64 = 1024.0 * 1024.0;

/// Summary of one figure over repetitions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    pub stddev: f64,
}

/// Summary of `xs`; None when empty or any value is not finite.
pub fn summarize(xs: &[f64]) -> Option<Summary> {
    if xs.is_empty() || xs.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let n = xs.len();
    let mean = xs.iter().sum::<f64>() / n as f64;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
    Some(Summary {
        n,
        median: median(xs)?,
        mean,
        min: xs.iter().copied().fold(f64::INFINITY, f64::min),
        max: xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        stddev: var.sqrt(),
    })
}

/// Median (the mean of the middle two for an even count).
pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn aggregate_spans_first_start_to_last_end() {
        let t0 = Instant::now();
        let s = |a: u64, b: u64, bytes: u64| TaskTiming {
            start: t0 + Duration::from_millis(a),
            end: t0 + Duration::from_millis(b),
            bytes,
            ops: bytes / (1024 * 1024),
        };
        // three tasks on three clients, 1 s total span, 6 MiB in all
        let a = aggregate(&[
            s(0, 500, 2 << 20),
            s(100, 1000, 2 << 20),
            s(200, 900, 2 << 20),
        ])
        .unwrap();
        assert!((a.seconds - 1.0).abs() < 1e-9);
        assert!((a.mib_per_sec - 6.0).abs() < 1e-9);
        assert!((a.ops_per_sec - 6.0).abs() < 1e-9);
        assert!(aggregate(&[]).is_none());
    }

    #[test]
    fn summary_matches_ior_definitions() {
        let s = summarize(&[100.0, 200.0, 300.0, 400.0]).unwrap();
        assert_eq!(s.max, 400.0);
        assert_eq!(s.min, 100.0);
        assert_eq!(s.mean, 250.0);
        assert_eq!(s.median, 250.0);
        assert!((s.stddev - 111.803_398_874_989_5).abs() < 1e-9);
        assert_eq!(summarize(&[5.0]).unwrap().stddev, 0.0);
        assert!(summarize(&[]).is_none());
        assert!(summarize(&[1.0, f64::NAN]).is_none());
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    }
}
