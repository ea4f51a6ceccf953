//! The namespace domain, once for every engine: names, attributes (with truncation), hard and
//! symbolic links, renames, directory listings, extended attributes, stripe defaults and
//! layouts, projects, paths, and the purge of files a rename replaced.
//!
//! Row locks (PostgreSQL; SQLite has one writer and renders them away): every write locks the
//! inode rows it reads to decide, in the global order of `postgres/mod.rs` (the `rename_lock`
//! counter, then inodes ascending in one statement, then targets), through
//! [`lock_inodes`]/[`lock1`]. Names looked up before the locks stay valid because any change
//! to a directory's entries also updates the directory's row.
//!
//! `// changelog: TYPE` marks where the changelog's record of an operation belongs (in the
//! same transaction, after the change).

use super::changelog::{self, Rec};
use super::common::{
    add_allocated, apply_allocated, attr_from_row, check_name, chunks_allocated, dir_attr,
    drop_inode, drop_link, find_dentry, get_attr, is_dir, lock1, lock_inodes, purge_inode,
    record_open, retire_inode, touch_dir, trash_slices, zero_range, ATTR_COLS, ATTR_COLS_I,
    MAX_LINKS, PENDING,
};
use super::pcc::LEASE_COLS;
use super::SqlMeta;
use crate::changelog::{RecordType, FLAG_EXCHANGE, FLAG_LAST};
use crate::engine::Namespace;
use crate::error::{MetaError, Result};
use crate::sql::{Driver, Tx, Value};
use crate::types::*;
use crate::vals;

fn resolve_time(t: TimeSet, now: Nanos) -> Nanos {
    match t {
        TimeSet::Now => now,
        TimeSet::At(n) => n,
    }
}

/// Whether `maybe_ancestor` is `ino` or one of its ancestors.
fn is_ancestor(tx: &mut dyn Tx, maybe_ancestor: Ino, mut ino: Ino) -> Result<bool> {
    let mut hops = 0;
    while ino != ROOT_INO && hops < 100_000 {
        if ino == maybe_ancestor {
            return Ok(true);
        }
        ino = tx.int("SELECT parent FROM inodes WHERE ino = $1", vals![ino])? as u64;
        hops += 1;
    }
    Ok(ino == maybe_ancestor)
}

/// Changes a file's size: shrinking frees whole chunks beyond the end and zeroes the tail of the
/// last one, so that growing again later reads zeros.
fn truncate(tx: &mut dyn Tx, a: &Attr, new_size: u64) -> Result<()> {
    if new_size >= a.size {
        return Ok(());
    }
    let Some(l) = &a.layout else {
        return Ok(());
    };
    let cs = l.stripe_size;
    let first_gone = new_size.div_ceil(cs);
    let mut gone = Vec::new();
    tx.query_each(
        "SELECT DISTINCT chunk FROM slices WHERE ino = $1 AND chunk >= $2",
        vals![a.ino, first_gone],
        &mut |r| {
            gone.push(r.u64(0)?);
            Ok(())
        },
    )?;
    let freed = chunks_allocated(tx, a.ino, &gone)?;
    trash_slices(tx, a.ino, "chunk >= $2", &[first_gone as i64])?;
    add_allocated(tx, a.ino, freed, 0)?;
    if !new_size.is_multiple_of(cs) {
        let chunk = new_size / cs;
        let off = new_size % cs;
        let beyond = tx.exists(
            "SELECT EXISTS (SELECT 1 FROM slices WHERE ino = $1 AND chunk = $2 \
             AND off + len > $3)",
            vals![a.ino, chunk, off],
        )?;
        if beyond {
            let delta = zero_range(tx, a.ino, cs, new_size, cs - off)?;
            apply_allocated(tx, a.ino, delta)?;
        }
    }
    Ok(())
}

/// The parent of a new name, locked, with its `projinherit` and whether the name is taken: one
/// statement.
fn lock_parent_for_create(tx: &mut dyn Tx, parent: Ino, name: &[u8]) -> Result<(Attr, bool, bool)> {
    let sql = if tx.dialect().row_locks() {
        const_format_lock()
    } else {
        const_format_select()
    };
    let r = tx.one(sql, vals![parent, name])?;
    let n = ATTR_COLS.split(", ").count();
    Ok((attr_from_row(&r)?, r.i64(n)? != 0, r.bool(n + 1)?))
}

fn const_format_lock() -> &'static str {
    static S: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        format!(
            "WITH l AS (SELECT ino FROM inodes WHERE ino = $1 FOR UPDATE) \
             UPDATE inodes i SET ino = i.ino FROM l WHERE i.ino = l.ino \
             RETURNING {ATTR_COLS_I}, i.projinherit, \
                       EXISTS (SELECT 1 FROM dentries WHERE parent = $1 AND name = $2)"
        )
    })
}

fn const_format_select() -> &'static str {
    static S: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        format!(
            "SELECT {ATTR_COLS}, projinherit, \
                    EXISTS (SELECT 1 FROM dentries WHERE parent = $1 AND name = $2) \
             FROM inodes WHERE ino = $1"
        )
    })
}

/// A new inode (SQLite's path of `create`).
const INSERT_INODE: &str = "INSERT INTO inodes (kind, perm, uid, gid, nlink, size, rdev, atime, \
     mtime, ctime, crtime, projid, projinherit, stripe_size, stripe_targets, parent, symlink) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $8, $8, $9, $10, $11, $12, $13, $14)";

/// PostgreSQL: the new inode, its name, the parent's times and link count, and the opener's
/// open count in one statement (the parent row is already locked by this transaction).
fn insert_inode_fused_sql() -> &'static str {
    static S: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        format!(
            "WITH n AS (INSERT INTO inodes (kind, perm, uid, gid, nlink, size, rdev, atime, \
                 mtime, ctime, crtime, projid, projinherit, stripe_size, stripe_targets, parent, \
                 symlink) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $8, $8, $9, $10, $11, $12, $13, $14) \
               RETURNING {ATTR_COLS}), \
             d AS (INSERT INTO dentries (parent, name, ino, kind) \
                   SELECT $13, $15, n.ino, $1 FROM n), \
             t AS (UPDATE inodes SET mtime = $8, ctime = $8, nlink = nlink + $16 \
                   WHERE ino = $13), \
             o AS (INSERT INTO open_files (session, ino, count) \
                   SELECT $17::BIGINT, n.ino, 1 FROM n WHERE $17::BIGINT IS NOT NULL) \
             SELECT * FROM n"
        )
    })
}

fn lookup_sql() -> &'static str {
    static S: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        format!(
            "SELECT {ATTR_COLS_I} FROM dentries d JOIN inodes i ON i.ino = d.ino \
             WHERE d.parent = $1 AND d.name = $2"
        )
    })
}

/// One page of a directory with each entry's attributes (one join): the attribute columns,
/// then the entry's cursor and name.
fn readdir_plus_sql() -> &'static str {
    static S: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        format!(
            "SELECT {ATTR_COLS_I}, d.id, d.name FROM dentries d JOIN inodes i ON i.ino = d.ino \
             WHERE d.parent = $1 AND d.id > $2 ORDER BY d.id LIMIT $3"
        )
    })
}

/// Locks a directory and an entry's inode (PostgreSQL); checks that the directory is one.
/// SQLite (one writer) reads only the directory, as a lock is not needed.
fn lock_parent_and_child(tx: &mut dyn Tx, parent: Ino, child: Ino) -> Result<()> {
    if tx.dialect().row_locks() {
        let locked = lock_inodes(tx, &[parent, child])?;
        is_dir(locked.get(&parent).ok_or(MetaError::NotFound)?)?;
    } else {
        dir_attr(tx, parent)?;
    }
    Ok(())
}

/// Removes an empty directory's inode (its entry is gone or going).
fn delete_dir_inode(tx: &mut dyn Tx, ino: Ino) -> Result<()> {
    tx.exec("DELETE FROM xattrs WHERE ino = $1", vals![ino])?;
    tx.exec("DELETE FROM inodes WHERE ino = $1", vals![ino])?;
    Ok(())
}

/// The layout columns of a new inode (stripe size, encoded targets): a regular file's layout,
/// nothing for other kinds.
fn layout_cols(layout: Option<&Layout>, kind: Kind) -> (i64, String) {
    match (layout, kind) {
        (Some(l), Kind::File) => (l.stripe_size as i64, l.encode_targets()),
        _ => (0, String::new()),
    }
}

/// The changelog record of a create of `kind`: CREAT (file), MKDIR (dir), SLINK (symlink),
/// MKNOD (other kinds).
fn made_record(kind: Kind) -> RecordType {
    match kind {
        Kind::File => RecordType::Creat,
        Kind::Dir => RecordType::Mkdir,
        Kind::Symlink => RecordType::Slink,
        _ => RecordType::Mknod,
    }
}

/// [`Namespace::create`] in the caller's transaction (`name` already checked): also what
/// `tierfs hsm import` creates its files with (`core::hsm`).
pub(crate) fn create_in(
    tx: &mut dyn Tx,
    parent: Ino,
    name: &[u8],
    node: &NewNode,
    layout: Option<Layout>,
    open_by: Option<u64>,
) -> Result<Attr> {
    // Opened at once: only under a live session (PostgreSQL: its row held first; the
    // fused insert below records the open. SQLite: `record_open` checks).
    if let (Some(s), true) = (open_by, tx.dialect().is_postgres()) {
        super::session::hold_session(tx, s)?;
    }
    let (p, p_inherit, taken) = lock_parent_for_create(tx, parent, name)?;
    is_dir(&p)?;
    if p.nlink == 0 {
        return Err(MetaError::NotFound);
    }
    if taken {
        return Err(MetaError::Exists);
    }
    let now = now_nanos();
    let mut perm = node.perm & 0o7777;
    let mut gid = node.gid;
    if p.perm & libc::S_ISGID != 0 {
        gid = p.gid;
        if node.kind == Kind::Dir {
            perm |= libc::S_ISGID;
        }
    }
    let (projid, projinherit) = if p_inherit {
        (p.projid, node.kind == Kind::Dir)
    } else {
        (0, false)
    };
    let nlink: i64 = if node.kind == Kind::Dir { 2 } else { 1 };
    let size = node.symlink.as_ref().map(|s| s.len()).unwrap_or(0) as i64;
    let (ss, st) = layout_cols(layout.as_ref(), node.kind);
    let parent_links: i64 = if node.kind == Kind::Dir { 1 } else { 0 };
    let mut params: Vec<Value> = vec![
        (node.kind as i64).into(),
        perm.into(),
        node.uid.into(),
        gid.into(),
        nlink.into(),
        size.into(),
        node.rdev.into(),
        now.into(),
        projid.into(),
        (projinherit as i64).into(),
        ss.into(),
        st.into(),
        parent.into(),
        node.symlink.as_deref().into(),
    ];
    let a = if tx.dialect().is_postgres() {
        params.extend([name.into(), parent_links.into(), open_by.into()]);
        attr_from_row(&tx.one(insert_inode_fused_sql(), &params)?)?
    } else {
        let ino = tx.insert_id(INSERT_INODE, &params, "ino")? as Ino;
        tx.exec(
            "INSERT INTO dentries (parent, name, ino, kind) VALUES ($1, $2, $3, $4)",
            vals![parent, name, ino, node.kind as i64],
        )?;
        touch_dir(tx, parent, now, parent_links)?;
        if let Some(session) = open_by {
            record_open(tx, session, ino)?;
        }
        get_attr(tx, ino)?
    };
    // changelog: CREAT (file), MKDIR (dir), SLINK (symlink), MKNOD (other kinds)
    let made = Rec::new(made_record(node.kind), a.ino).at(parent, name);
    if open_by.is_some() {
        changelog::record_all(tx, &[made, Rec::new(RecordType::Open, a.ino)])?;
    } else {
        changelog::record(tx, &made)?;
    }
    Ok(a)
}

/// What a directory hands down to a file made in it: its group when it is set-group-ID, its
/// project when its project is inherited (0 otherwise).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct HandedDown {
    pub gid: Option<u32>,
    pub projid: u32,
}

impl HandedDown {
    /// The group and project a file asked for with group `gid` gets.
    pub fn apply(&self, gid: u32) -> (u32, u32) {
        (self.gid.unwrap_or(gid), self.projid)
    }
}

/// Numbers of the parameters of [`pg_create_sql`] after its two records' (`$1` to `$26`).
const PC: usize = 26;

/// PostgreSQL: a whole create as ONE statement, sent as its own transaction
/// ([`Driver::write_once`]): the session's row held (when the new file is opened), the
/// parent's row locked, the checks, the inode, its name, the parent's times and link count,
/// the open, the lease of an RW-PCC attach at create (when `$42`, the client, is not null
/// and the new file has group `$44` and project `$45`, the facts the caller's rule was asked
/// about, see `SqlMeta::pg_create_leased`; generation `$43`, dirty), and the CREAT (and OPEN)
/// records, in the order a transaction of the other path takes them. Across a network each statement is a round trip, and a create
/// runs under its directory's kernel lock, so every other create and unlink in the directory
/// waits for it (issue 15: the BEGIN, session, lock, insert, lease, changelog and COMMIT of
/// the other path were eight). Nothing is written when a check fails; the last four columns
/// say which (the session's row, the parent's kind and link count, whether the name is
/// taken, all on the statement's snapshot), and the next four what the parent hands down.
fn pg_create_sql() -> &'static str {
    static S: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let p = |i: usize| format!("${}", PC + i);
        let (kind, perm, uid, gid, nlink, size, rdev, now) =
            (p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8));
        let (ss, st, parent, symlink, name, plinks, open_by, client, generation) =
            (p(9), p(10), p(11), p(12), p(13), p(14), p(15), p(16), p(17));
        let (lease_gid, lease_projid) = (p(18), p(19));
        let dir = Kind::Dir as i64;
        let sgid = libc::S_ISGID;
        let target = [(4, "SELECT ino FROM n")];
        format!(
            "WITH s AS (SELECT id FROM sessions WHERE id = {open_by}::BIGINT FOR KEY SHARE), \
             p AS (SELECT ino, kind, perm, gid, nlink, projid, projinherit FROM inodes \
                   WHERE ino = {parent}::BIGINT \
                   AND ({open_by}::BIGINT IS NULL OR EXISTS (SELECT 1 FROM s)) FOR UPDATE), \
             ok AS (SELECT * FROM p WHERE kind = {dir} AND nlink > 0 AND NOT EXISTS \
                    (SELECT 1 FROM dentries WHERE parent = {parent}::BIGINT \
                     AND name = {name}::BYTEA)), \
             n AS (INSERT INTO inodes (kind, perm, uid, gid, nlink, size, rdev, atime, mtime, \
                       ctime, crtime, projid, projinherit, stripe_size, stripe_targets, parent, \
                       symlink) \
                   SELECT {kind}::BIGINT, {perm}::BIGINT | CASE WHEN ok.perm & {sgid} <> 0 \
                            AND {kind}::BIGINT = {dir} THEN {sgid} ELSE 0 END, \
                          {uid}::BIGINT, \
                          CASE WHEN ok.perm & {sgid} <> 0 THEN ok.gid ELSE {gid}::BIGINT END, \
                          {nlink}::BIGINT, {size}::BIGINT, {rdev}::BIGINT, {now}::BIGINT, \
                          {now}::BIGINT, {now}::BIGINT, {now}::BIGINT, \
                          CASE WHEN ok.projinherit <> 0 THEN ok.projid ELSE 0 END, \
                          CASE WHEN ok.projinherit <> 0 AND {kind}::BIGINT = {dir} \
                               THEN 1 ELSE 0 END, \
                          {ss}::BIGINT, {st}::TEXT, {parent}::BIGINT, {symlink}::BYTEA \
                   FROM ok RETURNING {ATTR_COLS}), \
             d AS (INSERT INTO dentries (parent, name, ino, kind) \
                   SELECT {parent}::BIGINT, {name}::BYTEA, n.ino, {kind}::BIGINT FROM n), \
             t AS (UPDATE inodes SET mtime = {now}::BIGINT, ctime = {now}::BIGINT, \
                   nlink = nlink + {plinks}::BIGINT \
                   WHERE ino = {parent}::BIGINT AND EXISTS (SELECT 1 FROM n)), \
             o AS (INSERT INTO open_files (session, ino, count) \
                   SELECT {open_by}::BIGINT, n.ino, 1 FROM n WHERE {open_by}::BIGINT IS NOT NULL), \
             l AS (INSERT INTO pcc_leases (ino, client, generation, dirty, acquired, snapshot) \
                   SELECT n.ino, {client}::TEXT, {generation}::BIGINT, 1, {now}::BIGINT, 0 \
                   FROM n WHERE {client}::TEXT IS NOT NULL AND n.gid = {lease_gid}::BIGINT \
                   AND n.projid = {lease_projid}::BIGINT RETURNING {LEASE_COLS}), \
             c1 AS ({} RETURNING 1), \
             c2 AS ({} RETURNING 1) \
             SELECT n.*, l.*, EXISTS (SELECT 1 FROM s), (SELECT kind FROM p), \
                    (SELECT nlink FROM p), \
                    EXISTS (SELECT 1 FROM dentries WHERE parent = {parent}::BIGINT \
                            AND name = {name}::BYTEA), \
                    (SELECT perm FROM p), (SELECT gid FROM p), (SELECT projid FROM p), \
                    (SELECT projinherit FROM p) \
             FROM (SELECT 1) AS one LEFT JOIN n ON TRUE LEFT JOIN l ON TRUE",
            changelog::pg_insert_at(0, &target, "n", ""),
            changelog::pg_insert_at(
                13,
                &target,
                "n",
                &format!(" AND {open_by}::BIGINT IS NOT NULL AND (SELECT count(*) FROM c1) >= 0"),
            ),
        )
    })
}

/// [`Namespace::create`] on PostgreSQL ([`pg_create_sql`]), with the lease of an RW-PCC
/// attach at create for `lease.0` when given, if the file made has the group and project
/// `lease.1` (dirty, of generation [`super::pcc::CREATE_GENERATION`]); and what the parent
/// hands down. The errors are the other path's, in its order.
pub(super) fn pg_create(
    tx: &mut dyn Tx,
    parent: Ino,
    name: &[u8],
    node: &NewNode,
    layout: Option<&Layout>,
    open_by: Option<u64>,
    lease: Option<(&str, (u32, u32))>,
) -> Result<(Attr, Option<PccLease>, HandedDown)> {
    let (ss, st) = layout_cols(layout, node.kind);
    let dir = node.kind == Kind::Dir;
    // (the records' target is the new inode's number, taken in the statement)
    let mut params: Vec<Value> = Vec::with_capacity(PC + 19);
    params.extend(changelog::record_params(
        &Rec::new(made_record(node.kind), 0).at(parent, name),
    ));
    params.extend(changelog::record_params(&Rec::new(RecordType::Open, 0)));
    params.extend([
        (node.kind as i64).into(),
        (node.perm & 0o7777).into(),
        node.uid.into(),
        node.gid.into(),
        (if dir { 2i64 } else { 1 }).into(),
        (node.symlink.as_ref().map(|s| s.len()).unwrap_or(0) as i64).into(),
        node.rdev.into(),
        now_nanos().into(),
        ss.into(),
        st.into(),
        parent.into(),
        node.symlink.as_deref().into(),
        name.into(),
        (dir as i64).into(),
        open_by.into(),
        lease.map(|l| l.0).into(),
        (super::pcc::CREATE_GENERATION as i64).into(),
        lease.map(|l| l.1 .0).unwrap_or(0).into(),
        lease.map(|l| l.1 .1).unwrap_or(0).into(),
    ]);
    let r = tx.one(pg_create_sql(), &params)?;
    let n = ATTR_COLS.split(", ").count();
    let m = n + LEASE_COLS.split(", ").count();
    if r.is_null(0)? {
        // Nothing made: why, in the order of the other path's checks.
        if let (Some(s), false) = (open_by, r.bool(m)?) {
            return Err(MetaError::SessionEnded(s));
        }
        if r.is_null(m + 1)? {
            return Err(MetaError::NotFound);
        }
        if r.i64(m + 1)? != Kind::Dir as i64 {
            return Err(MetaError::NotDir);
        }
        if r.i64(m + 2)? == 0 {
            return Err(MetaError::NotFound);
        }
        if r.bool(m + 3)? {
            return Err(MetaError::Exists);
        }
        return Err(MetaError::Db(
            "a create made nothing and no check failed".into(),
        ));
    }
    let a = attr_from_row(&r)?;
    let lease = if r.is_null(n)? {
        None
    } else {
        Some(super::pcc::lease_at(&r, n)?)
    };
    let handed = HandedDown {
        gid: (r.u32(m + 4)? & libc::S_ISGID != 0)
            .then(|| r.u32(m + 5))
            .transpose()?,
        projid: if r.i64(m + 7)? != 0 { r.u32(m + 6)? } else { 0 },
    };
    Ok((a, lease, handed))
}

/// PostgreSQL: a whole unlink as ONE statement sent as its own transaction
/// ([`Driver::write_once`]), for the reason [`pg_create_sql`] gives: the name read, the
/// parent's and the file's rows locked in ascending order (the aggregate `v` reads them all
/// before anything changes), the checks, the name's removal, the parent's times, the file's
/// link count, ctime and (at its last link) its mark for the purge with its lease's end,
/// and the UNLNK record (flag LAST at the last link). A file whose last link goes while it
/// has HSM state is not touched (`v.archived`): its unlink also cancels its requests and may
/// queue its archive's removal, which the transaction of the other path does. Columns: the
/// name's inode and kind (null: no such name), whether the parent exists and is a directory,
/// whether the file is such an HSM file.
fn pg_unlink_sql() -> &'static str {
    static S: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let dir = Kind::Dir as i64;
        let last_flag = format!("SELECT CASE WHEN nlink > 0 THEN 0 ELSE {FLAG_LAST} END FROM u");
        format!(
            "WITH e AS (SELECT id, ino, kind FROM dentries \
                        WHERE parent = $14::BIGINT AND name = $15::BYTEA), \
             lk AS (SELECT ino, kind, nlink, hsm FROM inodes \
                    WHERE ino = $14::BIGINT OR ino = (SELECT ino FROM e) \
                    ORDER BY ino FOR UPDATE), \
             v AS (SELECT bool_or(ino = $14::BIGINT) AS pfound, \
                          bool_or(ino = $14::BIGINT AND kind = {dir}) AS pdir, \
                          bool_or(ino = (SELECT ino FROM e) AND ino <> $14::BIGINT \
                                  AND nlink <= 1 AND hsm <> 0) AS archived FROM lk), \
             ok AS (SELECT e.id, e.ino FROM e, v \
                    WHERE v.pdir AND e.kind <> {dir} AND NOT COALESCE(v.archived, FALSE)), \
             d AS (DELETE FROM dentries WHERE id = (SELECT id FROM ok)), \
             t AS (UPDATE inodes SET mtime = $16::BIGINT, ctime = $16::BIGINT \
                   WHERE ino = $14::BIGINT AND EXISTS (SELECT 1 FROM ok)), \
             u AS (UPDATE inodes SET nlink = nlink - 1, ctime = $16::BIGINT, \
                   orphan = CASE WHEN nlink > 1 THEN orphan \
                       WHEN EXISTS (SELECT 1 FROM open_files f WHERE f.ino = inodes.ino) THEN 1 \
                       WHEN hsm <> 0 THEN orphan ELSE {PENDING} END \
                   WHERE ino = (SELECT ino FROM ok) RETURNING nlink, orphan), \
             x AS (DELETE FROM pcc_leases WHERE ino = (SELECT ino FROM ok) \
                   AND EXISTS (SELECT 1 FROM u WHERE nlink <= 0 AND orphan = {PENDING})), \
             r AS (DELETE FROM pcc_revokes WHERE ino = (SELECT ino FROM ok) \
                   AND EXISTS (SELECT 1 FROM u WHERE nlink <= 0 AND orphan = {PENDING})), \
             c AS ({} RETURNING 1) \
             SELECT (SELECT ino FROM e), (SELECT kind FROM e), \
                    COALESCE((SELECT pfound FROM v), FALSE), \
                    COALESCE((SELECT pdir FROM v), FALSE), \
                    COALESCE((SELECT archived FROM v), FALSE)",
            changelog::pg_insert_at(
                0,
                &[(3, &last_flag), (4, "SELECT ino FROM ok")],
                "ok",
                " AND (SELECT count(*) FROM u) >= 0",
            ),
        )
    })
}

/// [`Namespace::unlink`] on PostgreSQL ([`pg_unlink_sql`]): the inode unlinked, or None when
/// the file is one that [`pg_unlink_sql`] leaves to a transaction (nothing was changed). The
/// errors are the other path's, in its order.
fn pg_unlink(tx: &mut dyn Tx, parent: Ino, name: &[u8]) -> Result<Option<Ino>> {
    let mut params: Vec<Value> = Vec::with_capacity(16);
    params.extend(changelog::record_params(
        &Rec::new(RecordType::Unlnk, 0)
            .at(parent, name)
            .flags(FLAG_LAST),
    ));
    params.extend([parent.into(), name.into(), now_nanos().into()]);
    let r = tx.one(pg_unlink_sql(), &params)?;
    let (pfound, pdir) = (r.bool(2)?, r.bool(3)?);
    if r.is_null(0)? {
        return Err(if pfound && !pdir {
            MetaError::NotDir
        } else {
            MetaError::NotFound
        });
    }
    if !pfound {
        return Err(MetaError::NotFound);
    }
    if !pdir {
        return Err(MetaError::NotDir);
    }
    if r.i64(1)? == Kind::Dir as i64 {
        return Err(MetaError::IsDir);
    }
    if r.bool(4)? {
        return Ok(None);
    }
    Ok(Some(r.u64(0)?))
}

/// [`Namespace::setattr`] inside the transaction `tx` (also run after a data commit, in the
/// same transaction: [`crate::engine::FileData::commit_slices_then`]).
pub(super) fn setattr_in(tx: &mut dyn Tx, ino: Ino, set: &SetAttr) -> Result<Attr> {
    let mut a = lock1(tx, ino)?;
    // (a change kept for later gives way to one made elsewhere meanwhile)
    let set = &set.against(&a);
    // The HSM record a truncate of a clean archived file writes (no statement else).
    let dirtied = super::data::dirtied(&a);
    let now = now_nanos();
    let mut changed = false;
    if let Some(size) = set.size {
        if a.kind == Kind::Dir {
            return Err(MetaError::IsDir);
        }
        if a.kind != Kind::File {
            return Err(MetaError::Invalid("truncate of a special file".into()));
        }
        if a.hsm.released() && size != a.size {
            // Its data is in the archive only: the client restores it first.
            return Err(crate::hsm::HsmError::Released.into());
        }
        truncate(tx, &a, size)?;
        if a.hsm.archived() {
            a.hsm.0 |= crate::hsm::HsmFlags::DIRTY;
        }
        a.size = size;
        a.data_version += 1;
        a.mtime = now;
        changed = true;
    }
    if let Some(p) = set.perm {
        a.perm = p & 0o7777;
        changed = true;
    }
    if let Some(u) = set.uid {
        a.uid = u;
        changed = true;
    }
    if let Some(g) = set.gid {
        a.gid = g;
        changed = true;
    }
    // (set.perm is None whenever set.kill_setid: see SetAttr)
    let killed = set.kill_setid && set.perm.is_none() && a.kind != Kind::Dir && {
        let mut p = a.perm & !libc::S_ISUID;
        if p & libc::S_IXGRP != 0 {
            p &= !libc::S_ISGID;
        }
        let dropped = p != a.perm;
        a.perm = p;
        dropped
    };
    changed |= killed;
    if let Some(t) = set.atime {
        a.atime = resolve_time(t, now);
        changed = true;
    }
    if let Some(t) = set.mtime {
        a.mtime = resolve_time(t, now);
        changed = true;
    }
    if changed {
        a.ctime = set.ctime.unwrap_or(now);
    } else if let Some(ct) = set.ctime {
        a.ctime = ct;
    }
    tx.exec(
        "UPDATE inodes SET perm = $2, uid = $3, gid = $4, size = $5, atime = $6, \
             mtime = $7, ctime = $8, data_version = $9, hsm = $10 WHERE ino = $1",
        vals![
            ino,
            a.perm,
            a.uid,
            a.gid,
            a.size,
            a.atime,
            a.mtime,
            a.ctime,
            a.data_version,
            a.hsm.0
        ],
    )?;
    // changelog: TRUNC (set.size), SATTR (perm, uid, gid, atime), MTIME (set.mtime),
    // CTIME (set.ctime alone). Lustre's precedence: TRUNC for a size change and SATTR
    // for mode/owner/group (both when both), else MTIME when mtime was set, else CTIME
    // when only atime or ctime moved.
    let mut recs = Vec::with_capacity(3);
    if set.size.is_some() {
        recs.push(Rec::new(RecordType::Trunc, ino));
        // HSM (STATE, dirty) when the truncate made an archived file dirty
        recs.extend(dirtied);
    }
    if set.perm.is_some() || killed || set.uid.is_some() || set.gid.is_some() {
        recs.push(Rec::new(RecordType::Sattr, ino));
    } else if set.size.is_none() {
        if set.mtime.is_some() {
            recs.push(Rec::new(RecordType::Mtime, ino));
        } else if set.atime.is_some() || set.ctime.is_some() {
            recs.push(Rec::new(RecordType::Ctime, ino));
        }
    }
    changelog::record_all(tx, &recs)?;
    Ok(a)
}

impl<D: Driver> Namespace for SqlMeta<D> {
    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(MetaError::NameTooLong);
        }
        self.d.read(
            |tx| match tx.query_opt(lookup_sql(), vals![parent, name])? {
                Some(r) => attr_from_row(&r),
                // no such name: in a directory that exists, or in one that is gone
                None => match dir_attr(tx, parent) {
                    Ok(_) => Err(MetaError::NotFound),
                    Err(MetaError::NotFound) => Err(MetaError::StaleDir),
                    Err(e) => Err(e),
                },
            },
        )
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.d.read(|tx| get_attr(tx, ino))
    }

    fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr> {
        self.d.write(|tx| setattr_in(tx, ino, set))
    }

    fn create(
        &self,
        parent: Ino,
        name: &[u8],
        node: &NewNode,
        layout: Option<Layout>,
        open_by: Option<u64>,
    ) -> Result<Attr> {
        check_name(name)?;
        if self.d.dialect().is_postgres() {
            return self
                .d
                .write_once(|tx| pg_create(tx, parent, name, node, layout.as_ref(), open_by, None))
                .map(|(a, _, _)| a);
        }
        self.d
            .write(|tx| create_in(tx, parent, name, node, layout.clone(), open_by))
    }

    fn link(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Attr> {
        check_name(new_name)?;
        self.d.write(|tx| {
            let mut locked = lock_inodes(tx, &[ino, new_parent])?;
            let a = locked.remove(&ino).ok_or(MetaError::NotFound)?;
            if a.kind == Kind::Dir {
                return Err(MetaError::NotPermitted);
            }
            if a.nlink as i64 >= MAX_LINKS {
                return Err(MetaError::TooManyLinks);
            }
            let p = locked.remove(&new_parent).ok_or(MetaError::NotFound)?;
            is_dir(&p)?;
            if p.nlink == 0 {
                return Err(MetaError::NotFound);
            }
            if find_dentry(tx, new_parent, new_name)?.is_some() {
                return Err(MetaError::Exists);
            }
            let now = now_nanos();
            tx.exec(
                "INSERT INTO dentries (parent, name, ino, kind) VALUES ($1, $2, $3, $4)",
                vals![new_parent, new_name, ino, a.kind as i64],
            )?;
            tx.exec(
                "UPDATE inodes SET nlink = nlink + 1, ctime = $2, orphan = 0 WHERE ino = $1",
                vals![ino, now],
            )?;
            touch_dir(tx, new_parent, now, 0)?;
            // changelog: HLINK
            changelog::record(
                tx,
                &Rec::new(RecordType::Hlink, ino).at(new_parent, new_name),
            )?;
            get_attr(tx, ino)
        })
    }

    fn unlink(&self, parent: Ino, name: &[u8]) -> Result<Ino> {
        if self.d.dialect().is_postgres() {
            if let Some(ino) = self.d.write_once(|tx| pg_unlink(tx, parent, name))? {
                return Ok(ino);
            }
            // (a file with HSM state losing its last link: the transaction below)
        }
        self.d.write(|tx| {
            let Some((id, ino, kind)) = find_dentry(tx, parent, name)? else {
                dir_attr(tx, parent)?;
                return Err(MetaError::NotFound);
            };
            lock_parent_and_child(tx, parent, ino)?;
            if kind == Kind::Dir {
                return Err(MetaError::IsDir);
            }
            let now = now_nanos();
            let nlink = if tx.dialect().is_postgres() {
                // The entry, the parent's times and the link count in one round trip.
                tx.query_opt(
                    "WITH d AS (DELETE FROM dentries WHERE id = $3), \
                          t AS (UPDATE inodes SET mtime = $2, ctime = $2 WHERE ino = $4) \
                     UPDATE inodes SET nlink = nlink - 1, ctime = $2 WHERE ino = $1 \
                     RETURNING nlink",
                    vals![ino, now, id, parent],
                )?
                .map(|r| r.i64(0))
                .transpose()?
            } else {
                tx.exec("DELETE FROM dentries WHERE id = $1", vals![id])?;
                touch_dir(tx, parent, now, 0)?;
                drop_link(tx, ino, now)?
            };
            let last = !matches!(nlink, Some(n) if n > 0);
            if matches!(nlink, Some(n) if n <= 0) {
                drop_inode(tx, ino)?;
            }
            // changelog: UNLNK (flag LAST when its last name went). Last, after every row
            // lock: on PostgreSQL a record holds the changelog's order lock until commit.
            let flags = if last { FLAG_LAST } else { 0 };
            changelog::record(
                tx,
                &Rec::new(RecordType::Unlnk, ino)
                    .at(parent, name)
                    .flags(flags),
            )?;
            Ok(ino)
        })
    }

    fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        if name == b"." {
            return Err(MetaError::Invalid("rmdir of '.'".into()));
        }
        if name == b".." {
            return Err(MetaError::NotEmpty);
        }
        self.d.write(|tx| {
            let Some((id, ino, kind)) = find_dentry(tx, parent, name)? else {
                dir_attr(tx, parent)?;
                return Err(MetaError::NotFound);
            };
            lock_parent_and_child(tx, parent, ino)?;
            if kind != Kind::Dir {
                return Err(MetaError::NotDir);
            }
            if tx.exists(
                "SELECT EXISTS (SELECT 1 FROM dentries WHERE parent = $1)",
                vals![ino],
            )? {
                return Err(MetaError::NotEmpty);
            }
            let now = now_nanos();
            tx.exec("DELETE FROM dentries WHERE id = $1", vals![id])?;
            delete_dir_inode(tx, ino)?;
            touch_dir(tx, parent, now, -1)?;
            // changelog: RMDIR
            changelog::record(
                tx,
                &Rec::new(RecordType::Rmdir, ino)
                    .at(parent, name)
                    .flags(FLAG_LAST),
            )?;
            Ok(())
        })
    }

    fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> Result<Option<Ino>> {
        check_name(new_name)?;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        if exchange && noreplace {
            return Err(MetaError::Invalid(
                "RENAME_EXCHANGE with RENAME_NOREPLACE".into(),
            ));
        }
        if flags & !(libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) != 0 {
            return Err(MetaError::Invalid("unsupported rename flags".into()));
        }
        self.d.write(|tx| {
            // Look first (on PostgreSQL this fixes the snapshot), then lock: a change to either
            // directory since the snapshot makes the locks fail and the transaction retry.
            dir_attr(tx, parent)?;
            if new_parent != parent {
                dir_attr(tx, new_parent)?;
            }
            let (sid, sino, skind) = find_dentry(tx, parent, name)?.ok_or(MetaError::NotFound)?;
            let dst = find_dentry(tx, new_parent, new_name)?;
            if parent == new_parent && name == new_name {
                return if noreplace {
                    Err(MetaError::Exists)
                } else {
                    Ok(None)
                };
            }
            if tx.dialect().row_locks() {
                let moves_dir = parent != new_parent
                    && (skind == Kind::Dir || (exchange && matches!(dst, Some((_, _, Kind::Dir)))));
                if moves_dir {
                    // Lock order 1: renames that move a directory to another parent, one at a
                    // time (the ancestor walk below cannot race another such rename).
                    tx.exec(
                        "INSERT INTO counters (name, value) VALUES ('rename_lock', 1) \
                         ON CONFLICT (name) DO UPDATE SET value = counters.value + 1",
                        vals![],
                    )?;
                }
                let mut set = vec![parent, new_parent, sino];
                if let Some((_, dino, _)) = dst {
                    set.push(dino);
                }
                let locked = lock_inodes(tx, &set)?;
                if !locked.contains_key(&parent) || !locked.contains_key(&new_parent) {
                    return Err(MetaError::NotFound);
                }
            }
            let now = now_nanos();
            if skind == Kind::Dir && is_ancestor(tx, sino, new_parent)? {
                return Err(MetaError::Invalid(
                    "cannot move a directory into itself".into(),
                ));
            }
            if exchange {
                let (did, dino, dkind) = dst.ok_or(MetaError::NotFound)?;
                if dkind == Kind::Dir && is_ancestor(tx, dino, parent)? {
                    return Err(MetaError::Invalid(
                        "cannot move a directory into itself".into(),
                    ));
                }
                tx.exec(
                    "UPDATE dentries SET ino = $2, kind = $3 WHERE id = $1",
                    vals![sid, dino, dkind as i64],
                )?;
                tx.exec(
                    "UPDATE dentries SET ino = $2, kind = $3 WHERE id = $1",
                    vals![did, sino, skind as i64],
                )?;
                let mut dp = 0i64;
                let mut dn = 0i64;
                if skind == Kind::Dir {
                    tx.exec(
                        "UPDATE inodes SET parent = $2 WHERE ino = $1",
                        vals![sino, new_parent],
                    )?;
                    dp -= 1;
                    dn += 1;
                }
                if dkind == Kind::Dir {
                    tx.exec(
                        "UPDATE inodes SET parent = $2 WHERE ino = $1",
                        vals![dino, parent],
                    )?;
                    dp += 1;
                    dn -= 1;
                }
                for ino in [sino, dino] {
                    tx.exec(
                        "UPDATE inodes SET ctime = $2 WHERE ino = $1",
                        vals![ino, now],
                    )?;
                }
                if parent == new_parent {
                    touch_dir(tx, parent, now, 0)?;
                } else {
                    touch_dir(tx, parent, now, dp)?;
                    touch_dir(tx, new_parent, now, dn)?;
                }
                // changelog: RENME + RNMTO (an exchange: both names now name the other inode)
                changelog::record_all(
                    tx,
                    &[
                        Rec::new(RecordType::Renme, sino)
                            .at(new_parent, new_name)
                            .from(parent, name),
                        Rec::new(RecordType::Rnmto, dino)
                            .at(new_parent, new_name)
                            .from(parent, name)
                            .flags(FLAG_EXCHANGE),
                    ],
                )?;
                return Ok(None);
            }
            let mut new_parent_nlink = 0i64;
            // The inode the rename replaced, and whether it lost its last name (changelog).
            let mut replaced: Option<(Ino, bool)> = None;
            if let Some((did, dino, dkind)) = dst {
                if noreplace {
                    return Err(MetaError::Exists);
                }
                if dino == sino {
                    // Two names of one file: POSIX says do nothing.
                    return Ok(None);
                }
                if dkind == Kind::Dir {
                    if skind != Kind::Dir {
                        return Err(MetaError::IsDir);
                    }
                    if tx.exists(
                        "SELECT EXISTS (SELECT 1 FROM dentries WHERE parent = $1)",
                        vals![dino],
                    )? {
                        return Err(MetaError::NotEmpty);
                    }
                    tx.exec("DELETE FROM dentries WHERE id = $1", vals![did])?;
                    delete_dir_inode(tx, dino)?;
                    new_parent_nlink -= 1;
                    replaced = Some((dino, true));
                } else {
                    if skind == Kind::Dir {
                        return Err(MetaError::NotDir);
                    }
                    tx.exec("DELETE FROM dentries WHERE id = $1", vals![did])?;
                    let nlink = drop_link(tx, dino, now)?.ok_or(MetaError::NotFound)?;
                    if nlink <= 0 {
                        retire_inode(tx, dino)?;
                    }
                    replaced = Some((dino, nlink <= 0));
                }
            }
            tx.exec(
                "UPDATE dentries SET parent = $2, name = $3 WHERE id = $1",
                vals![sid, new_parent, new_name],
            )?;
            tx.exec(
                "UPDATE inodes SET ctime = $2 WHERE ino = $1",
                vals![sino, now],
            )?;
            if skind == Kind::Dir && parent != new_parent {
                tx.exec(
                    "UPDATE inodes SET parent = $2 WHERE ino = $1",
                    vals![sino, new_parent],
                )?;
                touch_dir(tx, parent, now, -1)?;
                new_parent_nlink += 1;
            } else if parent != new_parent {
                touch_dir(tx, parent, now, 0)?;
            }
            touch_dir(tx, new_parent, now, new_parent_nlink)?;
            // changelog: RENME (source parent/name), RNMTO (target parent/name; the replaced
            // inode, if any, in the record's flags)
            let mut recs = vec![Rec::new(RecordType::Renme, sino)
                .at(new_parent, new_name)
                .from(parent, name)];
            if let Some((dino, last)) = replaced {
                recs.push(
                    Rec::new(RecordType::Rnmto, dino)
                        .at(new_parent, new_name)
                        .from(parent, name)
                        .flags(if last { FLAG_LAST } else { 0 }),
                );
            }
            changelog::record_all(tx, &recs)?;
            Ok(replaced.map(|(dino, _)| dino))
        })
    }

    fn readdir(&self, ino: Ino, offset: u64, limit: usize) -> Result<Vec<DirEntry>> {
        self.d.read(|tx| {
            dir_attr(tx, ino)?;
            let mut out = Vec::new();
            tx.query_each(
                "SELECT id, name, ino, kind FROM dentries WHERE parent = $1 AND id > $2 \
                 ORDER BY id LIMIT $3",
                vals![ino, offset, limit],
                &mut |mut r| {
                    out.push(DirEntry {
                        offset: r.u64(0)?,
                        name: r.take_blob(1)?.unwrap_or_default(),
                        ino: r.u64(2)?,
                        kind: Kind::from_i64(r.i64(3)?).unwrap_or(Kind::File),
                    });
                    Ok(())
                },
            )?;
            Ok(out)
        })
    }

    fn readdir_plus(&self, ino: Ino, offset: u64, limit: usize) -> Result<Vec<(DirEntry, Attr)>> {
        self.d.read(|tx| {
            dir_attr(tx, ino)?;
            let mut out = Vec::new();
            tx.query_each(
                readdir_plus_sql(),
                vals![ino, offset, limit],
                &mut |mut r| {
                    let a = attr_from_row(&r)?;
                    let n = r.len();
                    let e = DirEntry {
                        offset: r.u64(n - 2)?,
                        name: r.take_blob(n - 1)?.unwrap_or_default(),
                        ino: a.ino,
                        kind: a.kind,
                    };
                    out.push((e, a));
                    Ok(())
                },
            )?;
            Ok(out)
        })
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.d.read(|tx| {
            let r = tx.one(
                "SELECT kind, symlink FROM inodes WHERE ino = $1",
                vals![ino],
            )?;
            if r.i64(0)? != Kind::Symlink as i64 {
                return Err(MetaError::Invalid("not a symlink".into()));
            }
            Ok(r.opt_blob(1)?.unwrap_or_default())
        })
    }

    fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        self.d.read(|tx| {
            match tx.query_opt(
                "SELECT value FROM xattrs WHERE ino = $1 AND name = $2",
                vals![ino, name],
            )? {
                Some(mut r) => Ok(r.take_blob(0)?.unwrap_or_default()),
                None => Err(if get_attr(tx, ino).is_err() {
                    MetaError::NotFound
                } else {
                    MetaError::NoAttr
                }),
            }
        })
    }

    fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        if name.is_empty() || name.len() > 255 {
            return Err(MetaError::Invalid("bad xattr name".into()));
        }
        self.d.write(|tx| {
            lock1(tx, ino)?;
            let exists = tx.exists(
                "SELECT EXISTS (SELECT 1 FROM xattrs WHERE ino = $1 AND name = $2)",
                vals![ino, name],
            )?;
            if flags & libc::XATTR_CREATE != 0 && exists {
                return Err(MetaError::Exists);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return Err(MetaError::NoAttr);
            }
            tx.exec(
                "INSERT INTO xattrs (ino, name, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
                vals![ino, name, value],
            )?;
            // A new name counts (schema v9); a replaced value does not.
            tx.exec(
                "UPDATE inodes SET ctime = $2, xattr_count = xattr_count + $3 WHERE ino = $1",
                vals![ino, now_nanos(), (!exists) as i64],
            )?;
            // changelog: XATTR
            changelog::record(tx, &Rec::new(RecordType::Xattr, ino).at(0, name))?;
            Ok(())
        })
    }

    fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.d.read(|tx| {
            get_attr(tx, ino)?;
            let mut out = Vec::new();
            tx.query_each(
                "SELECT name FROM xattrs WHERE ino = $1 ORDER BY name",
                vals![ino],
                &mut |mut r| {
                    out.push(r.take_blob(0)?.unwrap_or_default());
                    Ok(())
                },
            )?;
            Ok(out)
        })
    }

    fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        // An absent name (`cp -a` removes the default ACL of every directory it copies, which
        // few have) is answered by a read, without a write transaction: the answer holds at
        // that read.
        let present = self.d.read(|tx| {
            match tx.query_opt(
                "SELECT EXISTS (SELECT 1 FROM xattrs WHERE ino = $1 AND name = $2) \
                 FROM inodes WHERE ino = $1",
                vals![ino, name],
            )? {
                Some(r) => r.bool(0),
                None => Err(MetaError::NotFound),
            }
        })?;
        if !present {
            return Err(MetaError::NoAttr);
        }
        self.d.write(|tx| {
            lock1(tx, ino)?;
            let n = tx.exec(
                "DELETE FROM xattrs WHERE ino = $1 AND name = $2",
                vals![ino, name],
            )?;
            if n == 0 {
                return Err(MetaError::NoAttr);
            }
            tx.exec(
                "UPDATE inodes SET ctime = $2, xattr_count = GREATEST(0, xattr_count - 1) \
                 WHERE ino = $1",
                vals![ino, now_nanos()],
            )?;
            // changelog: XATTR
            changelog::record(tx, &Rec::new(RecordType::Xattr, ino).at(0, name))?;
            Ok(())
        })
    }

    fn resolve_stripe_default(&self, dir: Ino) -> Result<StripeDefault> {
        self.d.read(|tx| {
            let mut out = StripeDefault::default();
            let mut ino = dir;
            for _ in 0..100_000 {
                let r = tx.one(
                    "SELECT def_stripe_count, def_stripe_size, parent FROM inodes WHERE ino = $1",
                    vals![ino],
                )?;
                let (cnt, size, parent) = (r.i64(0)?, r.i64(1)?, r.u64(2)?);
                if out.stripe_count == 0 && cnt > 0 {
                    out.stripe_count = cnt as u32;
                }
                if out.stripe_size == 0 && size > 0 {
                    out.stripe_size = size as u64;
                }
                if (out.stripe_count > 0 && out.stripe_size > 0) || ino == ROOT_INO {
                    break;
                }
                ino = parent;
            }
            if out.stripe_count == 0 || out.stripe_size == 0 {
                // The filesystem's defaults (as `info` reads them).
                let mut fs = StripeDefault {
                    stripe_count: 1,
                    stripe_size: 1 << 20,
                };
                tx.query_each(
                    "SELECT key, value FROM meta_info \
                     WHERE key = 'stripe_count' OR key = 'stripe_size'",
                    vals![],
                    &mut |r| {
                        let v = r.text(1)?;
                        match r.text(0)?.as_str() {
                            "stripe_count" => fs.stripe_count = v.parse().unwrap_or(1),
                            _ => fs.stripe_size = v.parse().unwrap_or(1 << 20),
                        }
                        Ok(())
                    },
                )?;
                if out.stripe_count == 0 {
                    out.stripe_count = fs.stripe_count;
                }
                if out.stripe_size == 0 {
                    out.stripe_size = fs.stripe_size;
                }
            }
            Ok(out)
        })
    }

    fn set_dir_stripe(&self, dir: Ino, def: StripeDefault) -> Result<()> {
        self.d.write(|tx| {
            is_dir(&lock1(tx, dir)?)?;
            tx.exec(
                "UPDATE inodes SET def_stripe_count = $2, def_stripe_size = $3, ctime = $4 \
                 WHERE ino = $1",
                vals![dir, def.stripe_count, def.stripe_size, now_nanos()],
            )?;
            // changelog: LYOUT
            changelog::record(tx, &Rec::new(RecordType::Lyout, dir))?;
            Ok(())
        })
    }

    fn set_file_layout(&self, ino: Ino, layout: &Layout) -> Result<()> {
        self.d.write(|tx| {
            let a = lock1(tx, ino)?;
            if a.kind != Kind::File {
                return Err(MetaError::Invalid("not a regular file".into()));
            }
            let has_data = tx.exists(
                "SELECT EXISTS (SELECT 1 FROM slices WHERE ino = $1)",
                vals![ino],
            )?;
            if has_data || a.size > 0 {
                return Err(MetaError::NotEmpty);
            }
            tx.exec(
                "UPDATE inodes SET stripe_size = $2, stripe_targets = $3, ctime = $4 \
                 WHERE ino = $1",
                vals![
                    ino,
                    layout.stripe_size,
                    layout.encode_targets(),
                    now_nanos()
                ],
            )?;
            // changelog: LYOUT
            changelog::record(tx, &Rec::new(RecordType::Lyout, ino))?;
            Ok(())
        })
    }

    fn set_projid(&self, ino: Ino, projid: u32, inherit: bool) -> Result<u64> {
        self.d.write(|tx| {
            let a = lock1(tx, ino)?;
            let now = now_nanos();
            let subtree = inherit && a.kind == Kind::Dir;
            tx.exec(
                "UPDATE inodes SET projid = $2, projinherit = $3, ctime = $4 WHERE ino = $1",
                vals![ino, projid, subtree as i64, now],
            )?;
            // changelog: SATTR (one record, for `ino`, written at the end below)
            let mut count = 1u64;
            if subtree {
                let mut queue = vec![ino];
                while let Some(dir) = queue.pop() {
                    let mut children = Vec::new();
                    tx.query_each(
                        "SELECT ino, kind FROM dentries WHERE parent = $1",
                        vals![dir],
                        &mut |r| {
                            children.push((r.u64(0)?, r.i64(1)? == Kind::Dir as i64));
                            Ok(())
                        },
                    )?;
                    for (child, is_d) in children {
                        tx.exec(
                            "UPDATE inodes SET projid = $2, projinherit = $3, ctime = $4 \
                             WHERE ino = $1",
                            vals![child, projid, is_d as i64, now],
                        )?;
                        count += 1;
                        if is_d {
                            queue.push(child);
                        }
                    }
                }
            }
            changelog::record(tx, &Rec::new(RecordType::Sattr, ino))?;
            Ok(count)
        })
    }

    fn get_projid(&self, ino: Ino) -> Result<(u32, bool)> {
        self.d.read(|tx| {
            let r = tx.one(
                "SELECT projid, projinherit FROM inodes WHERE ino = $1",
                vals![ino],
            )?;
            Ok((r.u32(0)?, r.i64(1)? != 0))
        })
    }

    fn path_of(&self, ino: Ino) -> Result<Option<Vec<u8>>> {
        self.d.read(|tx| {
            let mut parts: Vec<Vec<u8>> = Vec::new();
            let mut cur = ino;
            while cur != ROOT_INO {
                let Some(mut r) = tx.query_opt(
                    "SELECT parent, name FROM dentries WHERE ino = $1 ORDER BY id LIMIT 1",
                    vals![cur],
                )?
                else {
                    return Ok(None);
                };
                parts.push(r.take_blob(1)?.unwrap_or_default());
                cur = r.u64(0)?;
                if parts.len() > 4096 {
                    return Err(MetaError::Invalid(format!("inode {ino}: its path loops")));
                }
            }
            let mut path = Vec::new();
            for p in parts.iter().rev() {
                path.push(b'/');
                path.extend_from_slice(p);
            }
            if path.is_empty() {
                path.push(b'/');
            }
            Ok(Some(path))
        })
    }

    fn purge_orphans(&self, replaced_before: Nanos) -> Result<u64> {
        self.purge_found(
            "SELECT ino FROM inodes WHERE orphan = 2 AND ctime < $1 ORDER BY ino LIMIT 1000",
            vals![replaced_before],
            2,
        )
    }

    fn purge_unlinked(&self, max: u64, unlinked_before: Nanos) -> Result<u64> {
        self.purge_found(
            "SELECT ino FROM inodes WHERE orphan = 3 AND ctime < $2 ORDER BY ino LIMIT $1",
            vals![max, unlinked_before],
            PENDING,
        )
    }
}

impl<D: Driver> SqlMeta<D> {
    /// Frees the files `candidates` finds (read first, on a reader connection, so that a pass
    /// with nothing to free writes nothing: every client runs one each second) that, in the
    /// write transaction that frees them, are still in state `orphan` and open nowhere;
    /// returns how many. On PostgreSQL the rows are locked first, skipping those another
    /// transaction holds (another client's purge, an open of a file in its grace): those are
    /// left for a later pass, and two clients' purges free different files.
    fn purge_found(&self, candidates: &str, args: &[Value], orphan: i64) -> Result<u64> {
        let due: Vec<Ino> = self.d.read(|tx| {
            let mut v = Vec::new();
            tx.query_each(candidates, args, &mut |r| {
                v.push(r.u64(0)?);
                Ok(())
            })?;
            Ok(v)
        })?;
        if due.is_empty() {
            return Ok(0);
        }
        self.d.write(|tx| {
            let mut inos = due.clone();
            if tx.dialect().row_locks() {
                inos.clear();
                tx.query_each(
                    "SELECT ino FROM inodes WHERE ino = ANY($1) AND orphan = $2 \
                     ORDER BY ino FOR UPDATE SKIP LOCKED",
                    &[
                        Value::IntList(due.iter().map(|i| *i as i64).collect()),
                        Value::Int(orphan),
                    ],
                    &mut |r| {
                        inos.push(r.u64(0)?);
                        Ok(())
                    },
                )?;
            }
            let mut n = 0;
            for ino in inos {
                // Still in that state, and not open (one opened since is freed by a later pass
                // after its last close).
                if tx.exists(
                    "SELECT EXISTS (SELECT 1 FROM inodes WHERE ino = $1 AND orphan = $2) \
                     AND NOT EXISTS (SELECT 1 FROM open_files WHERE ino = $1)",
                    vals![ino, orphan],
                )? {
                    purge_inode(tx, ino)?;
                    n += 1;
                }
            }
            Ok(n)
        })
    }
}
