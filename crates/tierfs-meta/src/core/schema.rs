//! The versioned schema, defined once for every engine.
//!
//! Tables are written in a neutral DDL that [`render_ddl`] turns into each dialect's:
//!
//! | neutral          | SQLite                              | PostgreSQL               |
//! |------------------|-------------------------------------|--------------------------|
//! | `INT`            | `INTEGER`                           | `BIGINT`                 |
//! | `SERIAL`         | `INTEGER PRIMARY KEY AUTOINCREMENT` | `BIGSERIAL PRIMARY KEY`  |
//! | `BLOB`           | `BLOB`                              | `BYTEA`                  |
//! | `WITHOUT ROWID`  | `WITHOUT ROWID`                     | (nothing)                |
//!
//! (`TEXT`, `NOT NULL`, `DEFAULT`, `PRIMARY KEY (a, b)`, partial indexes and `"end"` are the
//! same in both.) `SERIAL` is an auto id: insert without it and read it back with
//! `RETURNING`. Every integer is 64 bits wide in both engines.
//!
//! [`MIGRATIONS`]`[i]` moves the schema from version `i` to `i + 1`; [`SCHEMA_VERSION`] is
//! where the list ends. Version 6 is assembled from the domains that brought tables with it
//! ([`V6`]): a domain defines its tables as a [`Ddl`] in its own module and registers it there
//! with one line.
//!
//! Where the version lives is the engine's: SQLite's `PRAGMA user_version`, PostgreSQL's
//! one-row table `schema_version` (PostgreSQL has no user version). The runner is
//! [`migrate`]: each step is one transaction with its version bump (both engines' DDL is
//! transactional), and on PostgreSQL under an advisory lock, so that two clients opening an old
//! filesystem at once do not both migrate it.

use crate::error::{MetaError, Result};
use crate::sql::{DialectKind, Driver, Tx};
use crate::vals;

/// Statements of neutral DDL (see the module doc), run in order.
pub type Ddl = &'static [&'static str];

/// Schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = 11;

/// One migration step.
pub struct Migration {
    /// The version this step moves to.
    pub version: i64,
    /// Its DDL, from each part that contributes to it, in order.
    pub parts: &'static [Ddl],
    /// Data work after the DDL, in the same transaction (counting what a new column holds for
    /// the existing rows).
    pub after: Option<fn(&mut dyn Tx) -> Result<()>>,
}

/// `MIGRATIONS[i]` moves the schema from version `i` to `i + 1`.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        parts: &[V1],
        after: None,
    },
    Migration {
        version: 2,
        parts: &[V2],
        after: None,
    },
    Migration {
        version: 3,
        parts: &[V3],
        after: None,
    },
    Migration {
        version: 4,
        parts: &[V4],
        after: None,
    },
    Migration {
        version: 5,
        parts: &[V5],
        after: Some(super::common::recount_all),
    },
    Migration {
        version: 6,
        parts: V6,
        after: None,
    },
    Migration {
        version: 7,
        parts: V7,
        after: None,
    },
    Migration {
        version: 8,
        parts: V8,
        after: None,
    },
    Migration {
        version: 9,
        parts: &[V9],
        after: Some(super::common::recount_xattrs),
    },
    Migration {
        version: 10,
        parts: &[V10],
        after: None,
    },
    Migration {
        version: 11,
        parts: &[V11],
        after: None,
    },
];

/// Version 11: a file whose last name went while nobody had it open is left for the purge
/// (`orphan = 3`: gone for every request, its rows and data freed by a background worker in
/// batches, `Namespace::purge_unlinked`) instead of being freed inside the unlink; this index
/// finds those files.
const V11: Ddl = &["CREATE INDEX inodes_unlinked ON inodes(ino) WHERE orphan = 3"];

/// Version 10: a changelog reader may be a client's change follower
/// (`changelog_readers.follower_of`, the client's name): the records that client makes itself
/// are not written for it (its kernel saw those changes), so a client alone on a filesystem
/// writes no records for its own follower. HSM records are written for it all the same (a
/// mover's change to the client's own file is news to its kernel).
const V10: Ddl = &["ALTER TABLE changelog_readers ADD COLUMN follower_of TEXT"];

/// Version 9: each inode's number of extended attributes (`inodes.xattr_count`), kept by
/// setxattr and removexattr in their transaction and carried in every [`crate::Attr`], so that
/// a client answers GETXATTR and LISTXATTR of a file without xattrs (most files: `ls -l`,
/// `tar x` and `cp -a` ask for ACLs and capabilities of each one) without reading the engine.
/// The migration counts the existing xattrs (`recount_xattrs`).
const V9: Ddl = &["ALTER TABLE inodes ADD COLUMN xattr_count INT NOT NULL DEFAULT 0"];

/// Version 8: HSM (docs/hsm.md). Each file's HSM flags in `inodes.hsm` (0 for every existing
/// file: none has HSM state), and the tables of archives, archive copies, the coordinator's
/// queue and its agents ([`crate::core::hsm::SCHEMA`]).
pub const V8: &[Ddl] = &[HSM_FLAGS, crate::core::hsm::SCHEMA];

const HSM_FLAGS: Ddl = &["ALTER TABLE inodes ADD COLUMN hsm INT NOT NULL DEFAULT 0"];

/// Version 7: RW-PCC recalls say whether they are for writing (give the lease back) or for
/// reading (a snapshot write-back will do while the owner keeps writing), and carry a number;
/// a lease records the newest read request a snapshot served. Requests from before v7 are
/// for writing.
pub const V7: &[Ddl] = &[PCC_SNAPSHOTS];

const PCC_SNAPSHOTS: Ddl = &[
    "ALTER TABLE pcc_revokes ADD COLUMN for_write INT NOT NULL DEFAULT 1",
    "ALTER TABLE pcc_revokes ADD COLUMN seq INT NOT NULL DEFAULT 0",
    "ALTER TABLE pcc_leases ADD COLUMN snapshot INT NOT NULL DEFAULT 0",
];

const _: () = assert!(MIGRATIONS.len() as i64 == SCHEMA_VERSION);

/// Version 6: the tables of the changelog and of the workers' reports. Each owning module
/// defines its [`Ddl`] and adds one line here.
pub const V6: &[Ddl] = &[
    crate::core::changelog::SCHEMA,
    crate::core::workers::SCHEMA,
    TRASH_CREATED,
];

/// Version 6, the trash: when each row came (0: at once, rows of files nobody holds and rows
/// from before v6), so that the objects a file kept open drops can go after a grace instead
/// of at its last close ([`crate::engine::OPEN_TRASH_GRACE`]).
const TRASH_CREATED: Ddl = &["ALTER TABLE trash ADD COLUMN created INT NOT NULL DEFAULT 0"];

/// Version 5: each file's allocated bytes (st_blocks): bytes covered by slices that are not
/// zero slices, the newest slice winning. Kept by every transaction that changes slices, for
/// the chunks it touches; the migration counts existing files (`recount_all`).
const V5: Ddl = &["ALTER TABLE inodes ADD COLUMN allocated INT NOT NULL DEFAULT 0"];

/// Version 4: a PCC rule may carry a quota, the most bytes the files it attached may take in
/// each client's cache (cache isolation); NULL: no limit beyond the cache's own size.
const V4: Ddl = &["ALTER TABLE pcc_rules ADD COLUMN quota INT"];

/// Version 3: files replaced by a rename stay openable for a grace period (`orphan = 2`, since
/// their `ctime`), so that another client which looked the name up just before can still open
/// what it found; this index finds the ones whose grace is over.
const V3: Ddl = &["CREATE INDEX inodes_grace ON inodes(ctime) WHERE orphan = 2"];

/// Version 2: the persistent client cache. RW-PCC leases (one owner client per file, with a
/// generation), requests to give a lease back, and attach rules.
const V2: Ddl = &[
    "CREATE TABLE pcc_leases (
        ino INT PRIMARY KEY,
        client TEXT NOT NULL,
        generation INT NOT NULL,
        dirty INT NOT NULL DEFAULT 0,
        acquired INT NOT NULL
    )",
    "CREATE INDEX pcc_leases_client ON pcc_leases(client)",
    "CREATE TABLE pcc_revokes (
        ino INT PRIMARY KEY,
        requester TEXT NOT NULL,
        requested INT NOT NULL
    )",
    "CREATE TABLE pcc_rules (
        id SERIAL,
        mode TEXT NOT NULL,
        client TEXT,
        rule TEXT NOT NULL,
        created INT NOT NULL
    )",
    "INSERT INTO counters (name, value) VALUES ('pcc_generation', 0)",
];

/// Version 1: the namespace, data, sessions and locks.
const V1: Ddl = &[
    "CREATE TABLE meta_info (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value INT NOT NULL)",
    "CREATE TABLE targets (
        id INT PRIMARY KEY,
        url TEXT NOT NULL,
        capacity INT NOT NULL DEFAULT 0,
        used INT NOT NULL DEFAULT 0,
        objects INT NOT NULL DEFAULT 0
    )",
    "CREATE TABLE inodes (
        ino SERIAL,
        kind INT NOT NULL,
        perm INT NOT NULL,
        uid INT NOT NULL,
        gid INT NOT NULL,
        nlink INT NOT NULL,
        size INT NOT NULL DEFAULT 0,
        rdev INT NOT NULL DEFAULT 0,
        atime INT NOT NULL,
        mtime INT NOT NULL,
        ctime INT NOT NULL,
        crtime INT NOT NULL,
        projid INT NOT NULL DEFAULT 0,
        projinherit INT NOT NULL DEFAULT 0,
        data_version INT NOT NULL DEFAULT 0,
        stripe_size INT NOT NULL DEFAULT 0,
        stripe_targets TEXT NOT NULL DEFAULT '',
        def_stripe_count INT NOT NULL DEFAULT 0,
        def_stripe_size INT NOT NULL DEFAULT 0,
        parent INT NOT NULL DEFAULT 0,
        symlink BLOB,
        orphan INT NOT NULL DEFAULT 0
    )",
    "CREATE TABLE dentries (
        id SERIAL,
        parent INT NOT NULL,
        name BLOB NOT NULL,
        ino INT NOT NULL,
        kind INT NOT NULL
    )",
    "CREATE UNIQUE INDEX dentries_name ON dentries(parent, name)",
    "CREATE INDEX dentries_cursor ON dentries(parent, id)",
    "CREATE TABLE slices (
        seq SERIAL,
        ino INT NOT NULL,
        chunk INT NOT NULL,
        off INT NOT NULL,
        len INT NOT NULL,
        target INT,
        obj INT,
        obj_off INT NOT NULL DEFAULT 0,
        obj_size INT NOT NULL DEFAULT 0,
        inline BLOB
    )",
    "CREATE INDEX slices_chunk ON slices(ino, chunk, seq)",
    "CREATE INDEX slices_obj ON slices(obj) WHERE obj IS NOT NULL",
    "CREATE TABLE xattrs (
        ino INT NOT NULL,
        name BLOB NOT NULL,
        value BLOB NOT NULL,
        PRIMARY KEY (ino, name)
    ) WITHOUT ROWID",
    "CREATE TABLE sessions (
        id SERIAL,
        client_name TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INT NOT NULL,
        mountpoint TEXT NOT NULL,
        version TEXT NOT NULL,
        started INT NOT NULL,
        heartbeat INT NOT NULL
    )",
    "CREATE TABLE open_files (
        ino INT NOT NULL,
        session INT NOT NULL,
        count INT NOT NULL,
        PRIMARY KEY (ino, session)
    ) WITHOUT ROWID",
    "CREATE INDEX open_files_session ON open_files(session)",
    "CREATE TABLE trash (
        id SERIAL,
        ino INT NOT NULL,
        target INT NOT NULL,
        obj INT NOT NULL,
        len INT NOT NULL
    )",
    "CREATE TABLE locks (
        ino INT NOT NULL,
        session INT NOT NULL,
        owner INT NOT NULL,
        flock INT NOT NULL,
        typ INT NOT NULL,
        start INT NOT NULL,
        \"end\" INT NOT NULL,
        pid INT NOT NULL
    )",
    "CREATE INDEX locks_ino ON locks(ino)",
];

/// PostgreSQL: holds the schema version (one row); its absence means "not formatted".
pub const PG_VERSION_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL);
INSERT INTO schema_version (version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM schema_version);";

/// PostgreSQL: key of the advisory lock held while migrating or formatting.
pub const PG_MIGRATION_LOCK: i64 = 0x7469_6572_6673_0001;

/// Every table the schema creates, in creation order (PostgreSQL's `format --force` drops
/// them; the dump lists them). Found from the DDL itself, so a new table is never forgotten.
pub fn tables() -> Vec<&'static str> {
    tables_added_after(0)
}

/// The DDL statements of the migrations past `version`, in order.
fn statements_after(version: i64) -> impl Iterator<Item = &'static str> {
    MIGRATIONS
        .iter()
        .filter(move |m| m.version > version)
        .flat_map(|m| m.parts.iter().flat_map(|p| p.iter().copied()))
}

/// The (table, column) pairs the migrations past `version` add to existing tables.
pub fn columns_added_after(version: i64) -> Vec<(&'static str, &'static str)> {
    // A column added to a table that is itself newer than `version` goes with its table.
    let new_tables = tables_added_after(version);
    statements_after(version)
        .filter_map(|stmt| {
            let words: Vec<&str> = stmt.split_whitespace().collect();
            match words[..] {
                ["ALTER", "TABLE", table, "ADD", "COLUMN", column, ..]
                    if !new_tables.contains(&table) =>
                {
                    Some((table, column))
                }
                _ => None,
            }
        })
        .collect()
}

/// The indexes the migrations past `version` create on tables that existed at `version` (an
/// index on a newer table goes with its table), in creation order.
pub fn indexes_added_after(version: i64) -> Vec<&'static str> {
    let new_tables = tables_added_after(version);
    statements_after(version)
        .filter_map(|stmt| {
            let words: Vec<&str> = stmt.split_whitespace().collect();
            match words[..] {
                ["CREATE", "INDEX", name, "ON", on, ..]
                    if !new_tables.contains(&on.split('(').next().unwrap_or(on)) =>
                {
                    Some(name)
                }
                _ => None,
            }
        })
        .collect()
}

/// The tables the migrations past `version` create, in creation order.
pub fn tables_added_after(version: i64) -> Vec<&'static str> {
    statements_after(version)
        .filter_map(|stmt| {
            let rest = stmt.trim_start().strip_prefix("CREATE TABLE ")?;
            let name = rest
                .trim_start_matches("IF NOT EXISTS ")
                .split([' ', '('])
                .next()
                .unwrap_or("");
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// One neutral DDL statement in `kind`'s dialect (see the module doc).
pub fn render_ddl(stmt: &str, kind: DialectKind) -> String {
    let rules: &[(&str, &str)] = match kind {
        DialectKind::Sqlite => &[
            ("INT", "INTEGER"),
            ("SERIAL", "INTEGER PRIMARY KEY AUTOINCREMENT"),
        ],
        DialectKind::Postgres => &[
            ("INT", "BIGINT"),
            ("SERIAL", "BIGSERIAL PRIMARY KEY"),
            ("BLOB", "BYTEA"),
            (" WITHOUT ROWID", ""),
        ],
    };
    let b = stmt.as_bytes();
    let mut out = String::with_capacity(stmt.len() + 32);
    let mut i = 0;
    let mut quote: Option<u8> = None;
    'outer: while i < b.len() {
        let c = b[i];
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
            out.push(c as char);
            i += 1;
            continue;
        }
        if c == b'\'' || c == b'"' {
            quote = Some(c);
            out.push(c as char);
            i += 1;
            continue;
        }
        let at_word_start = i == 0 || !is_word(b[i - 1]);
        if at_word_start || c == b' ' {
            for (from, to) in rules {
                let f = from.as_bytes();
                if b.len() >= i + f.len()
                    && &b[i..i + f.len()] == f
                    && (i + f.len() == b.len() || !is_word(b[i + f.len()]))
                {
                    out.push_str(to);
                    i += f.len();
                    continue 'outer;
                }
            }
        }
        out.push(c as char);
        i += 1;
    }
    out
}

/// The schema version the database holds: `None` when it holds no tierfs schema at all.
pub fn read_version(tx: &mut dyn Tx) -> Result<Option<i64>> {
    match tx.dialect().kind() {
        DialectKind::Sqlite => {
            let v = tx.int("PRAGMA user_version", vals![])?;
            Ok(if v == 0 { None } else { Some(v) })
        }
        DialectKind::Postgres => {
            if !tx.exists("SELECT to_regclass('schema_version') IS NOT NULL", vals![])? {
                return Ok(None);
            }
            Ok(tx
                .query_opt("SELECT version FROM schema_version", vals![])?
                .map(|r| r.i64(0))
                .transpose()?
                .filter(|v| *v > 0))
        }
    }
}

fn write_version(tx: &mut dyn Tx, v: i64) -> Result<()> {
    match tx.dialect().kind() {
        // A pragma takes no parameters; `v` is a number this code chose.
        DialectKind::Sqlite => tx.batch(&format!("PRAGMA user_version = {v}")),
        DialectKind::Postgres => tx
            .exec("UPDATE schema_version SET version = $1", vals![v])
            .map(|_| ()),
    }
}

/// Runs migration step `m` in `tx` (whose schema is at `m.version - 1`).
fn apply(tx: &mut dyn Tx, m: &Migration) -> Result<()> {
    let kind = tx.dialect().kind();
    for part in m.parts {
        for stmt in part.iter() {
            tx.batch(&render_ddl(stmt, kind))?;
        }
    }
    if let Some(f) = m.after {
        f(tx)?;
    }
    write_version(tx, m.version)
}

/// Brings the schema to [`SCHEMA_VERSION`], one transaction per step; from an empty
/// database, creates it. Refuses a schema newer than this build.
pub fn migrate<D: Driver>(d: &D) -> Result<()> {
    loop {
        let done = d.exclusive(|tx| {
            let current = match tx.dialect().kind() {
                DialectKind::Postgres => {
                    tx.batch(PG_VERSION_TABLE)?;
                    tx.int("SELECT version FROM schema_version", vals![])?
                }
                DialectKind::Sqlite => read_version(tx)?.unwrap_or(0),
            };
            if current > SCHEMA_VERSION {
                return Err(MetaError::SchemaTooNew {
                    found: current,
                    supported: SCHEMA_VERSION,
                });
            }
            if current == SCHEMA_VERSION {
                return Ok(true);
            }
            let m = &MIGRATIONS[current as usize];
            debug_assert_eq!(m.version, current + 1);
            tracing::info!("metadata schema: version {current} -> {}", m.version);
            apply(tx, m)?;
            Ok(m.version == SCHEMA_VERSION)
        })?;
        if done {
            return Ok(());
        }
    }
}

/// Opens a filesystem's schema: refuses a database without one (`what` names the database
/// in the error) or with a newer one than this build, and migrates an older one.
pub fn open<D: Driver>(d: &D, what: &str) -> Result<()> {
    match d.read(read_version)? {
        None => Err(MetaError::NotFormatted(format!(
            "{what} holds no tierfs schema"
        ))),
        Some(v) if v > SCHEMA_VERSION => Err(MetaError::SchemaTooNew {
            found: v,
            supported: SCHEMA_VERSION,
        }),
        Some(v) if v < SCHEMA_VERSION => migrate(d),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ddl_renders_per_dialect() {
        let s = "CREATE TABLE t (id SERIAL, n INT NOT NULL, b BLOB, \"end\" INT, \
                 note TEXT DEFAULT 'INT BLOB') WITHOUT ROWID";
        assert_eq!(
            render_ddl(s, DialectKind::Sqlite),
            "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, n INTEGER NOT NULL, b BLOB, \
             \"end\" INTEGER, note TEXT DEFAULT 'INT BLOB') WITHOUT ROWID"
        );
        assert_eq!(
            render_ddl(s, DialectKind::Postgres),
            "CREATE TABLE t (id BIGSERIAL PRIMARY KEY, n BIGINT NOT NULL, b BYTEA, \
             \"end\" BIGINT, note TEXT DEFAULT 'INT BLOB')"
        );
        // Words that contain a token are left alone.
        assert_eq!(
            render_ddl("CREATE INDEX x_int ON t(INTx, xINT)", DialectKind::Postgres),
            "CREATE INDEX x_int ON t(INTx, xINT)"
        );
    }

    #[test]
    fn every_table_is_listed_once() {
        let t = tables();
        for name in ["meta_info", "inodes", "dentries", "locks", "pcc_rules"] {
            assert_eq!(t.iter().filter(|x| **x == name).count(), 1, "{name}");
        }
        assert_eq!(MIGRATIONS.last().unwrap().version, SCHEMA_VERSION);
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i64 + 1);
        }
    }
}
