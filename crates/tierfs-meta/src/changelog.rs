//! The changelog's public vocabulary (Lustre's model, docs/changelog.md): record types and
//! masks, records, registered readers, and the **caller context** that each record carries.
//!
//! Storage (tables, writing a record inside an operation's transaction, the reader operations)
//! is the shared core's (`core/changelog.rs`); this module holds what the client and the
//! `tierfs changelog` command share with it.
//!
//! # Caller context
//!
//! A record names who made the change: uid/gid of the request, the client's name, and a job id
//! read from the writer's environment (Lustre's `jobid_var`). The engine's operations take no
//! such argument (their signatures are shared by every caller); the caller is carried instead by
//! a **per-thread scope**: the FUSE dispatcher (`tierfs_client::fs`) enters
//! [`Caller::enter`] at the start of each request that can change something, and the engine,
//! running the transaction on the same thread, reads [`current`]. Batched work that runs on
//! another thread on behalf of many requests sets the context of each item:
//! [`enter_batch`] gives a caller per inode (the client's queued closes, so a CLOSE record
//! carries the context of whoever opened the file). Outside any scope, [`current`] gives the
//! process's effective uid/gid and the client name set by [`set_process_client`] (the
//! daemon's own housekeeping, or a command-line tool).

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use serde::Serialize;

use crate::types::{Ino, Nanos};

macro_rules! record_types {
    ($( $(#[$doc:meta])* $var:ident = $num:expr, $name:literal, $default:expr; )*) => {
        /// A kind of changelog record. Numbers and names are Lustre's (`lfs changelog` prints
        /// `01CREAT`), so tools that know Lustre's read ours.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum RecordType {
            $( $(#[$doc])* $var = $num, )*
        }

        impl RecordType {
            /// Every type, in number order.
            pub const ALL: &'static [RecordType] = &[$(RecordType::$var),*];

            /// The five-letter name Lustre prints (`CREAT`, `RENME`, ...).
            pub fn name(self) -> &'static str {
                match self { $(RecordType::$var => $name,)* }
            }

            /// The type with this number (as stored).
            pub fn from_num(n: i64) -> Option<RecordType> {
                match n { $( $num => Some(RecordType::$var), )* _ => None }
            }

            /// Whether a reader registered without `--mask` receives this type.
            pub fn in_default_mask(self) -> bool {
                match self { $(RecordType::$var => $default,)* }
            }
        }
    };
}

record_types! {
    /// A regular file created (`t`: the file, `p`/name: where).
    Creat = 1, "CREAT", true;
    /// A directory created.
    Mkdir = 2, "MKDIR", true;
    /// A hard link made (`t`: the inode, `p`/name: the new name).
    Hlink = 3, "HLINK", true;
    /// A symbolic link created.
    Slink = 4, "SLINK", true;
    /// A special file (device, fifo, socket) created.
    Mknod = 5, "MKNOD", true;
    /// A name of a non-directory removed; flag [`FLAG_LAST`] when it was the last one.
    Unlnk = 6, "UNLNK", true;
    /// A directory removed.
    Rmdir = 7, "RMDIR", true;
    /// A rename: `t` the inode moved, `p`/name where it now is, `sp`/sname where it was.
    Renme = 8, "RENME", true;
    /// The target side of a rename that replaced (or, with [`FLAG_EXCHANGE`], swapped with) an
    /// existing name: `t` the inode that was there, `p`/name that name, `sp`/sname the source.
    Rnmto = 9, "RNMTO", true;
    /// A file opened (first open by a client that has none open); off by default, as in Lustre.
    Open = 10, "OPEN", false;
    /// A file closed (last close by a client), with the context of whoever opened it.
    Close = 11, "CLOSE", true;
    /// A file's layout or a directory's stripe default changed.
    Lyout = 12, "LYOUT", true;
    /// A file's size changed by truncate.
    Trunc = 13, "TRUNC", true;
    /// Attributes changed (mode, owner, group, project).
    Sattr = 14, "SATTR", true;
    /// An extended attribute set or removed (name: the attribute's name).
    Xattr = 15, "XATTR", true;
    /// An HSM event (Lustre's CL_HSM): the event, an error code and the dirty flag are in
    /// the record's flags ([`crate::hsm::changelog_flags`], [`crate::hsm::HsmEvent`]).
    Hsm = 16, "HSM", true;
    /// The modification time changed: data written, or `utimes` setting mtime.
    Mtime = 17, "MTIME", true;
    /// Only the change time moved (e.g. `utimes` setting atime and ctime).
    Ctime = 18, "CTIME", true;
}

impl RecordType {
    /// The mask bit of this type.
    pub fn bit(self) -> i64 {
        1i64 << (self as u8)
    }
}

/// Serialized as its name (`"CREAT"`).
impl Serialize for RecordType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl fmt::Display for RecordType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RecordType {
    type Err = MaskError;
    fn from_str(s: &str) -> Result<Self, MaskError> {
        let u = s.trim().to_ascii_uppercase();
        RecordType::ALL
            .iter()
            .copied()
            .find(|t| t.name() == u)
            .ok_or_else(|| MaskError(s.trim().to_string()))
    }
}

/// An unknown record type in a mask.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown changelog record type {0:?} (known: CREAT MKDIR HLINK SLINK MKNOD UNLNK RMDIR \
     RENME RNMTO OPEN CLOSE LYOUT TRUNC SATTR XATTR HSM MTIME CTIME, or ALL, DEFAULT)"
)]
pub struct MaskError(pub String);

/// Bad input to a changelog operation; each prints as one line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChangelogError {
    #[error("no changelog reader cl{0} (see tierfs changelog readers)")]
    UnknownReader(u64),
    #[error("changelog reader cl{reader} was deregistered after staying idle past its idle time")]
    ReaderExpired { reader: u64 },
    #[error("cannot clear changelog records up to {endrec}: the last record is {last}")]
    ClearPastEnd { endrec: u64, last: u64 },
    #[error("{0}")]
    Mask(#[from] MaskError),
    #[error(
        "this filesystem's metadata is schema v{found}, which has no changelog (v{needed} and \
         later); mount it with this tierfs once to upgrade it"
    )]
    OldSchema { found: i64, needed: i64 },
}

impl ChangelogError {
    pub fn errno(&self) -> i32 {
        match self {
            ChangelogError::UnknownReader(_) | ChangelogError::ReaderExpired { .. } => libc::ENOENT,
            _ => libc::EINVAL,
        }
    }
}

/// Flag of UNLNK/RNMTO: the inode lost its last name (Lustre's CLF_UNLINK_LAST).
pub const FLAG_LAST: u32 = 0x1;
/// Flag of RNMTO: the two names were swapped (`RENAME_EXCHANGE`), nothing was removed.
pub const FLAG_EXCHANGE: u32 = 0x2;

/// A set of record types, one bit per [`RecordType`] number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mask(pub i64);

impl Mask {
    /// Every type.
    pub fn all() -> Mask {
        Mask(RecordType::ALL.iter().fold(0, |m, t| m | t.bit()))
    }

    /// What a reader registered without `--mask` receives: every type but OPEN (as Lustre's
    /// default changelog mask).
    pub fn default_mask() -> Mask {
        Mask(
            RecordType::ALL
                .iter()
                .filter(|t| t.in_default_mask())
                .fold(0, |m, t| m | t.bit()),
        )
    }

    pub fn contains(self, t: RecordType) -> bool {
        self.0 & t.bit() != 0
    }

    /// The types in this mask, in number order.
    pub fn types(self) -> impl Iterator<Item = RecordType> {
        RecordType::ALL
            .iter()
            .copied()
            .filter(move |t| self.contains(*t))
    }

    /// Parses Lustre's mask syntax: type names separated by commas or spaces, `ALL`,
    /// `DEFAULT`, and `+TYPE`/`-TYPE` to add to or take from what came before (starting from
    /// DEFAULT when the first item is `+`/`-`), e.g. `CREAT,UNLNK`, `ALL,-OPEN`, `+OPEN`.
    /// Case does not matter. An empty mask or an unknown name is an error.
    pub fn parse(s: &str) -> Result<Mask, MaskError> {
        let items: Vec<&str> = s.split([',', ' ', '|']).filter(|x| !x.is_empty()).collect();
        if items.is_empty() {
            return Err(MaskError(s.to_string()));
        }
        let relative = items[0].starts_with(['+', '-']);
        let mut m = if relative { Mask::default_mask().0 } else { 0 };
        for it in items {
            let (op, name) = match it.as_bytes()[0] {
                b'+' => ('+', &it[1..]),
                b'-' => ('-', &it[1..]),
                _ => ('+', it),
            };
            let bits = match name.to_ascii_uppercase().as_str() {
                "ALL" => Mask::all().0,
                "DEFAULT" => Mask::default_mask().0,
                _ => name.parse::<RecordType>()?.bit(),
            };
            if op == '+' {
                m |= bits;
            } else {
                m &= !bits;
            }
        }
        if m == 0 {
            return Err(MaskError(s.to_string()));
        }
        Ok(Mask(m))
    }
}

impl fmt::Display for Mask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Mask::all() {
            return f.write_str("ALL");
        }
        let names: Vec<&str> = self.types().map(|t| t.name()).collect();
        f.write_str(&names.join(","))
    }
}

/// One changelog record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChangelogRecord {
    /// Position in the changelog: increasing in commit order, never reused.
    pub index: u64,
    /// When the change committed (ns since the epoch).
    pub time: Nanos,
    #[serde(rename = "type")]
    pub typ: RecordType,
    /// [`FLAG_LAST`], [`FLAG_EXCHANGE`].
    pub flags: u32,
    /// The inode changed (`t=`).
    pub target: Ino,
    /// Its parent directory for namespace records (`p=`), else 0.
    pub parent: Ino,
    /// The name in `parent` (namespace records) or the attribute's name (XATTR); may be empty.
    #[serde(serialize_with = "ser_bytes")]
    pub name: Vec<u8>,
    /// RENME/RNMTO: where the renamed inode was.
    pub source_parent: Option<Ino>,
    #[serde(serialize_with = "ser_opt_bytes")]
    pub source_name: Option<Vec<u8>>,
    pub uid: u32,
    pub gid: u32,
    /// The client that made the change.
    pub client: String,
    /// The job id read from the writer's environment, when the client was told which variable.
    pub jobid: Option<String>,
}

/// A name as text without losing a byte: valid UTF-8 as it is, a backslash doubled, and each
/// byte of invalid UTF-8 as `\xNN` (so `\\` and `\x` tell the two apart).
pub fn escape_name(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for x in chunk.invalid() {
            out.push_str(&format!("\\x{x:02x}"));
        }
    }
    out
}

fn ser_bytes<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&escape_name(b))
}

fn ser_opt_bytes<S: serde::Serializer>(b: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    match b {
        Some(b) => s.serialize_some(&escape_name(b)),
        None => s.serialize_none(),
    }
}

/// A registered reader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChangelogReader {
    /// The number in its name (`cl3` is 3).
    pub id: u64,
    pub mask: i64,
    /// Records up to this index are cleared for this reader (0: none).
    pub cleared: u64,
    pub registered: Nanos,
    /// The last time it was registered, cleared or read with `--reader`.
    pub last_used: Nanos,
    /// Deregistered when idle (not used) for this long.
    pub idle_ns: i64,
    /// The client whose change follower this reader is (its own records are not written for
    /// it), or `None` for an ordinary reader.
    pub follower_of: Option<String>,
}

impl ChangelogReader {
    /// The reader's name, `cl<id>` as in Lustre.
    pub fn name(&self) -> String {
        reader_name(self.id)
    }
}

/// `cl<id>`.
pub fn reader_name(id: u64) -> String {
    format!("cl{id}")
}

/// The id in a reader name: `cl3` or `3`.
pub fn parse_reader(s: &str) -> Option<u64> {
    let t = s.trim();
    let digits = t.strip_prefix("cl").unwrap_or(t);
    digits.parse().ok().filter(|n| *n > 0)
}

/// A reader deregistered because it stayed idle, as `tierfs status` warns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IdleDeregistration {
    pub reader: u64,
    /// Its last clear.
    pub cleared: u64,
    pub last_used: Nanos,
    /// When it was dropped.
    pub at: Nanos,
}

/// The state of the changelog, for `tierfs status` and `tierfs changelog readers`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ChangelogStatus {
    pub readers: Vec<ChangelogReader>,
    /// Lowest and highest index held (None: empty).
    pub first: Option<u64>,
    pub last: Option<u64>,
    /// The highest index ever handed out (0: none yet).
    pub current: u64,
    /// Readers dropped for idleness, newest first.
    pub idle_deregistered: Vec<IdleDeregistration>,
}

/// Default idle time after which a reader that neither cleared nor read with `--reader` is
/// deregistered: 7 days (unread records would otherwise fill the metadata database).
pub const DEFAULT_IDLE_SECS: u64 = 7 * 24 * 3600;

// ---------------------------------------------------------------------------------------------
// caller context

/// Who makes a change: carried into each changelog record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// The client name (None: the process default, [`set_process_client`]).
    pub client: Option<Arc<str>>,
    pub jobid: Option<Arc<str>>,
}

thread_local! {
    static CURRENT: RefCell<Option<Caller>> = const { RefCell::new(None) };
    static BATCH: RefCell<Option<Vec<(Ino, Caller)>>> = const { RefCell::new(None) };
}

static PROCESS_CLIENT: OnceLock<Arc<str>> = OnceLock::new();

/// Sets the client name records made outside a scope (and scopes without a client) carry.
/// First call wins (one client per process).
pub fn set_process_client(name: &str) {
    let _ = PROCESS_CLIENT.set(Arc::from(name));
}

fn process_client() -> Arc<str> {
    PROCESS_CLIENT
        .get()
        .cloned()
        .unwrap_or_else(|| Arc::from(""))
}

/// Restores the previous scope when dropped.
#[must_use = "the caller scope ends when this guard is dropped"]
pub struct CallerGuard {
    prev: Option<Caller>,
}

impl Drop for CallerGuard {
    fn drop(&mut self) {
        let prev = self.prev.take();
        CURRENT.with(|c| *c.borrow_mut() = prev);
    }
}

/// Restores the previous batch scope when dropped.
#[must_use = "the batch scope ends when this guard is dropped"]
pub struct BatchGuard {
    prev: Option<Vec<(Ino, Caller)>>,
}

impl Drop for BatchGuard {
    fn drop(&mut self) {
        let prev = self.prev.take();
        BATCH.with(|c| *c.borrow_mut() = prev);
    }
}

impl Caller {
    /// Makes this the caller of what this thread does until the guard drops.
    pub fn enter(self) -> CallerGuard {
        let prev = CURRENT.with(|c| c.borrow_mut().replace(self));
        CallerGuard { prev }
    }

    /// The process's own identity (effective uid/gid, the process client name).
    pub fn process() -> Caller {
        // SAFETY: geteuid/getegid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Caller {
            uid,
            gid,
            client: None,
            jobid: None,
        }
    }

    /// The client name to record (the process default when unset).
    pub fn client_name(&self) -> Arc<str> {
        self.client.clone().unwrap_or_else(process_client)
    }
}

/// Per-inode callers for a batch this thread runs on behalf of several requests (the queued
/// closes of a client); [`for_ino`] finds an inode's, others get [`current`].
pub fn enter_batch(items: Vec<(Ino, Caller)>) -> BatchGuard {
    let prev = BATCH.with(|c| c.borrow_mut().replace(items));
    BatchGuard { prev }
}

/// The caller of what this thread does now.
pub fn current() -> Caller {
    CURRENT
        .with(|c| c.borrow().clone())
        .unwrap_or_else(Caller::process)
}

/// The caller for a change of `ino`: its entry in the batch scope, else [`current`]. (The
/// first entry when the batch names the inode more than once.)
pub fn for_ino(ino: Ino) -> Caller {
    BATCH
        .with(|b| {
            b.borrow()
                .as_ref()
                .and_then(|v| v.iter().find(|(i, _)| *i == ino).map(|(_, c)| c.clone()))
        })
        .unwrap_or_else(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_round_trip_and_numbers_are_lustres() {
        for t in RecordType::ALL {
            assert_eq!(t.name().parse::<RecordType>().unwrap(), *t);
            assert_eq!(RecordType::from_num(*t as i64), Some(*t));
        }
        assert_eq!(RecordType::Creat as u8, 1);
        assert_eq!(RecordType::Close as u8, 11);
        assert_eq!(RecordType::Ctime as u8, 18);
        assert_eq!(RecordType::Hsm as u8, 16, "Lustre's CL_HSM");
        assert_eq!(RecordType::from_num(16), Some(RecordType::Hsm));
        assert_eq!(RecordType::from_num(19), None);
        assert!("creat".parse::<RecordType>().is_ok());
        assert!("CREATE".parse::<RecordType>().is_err());
    }

    #[test]
    fn masks_parse_like_lustre() {
        let m = Mask::parse("CREAT,unlnk").unwrap();
        assert!(m.contains(RecordType::Creat) && m.contains(RecordType::Unlnk));
        assert!(!m.contains(RecordType::Mkdir));
        assert_eq!(m.to_string(), "CREAT,UNLNK");
        assert!(!Mask::default_mask().contains(RecordType::Open));
        assert!(Mask::default_mask().contains(RecordType::Close));
        assert!(Mask::parse("+OPEN").unwrap().contains(RecordType::Open));
        assert!(Mask::parse("+OPEN").unwrap().contains(RecordType::Creat));
        let m = Mask::parse("ALL -OPEN -CLOSE").unwrap();
        assert!(!m.contains(RecordType::Open) && !m.contains(RecordType::Close));
        assert!(m.contains(RecordType::Mtime));
        assert_eq!(Mask::parse("ALL").unwrap(), Mask::all());
        assert_eq!(Mask::parse("CREAT,BOGUS"), Err(MaskError("BOGUS".into())));
        assert!(Mask::parse("").is_err());
        assert!(Mask::parse("CREAT,-CREAT").is_err());
    }

    #[test]
    fn names_escape_without_loss() {
        assert_eq!(escape_name(b"plain"), "plain");
        assert_eq!(escape_name("é".as_bytes()), "é");
        assert_eq!(escape_name(b"a\\b"), "a\\\\b");
        assert_eq!(escape_name(b"x\xffy"), "x\\xffy");
    }

    #[test]
    fn reader_names() {
        assert_eq!(parse_reader("cl3"), Some(3));
        assert_eq!(parse_reader("3"), Some(3));
        assert_eq!(parse_reader("cl0"), None);
        assert_eq!(parse_reader("clx"), None);
        assert_eq!(reader_name(12), "cl12");
    }

    #[test]
    fn scopes_nest_and_restore() {
        let base = current();
        assert_eq!(base.uid, unsafe { libc::geteuid() });
        {
            let _a = Caller {
                uid: 5,
                gid: 6,
                client: Some("a".into()),
                jobid: Some("j1".into()),
            }
            .enter();
            assert_eq!(current().uid, 5);
            {
                let _b = Caller {
                    uid: 7,
                    ..Default::default()
                }
                .enter();
                assert_eq!(current().uid, 7);
                let _batch = enter_batch(vec![(
                    42,
                    Caller {
                        uid: 9,
                        ..Default::default()
                    },
                )]);
                assert_eq!(for_ino(42).uid, 9);
                assert_eq!(for_ino(43).uid, 7);
            }
            assert_eq!(for_ino(42).uid, 5);
            assert_eq!(current().jobid.as_deref(), Some("j1"));
        }
        assert_eq!(current(), base);
        // other threads do not see this thread's scope
        let _a = Caller {
            uid: 11,
            ..Default::default()
        }
        .enter();
        let other = std::thread::spawn(|| current().uid).join().unwrap();
        assert_eq!(other, unsafe { libc::geteuid() });
    }
}
