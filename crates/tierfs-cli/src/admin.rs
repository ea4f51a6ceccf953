//! Administration commands: df, setstripe, getstripe, project, status, stats.

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use tierfs_meta::{now_nanos, open_engine, Kind, Layout, MetaEngine, SliceData, StripeDefault};
use tierfs_store::allocator::TargetFill;
use tierfs_store::size::human;
use tierfs_store::{Allocator, TargetSpec};

use crate::cli::{DfArgs, GetstripeArgs, ProjectArgs, SetstripeArgs, StatsArgs, StatusArgs};
use crate::error::{CliError, Result};
use crate::format::{stripe_count, stripe_size};
use crate::locate::{all_mounts, engine_and_ino, mount_of, MountInfo};

fn size_str(n: u64, h: bool) -> String {
    if h {
        human(n)
    } else {
        (n / 1024).to_string()
    }
}

/// (id, url, capacity, used, available) of one target.
type TargetRow = (u32, String, u64, u64, u64);

/// Space of one target, and of the device under it.
struct TargetSpace {
    row: TargetRow,
    /// The device of a local target (`st_dev` of its directory); `None` for object stores.
    dev: Option<u64>,
    /// Size and free space of that device.
    dev_space: tierfs_store::target::DeviceSpace,
}

/// Capacity, use and free space of each target.
fn target_space(engine: &dyn MetaEngine) -> Result<Vec<TargetRow>> {
    Ok(target_spaces(engine)?.into_iter().map(|t| t.row).collect())
}

fn target_spaces(engine: &dyn MetaEngine) -> Result<Vec<TargetSpace>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for t in engine.targets()? {
        let spec = TargetSpec::parse(&t.url)?;
        let devid = match &spec.kind {
            tierfs_store::target::TargetKind::Local(dir) => {
                std::fs::metadata(dir).ok().map(|m| m.dev())
            }
            tierfs_store::target::TargetKind::S3(_) => None,
        };
        let dev = tierfs_store::Target::open(t.id, spec)
            .map(|x| x.device_space())
            .unwrap_or_default();
        let (cap, avail) = if t.capacity > 0 {
            let left = t.capacity.saturating_sub(t.used);
            // An object store has no device to ask (total 0): its capacity alone counts.
            let left = if dev.total > 0 {
                left.min(dev.avail)
            } else {
                left
            };
            (t.capacity, left)
        } else {
            (dev.total, dev.avail)
        };
        out.push(TargetSpace {
            row: (t.id, t.url, cap, t.used, avail),
            dev: devid,
            dev_space: dev,
        });
    }
    Ok(out)
}

/// The filesystem's capacity, use and free space (the `df` summary): targets on one device
/// share its size and free space, so a device counts once (at most its size, at most its free
/// space, however many targets sit on it); object stores count by their capacity.
fn summary(targets: &[TargetSpace]) -> (u64, u64, u64) {
    let mut devices: BTreeMap<u64, (u64, u64, tierfs_store::target::DeviceSpace)> = BTreeMap::new();
    let (mut tc, mut tu, mut ta) = (0u64, 0u64, 0u64);
    for t in targets {
        let (_, _, cap, used, avail) = t.row;
        tu += used;
        match t.dev {
            Some(d) if t.dev_space.total > 0 => {
                let e = devices.entry(d).or_insert((0, 0, t.dev_space));
                e.0 += cap;
                e.1 += avail;
            }
            _ => {
                tc += cap;
                ta += avail;
            }
        }
    }
    for (cap, avail, dev) in devices.into_values() {
        tc += cap.min(dev.total);
        ta += avail.min(dev.avail);
    }
    (tc, tu, ta)
}

fn fills(engine: &dyn MetaEngine) -> Result<Vec<TargetFill>> {
    Ok(target_space(engine)?
        .into_iter()
        .map(|(id, _, cap, used, avail)| TargetFill {
            id,
            used: if cap > 0 {
                cap.saturating_sub(avail).max(used)
            } else {
                used
            },
            capacity: cap,
        })
        .collect())
}

fn df_one(root: &Path, mi: &MountInfo, h: bool) -> Result<()> {
    let engine = open_engine(&mi.meta)?;
    let unit = if h { "bytes" } else { "1K-blocks" };
    println!(
        "{:<24} {:>12} {:>12} {:>12} {:>5} Mounted on",
        "UUID", unit, "Used", "Available", "Use%"
    );
    let db = mi
        .meta
        .strip_prefix("sqlite://")
        .map(std::path::PathBuf::from);
    let (mdt_size, mdt_total, mdt_avail) = match &db {
        Some(p) => {
            let size = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
                + std::fs::metadata(format!("{}-wal", p.display()))
                    .map(|m| m.len())
                    .unwrap_or(0);
            let dev = tierfs_store::Target::open(
                0,
                TargetSpec::parse(&format!(
                    "file://{}",
                    p.parent().unwrap_or(Path::new("/")).display()
                ))?,
            )
            .map(|t| t.device_space())
            .unwrap_or_default();
            (size, dev.total, dev.avail)
        }
        None => (0, 0, 0),
    };
    let pct = |used: u64, total: u64| {
        if total == 0 {
            0
        } else {
            (used * 100).div_ceil(total)
        }
    };
    println!(
        "{:<24} {:>12} {:>12} {:>12} {:>4}% {}[MDT:0]",
        format!("{}-MDT0000_UUID", mi.name),
        size_str(mdt_total, h),
        size_str(mdt_size, h),
        size_str(mdt_avail, h),
        pct(mdt_size, mdt_total),
        root.display()
    );
    let spaces = target_spaces(engine.as_ref())?;
    for &(id, _, cap, used, avail) in spaces.iter().map(|t| &t.row) {
        println!(
            "{:<24} {:>12} {:>12} {:>12} {:>4}% {}[OST:{id}]",
            format!("{}-OST{:04x}_UUID", mi.name, id),
            size_str(cap, h),
            size_str(used, h),
            size_str(avail, h),
            pct(used, cap),
            root.display()
        );
    }
    let (tc, tu, ta) = summary(&spaces);
    let usage = engine.usage()?;
    println!();
    println!(
        "{:<24} {:>12} {:>12} {:>12} {:>4}% {}",
        "filesystem_summary:",
        size_str(tc, h),
        size_str(tu, h),
        size_str(ta, h),
        pct(tu, tc),
        root.display()
    );
    println!("{:<24} {:>12}", "inodes used:", usage.inodes);
    Ok(())
}

pub fn df(a: DfArgs) -> Result<()> {
    let mounts = match &a.path {
        Some(p) => vec![mount_of(p)?],
        None => all_mounts()
            .iter()
            .filter_map(|m| mount_of(m).ok())
            .collect(),
    };
    if mounts.is_empty() {
        return Err(CliError::Other("no tierfs filesystem is mounted".into()));
    }
    for (i, (root, mi)) in mounts.iter().enumerate() {
        if i > 0 {
            println!();
        }
        df_one(root, mi, a.human)?;
    }
    Ok(())
}

pub fn setstripe(a: SetstripeArgs) -> Result<()> {
    if a.count.is_none() && a.size.is_none() {
        return Err(CliError::Usage(
            "setstripe needs -c COUNT and/or -S SIZE".into(),
        ));
    }
    let size = a.size.as_deref().map(stripe_size).transpose()?;
    let created = if std::fs::symlink_metadata(&a.path).is_err() {
        // lfs setstripe on a new name creates an empty file with that layout.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&a.path)
            .map_err(|e| CliError::Io(a.path.display().to_string(), e))?;
        true
    } else {
        false
    };
    let (engine, ino, _mi) = engine_and_ino(&a.path)?;
    let ntargets = engine.targets()?.len();
    let count = a.count.map(|c| stripe_count(c, ntargets)).transpose()?;
    let attr = engine.getattr(ino)?;
    match attr.kind {
        Kind::Dir => {
            let mut def = StripeDefault {
                stripe_count: attr.dir_default.stripe_count,
                stripe_size: attr.dir_default.stripe_size,
            };
            if let Some(c) = count {
                def.stripe_count = c;
            }
            if let Some(s) = size {
                def.stripe_size = s;
            }
            engine.set_dir_stripe(ino, def)?;
        }
        Kind::File => {
            let parent_def = engine.resolve_stripe_default(attr.parent)?;
            let cur = attr.layout.clone();
            let count = count.unwrap_or_else(|| {
                cur.as_ref()
                    .map(|l| l.stripe_count())
                    .unwrap_or(parent_def.stripe_count)
            });
            let ssize = size.unwrap_or_else(|| {
                cur.as_ref()
                    .map(|l| l.stripe_size)
                    .unwrap_or(parent_def.stripe_size)
            });
            let targets = Allocator::default().choose(&fills(engine.as_ref())?, count);
            let r = engine.set_file_layout(
                ino,
                &Layout {
                    stripe_size: ssize,
                    targets,
                },
            );
            if let Err(tierfs_meta::MetaError::NotEmpty) = r {
                return Err(CliError::Usage(format!(
                    "{}: the layout of a file that holds data cannot change",
                    a.path.display()
                )));
            }
            r?;
        }
        _ => {
            return Err(CliError::Usage(format!(
                "{}: not a regular file or directory",
                a.path.display()
            )))
        }
    }
    if created {
        tracing::debug!("created {}", a.path.display());
    }
    Ok(())
}

pub fn getstripe(a: GetstripeArgs) -> Result<()> {
    let (engine, ino, _mi) = engine_and_ino(&a.path)?;
    let attr = engine.getattr(ino)?;
    println!("{}", a.path.display());
    match attr.kind {
        Kind::Dir => {
            let d = engine.resolve_stripe_default(ino)?;
            let own = attr.dir_default.stripe_count > 0 || attr.dir_default.stripe_size > 0;
            println!(
                "stripe_count:  {} stripe_size:   {}{}",
                d.stripe_count,
                d.stripe_size,
                if own { "" } else { " (inherited)" }
            );
        }
        Kind::File => {
            let l = attr
                .layout
                .clone()
                .ok_or_else(|| CliError::Other("file has no layout".into()))?;
            println!("lmm_stripe_count:  {}", l.stripe_count());
            println!("lmm_stripe_size:   {}", l.stripe_size);
            println!(
                "lmm_stripe_offset: {}",
                l.targets.first().copied().unwrap_or(0)
            );
            let mut seen = std::collections::HashSet::new();
            let mut per: BTreeMap<u32, (u64, u64)> =
                l.targets.iter().map(|t| (*t, (0, 0))).collect();
            let mut inline = 0u64;
            let chunks = attr.size.div_ceil(l.stripe_size);
            for c in 0..chunks {
                for s in engine.read_chunk(ino, c)? {
                    match s.data {
                        SliceData::Object { target, obj, .. } => {
                            let e = per.entry(target).or_insert((0, 0));
                            if seen.insert(obj) {
                                e.0 += 1;
                            }
                            e.1 += s.len;
                        }
                        SliceData::Inline(_) => inline += s.len,
                        SliceData::Zero => {}
                    }
                }
            }
            println!("\tobdidx\t\t objects\t\t bytes");
            for (t, (n, b)) in per {
                println!("\t{t:>6}\t\t{n:>8}\t\t{b:>10}");
            }
            if inline > 0 {
                println!("\tinline (in the metadata engine): {inline} bytes");
            }
        }
        _ => println!("(no layout: not a regular file)"),
    }
    Ok(())
}

pub fn project(a: ProjectArgs) -> Result<()> {
    let (engine, ino, _mi) = engine_and_ino(&a.path)?;
    match a.projid {
        Some(p) => {
            let n = engine.set_projid(ino, p, a.inherit)?;
            if a.inherit {
                println!("set project {p} on {n} inode(s) under {}", a.path.display());
            }
        }
        None => {
            let (p, inh) = engine.get_projid(ino)?;
            println!(
                "{:>10} {} {}",
                p,
                if inh { "P" } else { "-" },
                a.path.display()
            );
        }
    }
    Ok(())
}

fn print_status(engine: Arc<dyn MetaEngine>) -> Result<()> {
    let info = engine.info()?;
    println!("filesystem: {} ({})", info.name, info.uuid);
    println!(
        "defaults:   stripe count {}, stripe size {}, inline up to {}, schema v{}",
        info.default_stripe_count,
        human(info.default_stripe_size),
        human(info.inline_threshold),
        info.schema_version
    );
    let usage = engine.usage()?;
    println!(
        "inodes:     {}    data: {}",
        usage.inodes,
        human(usage.bytes)
    );
    println!("targets:");
    for (id, url, cap, used, _avail) in target_space(engine.as_ref())? {
        let of = if cap > 0 {
            human(cap)
        } else {
            "no set capacity".to_string()
        };
        println!("  OST{id:04x}  {url}  used {} of {of}", human(used));
    }
    use tierfs_client::liveness::{state, Liveness};
    let sessions: Vec<_> = engine
        .sessions()?
        .into_iter()
        .map(|s| {
            let l = state(&s);
            (s, l)
        })
        .collect();
    let gone = sessions
        .iter()
        .filter(|(_, l)| matches!(l, Liveness::Gone(_)))
        .count();
    if gone > 0 {
        println!(
            "clients:    {} mounted, {gone} dead (session not yet ended)",
            sessions.len() - gone
        );
    } else {
        println!("clients:    {} mounted", sessions.len());
    }
    let now = now_nanos();
    // Heartbeats are stamped with the database's clock: their age is by it too.
    let db_now = engine.db_now()?;
    // A database the workers cannot report to (an error here) still shows everything else.
    let reports = engine.worker_reports();
    for (s, l) in sessions {
        let dead = match l {
            Liveness::Gone(why) => format!("  DEAD: {why}"),
            _ => String::new(),
        };
        println!(
            "  {:<16} host {} pid {} at {}  (session {}, heartbeat {:.1}s ago, v{}){dead}",
            s.client_name,
            s.host_name(),
            s.pid,
            s.mountpoint,
            s.id,
            (db_now - s.heartbeat) as f64 / 1e9,
            s.version
        );
        match &reports {
            Ok(all) => print_workers(all.iter().filter(|r| r.session == s.id), now),
            Err(e) => println!("    workers: cannot read their reports: {e}"),
        }
    }
    for line in crate::changelog::status_lines(engine.as_ref())? {
        println!("{line}");
    }
    Ok(())
}

/// One session's workers, as its daemon last reported them: a header with the report's age,
/// then `worker NAME STATE last run T ago  runs N  errors N  PROGRESS`, and the last error
/// (with its age) on a line of its own.
fn print_workers<'a>(reports: impl Iterator<Item = &'a tierfs_meta::WorkerReport>, now: i64) {
    let reports: Vec<_> = reports.collect();
    let ago = |t: i64| {
        if t == 0 {
            "never".to_string()
        } else {
            format!("{:.1}s ago", (now - t) as f64 / 1e9)
        }
    };
    let Some(first) = reports.first() else {
        println!("    workers: none reported (yet)");
        return;
    };
    println!("    workers (reported {}):", ago(first.reported));
    for r in reports {
        let mut line = format!(
            "    worker {:<15} {:<8} last run {}  runs {}  errors {}",
            r.name,
            r.state,
            ago(r.last_run),
            r.runs,
            r.errors
        );
        if !r.progress.is_empty() {
            line.push_str(&format!("  {}", r.progress));
        }
        println!("{line}");
        if let Some(e) = &r.last_error {
            println!("      last error {}: {e}", ago(r.last_error_at));
        }
    }
}

pub fn status(a: StatusArgs) -> Result<()> {
    match (&a.meta, &a.path) {
        (Some(m), _) => print_status(open_engine(m)?),
        (None, Some(p)) => {
            let (_root, mi) = mount_of(p)?;
            print_status(open_engine(&mi.meta)?)
        }
        (None, None) => Err(CliError::Usage("status needs a PATH or --meta URL".into())),
    }
}

/// Parses `name{label="v"} value` lines of the Prometheus text format.
fn parse_prom(text: &str) -> Vec<(String, String, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((key, val)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = val.parse::<f64>() else { continue };
        let (name, label) = match key.split_once('{') {
            Some((n, rest)) => (n.to_string(), rest.trim_end_matches('}').to_string()),
            None => (key.to_string(), String::new()),
        };
        out.push((name, label, v));
    }
    out
}

pub fn stats(a: StatsArgs) -> Result<()> {
    let (root, mi) = mount_of(&a.mount)?;
    let text = std::fs::read_to_string(root.join(tierfs_client::fs::STATS_NAME))
        .map_err(|e| CliError::Io(a.mount.display().to_string(), e))?;
    if a.raw {
        print!("{text}");
        return Ok(());
    }
    println!(
        "client {} (session {}) at {}",
        mi.client, mi.session, mi.mountpoint
    );
    let rows = parse_prom(&text);
    // count, errors, misses (normal negative answers such as ENOENT), seconds
    let mut ops: BTreeMap<String, (f64, f64, f64, f64)> = BTreeMap::new();
    let mut bytes: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for (name, label, v) in rows {
        let l = label
            .split_once('=')
            .map(|(_, v)| v.trim_matches('"').to_string())
            .unwrap_or_default();
        match name.as_str() {
            "tierfs_fuse_ops_total" => ops.entry(l).or_default().0 = v,
            "tierfs_fuse_errors_total" => ops.entry(l).or_default().1 = v,
            "tierfs_fuse_misses_total" => ops.entry(l).or_default().2 = v,
            "tierfs_fuse_op_seconds_sum" => ops.entry(l).or_default().3 = v,
            "tierfs_target_read_bytes_total" => bytes.entry(l).or_default().0 = v,
            "tierfs_target_written_bytes_total" => bytes.entry(l).or_default().1 = v,
            _ => {}
        }
    }
    println!(
        "{:<14} {:>12} {:>8} {:>8} {:>14}",
        "operation", "count", "errors", "misses", "mean latency"
    );
    for (op, (n, e, m, s)) in &ops {
        let mean = if *n > 0.0 { s / n * 1e6 } else { 0.0 };
        println!("{op:<14} {n:>12} {e:>8} {m:>8} {:>11.1} µs", mean);
    }
    println!();
    println!("{:<14} {:>14} {:>14}", "target", "read", "written");
    for (t, (r, w)) in &bytes {
        println!(
            "OST{:<11} {:>14} {:>14}",
            t,
            human(*r as u64),
            human(*w as u64)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierfs_store::target::DeviceSpace;

    fn t(
        id: u32,
        cap: u64,
        used: u64,
        avail: u64,
        dev: Option<u64>,
        total: u64,
        free: u64,
    ) -> TargetSpace {
        TargetSpace {
            row: (id, String::new(), cap, used, avail),
            dev,
            dev_space: DeviceSpace { total, avail: free },
        }
    }

    #[test]
    fn summary_counts_a_device_once() {
        // two uncapped targets on one 100-byte device with 40 free, one on another device
        let rows = [
            t(0, 100, 10, 40, Some(1), 100, 40),
            t(1, 100, 20, 40, Some(1), 100, 40),
            t(2, 50, 5, 30, Some(2), 50, 30),
        ];
        assert_eq!(summary(&rows), (150, 35, 70));
        // capped targets on one device: their capacities, at most the device
        let rows = [
            t(0, 30, 10, 20, Some(1), 100, 90),
            t(1, 30, 0, 30, Some(1), 100, 90),
        ];
        assert_eq!(summary(&rows), (60, 10, 50));
        let rows = [
            t(0, 80, 0, 80, Some(1), 100, 60),
            t(1, 80, 0, 80, Some(1), 100, 60),
        ];
        assert_eq!(summary(&rows), (100, 0, 60));
        // object stores: by capacity, each
        let rows = [
            t(0, 1000, 1, 999, None, 0, 0),
            t(1, 1000, 1, 999, None, 0, 0),
        ];
        assert_eq!(summary(&rows), (2000, 2, 1998));
    }
}
