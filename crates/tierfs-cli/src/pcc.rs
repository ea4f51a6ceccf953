//! `tierfs pcc`: attach, detach, state, pin, rules and stats of the persistent client cache.
//!
//! Commands on files travel to the mount's daemon as extended attributes of the file
//! (`user.tierfs.pcc.<command>`), so the kernel checks the caller's permissions on the file
//! itself: reading it is enough for state, RO attach and pin; writing it is needed for RW attach.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use tierfs_meta::open_engine;
use tierfs_pcc::rules::Rule;

use crate::error::{CliError, Result};
use crate::locate::mount_of;

#[derive(Debug, Subcommand)]
pub enum PccCmd {
    /// Attach files to this client's cache: -r read-only copy (default, as Lustre), -w RW-PCC
    /// (the file's data then lives only in this client's cache).
    Attach {
        #[arg(short = 'w', long = "write", conflicts_with = "ro")]
        rw: bool,
        #[arg(short = 'r', long = "read")]
        ro: bool,
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Detach files: RW-PCC files are written back to the capacity tier first.
    Detach {
        /// Keep a read-only copy in the cache.
        #[arg(long, conflicts_with = "force_stale")]
        keep: bool,
        /// Root only, from any client: drop the RW-PCC lease of an owner that is DOWN (its
        /// daemon gone, or silent past a few heartbeats: see `tierfs pcc state`) even though
        /// it holds writes not yet written back. Those writes are LOST: the file reads as the
        /// capacity tier has it (its size stays as the owner last reported it). Logged by the
        /// mount; refused while the owner is alive. The owner, when it comes back, quarantines
        /// its cached copy instead of writing it back.
        #[arg(long)]
        force_stale: bool,
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Cache state of files: type (readwrite, readonly, none), cache file, opens, flags, the
    /// RW-PCC lease and the state of its owner by the database's view of its session (alive,
    /// silent for N s, down (why), no session).
    State {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Never evict these files.
    Pin {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Let these files be evicted again.
    Unpin {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Attach rules (Lustre `lctl pcc add` syntax), stored in the metadata engine.
    #[command(subcommand)]
    Rule(RuleCmd),
    /// Cache hits, misses, bytes, attaches, write-backs, evictions and use of one mount.
    Stats { mount: PathBuf },
}

/// Which filesystem a command works on (shared by `tierfs pcc` and `tierfs session`).
#[derive(Debug, Args)]
pub struct Target {
    /// Metadata URL of the filesystem (default: the filesystem of --mount or of the current
    /// directory).
    #[arg(long)]
    pub meta: Option<String>,
    /// A path in a tierfs mount.
    #[arg(long)]
    pub mount: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum RuleCmd {
    /// Add a rule, e.g. `--mode rw "projid={500 1000}&fname={*.h5},uid={1001}"`. Rules are
    /// tried in id order; the first that matches decides.
    Add {
        #[arg(long, value_parser = ["rw", "ro"])]
        mode: String,
        /// Only for this client (default: every client).
        #[arg(long)]
        client: Option<String>,
        /// Cache isolation: the most the files this rule attaches may take in each client's
        /// cache (e.g. 50G; K/M/G/T suffixes). Past it, the rule's own files are evicted in
        /// the cache's eviction order (`cache_eviction`, LRU by default) down to the cache's
        /// low watermark of the quota; when none can be, files this rule would attach stay
        /// uncached. Default: no quota.
        #[arg(long, value_name = "SIZE")]
        quota: Option<String>,
        /// The rule: fields uid, gid, projid, fname, size, mtime; `&` AND, `,` OR (docs/pcc.md).
        rule: String,
        #[command(flatten)]
        target: Target,
    },
    /// Set or clear (`none`) the quota of a rule; mounted clients apply it within 2 s.
    Quota {
        id: u64,
        /// e.g. 50G, or `none`.
        size: String,
        #[command(flatten)]
        target: Target,
    },
    /// List the rules.
    List {
        #[command(flatten)]
        target: Target,
    },
    /// Delete a rule by id.
    Del {
        id: u64,
        #[command(flatten)]
        target: Target,
    },
}

fn xattr_name(cmd: &str) -> CString {
    CString::new(format!("user.tierfs.pcc.{cmd}")).expect("no NUL")
}

fn errno_text(path: &Path, e: std::io::Error) -> CliError {
    let why = match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            "this mount has no persistent cache (mount with --cache-dir)".to_string()
        }
        Some(libc::EBUSY) => {
            "another client holds the file's RW-PCC lease (and is alive), or has the file open"
                .to_string()
        }
        Some(libc::ENOSPC) => "the cache is full".to_string(),
        Some(libc::EACCES) => "permission denied".to_string(),
        Some(libc::EPERM) => {
            "not permitted: attach, detach, pin and unpin by hand are for the users the mount's \
             pcc_attach setting admits (root only by default), --force-stale for root"
                .to_string()
        }
        Some(libc::EHOSTDOWN) => {
            "the file's RW-PCC owner is down with data not yet written back".to_string()
        }
        Some(libc::ENODATA) => "not supported by this tierfs mount".to_string(),
        _ => e.to_string(),
    };
    CliError::Other(format!("{}: {why}", path.display()))
}

/// Refuses a path outside tierfs before any extended attribute is asked for or set: on another
/// filesystem `user.tierfs.pcc.*` is an ordinary attribute name, so a set would succeed there
/// and leave the attribute on the file.
fn in_tierfs(path: &Path) -> Result<()> {
    mount_of(path).map(|_| ())
}

/// Runs a command by reading `user.tierfs.pcc.<cmd>`; returns the state JSON.
fn get(path: &Path, cmd: &str) -> Result<serde_json::Value> {
    in_tierfs(path)?;
    let p = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| CliError::Usage("path with a NUL byte".into()))?;
    let name = xattr_name(cmd);
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings and a buffer of the given length.
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(errno_text(path, std::io::Error::last_os_error()));
    }
    buf.truncate(n as usize);
    serde_json::from_slice(&buf).map_err(|e| CliError::Other(format!("{}: {e}", path.display())))
}

/// Runs a command by setting `user.tierfs.pcc.<cmd>` to `value`.
fn set(path: &Path, cmd: &str, value: &str) -> Result<()> {
    in_tierfs(path)?;
    let p = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| CliError::Usage("path with a NUL byte".into()))?;
    let name = xattr_name(cmd);
    // SAFETY: valid C strings and a value buffer of the given length.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r < 0 {
        return Err(errno_text(path, std::io::Error::last_os_error()));
    }
    Ok(())
}

fn print_state(path: &Path, v: &serde_json::Value) {
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
    let b = |k: &str| v.get(k).and_then(|x| x.as_bool()).unwrap_or(false);
    let mut flags = Vec::new();
    if b("dirty") {
        flags.push("dirty");
    }
    if b("pinned") {
        flags.push("pinned");
    }
    if b("kept_open") {
        // the engine still records an open of it by this client (docs/pcc.md, "Kept opens")
        flags.push("kept_open");
    }
    if s("type") != "none" && !b("complete") {
        flags.push("copying");
    }
    let lease = match v.get("lease_owner").and_then(|x| x.as_str()) {
        Some(owner) => format!(
            ", lease: {owner} (generation {}{})",
            v.get("lease_generation")
                .and_then(|x| x.as_u64())
                .unwrap_or(0),
            if v.get("lease_dirty")
                .and_then(|x| x.as_bool())
                .unwrap_or(false)
            {
                ", dirty"
            } else {
                ""
            }
        ),
        None => String::new(),
    };
    let owner = match v.get("owner_state").and_then(|x| x.as_str()) {
        Some(st) => format!(", owner: {st}"),
        None => String::new(),
    };
    println!(
        "file: {}, type: {}, cache_file: {}, open_count: {}, flags: {}{}{}",
        path.display(),
        s("type"),
        v.get("cache_file").and_then(|x| x.as_str()).unwrap_or("-"),
        v.get("open_count").and_then(|x| x.as_u64()).unwrap_or(0),
        if flags.is_empty() {
            "-".to_string()
        } else {
            flags.join(",")
        },
        lease,
        owner
    );
}

pub(crate) fn engine_for(t: &Target) -> Result<std::sync::Arc<dyn tierfs_meta::MetaEngine>> {
    let url = match (&t.meta, &t.mount) {
        (Some(m), _) => m.clone(),
        (None, Some(p)) => mount_of(p)?.1.meta,
        (None, None) => {
            let cwd = std::env::current_dir().map_err(|e| CliError::Io(".".into(), e))?;
            mount_of(&cwd)?.1.meta
        }
    };
    Ok(open_engine(&url)?)
}

pub fn run(cmd: PccCmd) -> Result<()> {
    let mut failed = 0;
    let mut single: Option<CliError> = None;
    let mut each = |paths: &[PathBuf], f: &dyn Fn(&Path) -> Result<()>| {
        for p in paths {
            if let Err(e) = f(p) {
                if paths.len() == 1 {
                    // One file: its error is the one line.
                    single = Some(e);
                } else {
                    eprintln!("tierfs: {e}");
                }
                failed += 1;
            }
        }
    };
    match cmd {
        PccCmd::Attach { rw, ro: _, paths } => each(&paths, &|p| {
            if rw {
                set(p, "attach", "rw")
            } else {
                get(p, "attach.ro").map(|_| ())
            }
        }),
        PccCmd::Detach {
            keep,
            force_stale,
            paths,
        } => each(&paths, &|p| {
            let cmd = if force_stale {
                "detach.force-stale"
            } else if keep {
                "detach.keep"
            } else {
                "detach"
            };
            get(p, cmd).map(|_| ())
        }),
        PccCmd::State { paths } => each(&paths, &|p| get(p, "state").map(|v| print_state(p, &v))),
        PccCmd::Pin { paths } => each(&paths, &|p| get(p, "pin").map(|_| ())),
        PccCmd::Unpin { paths } => each(&paths, &|p| get(p, "unpin").map(|_| ())),
        PccCmd::Rule(r) => return rule(r),
        PccCmd::Stats { mount } => return stats(&mount),
    }
    if let Some(e) = single {
        return Err(e);
    }
    if failed > 0 {
        return Err(CliError::Other(format!("{failed} file(s) failed")));
    }
    Ok(())
}

/// An engine error about rule `id`: "no rule" when there is none.
fn rule_error(id: u64, err: tierfs_meta::MetaError) -> CliError {
    match err {
        tierfs_meta::MetaError::NotFound => CliError::Usage(format!("no rule {id}")),
        other => other.into(),
    }
}

/// A rule quota from the command line: a size, or `none`.
fn quota_arg(s: &str) -> Result<Option<u64>> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    match tierfs_store::size::parse_size(s) {
        Ok(0) | Err(_) => Err(CliError::Usage(format!(
            "invalid quota '{s}': expected a size above zero such as 500M or 50G, or none"
        ))),
        Ok(n) => Ok(Some(n)),
    }
}

fn rule(r: RuleCmd) -> Result<()> {
    match r {
        RuleCmd::Add {
            mode,
            client,
            quota,
            rule,
            target,
        } => {
            let parsed = Rule::parse(&rule)
                .map_err(|e| CliError::Usage(format!("invalid rule '{rule}': {e}")))?;
            let quota = quota.as_deref().map(quota_arg).transpose()?.flatten();
            let e = engine_for(&target)?;
            let id = e.pcc_rule_add(&mode, client.as_deref(), &parsed.text(), quota)?;
            println!(
                "rule {id}: {mode} {}{}{}",
                parsed.text(),
                client.map(|c| format!(" (client {c})")).unwrap_or_default(),
                quota
                    .map(|q| format!(" (quota {})", tierfs_store::size::human(q)))
                    .unwrap_or_default()
            );
        }
        RuleCmd::Quota { id, size, target } => {
            let quota = quota_arg(&size)?;
            let e = engine_for(&target)?;
            e.pcc_rule_set_quota(id, quota)
                .map_err(|err| rule_error(id, err))?;
        }
        RuleCmd::List { target } => {
            let e = engine_for(&target)?;
            println!(
                "{:>4}  {:<4}  {:<12}  {:>8}  rule",
                "id", "mode", "client", "quota"
            );
            for r in e.pcc_rules()? {
                println!(
                    "{:>4}  {:<4}  {:<12}  {:>8}  {}",
                    r.id,
                    r.mode,
                    r.client.unwrap_or_else(|| "*".into()),
                    r.quota
                        .map(tierfs_store::size::human)
                        .unwrap_or_else(|| "-".into()),
                    r.rule
                );
            }
        }
        RuleCmd::Del { id, target } => {
            let e = engine_for(&target)?;
            e.pcc_rule_del(id).map_err(|err| rule_error(id, err))?;
        }
    }
    Ok(())
}

fn stats(mount: &Path) -> Result<()> {
    let (root, mi) = mount_of(mount)?;
    let text = std::fs::read_to_string(root.join(tierfs_client::fs::STATS_NAME))
        .map_err(|e| CliError::Io(mount.display().to_string(), e))?;
    println!("client {} at {}", mi.client, mi.mountpoint);
    let mut any = false;
    // How recall requests reach this client (printed after the rest, only with a cache).
    let mut recall = Vec::new();
    // Use and quota per attach rule.
    let mut rules = Vec::new();
    for line in text.lines() {
        if let Some(row) = recall_row(line) {
            recall.push(row);
            continue;
        }
        if let Some(row) = rule_row(line) {
            rules.push(row);
            continue;
        }
        if let Some(rest) = line.strip_prefix("tierfs_pcc_events_total{event=\"") {
            if let Some((ev, v)) = rest.split_once("\"} ") {
                println!("{ev:<22} {v}");
                any = true;
            }
        } else if let Some(rest) = line.strip_prefix("tierfs_pcc_cache_") {
            if let Some((k, v)) = rest.split_once(' ') {
                let shown = if k.ends_with("bytes") {
                    tierfs_store::size::human(v.parse().unwrap_or(0))
                } else {
                    v.to_string()
                };
                println!("cache_{k:<16} {shown}");
                any = true;
            }
        }
    }
    if !any {
        return Err(CliError::Other(format!(
            "{}: this mount has no persistent cache",
            mount.display()
        )));
    }
    for (k, v) in rules.into_iter().chain(recall) {
        println!("{k:<22} {v}");
    }
    Ok(())
}

/// `tierfs_pcc_rule_used_bytes{rule="3"} 1048576` -> ("rule_3_used_bytes", "1M"),
/// `tierfs_pcc_rule_files{rule="3"} 2` -> ("rule_3_files", "2").
fn rule_row(line: &str) -> Option<(String, String)> {
    let rest = line.strip_prefix("tierfs_pcc_rule_")?;
    let (name, rest) = rest.split_once("{rule=\"")?;
    let (id, v) = rest.split_once("\"} ")?;
    let shown = if name.ends_with("bytes") {
        tierfs_store::size::human(v.parse().ok()?)
    } else {
        v.to_string()
    };
    Some((format!("rule_{id}_{name}"), shown))
}

/// `tierfs_pcc_recall_wakeups_total{source="poll"} 12` -> ("recall_wakeups_poll", "12"),
/// `tierfs_pcc_recall_listening 1` -> ("recall_listening", "1").
fn recall_row(line: &str) -> Option<(String, String)> {
    let rest = line.strip_prefix("tierfs_pcc_recall_")?;
    let (key, v) = rest.rsplit_once(' ')?;
    let (name, label) = match key.split_once('{') {
        Some((n, l)) => (n, l.trim_end_matches('}').split_once('=').map(|x| x.1)),
        None => (key, None),
    };
    let name = name.strip_suffix("_total").unwrap_or(name);
    let shown = match label {
        Some(l) => format!("recall_{name}_{}", l.trim_matches('"')),
        None => format!("recall_{name}"),
    };
    Some((shown, v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::{quota_arg, recall_row, rule_row};

    #[test]
    fn rule_rows_of_the_stats_file() {
        let row = |l: &str| rule_row(l).map(|(k, v)| format!("{k} {v}"));
        assert_eq!(
            row("tierfs_pcc_rule_used_bytes{rule=\"3\"} 1048576").as_deref(),
            Some("rule_3_used_bytes 1.0M")
        );
        assert_eq!(
            row("tierfs_pcc_rule_files{rule=\"12\"} 2").as_deref(),
            Some("rule_12_files 2")
        );
        assert_eq!(row("tierfs_pcc_cache_files 2"), None);
        assert_eq!(row("tierfs_pcc_rule_used_bytes{rule=\"3\"} x"), None);
    }

    #[test]
    fn quotas_on_the_command_line() {
        assert_eq!(quota_arg("50G").unwrap(), Some(50 << 30));
        assert_eq!(quota_arg("None").unwrap(), None);
        assert!(quota_arg("0").is_err());
        assert!(quota_arg("-1G").is_err());
        assert!(quota_arg("lots").is_err());
    }

    #[test]
    fn recall_rows_of_the_stats_file() {
        let row = |l: &str| recall_row(l).map(|(k, v)| format!("{k} {v}"));
        assert_eq!(
            row("tierfs_pcc_recall_wakeups_total{source=\"notification\"} 3").as_deref(),
            Some("recall_wakeups_notification 3")
        );
        assert_eq!(
            row("tierfs_pcc_recall_given_back_total{source=\"poll\"} 1").as_deref(),
            Some("recall_given_back_poll 1")
        );
        assert_eq!(
            row("tierfs_pcc_recall_listening 1").as_deref(),
            Some("recall_listening 1")
        );
        assert_eq!(row("tierfs_pcc_events_total{event=\"hits\"} 1"), None);
        assert_eq!(row("# HELP tierfs_pcc_recall_listening 1 while ..."), None);
    }
}
