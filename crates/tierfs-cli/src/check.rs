//! `tierfs gc` and `tierfs fsck`: the metadata checked against the objects on the targets.
//!
//! Both list every target's objects first and read the metadata's references after, so an
//! object committed while the listing runs is seen as referenced. An object nothing references
//! (no slice, no trash row) is either a leak (an upload whose client died before its commit) or
//! an upload still in flight; it is removed only when it is:
//! - older than the grace period (`--grace`, default 1 hour);
//! - not written while a client that is still mounted was running (that client may still
//!   commit it: a file kept open with buffered writes commits at its next flush, fsync or
//!   close);
//! - below the engine's object id counter (an id above it was handed to nobody: not ours to
//!   judge, kept and reported).
//!
//! Names under a target that are not tierfs objects (marker files, anything foreign) are never
//! touched.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tierfs_meta::hsm::HsmFlags;
use tierfs_meta::{
    now_nanos, open_engine, MetaEngine, MetaError, MetaIssue, Nanos, ObjectRef, SessionInfo,
};
use tierfs_store::size::human;
use tierfs_store::target::ListedObject;
use tierfs_store::TargetSet;

use crate::error::{CliError, Result};

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Metadata database URL of the filesystem.
    #[arg(long)]
    pub meta: String,
    /// Leave unreferenced objects younger than this alone (uploads in flight), e.g. 30m, 1h,
    /// 0 (every client stopped writing).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// A client whose heartbeat is older than this counts as gone (as the clients'
    /// session_timeout_secs); a client on this host whose process is gone counts as gone at once.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub session_timeout: Duration,
    /// List what would be removed, remove nothing.
    #[arg(long, short = 'n')]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct FsckArgs {
    /// Metadata database URL of the filesystem.
    #[arg(long)]
    pub meta: String,
    /// Repair what can be repaired: remove orphan objects (as `tierfs gc`, with its grace),
    /// forget trash rows whose object is gone, end dead clients' sessions with their open files
    /// and locks, drop their clean RW-PCC leases, purge files without names nobody holds,
    /// remove directory entries that lead nowhere; HSM: trash a released file's leftover
    /// slices when its copy is recorded, clear ARCHIVED without a copy on a file that is not
    /// released, forget copies of files that are gone, cancel requests of files that are gone
    /// and impossible ones, requeue dead agents' requests (docs/hsm.md, "fsck"). Dirty RW-PCC
    /// leases of dead clients, missing objects and released files without a copy are
    /// reported, never changed.
    #[arg(long)]
    pub repair: bool,
    /// Grace of unreferenced objects (see `tierfs gc --grace`).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// A client whose heartbeat is older than this counts as gone.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub session_timeout: Duration,
    /// Also read the HSM archives: every recorded archive copy must be there with its recorded
    /// size (one HEAD request per copy). With --repair, a file whose copy is missing or of the
    /// wrong size is flagged `lost` (release and restore refused; `tierfs hsm clear --lost`
    /// undoes it once the copy is back).
    #[arg(long)]
    pub archives: bool,
}

/// Progress on stderr (hidden when it is not a terminal).
fn spinner(msg: String) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} {pos} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(msg);
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// A progress bar on stderr (hidden when it is not a terminal).
pub(crate) fn bar(len: u64, msg: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.set_message(msg.to_string());
    pb
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether a session is a client still running: a recent heartbeat, and (on this host) a live
/// process. A session that recorded its daemon's identity (`tierfs_client::liveness`) is judged
/// by it (boot id, pid namespace and start time: a reused pid is not taken for the daemon);
/// one without it, by its pid when its host name is this host's.
fn session_alive(s: &SessionInfo, timeout: Duration, host: &str, now: Nanos) -> bool {
    use tierfs_client::liveness::{state, Liveness};
    if now - s.heartbeat > timeout.as_nanos() as i64 {
        return false;
    }
    match state(s) {
        Liveness::Gone(_) => return false,
        Liveness::Running => return true,
        Liveness::Unknown => {}
    }
    if s.process_id().is_none() && s.host_name() == host && s.pid > 0 && !process_running(s.pid) {
        return false;
    }
    true
}

/// Whether process `pid` of this host runs (a zombie, killed and not yet reaped, does not).
fn process_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(st) => match st.rsplit_once(')') {
            Some((_, rest)) => !matches!(rest.trim_start().chars().next(), Some('Z' | 'X')),
            None => true,
        },
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

/// Why an unreferenced object is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Keep {
    /// Younger than the grace: maybe an upload in flight.
    Young,
    /// Written while a client that is still mounted was running.
    LiveClient,
    /// Its id was never handed out.
    UnknownId,
}

/// Everything both commands learn: the targets' objects, then the metadata's references.
struct Scan {
    targets: TargetSet,
    /// (target, obj) -> the object as listed.
    objects: HashMap<(u32, u64), ListedObject>,
    /// Staging files of interrupted uploads: never referenced.
    staged: Vec<(u32, ListedObject)>,
    ignored: u64,
    refs: Vec<ObjectRef>,
    counter: u64,
    /// Start of the oldest session still running (None: no client is running).
    oldest_live: Option<Nanos>,
    live_clients: usize,
}

fn scan(engine: &dyn MetaEngine, session_timeout: Duration) -> Result<Scan> {
    let list: Vec<(u32, String, u64)> = engine
        .targets()?
        .into_iter()
        .map(|t| (t.id, t.url, t.capacity))
        .collect();
    let targets = TargetSet::open(&list)?;
    // Never list (and so never remove) objects of a target that is not this filesystem's.
    tierfs_client::daemon::check_targets(&targets, &engine.info()?)?;
    let mut objects = HashMap::new();
    let mut staged = Vec::new();
    let mut ignored = 0;
    for t in targets.all() {
        let pb = spinner(format!("listing target {} ({}):", t.id, t.spec.url));
        let mut found = Vec::new();
        ignored += t.list_objects(&mut |l| {
            pb.inc(1);
            found.push(l);
        })?;
        pb.finish_and_clear();
        for l in found {
            if l.staged.is_some() {
                staged.push((t.id, l));
            } else {
                objects.insert((t.id, l.obj), l);
            }
        }
    }
    // After the listing: an object committed meanwhile shows as referenced.
    let refs = engine.object_refs()?;
    let counter = engine.object_id_counter()?;
    let host = hostname();
    // Heartbeats carry the database's clock: judged by it, not this host's.
    let now = engine.db_now()?;
    let live: Vec<SessionInfo> = engine
        .sessions()?
        .into_iter()
        .filter(|s| session_alive(s, session_timeout, &host, now))
        .collect();
    Ok(Scan {
        targets,
        objects,
        staged,
        ignored,
        refs,
        counter,
        oldest_live: live.iter().map(|s| s.started).min(),
        live_clients: live.len(),
    })
}

/// An unreferenced object or staging file, and whether (and why) it stays.
struct Orphan {
    target: u32,
    item: ListedObject,
    keep: Option<Keep>,
}

impl Scan {
    fn referenced(&self) -> HashSet<(u32, u64)> {
        self.refs.iter().map(|r| (r.target, r.obj)).collect()
    }

    fn orphans(&self, grace: Duration) -> Vec<Orphan> {
        let referenced = self.referenced();
        let now = now_nanos();
        let judge = |l: &ListedObject| -> Option<Keep> {
            if l.obj >= self.counter {
                Some(Keep::UnknownId)
            } else if now - l.modified < grace.as_nanos() as i64 {
                Some(Keep::Young)
            } else if self.oldest_live.is_some_and(|t| l.modified >= t) {
                Some(Keep::LiveClient)
            } else {
                None
            }
        };
        let mut out: Vec<Orphan> = self
            .objects
            .iter()
            .filter(|(k, _)| !referenced.contains(k))
            .map(|((t, _), l)| Orphan {
                target: *t,
                item: l.clone(),
                keep: judge(l),
            })
            .chain(self.staged.iter().map(|(t, l)| Orphan {
                target: *t,
                item: l.clone(),
                keep: judge(l),
            }))
            .collect();
        out.sort_by_key(|o| (o.target, o.item.obj));
        out
    }

    /// Removes the orphans no rule keeps; returns (removed, bytes, failures).
    fn remove(&self, orphans: &[Orphan]) -> (u64, u64, Vec<String>) {
        let todo: Vec<&Orphan> = orphans.iter().filter(|o| o.keep.is_none()).collect();
        let pb = bar(todo.len() as u64, "removing leaked objects");
        let (mut n, mut bytes, mut failed) = (0, 0, Vec::new());
        for o in todo {
            let r = self
                .targets
                .get(o.target)
                .map_err(CliError::from)
                .and_then(|t| t.remove_listed(&o.item).map_err(CliError::from));
            match r {
                Ok(()) => {
                    n += 1;
                    bytes += o.item.size;
                }
                Err(e) => failed.push(format!("target {} object {}: {e}", o.target, o.item.obj)),
            }
            pb.inc(1);
        }
        pb.finish_and_clear();
        (n, bytes, failed)
    }
}

fn age(modified: Nanos) -> String {
    let s = ((now_nanos() - modified).max(0) / 1_000_000_000) as u64;
    humantime::format_duration(Duration::from_secs(s)).to_string()
}

fn keep_text(k: Keep) -> &'static str {
    match k {
        Keep::Young => "younger than the grace (maybe an upload in flight)",
        Keep::LiveClient => "written while a client still mounted was running",
        Keep::UnknownId => "id never handed out",
    }
}

pub fn gc(a: GcArgs) -> Result<()> {
    let engine = open_engine(&a.meta)?;
    let s = scan(engine.as_ref(), a.session_timeout)?;
    let orphans = s.orphans(a.grace);
    let scanned = (s.objects.len() + s.staged.len()) as u64;
    let referenced = s.referenced();
    let in_use = s.objects.keys().filter(|k| referenced.contains(k)).count();
    let leaked: Vec<&Orphan> = orphans.iter().filter(|o| o.keep.is_none()).collect();
    let leaked_bytes: u64 = leaked.iter().map(|o| o.item.size).sum();
    let mut kept: HashMap<Keep, (u64, u64)> = HashMap::new();
    for o in &orphans {
        if let Some(k) = o.keep {
            let e = kept.entry(k).or_default();
            e.0 += 1;
            e.1 += o.item.size;
        }
    }
    if a.dry_run {
        for o in &leaked {
            println!(
                "would remove: target {} object {}{} ({}, written {} ago)",
                o.target,
                o.item.obj,
                o.item
                    .staged
                    .as_deref()
                    .map(|n| format!(" (staging file {n})"))
                    .unwrap_or_default(),
                human(o.item.size),
                age(o.item.modified)
            );
        }
    }
    let (removed, removed_bytes, failed) = if a.dry_run {
        (0, 0, Vec::new())
    } else {
        s.remove(&orphans)
    };
    for f in &failed {
        eprintln!("tierfs: could not remove {f}");
    }
    println!(
        "objects scanned: {scanned} on {} targets ({} other names left alone)",
        s.targets.len(),
        s.ignored
    );
    println!("referenced:      {in_use}");
    println!(
        "leaked:          {} ({})",
        leaked.len(),
        human(leaked_bytes)
    );
    let mut kinds: Vec<_> = kept.into_iter().collect();
    kinds.sort();
    for (k, (n, b)) in kinds {
        println!("kept:            {n} ({}): {}", human(b), keep_text(k));
    }
    if a.dry_run {
        println!("removed:         0 (dry run)");
    } else {
        println!("removed:         {removed} ({})", human(removed_bytes));
    }
    if !failed.is_empty() {
        return Err(CliError::Other(format!(
            "{} leaked objects could not be removed",
            failed.len()
        )));
    }
    Ok(())
}

/// One line of the fsck table.
#[derive(Default)]
struct Row {
    count: u64,
    bytes: u64,
    example: Option<String>,
    repaired: u64,
    /// Cannot be repaired (reported).
    unrepairable: bool,
}

impl Row {
    fn add(&mut self, bytes: u64, example: impl FnOnce() -> String) {
        self.count += 1;
        self.bytes += bytes;
        if self.example.is_none() {
            self.example = Some(example());
        }
    }
}

fn path_or_ino(engine: &dyn MetaEngine, ino: u64) -> String {
    match engine.path_of(ino) {
        Ok(Some(p)) => format!("{} (inode {ino})", String::from_utf8_lossy(&p)),
        _ => format!("inode {ino} (no name)"),
    }
}

/// Returns the exit code: 0 clean, 1 problems found (repaired or not).
pub fn fsck(a: FsckArgs) -> Result<i32> {
    let engine = open_engine(&a.meta)?;
    let e = engine.as_ref();
    let s = scan(e, a.session_timeout)?;
    let timeout = a.session_timeout.as_nanos() as i64;
    let kinds = [
        "missing object (data lost)",
        "slice past its object's end",
        "orphan object",
        "trash row, object already gone",
        "directory entry to a missing inode",
        "file without names nobody holds",
        "open file of a dead session",
        "lock of a dead session",
        "clean RW-PCC lease of a dead client",
        "dirty RW-PCC lease of a dead client",
        "HSM: released file with data",
        "HSM: ARCHIVED flag without a copy",
        "HSM: released file without a copy",
        "HSM: copy of a file that is gone",
        "HSM: request of a file that is gone",
        "HSM: impossible request",
        "HSM: request held by a dead agent",
        "HSM: archive copy missing or bad size",
        "HSM: archive unreachable",
        "xattr count differs from xattrs",
    ];
    // What --repair does about each HSM problem (printed under the table when found).
    let hsm_fix: HashMap<&str, &str> = [
        (kinds[10], "the leftover slices go to the trash (the archive copy holds the data); kept when no copy is recorded"),
        (kinds[11], "ARCHIVED is cleared: the file's data is in the capacity tier, archive it again"),
        (kinds[12], "none: the data is lost (restore the file from a backup, or `tierfs hsm import` its copy)"),
        (kinds[13], "the copy's record goes, as the file's unlink would have done (a REMOVE of it queued first when remove_archive_on_last_unlink is on)"),
        (kinds[14], "the request is canceled"),
        (kinds[15], "unknown action or state: marked failed; started by no agent: back to waiting; a RESTORE of a file that is not released: canceled"),
        (kinds[16], "requeued as the coordinator's housekeeping does (the attempt counts)"),
        (kinds[17], "the file is flagged lost (release and restore refused; `tierfs hsm clear --lost` undoes it)"),
        (kinds[18], "none: the archive's copies were not checked"),
    ]
    .into_iter()
    .collect();
    let mut rows: HashMap<&str, Row> = kinds.iter().map(|k| (*k, Row::default())).collect();

    // Objects the slices read, checked against the listing.
    let pb = bar(s.refs.len() as u64, "checking references");
    let mut missing: Vec<&ObjectRef> = Vec::new();
    let mut gone_trash: Vec<u64> = Vec::new();
    for r in &s.refs {
        pb.inc(1);
        match (s.objects.get(&(r.target, r.obj)), r.trash) {
            (None, None) => missing.push(r),
            (None, Some(id)) => gone_trash.push(id),
            (Some(l), None) if l.size < r.end => {
                rows.get_mut(kinds[1]).unwrap().add(r.end - l.size, || {
                    format!(
                        "{}: object {} on target {} has {} bytes, a slice reads up to {}",
                        path_or_ino(e, r.ino),
                        r.obj,
                        r.target,
                        l.size,
                        r.end
                    )
                });
            }
            _ => {}
        }
    }
    pb.finish_and_clear();
    // A slice committed after the listing, or an object deleted after the references were
    // read, would look missing: read the references again and look at the object itself.
    if !missing.is_empty() {
        let again: HashSet<(u32, u64)> = e
            .object_refs()?
            .into_iter()
            .filter(|r| r.trash.is_none())
            .map(|r| (r.target, r.obj))
            .collect();
        let mut lost_files: Vec<u64> = Vec::new();
        for r in missing {
            if !again.contains(&(r.target, r.obj)) {
                continue;
            }
            if s.targets.get(r.target)?.exists(r.obj)? {
                continue;
            }
            rows.get_mut(kinds[0]).unwrap().add(r.end, || {
                format!(
                    "{}: object {} on target {}",
                    path_or_ino(e, r.ino),
                    r.obj,
                    r.target
                )
            });
            rows.get_mut(kinds[0]).unwrap().unrepairable = true;
            lost_files.push(r.ino);
        }
        lost_files.sort_unstable();
        lost_files.dedup();
        for ino in &lost_files {
            eprintln!("tierfs: data lost: {}", path_or_ino(e, *ino));
        }
    }

    // Orphans: reported when gc would remove them; younger ones are uploads in flight.
    let orphans = s.orphans(a.grace);
    let mut kept = 0u64;
    for o in &orphans {
        match o.keep {
            None => rows.get_mut(kinds[2]).unwrap().add(o.item.size, || {
                format!(
                    "object {} on target {}{}, written {} ago",
                    o.item.obj,
                    o.target,
                    if o.item.staged.is_some() {
                        " (staging file)"
                    } else {
                        ""
                    },
                    age(o.item.modified)
                )
            }),
            Some(_) => kept += 1,
        }
    }
    for id in &gone_trash {
        rows.get_mut(kinds[3])
            .unwrap()
            .add(0, || format!("trash row {id}"));
    }

    // The metadata alone.
    let issues = e.meta_issues(timeout)?;
    for i in &issues {
        let (k, ex) = match i {
            MetaIssue::DanglingEntry { parent, name, ino } => (
                kinds[4],
                format!(
                    "{}/{} -> inode {ino}",
                    e.path_of(*parent)
                        .ok()
                        .flatten()
                        .map(|p| String::from_utf8_lossy(&p)
                            .trim_end_matches('/')
                            .to_string())
                        .unwrap_or_else(|| format!("inode {parent}")),
                    String::from_utf8_lossy(name)
                ),
            ),
            MetaIssue::UnheldOrphan { ino } => (kinds[5], format!("inode {ino}")),
            MetaIssue::StaleOpen { ino, session } => (
                kinds[6],
                format!("session {session}, {}", path_or_ino(e, *ino)),
            ),
            MetaIssue::StaleLock { ino, session } => (
                kinds[7],
                format!("session {session}, {}", path_or_ino(e, *ino)),
            ),
            MetaIssue::StaleLease { ino, client, dirty } => (
                if *dirty { kinds[9] } else { kinds[8] },
                format!("client {client}, {}", path_or_ino(e, *ino)),
            ),
            MetaIssue::XattrCount {
                ino,
                recorded,
                actual,
            } => (
                kinds[19],
                format!(
                    "{}: recorded {recorded}, has {actual}",
                    path_or_ino(e, *ino)
                ),
            ),
            other => match hsm_issue(e, other, &kinds) {
                Some(x) => x,
                None => continue,
            },
        };
        rows.get_mut(k).unwrap().add(0, || ex);
    }
    rows.get_mut(kinds[1]).unwrap().unrepairable = true;
    rows.get_mut(kinds[9]).unwrap().unrepairable = true;
    rows.get_mut(kinds[12]).unwrap().unrepairable = true;
    rows.get_mut(kinds[18]).unwrap().unrepairable = true;

    // The archives themselves, when asked.
    let bad_copies = if a.archives {
        check_archives(e, &mut |k, ex| {
            let kind = if k { kinds[17] } else { kinds[18] };
            rows.get_mut(kind).unwrap().add(0, || ex);
        })?
    } else {
        Vec::new()
    };

    let mut failures = Vec::new();
    if a.repair {
        let (n, _, failed) = s.remove(&orphans);
        rows.get_mut(kinds[2]).unwrap().repaired = n;
        failures.extend(failed);
        if !gone_trash.is_empty() {
            e.trash_done(&gone_trash)?;
            rows.get_mut(kinds[3]).unwrap().repaired = gone_trash.len() as u64;
        }
        let pb = bar(issues.len() as u64, "repairing metadata");
        for i in &issues {
            pb.inc(1);
            let k = match i {
                MetaIssue::DanglingEntry { .. } => kinds[4],
                MetaIssue::UnheldOrphan { .. } => kinds[5],
                MetaIssue::StaleOpen { .. } => kinds[6],
                MetaIssue::StaleLock { .. } => kinds[7],
                MetaIssue::StaleLease { dirty: false, .. } => kinds[8],
                MetaIssue::StaleLease { dirty: true, .. } => continue,
                MetaIssue::XattrCount { .. } => kinds[19],
                other => match hsm_issue(e, other, &kinds) {
                    Some((k, _)) if k != kinds[12] => k,
                    _ => continue,
                },
            };
            let hsm = k.starts_with("HSM");
            match e.repair_issue(i, timeout) {
                // A stale open's repair ends its session with every row of it.
                Ok(changed) if changed || !hsm => rows.get_mut(k).unwrap().repaired += 1,
                Ok(_) => {}
                Err(err) => failures.push(format!("{k}: {err}")),
            }
        }
        pb.finish_and_clear();
        for (ino, key) in &bad_copies {
            // Only if the file still has that copy (one archived again meanwhile is fine).
            let same = e
                .hsm_state(*ino)
                .ok()
                .and_then(|st| st.copy)
                .is_some_and(|c| &c.key == key);
            if !same {
                continue;
            }
            match e.hsm_set_flags(*ino, HsmFlags::LOST, 0) {
                Ok(_) => rows.get_mut(kinds[17]).unwrap().repaired += 1,
                Err(err) => failures.push(format!("{}: {err}", kinds[17])),
            }
        }
    }

    let problems: u64 = kinds.iter().map(|k| rows[k].count).sum();
    println!(
        "objects: {} on {} targets ({} other names left alone), {} references; {} clients running; {} unreferenced objects kept (younger than {}, or a running client's)",
        s.objects.len() + s.staged.len(),
        s.targets.len(),
        s.ignored,
        s.refs.len(),
        s.live_clients,
        kept,
        humantime::format_duration(a.grace)
    );
    println!(
        "{:<38} {:>8} {:>10} {:>9}  EXAMPLE",
        "PROBLEM",
        "COUNT",
        "BYTES",
        if a.repair { "REPAIRED" } else { "" }
    );
    for k in kinds {
        let r = &rows[k];
        let repaired = if !a.repair {
            String::new()
        } else if r.unrepairable && r.count > 0 {
            "no".to_string()
        } else {
            r.repaired.to_string()
        };
        println!(
            "{:<38} {:>8} {:>10} {:>9}  {}",
            k,
            r.count,
            human(r.bytes),
            repaired,
            r.example.as_deref().unwrap_or("-")
        );
    }
    for k in kinds {
        if let (Some(fix), true) = (hsm_fix.get(k), rows[k].count > 0) {
            println!("{k}: --repair: {fix}");
        }
    }
    for f in &failures {
        eprintln!("tierfs: could not repair: {f}");
    }
    if rows[kinds[0]].count > 0 {
        eprintln!(
            "tierfs: {} objects are missing: the files named above lost data (restore them from a backup)",
            rows[kinds[0]].count
        );
    }
    if rows[kinds[9]].count > 0 {
        eprintln!(
            "tierfs: dirty RW-PCC leases of clients not running: their data exists only in those clients' caches; mount those clients again to write it back"
        );
    }
    if problems == 0 {
        println!("clean");
        Ok(0)
    } else {
        println!("{problems} problems found");
        Ok(1)
    }
}

/// The row and example of an HSM issue (`None`: not an HSM issue).
fn hsm_issue<'k>(
    e: &dyn MetaEngine,
    i: &MetaIssue,
    kinds: &[&'k str],
) -> Option<(&'k str, String)> {
    Some(match i {
        MetaIssue::ReleasedWithData {
            ino,
            slices,
            allocated,
            ..
        } => (
            kinds[10],
            format!(
                "{}: {slices} slices, {} allocated",
                path_or_ino(e, *ino),
                human(*allocated)
            ),
        ),
        MetaIssue::ArchivedWithoutCopy {
            ino,
            released: false,
        } => (kinds[11], path_or_ino(e, *ino)),
        MetaIssue::ArchivedWithoutCopy {
            ino,
            released: true,
        } => (kinds[12], path_or_ino(e, *ino)),
        MetaIssue::CopyOfMissingFile {
            ino,
            archive_id,
            key,
        } => (
            kinds[13],
            format!("inode {ino}: archive {archive_id} key {key}"),
        ),
        MetaIssue::RequestOfMissingFile { request, ino } => {
            (kinds[14], format!("request {request}, inode {ino}"))
        }
        MetaIssue::ImpossibleRequest { request, ino, why } => (
            kinds[15],
            format!("request {request}, {}: {why}", path_or_ino(e, *ino)),
        ),
        MetaIssue::DeadAgentRequest {
            request,
            ino,
            agent,
            registered,
        } => (
            kinds[16],
            format!(
                "request {request}, {}: agent {agent} {}",
                path_or_ino(e, *ino),
                if *registered {
                    "silent past the request timeout"
                } else {
                    "not registered"
                }
            ),
        ),
        _ => return None,
    })
}

/// Every recorded archive copy looked up in its archive (`tierfs fsck --archives`): `found`
/// gets (true, example) for a copy missing or of another size than recorded, (false, example)
/// for an archive that cannot be opened (its copies are not checked). Returns the bad copies
/// as (inode, key).
fn check_archives(
    e: &dyn MetaEngine,
    found: &mut dyn FnMut(bool, String),
) -> Result<Vec<(u64, String)>> {
    use tierfs_store::archive::ArchiveStore;
    use tierfs_store::error::StoreError;
    let mut stores: HashMap<u32, Option<ArchiveStore>> = HashMap::new();
    for ar in e.hsm_archives()? {
        let st = match ArchiveStore::open(&ar.url) {
            Ok(st) => Some(st),
            Err(err) => {
                found(false, format!("archive {}: {err}", ar.id));
                None
            }
        };
        stores.insert(ar.id, st);
    }
    let pb = spinner("checking archive copies:".to_string());
    let mut bad = Vec::new();
    let mut after = 0;
    loop {
        let page = e.hsm_copies(after, 1000)?;
        let Some(last) = page.last() else { break };
        after = last.0;
        // One runtime per page: HEAD requests, 16 at a time, answers in the page's order.
        let sizes: Vec<Option<std::result::Result<u64, StoreError>>> =
            tierfs_store::s3::block_on(async {
                use futures::StreamExt;
                let jobs: Vec<(Option<ArchiveStore>, String)> = page
                    .iter()
                    .map(|(_, a, c)| (stores.get(a).cloned().flatten(), c.key.clone()))
                    .collect();
                Ok(futures::stream::iter(jobs)
                    .map(|(st, key)| async move {
                        match st {
                            Some(st) => Some(st.size(&key).await),
                            None => None,
                        }
                    })
                    .buffered(16)
                    .collect()
                    .await)
            })?;
        for ((ino, archive, copy), size) in page.iter().zip(sizes) {
            pb.inc(1);
            let why = match size {
                None => {
                    if !stores.contains_key(archive) {
                        found(
                            false,
                            format!("archive {archive} (of inode {ino}) is not registered"),
                        );
                        stores.insert(*archive, None);
                    }
                    continue;
                }
                Some(Ok(n)) if n == copy.size => continue,
                Some(Ok(n)) => format!("{n} bytes, {} recorded", copy.size),
                Some(Err(StoreError::NotFound(_))) => "missing".to_string(),
                Some(Err(err)) => return Err(err.into()),
            };
            // A copy of a file that is gone is another row; one already flagged lost is known.
            match e.hsm_state(*ino) {
                Ok(st) if !st.flags.has(HsmFlags::LOST) => {}
                Ok(_) | Err(MetaError::NotFound) => continue,
                Err(err) => return Err(err.into()),
            }
            found(
                true,
                format!(
                    "{}: archive {archive} key {}: {why}",
                    path_or_ino(e, *ino),
                    copy.key
                ),
            );
            bad.push((*ino, copy.key.clone()));
        }
    }
    pb.finish_and_clear();
    Ok(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_local_process_is_not_a_live_session() {
        let now = now_nanos();
        let mut s = SessionInfo {
            id: 1,
            client_name: "c".into(),
            host: "h".into(),
            pid: std::process::id(),
            mountpoint: "/m".into(),
            version: "0".into(),
            started: now,
            heartbeat: now,
        };
        let t = Duration::from_secs(30);
        assert!(session_alive(&s, t, "h", now));
        s.heartbeat = now - 31_000_000_000;
        assert!(!session_alive(&s, t, "h", now));
        s.heartbeat = now;
        // A pid that cannot exist (above pid_max).
        s.pid = 0x3fff_fff0;
        assert!(!session_alive(&s, t, "h", now));
        // On another host the pid means nothing here.
        assert!(session_alive(&s, t, "other", now));
        // With the daemon's identity recorded (as mounts do): this process runs...
        s.pid = std::process::id();
        s.host = tierfs_client::liveness::host_field("h");
        assert!(session_alive(&s, t, "h", now));
        // ...and a pid that cannot exist does not, whatever host name is asked about.
        s.pid = 0x3fff_fff0;
        assert!(!session_alive(&s, t, "h", now));
        assert!(!session_alive(&s, t, "other", now));
    }
}
