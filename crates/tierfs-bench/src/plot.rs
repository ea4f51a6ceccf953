//! PNG charts: grouped bars, one group per benchmark figure, one bar per mode (like the seeds'
//! figures), plus the ratio of every figure to native. Drawn with plotters' bitmap backend and
//! an embedded DejaVu font, so no system font or library is needed (headless machines).

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::error::BenchError;
use crate::fixture::Mode;
use crate::report::{fmt_value, Report, Row};

const FONT: &str = "sans-serif";

fn ensure_font() -> Result<(), BenchError> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *ONCE.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(BenchError::Report(
            "the embedded chart font is invalid".into(),
        ))
    }
}

fn color(m: Mode) -> RGBColor {
    match m {
        Mode::Native => RGBColor(110, 110, 110),
        Mode::Tierfs => RGBColor(31, 119, 180),
        Mode::TierfsRwPcc => RGBColor(255, 127, 14),
        Mode::TierfsRoPcc => RGBColor(44, 160, 44),
    }
}

/// One group of bars.
pub struct Category {
    /// Label lines under the group.
    pub label: Vec<String>,
    /// One value per mode; None: failed or skipped (drawn as a marked gap).
    pub values: Vec<Option<f64>>,
}

fn perr<E: std::fmt::Display>(e: E) -> BenchError {
    BenchError::Report(format!("chart: {e}"))
}

/// Draws a grouped bar chart into `path`.
pub fn bar_chart(
    path: &Path,
    title: &str,
    y_desc: &str,
    modes: &[Mode],
    cats: &[Category],
    reference_line: Option<f64>,
) -> Result<(), BenchError> {
    ensure_font()?;
    let n = cats.len().max(1);
    let width = (160 * n as u32 + 200).clamp(700, 2400);
    let root = BitMapBackend::new(path, (width, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let maxv = cats
        .iter()
        .flat_map(|c| c.values.iter().flatten())
        .copied()
        .chain(reference_line)
        .fold(0.0f64, f64::max);
    let top = if maxv > 0.0 { maxv * 1.18 } else { 1.0 };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(12)
        .x_label_area_size(56)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..n as f64, 0f64..top)
        .map_err(perr)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_label_formatter(&|_| String::new())
        .y_desc(y_desc)
        .y_label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .draw()
        .map_err(perr)?;
    let m = modes.len().max(1) as f64;
    let bw = 0.8 / m;
    for (j, &mode) in modes.iter().enumerate() {
        let c = color(mode);
        let bars: Vec<Rectangle<(f64, f64)>> = cats
            .iter()
            .enumerate()
            .filter_map(|(i, cat)| {
                let v = cat.values.get(j).copied().flatten()?;
                let x0 = i as f64 + 0.1 + j as f64 * bw;
                Some(Rectangle::new([(x0, 0.0), (x0 + bw * 0.92, v)], c.filled()))
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(perr)?
            .label(mode.name())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
        let small =
            TextStyle::from((FONT, 11).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
        let fail = TextStyle::from((FONT, 11).into_font())
            .color(&RED)
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        let labels: Vec<Text<(f64, f64), String>> = cats
            .iter()
            .enumerate()
            .map(|(i, cat)| {
                let xc = i as f64 + 0.1 + (j as f64 + 0.46) * bw;
                match cat.values.get(j).copied().flatten() {
                    Some(v) => Text::new(fmt_value(v), (xc, v), small.clone()),
                    None => Text::new("failed".to_string(), (xc, 0.0), fail.clone()),
                }
            })
            .collect();
        chart.draw_series(labels).map_err(perr)?;
    }
    if let Some(r) = reference_line {
        chart
            .draw_series(LineSeries::new(
                vec![(0.0, r), (n as f64, r)],
                BLACK.stroke_width(1),
            ))
            .map_err(perr)?;
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 14))
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(perr)?;
    let style = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    for (i, cat) in cats.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        for (k, line) in cat.label.iter().enumerate() {
            root.draw(&Text::new(
                line.clone(),
                (px, py + 6 + 16 * k as i32),
                style.clone(),
            ))
            .map_err(perr)?;
        }
    }
    root.present().map_err(perr)?;
    Ok(())
}

/// (family, metric, title) of each chart a report gets.
const SPECS: [(&str, &str, &str); 6] = [
    ("ior", "bw", "IOR aggregate bandwidth"),
    ("mdtest", "ops", "mdtest rates"),
    ("fio", "bw", "fio bandwidth"),
    ("fio", "iops", "fio IOPS"),
    ("filebench", "ops", "filebench operations"),
    ("untar", "files", "untar: files extracted"),
];

fn categories<'a>(
    rows: &'a [Row],
    modes: &[Mode],
    pred: impl Fn(&Row) -> bool,
) -> Vec<(Vec<&'a Row>, Vec<String>)> {
    let mut keys: Vec<(String, String, String)> = Vec::new();
    for r in rows.iter().filter(|r| pred(r)) {
        let k = (r.name.clone(), r.test.clone(), r.metric.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(name, test, metric)| {
            let rs: Vec<&Row> = modes
                .iter()
                .filter_map(|m| {
                    rows.iter().find(|r| {
                        r.mode == *m && r.name == name && r.test == test && r.metric == metric
                    })
                })
                .collect();
            let short = name
                .split_once('-')
                .map(|(_, rest)| rest.to_string())
                .unwrap_or(name.clone());
            (rs, vec![short, test])
        })
        .collect()
}

/// Writes the charts of `report` into `dir`; returns their paths.
pub fn write_charts(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
    let mut out = Vec::new();
    let modes = &report.modes;
    for (family, metric, title) in SPECS {
        let cats = categories(&report.rows, modes, |r| {
            r.workload == family && r.metric == metric
        });
        if cats.is_empty() {
            continue;
        }
        let unit = cats[0].0.first().map(|r| r.unit.label()).unwrap_or("");
        let cats: Vec<Category> = cats
            .into_iter()
            .map(|(rs, label)| Category {
                label,
                values: modes
                    .iter()
                    .map(|m| {
                        rs.iter()
                            .find(|r| r.mode == *m)
                            .and_then(|r| r.summary.map(|s| s.median))
                    })
                    .collect(),
            })
            .collect();
        let p = dir.join(format!("{family}-{metric}.png"));
        bar_chart(&p, &format!("{title} (median)"), unit, modes, &cats, None)?;
        out.push(p);
    }
    // every primary figure relative to native
    let others: Vec<Mode> = modes
        .iter()
        .copied()
        .filter(|m| *m != Mode::Native)
        .collect();
    if modes.contains(&Mode::Native) && !others.is_empty() {
        let cats = categories(&report.rows, modes, |r| {
            SPECS
                .iter()
                .any(|(f, m, _)| r.workload == *f && r.metric == *m && *m != "iops")
        });
        let cats: Vec<Category> = cats
            .into_iter()
            .map(|(rs, label)| Category {
                label,
                values: others
                    .iter()
                    .map(|m| {
                        rs.iter()
                            .find(|r| r.mode == *m)
                            .and_then(|r| r.ratio_to_native)
                    })
                    .collect(),
            })
            .collect();
        if !cats.is_empty() {
            let p = dir.join("ratio-to-native.png");
            bar_chart(
                &p,
                "Each figure relative to native (1.0 = the local disk)",
                "ratio to native",
                &others,
                &cats,
                Some(1.0),
            )?;
            out.push(p);
        }
    }
    Ok(out)
}

/// The seeds' PCC speed-ups over the remote tier without the cache (issue 15): seed 004's
/// SSD-LPCC filebench figures and seed 000's 4 KiB O_DIRECT random write at QD1 (7.5 → 46.7
/// MB/s), by the run names `scripts/bench-remote.sh` gives.
pub const SEED_SPEEDUPS: [(&str, f64); 4] = [
    ("filebench-fileserver", 2.0),
    ("filebench-webserver", 8.3),
    ("filebench-varmail", 1.5),
    ("fio-rand-write-4k-qd1-direct", 6.2),
];

/// What tells apart, in a chart's label, runs of one configuration name: the clients when
/// more than one ("3 clients"), and IOR's `-C` (a task reads what another client wrote).
fn clients_tag(config: &serde_json::Value) -> Option<String> {
    let clients = config.get("clients").and_then(|c| c.as_u64()).unwrap_or(1);
    let reorder = config.get("reorder").and_then(|r| r.as_bool()) == Some(true);
    match (clients > 1, reorder) {
        (false, false) => None,
        (true, false) => Some(format!("{clients} clients")),
        (false, true) => Some("-C".into()),
        (true, true) => Some(format!("{clients} clients -C")),
    }
}

/// Draws, from several reports, each primary figure's PCC speed-up over uncached tierfs (one
/// group per figure, a bar per PCC mode, the seed's speed-up in the label, 1.0 marked).
pub fn speedup_chart(reports: &[Report], path: &Path, title: &str) -> Result<(), BenchError> {
    let pcc = [Mode::TierfsRwPcc, Mode::TierfsRoPcc];
    let mut cats = Vec::new();
    for rep in reports {
        // The figure the seeds report for each workload.
        let primary = [
            ("filebench", "ops"),
            ("fio", "iops"),
            ("mdtest", "ops"),
            ("ior", "bw"),
            ("untar", "files"),
        ];
        let Some((family, metric)) = primary
            .iter()
            .find(|(f, m)| rep.rows.iter().any(|r| r.workload == *f && r.metric == *m))
        else {
            continue;
        };
        for (rs, mut label) in categories(&rep.rows, &rep.modes, |r| {
            r.workload == *family && r.metric == *metric
        }) {
            let median = |m: Mode| {
                rs.iter()
                    .find(|r| r.mode == m)
                    .and_then(|r| r.summary.map(|s| s.median))
            };
            let base = median(Mode::Tierfs);
            let name = rs.first().map(|r| r.name.as_str()).unwrap_or("");
            if let Some(tag) = rep
                .workloads
                .iter()
                .find(|w| w.name == name)
                .and_then(|w| clients_tag(&w.config))
            {
                // runs of one configuration that differ in clients or -C (IOR's names do not)
                label.insert(1, tag);
            }
            if let Some((_, x)) = SEED_SPEEDUPS.iter().find(|(n, _)| *n == name) {
                label.push(format!("seed: {x}x"));
            }
            cats.push(Category {
                label,
                values: pcc
                    .iter()
                    .map(|m| match (median(*m), base) {
                        (Some(v), Some(b)) if b > 0.0 => Some(v / b),
                        _ => None,
                    })
                    .collect(),
            });
        }
    }
    if cats.is_empty() {
        return Err(BenchError::Report(
            "no figure with both uncached tierfs and a PCC mode in these reports".into(),
        ));
    }
    bar_chart(
        path,
        title,
        "speed-up over uncached tierfs",
        &pcc,
        &cats,
        Some(1.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_client_runs_are_told_apart_in_labels() {
        let ior = |c: u64, r: bool| serde_json::json!({"clients": c, "reorder": r});
        assert_eq!(clients_tag(&ior(1, false)), None);
        assert_eq!(clients_tag(&ior(3, false)).as_deref(), Some("3 clients"));
        assert_eq!(clients_tag(&ior(2, true)).as_deref(), Some("2 clients -C"));
        assert_eq!(clients_tag(&ior(1, true)).as_deref(), Some("-C"));
        // mdtest's and filebench's configurations have no `reorder`
        assert_eq!(
            clients_tag(&serde_json::json!({"clients": 4})).as_deref(),
            Some("4 clients")
        );
        assert_eq!(clients_tag(&serde_json::json!({})), None);
    }
}
