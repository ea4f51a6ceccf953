//! `tierfs changelog`: registered readers of the changelog and its records (Lustre's
//! `lfs changelog`, `lfs changelog_clear`, `lctl changelog_register/deregister`);
//! docs/changelog.md.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use tierfs_meta::changelog::{
    escape_name, parse_reader, reader_name, ChangelogError, ChangelogRecord, ChangelogStatus, Mask,
};
use tierfs_meta::{now_nanos, open_engine, Channel, MetaEngine, MetaUrl, Nanos};

use crate::error::{CliError, Result};
use crate::locate::mount_of;

/// The first schema version with a changelog.
const CHANGELOG_SCHEMA: i64 = 6;
/// Records asked for at a time.
const BATCH: usize = 1000;

#[derive(Debug, Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "Record types: CREAT MKDIR HLINK SLINK MKNOD UNLNK RMDIR RENME RNMTO OPEN CLOSE \
LYOUT TRUNC SATTR XATTR HSM MTIME CTIME.\n\
Each text line: INDEX NNTYPE TIME 0xFLAGS t=INODE p=PARENT u=UID:GID c=CLIENT j=JOBID NAME \
[sp=SOURCE_PARENT SOURCE_NAME], times in UTC; in names a backslash is \\\\ and whitespace, \
control characters and bytes that are not UTF-8 are \\xNN. --json: one object per line, \
time in ns.\n\
Examples:\n  tierfs changelog register --mask CREAT,UNLNK,RENME   # prints cl1\n  \
tierfs changelog --reader cl1 --follow\n  tierfs changelog clear cl1 420\n\
See docs/changelog.md."
)]
pub struct ChangelogArgs {
    #[command(subcommand)]
    pub cmd: Option<ChangelogCmd>,
    #[command(flatten)]
    pub fs: FsArgs,
    /// Keep printing new records as they are committed (PostgreSQL: woken by notifications;
    /// SQLite: polled every 0.2 s); stops at END, or on Ctrl-C.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Print the records this reader has not cleared, of the types in its mask (and count as
    /// its use: a reader that reads is not idle).
    #[arg(long, value_name = "ID")]
    pub reader: Option<String>,
    /// Only these record types (comma-separated, as --mask of register).
    #[arg(long, value_name = "TYPES")]
    pub types: Option<String>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// First record index to print (default: the first held).
    #[arg(value_name = "START")]
    pub start: Option<u64>,
    /// Last record index to print (default: the last).
    #[arg(value_name = "END")]
    pub end: Option<u64>,
}

/// Which filesystem: a metadata URL, or a path in a mount (default: the current directory).
#[derive(Clone, Debug, Default, Args)]
pub struct FsArgs {
    /// Metadata database URL (instead of a mount).
    #[arg(long, global = true, value_name = "URL")]
    pub meta: Option<String>,
    /// A path inside a tierfs mount (default: the current directory).
    #[arg(long, global = true, value_name = "PATH")]
    pub mount: Option<PathBuf>,
}

impl FsArgs {
    /// The metadata URL asked for: `--meta`, else that of the mount holding `--mount` (or the
    /// current directory).
    pub fn meta_url(&self) -> Result<String> {
        match (&self.meta, &self.mount) {
            (Some(m), _) => Ok(m.clone()),
            (None, p) => {
                let p = p.clone().unwrap_or_else(|| PathBuf::from("."));
                Ok(mount_of(&p)?.1.meta)
            }
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum ChangelogCmd {
    /// Register a reader; prints its id (cl1, cl2, ...). From now on records of its types are
    /// kept until it clears them.
    Register(RegisterArgs),
    /// Deregister a reader: records no other reader still needs are purged. Also dismisses
    /// the warning about a reader dropped for idleness.
    Deregister(DeregisterArgs),
    /// Tell that a reader has processed records up to ENDREC (0: every record now); records
    /// every reader has cleared are purged.
    Clear(ClearArgs),
    /// List registered readers, the records held, and readers dropped for idleness.
    Readers(ReadersArgs),
}

#[derive(Debug, Args)]
pub struct RegisterArgs {
    /// Record types this reader receives: names separated by commas, ALL, DEFAULT (every
    /// type but OPEN, as Lustre's default), or +TYPE/-TYPE relative to DEFAULT
    /// (e.g. CREAT,UNLNK or ALL,-CLOSE or +OPEN). Default: DEFAULT.
    #[arg(long, short = 'm', value_name = "TYPES")]
    pub mask: Option<String>,
    /// Deregister the reader if it neither reads (with --reader) nor clears for this long,
    /// so its unread records do not fill the metadata database, e.g. 12h, 7d.
    #[arg(long, value_name = "DURATION", default_value = "7d")]
    pub idle: humantime::Duration,
}

#[derive(Debug, Args)]
pub struct DeregisterArgs {
    /// The reader (cl1 or 1).
    pub id: String,
}

#[derive(Debug, Args)]
pub struct ClearArgs {
    /// The reader (cl1 or 1).
    pub id: String,
    /// Last record index it has processed (0: every record written so far).
    pub endrec: u64,
}

#[derive(Debug, Args)]
pub struct ReadersArgs {
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

fn reader_id(s: &str) -> Result<u64> {
    parse_reader(s).ok_or_else(|| {
        CliError::Usage(format!(
            "changelog reader {s:?}: expected an id such as cl1 (see tierfs changelog readers)"
        ))
    })
}

/// The engine of the filesystem asked for; refuses (without upgrading it) a filesystem whose
/// schema predates the changelog.
fn engine(fs: &FsArgs) -> Result<Arc<dyn MetaEngine>> {
    let url = fs.meta_url()?;
    MetaUrl::parse(&url)?;
    if let Some(found) = tierfs_meta::url::schema_version(&url)? {
        if found < CHANGELOG_SCHEMA {
            return Err(ChangelogError::OldSchema {
                found,
                needed: CHANGELOG_SCHEMA,
            }
            .into());
        }
    }
    Ok(open_engine(&url)?)
}

impl From<ChangelogError> for CliError {
    fn from(e: ChangelogError) -> CliError {
        CliError::Meta(e.into())
    }
}

pub fn run(a: ChangelogArgs) -> Result<()> {
    match a.cmd {
        Some(ChangelogCmd::Register(r)) => {
            let mask = match &r.mask {
                Some(m) => Mask::parse(m).map_err(ChangelogError::from)?,
                None => Mask::default_mask(),
            };
            let idle: Duration = r.idle.into();
            if idle.is_zero() {
                return Err(CliError::Usage("--idle must be more than 0".into()));
            }
            let e = engine(&a.fs)?;
            let id = e.changelog_register(mask, idle)?;
            println!("{}", reader_name(id));
            Ok(())
        }
        Some(ChangelogCmd::Deregister(d)) => {
            let id = reader_id(&d.id)?;
            let purged = engine(&a.fs)?.changelog_deregister(id)?;
            println!("deregistered {} ({purged} records purged)", reader_name(id));
            Ok(())
        }
        Some(ChangelogCmd::Clear(c)) => {
            let id = reader_id(&c.id)?;
            let purged = engine(&a.fs)?.changelog_clear(id, c.endrec)?;
            println!(
                "cleared {} up to {} ({purged} records purged)",
                reader_name(id),
                if c.endrec == 0 {
                    "the last record".to_string()
                } else {
                    c.endrec.to_string()
                }
            );
            Ok(())
        }
        Some(ChangelogCmd::Readers(r)) => {
            let st = engine(&a.fs)?.changelog_status()?;
            if r.json {
                println!(
                    "{}",
                    serde_json::to_string(&st).map_err(|e| CliError::Other(e.to_string()))?
                );
            } else {
                print_readers(&st, now_nanos());
            }
            Ok(())
        }
        None => print_records(&a),
    }
}

fn print_records(a: &ChangelogArgs) -> Result<()> {
    let reader = a.reader.as_deref().map(reader_id).transpose()?;
    let mask = match &a.types {
        Some(t) => Mask::parse(t).map_err(ChangelogError::from)?,
        None => Mask::all(),
    };
    let start = a.start.unwrap_or(0);
    let end = a.end.unwrap_or(u64::MAX);
    if start > end {
        return Err(CliError::Usage(format!("START {start} is after END {end}")));
    }
    let e = engine(&a.fs)?;
    let mut next = start;
    let mut listener = None;
    let out = std::io::stdout();
    loop {
        let recs = e.changelog_read(reader, mask, next, end, BATCH)?;
        let full = recs.len() == BATCH;
        {
            let mut w = out.lock();
            for r in &recs {
                let line = if a.json {
                    serde_json::to_string(r).map_err(|e| CliError::Other(e.to_string()))?
                } else {
                    format_record(r)
                };
                writeln!(w, "{line}").map_err(|e| CliError::Io("stdout".into(), e))?;
            }
            w.flush().map_err(|e| CliError::Io("stdout".into(), e))?;
        }
        if let Some(r) = recs.last() {
            if r.index >= end {
                return Ok(());
            }
            next = r.index + 1;
        }
        if full {
            continue;
        }
        if !a.follow {
            return Ok(());
        }
        // Wait for more: a notification (PostgreSQL) or a short poll (SQLite, or while the
        // listening connection is lost). The tables are read after every wake-up, so a
        // notification missed while not listening costs at most one poll.
        if listener.is_none() {
            listener = e.listen("changelog", &[Channel::Changelog]).ok().flatten();
        }
        match listener.as_mut() {
            Some(l) => {
                if l.wait(Duration::from_secs(1)).is_err() {
                    listener = None;
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            None => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// `HH:MM:SS.nnnnnnnnn YYYY.MM.DD` in UTC, as Lustre prints a record's time.
fn format_time(ns: Nanos) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let nanos = ns.rem_euclid(1_000_000_000);
    let t = std::time::UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64);
    // RFC 3339 "YYYY-MM-DDTHH:MM:SSZ", rearranged.
    let s = humantime::format_rfc3339_seconds(t).to_string();
    let (date, time) = s.split_once('T').unwrap_or((&s, "00:00:00Z"));
    format!(
        "{}.{nanos:09} {}",
        time.trim_end_matches('Z'),
        date.replace('-', ".")
    )
}

/// A name as one whitespace-free token: [`escape_name`], and spaces and control characters as
/// `\xNN` too.
fn token(b: &[u8]) -> String {
    let s = escape_name(b);
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_whitespace() || c.is_control() {
            let mut buf = [0u8; 4];
            for x in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("\\x{x:02x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// One record as a text line (Lustre's `lfs changelog` layout).
pub fn format_record(r: &ChangelogRecord) -> String {
    let mut s = format!(
        "{} {:02}{} {} 0x{:x} t={} p={} u={}:{} c={} j={}",
        r.index,
        r.typ as u8,
        r.typ.name(),
        format_time(r.time),
        r.flags,
        r.target,
        r.parent,
        r.uid,
        r.gid,
        token(r.client.as_bytes()),
        r.jobid
            .as_deref()
            .map(|j| token(j.as_bytes()))
            .unwrap_or_default(),
    );
    if !r.name.is_empty() {
        s.push(' ');
        s.push_str(&token(&r.name));
    }
    if let (Some(sp), Some(sn)) = (r.source_parent, &r.source_name) {
        s.push_str(&format!(" sp={sp} {}", token(sn)));
    }
    s
}

fn ago(now: Nanos, t: Nanos) -> String {
    let d = Duration::from_secs(((now - t).max(0) / 1_000_000_000) as u64);
    humantime::format_duration(d).to_string()
}

fn print_readers(st: &ChangelogStatus, now: Nanos) {
    match (st.first, st.last) {
        (Some(f), Some(l)) => println!(
            "records: {} held ({f}..{l}), last index {}",
            l - f + 1,
            st.current
        ),
        _ => println!("records: none held, last index {}", st.current),
    }
    if st.readers.is_empty() {
        println!("readers: none (no records are written)");
    } else {
        println!(
            "{:<6} {:>12} {:>10} {:>16} {:>10}  mask",
            "reader", "cleared", "unread", "last used", "idle after"
        );
        for r in &st.readers {
            let unread = st.last.map(|l| l.saturating_sub(r.cleared)).unwrap_or(0);
            println!(
                "{:<6} {:>12} {:>10} {:>16} {:>10}  {}",
                r.name(),
                r.cleared,
                unread,
                format!("{} ago", ago(now, r.last_used)),
                humantime::format_duration(Duration::from_secs(
                    (r.idle_ns / 1_000_000_000).max(0) as u64
                ))
                .to_string(),
                match &r.follower_of {
                    Some(c) => format!("{} (change follower of client {c})", Mask(r.mask)),
                    None => Mask(r.mask).to_string(),
                }
            );
        }
    }
    for w in idle_warnings(st, now) {
        println!("{w}");
    }
}

/// The warnings `tierfs status` and `tierfs changelog readers` print about readers dropped
/// for idleness.
pub fn idle_warnings(st: &ChangelogStatus, now: Nanos) -> Vec<String> {
    st.idle_deregistered
        .iter()
        .map(|d| {
            format!(
                "WARNING: changelog reader {} was deregistered {} ago: idle since {} ago \
                 (records after {} it had not cleared may be purged); \
                 `tierfs changelog deregister {}` dismisses this",
                reader_name(d.reader),
                ago(now, d.at),
                ago(now, d.last_used),
                d.cleared,
                reader_name(d.reader)
            )
        })
        .collect()
}

/// The changelog lines of `tierfs status`.
pub fn status_lines(engine: &dyn MetaEngine) -> Result<Vec<String>> {
    let st = engine.changelog_status()?;
    let now = now_nanos();
    let mut v = Vec::new();
    let held = match (st.first, st.last) {
        (Some(f), Some(l)) => format!("{} records held ({f}..{l})", l - f + 1),
        _ => "no records held".into(),
    };
    let names: Vec<String> = st.readers.iter().map(|r| r.name()).collect();
    v.push(format!(
        "changelog:  {} reader{}{}, {held}",
        st.readers.len(),
        if st.readers.len() == 1 { "" } else { "s" },
        if names.is_empty() {
            String::new()
        } else {
            format!(" ({})", names.join(", "))
        }
    ));
    v.extend(idle_warnings(&st, now));
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierfs_meta::changelog::RecordType;

    fn rec() -> ChangelogRecord {
        ChangelogRecord {
            index: 7,
            time: 1_700_000_000_123_456_789,
            typ: RecordType::Renme,
            flags: 0,
            target: 42,
            parent: 1,
            name: b"new name".to_vec(),
            source_parent: Some(3),
            source_name: Some(b"old\xff".to_vec()),
            uid: 1000,
            gid: 100,
            client: "node1".into(),
            jobid: Some("4242".into()),
        }
    }

    #[test]
    fn text_lines_look_like_lustres() {
        assert_eq!(
            format_record(&rec()),
            "7 08RENME 22:13:20.123456789 2023.11.14 0x0 t=42 p=1 u=1000:100 c=node1 j=4242 \
             new\\x20name sp=3 old\\xff"
        );
    }

    #[test]
    fn json_lines_keep_every_field() {
        let v: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&rec()).unwrap()).unwrap();
        assert_eq!(v["type"], "RENME");
        assert_eq!(v["name"], "new name");
        assert_eq!(v["source_name"], "old\\xff");
        assert_eq!(v["jobid"], "4242");
        assert_eq!(v["uid"], 1000);
    }

    #[test]
    fn every_type_is_in_the_help() {
        let help = "CREAT MKDIR HLINK SLINK MKNOD UNLNK RMDIR RENME RNMTO OPEN CLOSE LYOUT TRUNC \
                    SATTR XATTR HSM MTIME CTIME";
        let names: Vec<&str> = RecordType::ALL.iter().map(|t| t.name()).collect();
        assert_eq!(names.join(" "), help);
        let mut cli = <crate::cli::Cli as clap::CommandFactory>::command();
        let sub = cli.find_subcommand_mut("changelog").unwrap();
        let text = sub.render_long_help().to_string();
        assert!(text.contains(help), "{text}");
    }
}
