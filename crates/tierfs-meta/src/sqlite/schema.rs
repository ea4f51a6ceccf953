//! The versioned SQL schema. `PRAGMA user_version` records the version; each migration moves
//! it one step. The same tables serve every SQL engine (types are plain INTEGER/TEXT/BLOB).

/// Schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = 5;

/// `MIGRATIONS[i]` moves the schema from version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5];

/// Version 5: each file's allocated bytes (st_blocks): bytes covered by slices that are not
/// zero slices, the newest slice winning. Kept by every transaction that changes slices, for
/// the chunks it touches; the migration counts existing files (`recount_all`).
const V5: &str = r#"
ALTER TABLE inodes ADD COLUMN allocated INTEGER NOT NULL DEFAULT 0;
"#;

/// Version 4: a PCC rule may carry a quota, the most bytes the files it attached may take in
/// each client's cache (cache isolation); NULL: no limit beyond the cache's own size.
const V4: &str = r#"
ALTER TABLE pcc_rules ADD COLUMN quota INTEGER;
"#;

/// Version 3: files replaced by a rename stay openable for a grace period (`orphan = 2`, since
/// their `ctime`), so that another client which looked the name up just before can still open
/// what it found; this index finds the ones whose grace is over.
const V3: &str = r#"
CREATE INDEX inodes_grace ON inodes(ctime) WHERE orphan = 2;
"#;

/// Version 2: the persistent client cache. RW-PCC leases (one owner client per file, with a
/// generation), requests to give a lease back, and attach rules.
const V2: &str = r#"
CREATE TABLE pcc_leases (
    ino INTEGER PRIMARY KEY,
    client TEXT NOT NULL,
    generation INTEGER NOT NULL,
    dirty INTEGER NOT NULL DEFAULT 0,
    acquired INTEGER NOT NULL
);
CREATE INDEX pcc_leases_client ON pcc_leases(client);
CREATE TABLE pcc_revokes (
    ino INTEGER PRIMARY KEY,
    requester TEXT NOT NULL,
    requested INTEGER NOT NULL
);
CREATE TABLE pcc_rules (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    mode TEXT NOT NULL,
    client TEXT,
    rule TEXT NOT NULL,
    created INTEGER NOT NULL
);
INSERT INTO counters (name, value) VALUES ('pcc_generation', 0);
"#;

const V1: &str = r#"
CREATE TABLE meta_info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE targets (
    id INTEGER PRIMARY KEY,
    url TEXT NOT NULL,
    capacity INTEGER NOT NULL DEFAULT 0,
    used INTEGER NOT NULL DEFAULT 0,
    objects INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE inodes (
    ino INTEGER PRIMARY KEY AUTOINCREMENT,
    kind INTEGER NOT NULL,
    perm INTEGER NOT NULL,
    uid INTEGER NOT NULL,
    gid INTEGER NOT NULL,
    nlink INTEGER NOT NULL,
    size INTEGER NOT NULL DEFAULT 0,
    rdev INTEGER NOT NULL DEFAULT 0,
    atime INTEGER NOT NULL,
    mtime INTEGER NOT NULL,
    ctime INTEGER NOT NULL,
    crtime INTEGER NOT NULL,
    projid INTEGER NOT NULL DEFAULT 0,
    projinherit INTEGER NOT NULL DEFAULT 0,
    data_version INTEGER NOT NULL DEFAULT 0,
    stripe_size INTEGER NOT NULL DEFAULT 0,
    stripe_targets TEXT NOT NULL DEFAULT '',
    def_stripe_count INTEGER NOT NULL DEFAULT 0,
    def_stripe_size INTEGER NOT NULL DEFAULT 0,
    parent INTEGER NOT NULL DEFAULT 0,
    symlink BLOB,
    orphan INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE dentries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    parent INTEGER NOT NULL,
    name BLOB NOT NULL,
    ino INTEGER NOT NULL,
    kind INTEGER NOT NULL
);
CREATE UNIQUE INDEX dentries_name ON dentries(parent, name);
CREATE INDEX dentries_cursor ON dentries(parent, id);
CREATE TABLE slices (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ino INTEGER NOT NULL,
    chunk INTEGER NOT NULL,
    off INTEGER NOT NULL,
    len INTEGER NOT NULL,
    target INTEGER,
    obj INTEGER,
    obj_off INTEGER NOT NULL DEFAULT 0,
    obj_size INTEGER NOT NULL DEFAULT 0,
    inline BLOB
);
CREATE INDEX slices_chunk ON slices(ino, chunk, seq);
CREATE INDEX slices_obj ON slices(obj) WHERE obj IS NOT NULL;
CREATE TABLE xattrs (
    ino INTEGER NOT NULL,
    name BLOB NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (ino, name)
) WITHOUT ROWID;
CREATE TABLE sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    client_name TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    mountpoint TEXT NOT NULL,
    version TEXT NOT NULL,
    started INTEGER NOT NULL,
    heartbeat INTEGER NOT NULL
);
CREATE TABLE open_files (
    ino INTEGER NOT NULL,
    session INTEGER NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (ino, session)
) WITHOUT ROWID;
CREATE INDEX open_files_session ON open_files(session);
CREATE TABLE trash (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ino INTEGER NOT NULL,
    target INTEGER NOT NULL,
    obj INTEGER NOT NULL,
    len INTEGER NOT NULL
);
CREATE TABLE locks (
    ino INTEGER NOT NULL,
    session INTEGER NOT NULL,
    owner INTEGER NOT NULL,
    flock INTEGER NOT NULL,
    typ INTEGER NOT NULL,
    start INTEGER NOT NULL,
    end INTEGER NOT NULL,
    pid INTEGER NOT NULL
);
CREATE INDEX locks_ino ON locks(ino);
"#;
