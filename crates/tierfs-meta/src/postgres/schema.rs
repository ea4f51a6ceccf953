//! The versioned SQL schema in PostgreSQL's dialect: the same tables, columns and version
//! numbers as [`crate::sqlite`]'s (`MIGRATIONS[i]` moves version `i` to `i + 1` in both), with
//! BIGINT for INTEGER, BYTEA for BLOB and BIGSERIAL for AUTOINCREMENT. PostgreSQL has no
//! `PRAGMA user_version`: the version lives in the one-row table `schema_version`, created
//! before the first migration. Each migration runs in one transaction with its version bump
//! (PostgreSQL's DDL is transactional), under an advisory lock so that two clients opening an
//! old filesystem at once do not both migrate it.

/// Schema version this build writes and understands: always the SQLite engine's.
pub const SCHEMA_VERSION: i64 = crate::sqlite::SCHEMA_VERSION;

/// `MIGRATIONS[i]` moves the schema from version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5];

/// Version 5: see the SQLite twin (allocated bytes per file, for st_blocks).
const V5: &str = r#"
ALTER TABLE inodes ADD COLUMN allocated BIGINT NOT NULL DEFAULT 0;
"#;

// A new SQLite migration needs its PostgreSQL twin: the build fails until it has one.
const _: () = assert!(MIGRATIONS.len() as i64 == SCHEMA_VERSION);

/// Holds the schema version (one row); its absence means "not formatted".
pub const VERSION_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL);
INSERT INTO schema_version (version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM schema_version);";

/// Key of the advisory lock held while migrating or formatting.
pub const MIGRATION_LOCK: i64 = 0x7469_6572_6673_0001;

/// Every table the schema creates (dropped by `format --force`), with `schema_version`.
pub const TABLES: &[&str] = &[
    "schema_version",
    "meta_info",
    "counters",
    "targets",
    "inodes",
    "dentries",
    "slices",
    "xattrs",
    "sessions",
    "open_files",
    "trash",
    "locks",
    "pcc_leases",
    "pcc_revokes",
    "pcc_rules",
];

/// Version 2: the persistent client cache. RW-PCC leases (one owner client per file, with a
/// generation), requests to give a lease back, and attach rules.
/// Version 4: see the SQLite twin (a quota per PCC rule).
const V4: &str = r#"
ALTER TABLE pcc_rules ADD COLUMN quota BIGINT;
"#;

/// Version 3: see the SQLite twin (files in their grace period after a rename replaced them).
const V3: &str = r#"
CREATE INDEX inodes_grace ON inodes(ctime) WHERE orphan = 2;
"#;

const V2: &str = r#"
CREATE TABLE pcc_leases (
    ino BIGINT PRIMARY KEY,
    client TEXT NOT NULL,
    generation BIGINT NOT NULL,
    dirty BIGINT NOT NULL DEFAULT 0,
    acquired BIGINT NOT NULL
);
CREATE INDEX pcc_leases_client ON pcc_leases(client);
CREATE TABLE pcc_revokes (
    ino BIGINT PRIMARY KEY,
    requester TEXT NOT NULL,
    requested BIGINT NOT NULL
);
CREATE TABLE pcc_rules (
    id BIGSERIAL PRIMARY KEY,
    mode TEXT NOT NULL,
    client TEXT,
    rule TEXT NOT NULL,
    created BIGINT NOT NULL
);
INSERT INTO counters (name, value) VALUES ('pcc_generation', 0);
"#;

const V1: &str = r#"
CREATE TABLE meta_info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
CREATE TABLE targets (
    id BIGINT PRIMARY KEY,
    url TEXT NOT NULL,
    capacity BIGINT NOT NULL DEFAULT 0,
    used BIGINT NOT NULL DEFAULT 0,
    objects BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE inodes (
    ino BIGSERIAL PRIMARY KEY,
    kind BIGINT NOT NULL,
    perm BIGINT NOT NULL,
    uid BIGINT NOT NULL,
    gid BIGINT NOT NULL,
    nlink BIGINT NOT NULL,
    size BIGINT NOT NULL DEFAULT 0,
    rdev BIGINT NOT NULL DEFAULT 0,
    atime BIGINT NOT NULL,
    mtime BIGINT NOT NULL,
    ctime BIGINT NOT NULL,
    crtime BIGINT NOT NULL,
    projid BIGINT NOT NULL DEFAULT 0,
    projinherit BIGINT NOT NULL DEFAULT 0,
    data_version BIGINT NOT NULL DEFAULT 0,
    stripe_size BIGINT NOT NULL DEFAULT 0,
    stripe_targets TEXT NOT NULL DEFAULT '',
    def_stripe_count BIGINT NOT NULL DEFAULT 0,
    def_stripe_size BIGINT NOT NULL DEFAULT 0,
    parent BIGINT NOT NULL DEFAULT 0,
    symlink BYTEA,
    orphan BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE dentries (
    id BIGSERIAL PRIMARY KEY,
    parent BIGINT NOT NULL,
    name BYTEA NOT NULL,
    ino BIGINT NOT NULL,
    kind BIGINT NOT NULL
);
CREATE UNIQUE INDEX dentries_name ON dentries(parent, name);
CREATE INDEX dentries_cursor ON dentries(parent, id);
CREATE TABLE slices (
    seq BIGSERIAL PRIMARY KEY,
    ino BIGINT NOT NULL,
    chunk BIGINT NOT NULL,
    off BIGINT NOT NULL,
    len BIGINT NOT NULL,
    target BIGINT,
    obj BIGINT,
    obj_off BIGINT NOT NULL DEFAULT 0,
    obj_size BIGINT NOT NULL DEFAULT 0,
    inline BYTEA
);
CREATE INDEX slices_chunk ON slices(ino, chunk, seq);
CREATE INDEX slices_obj ON slices(obj) WHERE obj IS NOT NULL;
CREATE TABLE xattrs (
    ino BIGINT NOT NULL,
    name BYTEA NOT NULL,
    value BYTEA NOT NULL,
    PRIMARY KEY (ino, name)
);
CREATE TABLE sessions (
    id BIGSERIAL PRIMARY KEY,
    client_name TEXT NOT NULL,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    mountpoint TEXT NOT NULL,
    version TEXT NOT NULL,
    started BIGINT NOT NULL,
    heartbeat BIGINT NOT NULL
);
CREATE TABLE open_files (
    ino BIGINT NOT NULL,
    session BIGINT NOT NULL,
    count BIGINT NOT NULL,
    PRIMARY KEY (ino, session)
);
CREATE INDEX open_files_session ON open_files(session);
CREATE TABLE trash (
    id BIGSERIAL PRIMARY KEY,
    ino BIGINT NOT NULL,
    target BIGINT NOT NULL,
    obj BIGINT NOT NULL,
    len BIGINT NOT NULL
);
CREATE TABLE locks (
    ino BIGINT NOT NULL,
    session BIGINT NOT NULL,
    owner BIGINT NOT NULL,
    flock BIGINT NOT NULL,
    typ BIGINT NOT NULL,
    start BIGINT NOT NULL,
    "end" BIGINT NOT NULL,
    pid BIGINT NOT NULL
);
CREATE INDEX locks_ino ON locks(ino);
"#;
