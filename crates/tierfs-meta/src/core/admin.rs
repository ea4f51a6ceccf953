//! The admin domain: filesystem info, targets and usage, durability and housekeeping (the
//! driver's, plus purging replaced files), dump/load, the queries and repairs of `tierfs fsck`
//! and `tierfs gc`, and notifications (the driver's).

use std::collections::BTreeMap;

use super::common::{lock_rows, purge_if_orphan, purge_inode};
use super::schema::SCHEMA_VERSION;
use super::session::end_sessions;
use super::SqlMeta;
use crate::engine::{Admin, Channel, Listener, Namespace, Sessions, ORPHAN_GRACE};
use crate::error::{MetaError, Result};
use crate::sql::{Driver, Row, Tx, Value};
use crate::types::*;
use crate::vals;

/// The inodes in use: files left for the purge (orphan 3; few rows, the partial index
/// `inodes_unlinked`) count as gone.
const INODES_USED: &str =
    "SELECT (SELECT COUNT(*) FROM inodes) - (SELECT COUNT(*) FROM inodes WHERE orphan = 3)";

/// The condition (on `inodes i`) of a file without names that nobody holds: unlinked while
/// open (`orphan = 1`) or with no link, no directory entry, and no open anywhere. Files a
/// rename replaced (`orphan = 2`) wait for their grace and `purge_orphans`; files left for the
/// purge (`orphan = 3`) wait for `purge_unlinked`.
const UNHELD: &str =
    "i.kind != 2 AND i.ino != 1 AND i.orphan NOT IN (2, 3) AND (i.orphan = 1 OR i.nlink = 0) \
     AND NOT EXISTS (SELECT 1 FROM open_files o WHERE o.ino = i.ino) \
     AND NOT EXISTS (SELECT 1 FROM dentries d WHERE d.ino = i.ino)";

/// The neutral type of a column, as the schema declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ColType {
    Int,
    Serial,
    Text,
    Blob,
}

/// The columns of `table` in the order the schema creates them (its `CREATE TABLE`, then each
/// later `ALTER TABLE ... ADD COLUMN`), read from the schema's own DDL ([`super::schema`]), so
/// dump and load follow every change of the schema by themselves.
fn table_columns(table: &str) -> Vec<(String, ColType)> {
    fn col_type(t: &str) -> Option<ColType> {
        match t.to_ascii_uppercase().as_str() {
            "INT" | "INTEGER" | "BIGINT" => Some(ColType::Int),
            "SERIAL" => Some(ColType::Serial),
            "TEXT" => Some(ColType::Text),
            "BLOB" => Some(ColType::Blob),
            _ => None,
        }
    }
    fn column(def: &str) -> Option<(String, ColType)> {
        let mut words = def.split_whitespace();
        let name = words.next()?.trim_matches('"');
        let upper = name.to_ascii_uppercase();
        if ["PRIMARY", "UNIQUE", "CONSTRAINT", "FOREIGN", "CHECK"].contains(&upper.as_str()) {
            return None;
        }
        Some((name.to_string(), col_type(words.next()?)?))
    }
    let mut cols = Vec::new();
    let create = format!("CREATE TABLE {table} ");
    let create2 = format!("CREATE TABLE {table}(");
    let alter = format!("ALTER TABLE {table} ADD COLUMN ");
    for m in super::schema::MIGRATIONS {
        for part in m.parts {
            for stmt in part.iter() {
                let s = stmt.trim();
                if s.starts_with(&create) || s.starts_with(&create2) {
                    let (Some(open), Some(close)) = (s.find('('), s.rfind(')')) else {
                        continue;
                    };
                    // Split the column list at the commas outside parentheses.
                    let body = &s[open + 1..close];
                    let mut depth = 0;
                    let mut start = 0;
                    for (i, ch) in body.char_indices() {
                        match ch {
                            '(' => depth += 1,
                            ')' => depth -= 1,
                            ',' if depth == 0 => {
                                cols.extend(column(&body[start..i]));
                                start = i + 1;
                            }
                            _ => {}
                        }
                    }
                    cols.extend(column(&body[start..]));
                } else if let Some(rest) = s.strip_prefix(&alter) {
                    cols.extend(column(rest));
                }
            }
        }
    }
    cols
}

/// A dumped value as its column's type wants it (a dump from SQLite is loosely typed).
fn load_value(v: DumpValue, t: ColType, table: &str, col: &str) -> Result<Value> {
    let bad = |v: &DumpValue| {
        MetaError::Invalid(format!(
            "dump value {v:?} does not fit column {table}.{col} ({t:?})"
        ))
    };
    Ok(match (v, t) {
        (DumpValue::Null, _) => Value::Null,
        (DumpValue::Int(n), ColType::Int | ColType::Serial) => Value::Int(n),
        (DumpValue::Text(s), ColType::Int | ColType::Serial) => Value::Int(
            s.trim()
                .parse::<i64>()
                .map_err(|_| bad(&DumpValue::Text(s)))?,
        ),
        (DumpValue::Real(f), ColType::Int | ColType::Serial) if f.fract() == 0.0 => {
            Value::Int(f as i64)
        }
        (DumpValue::Text(s), ColType::Text) => Value::Text(s),
        (DumpValue::Int(n), ColType::Text) => Value::Text(n.to_string()),
        (DumpValue::Real(f), ColType::Text) => Value::Text(f.to_string()),
        (DumpValue::Blob(b), ColType::Text) => match String::from_utf8(b) {
            Ok(s) => Value::Text(s),
            Err(e) => return Err(bad(&DumpValue::Blob(e.into_bytes()))),
        },
        (DumpValue::Blob(b), ColType::Blob) => Value::Blob(b),
        (DumpValue::Text(s), ColType::Blob) => Value::Blob(s.into_bytes()),
        (v, _) => return Err(bad(&v)),
    })
}

/// A stored value as a dump carries it: typed by its column (a BLOB column's bytes stay bytes
/// whatever SQLite's storage class).
fn dump_value(v: Value, t: ColType) -> Result<DumpValue> {
    Ok(match (v, t) {
        (Value::Null, _) => DumpValue::Null,
        (Value::Int(n), _) => DumpValue::Int(n),
        (Value::Bool(b), _) => DumpValue::Int(b as i64),
        (Value::Text(s), ColType::Blob) => DumpValue::Blob(s.into_bytes()),
        (Value::Text(s), _) => DumpValue::Text(s),
        (Value::Blob(b), ColType::Text) => match String::from_utf8(b) {
            Ok(s) => DumpValue::Text(s),
            Err(e) => DumpValue::Blob(e.into_bytes()),
        },
        (Value::Blob(b), _) => DumpValue::Blob(b),
        (Value::IntList(_), _) => {
            return Err(MetaError::Db("a list in a table cell".into()));
        }
    })
}

/// The session of a stale row: `Some(true)` alive, `Some(false)` dead (heartbeat older than
/// `limit`), `None` gone. Locks the session's row (PostgreSQL), so that a heartbeat cannot
/// revive it between this check and the repair.
fn session_state(tx: &mut dyn Tx, session: u64, limit: i64) -> Result<Option<bool>> {
    tx.query_opt(
        "SELECT heartbeat >= $2 FROM sessions WHERE id = $1 FOR UPDATE",
        vals![session, limit],
    )?
    .map(|r| r.bool(0))
    .transpose()
}

fn ino_of(r: &Row, i: usize) -> Result<Ino> {
    r.u64(i)
}

/// The filesystem's settings (`meta_info`), through driver `d` (the engines' own format and
/// stripe-default code reads them too).
pub(crate) fn fs_info<D: Driver>(d: &D) -> Result<FsInfo> {
    d.read(|tx| {
        let mut info = FsInfo {
            name: String::new(),
            uuid: String::new(),
            default_stripe_count: 1,
            default_stripe_size: 1 << 20,
            inline_threshold: 0,
            created: 0,
            schema_version: SCHEMA_VERSION,
        };
        tx.query_each("SELECT key, value FROM meta_info", vals![], &mut |r| {
            let v = r.text(1)?;
            match r.text(0)?.as_str() {
                "name" => info.name = v,
                "uuid" => info.uuid = v,
                "stripe_count" => info.default_stripe_count = v.parse().unwrap_or(1),
                "stripe_size" => info.default_stripe_size = v.parse().unwrap_or(1 << 20),
                "inline_threshold" => info.inline_threshold = v.parse().unwrap_or(0),
                "created" => info.created = v.parse().unwrap_or(0),
                _ => {}
            }
            Ok(())
        })?;
        Ok(info)
    })
}

/// The rows of a freshly formatted filesystem, once its schema exists: settings, the object
/// id counter, the targets and the root directory (one transaction through driver `d`).
pub(crate) fn init_filesystem<D: Driver>(d: &D, p: &FormatParams) -> Result<()> {
    let now = now_nanos();
    let uuid = uuid::Uuid::new_v4().to_string();
    d.write(|tx| {
        let kv = [
            ("name", p.name.clone()),
            ("uuid", uuid.clone()),
            ("stripe_count", p.stripe_count.to_string()),
            ("stripe_size", p.stripe_size.to_string()),
            ("inline_threshold", p.inline_threshold.to_string()),
            ("created", now.to_string()),
        ];
        for (k, v) in kv {
            tx.exec(
                "INSERT INTO meta_info (key, value) VALUES ($1, $2)",
                vals![k, v],
            )?;
        }
        tx.exec(
            "INSERT INTO counters (name, value) VALUES ('next_object', 1)",
            vals![],
        )?;
        for (i, (url, cap)) in p.targets.iter().enumerate() {
            tx.exec(
                "INSERT INTO targets (id, url, capacity) VALUES ($1, $2, $3)",
                vals![i, url.as_str(), *cap],
            )?;
        }
        tx.exec(
            "INSERT INTO inodes (ino, kind, perm, uid, gid, nlink, atime, mtime, ctime, crtime, \
             parent) VALUES (1, $1, $2, 0, 0, 2, $3, $3, $3, $3, 1)",
            vals![Kind::Dir as i64, 0o755, now],
        )?;
        if tx.dialect().is_postgres() {
            // The root took ino 1 by hand: new inodes start at 2. (SQLite's AUTOINCREMENT
            // follows the largest id inserted by itself.)
            tx.exec(
                "SELECT setval(pg_get_serial_sequence('inodes', 'ino'), 1)",
                vals![],
            )?;
        }
        Ok(())
    })
}

impl<D: Driver> Admin for SqlMeta<D> {
    fn info(&self) -> Result<FsInfo> {
        fs_info(&self.d)
    }

    fn targets(&self) -> Result<Vec<TargetInfo>> {
        self.d.read(|tx| {
            let mut v = Vec::new();
            tx.query_each(
                "SELECT id, url, capacity, used, objects FROM targets ORDER BY id",
                vals![],
                &mut |r| {
                    v.push(TargetInfo {
                        id: r.u32(0)?,
                        url: r.text(1)?,
                        capacity: r.u64(2)?,
                        used: r.i64(3)?.max(0) as u64,
                        objects: r.i64(4)?.max(0) as u64,
                    });
                    Ok(())
                },
            )?;
            Ok(v)
        })
    }

    fn usage(&self) -> Result<Usage> {
        self.d.read(|tx| {
            // Files left for the purge count as gone (few rows: the partial index
            // `inodes_unlinked`), their inline bytes too; their objects, like every file's,
            // count until the trash has removed them.
            let r = tx.one(
                &format!(
                    "SELECT ({INODES_USED}), \
                        (SELECT CAST(COALESCE(SUM(used), 0) AS BIGINT) FROM targets), \
                        (SELECT CAST(COALESCE(SUM(len), 0) AS BIGINT) FROM slices \
                         WHERE inline IS NOT NULL \
                         AND ino NOT IN (SELECT ino FROM inodes WHERE orphan = 3))"
                ),
                vals![],
            )?;
            Ok(Usage {
                inodes: r.u64(0)?,
                bytes: (r.i64(1)? + r.i64(2)?).max(0) as u64,
            })
        })
    }

    fn inodes_used(&self) -> Result<u64> {
        self.d.read(|tx| tx.one(INODES_USED, vals![])?.u64(0))
    }

    fn sync(&self) -> Result<()> {
        self.d.sync()
    }

    fn maintain(&self) -> Result<()> {
        self.d.maintain()?;
        self.purge_orphans(now_nanos() - ORPHAN_GRACE.as_nanos() as Nanos)?;
        // Changelog readers idle past their idle time are deregistered by whichever client
        // notices first (one read when none is due).
        crate::engine::Changelog::changelog_expire(self)?;
        Ok(())
    }

    fn export_rows(&self, sink: &mut dyn FnMut(DumpRow) -> Result<()>) -> Result<()> {
        // One read transaction (a consistent snapshot) on a reader connection: writers of
        // every client go on meanwhile. Rows stream to `sink`; should the driver run this
        // again (a connection lost midway), the rows already sent cannot be taken back, so
        // that is an error instead of a dump with rows twice.
        let mut sent = false;
        self.d.read(|tx| {
            if sent {
                return Err(MetaError::Db(
                    "the metadata connection was lost during the dump; run it again".into(),
                ));
            }
            tx.batch(if tx.dialect().is_postgres() {
                "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"
            } else {
                "BEGIN"
            })?;
            let r = (|| -> Result<()> {
                for table in DUMP_TABLES {
                    let cols = table_columns(table);
                    if cols.is_empty() {
                        return Err(MetaError::Db(format!("no columns known for {table}")));
                    }
                    let list: Vec<String> = cols.iter().map(|(c, _)| format!("\"{c}\"")).collect();
                    let sql = format!("SELECT {} FROM {table}", list.join(", "));
                    tx.query_each(&sql, vals![], &mut |r| {
                        let mut vals = Vec::with_capacity(cols.len());
                        for (v, (c, t)) in r.vals.into_iter().zip(&cols) {
                            vals.push((c.clone(), dump_value(v, *t)?));
                        }
                        sent = true;
                        sink((table.to_string(), vals))
                    })?;
                }
                Ok(())
            })();
            match r {
                Ok(()) => tx.batch("COMMIT"),
                Err(e) => {
                    let _ = tx.batch("ROLLBACK");
                    Err(e)
                }
            }
        })
    }

    fn import_rows(&self, rows: &mut dyn Iterator<Item = Result<DumpRow>>) -> Result<u64> {
        let mut columns: BTreeMap<&str, BTreeMap<String, ColType>> = BTreeMap::new();
        for table in DUMP_TABLES {
            columns.insert(table, table_columns(table).into_iter().collect());
        }
        // The rows are read once, inside the transaction: should the driver run it again (a
        // conflict, a lost connection), they are gone, so that is an error (nothing was
        // loaded: the transaction rolled back).
        let mut began = false;
        self.d.write(|tx| {
            if began {
                return Err(MetaError::Db(
                    "the load was interrupted (a conflict or a lost connection) and rolled \
                     back; run it again"
                        .into(),
                ));
            }
            began = true;
            if tx.int("SELECT COUNT(*) FROM inodes", vals![])? > 1 {
                return Err(MetaError::Invalid(
                    "the target filesystem is not empty (load needs a freshly formatted one)"
                        .into(),
                ));
            }
            // The dump replaces the format's own settings, root and targets.
            for table in DUMP_TABLES.iter().rev() {
                tx.exec(&format!("DELETE FROM {table}"), vals![])?;
            }
            let mut n = 0u64;
            for row in &mut *rows {
                let (table, cols) = row?;
                let Some(known) = columns.get(table.as_str()) else {
                    return Err(MetaError::Invalid(format!(
                        "unknown table '{table}' in the dump"
                    )));
                };
                let mut names = Vec::with_capacity(cols.len());
                let mut vals = Vec::with_capacity(cols.len());
                for (col, v) in cols {
                    let Some(t) = known.get(&col) else {
                        return Err(MetaError::Invalid(format!(
                            "unknown column '{col}' of table '{table}' in the dump"
                        )));
                    };
                    vals.push(load_value(v, *t, &table, &col)?);
                    names.push(format!("\"{col}\""));
                }
                let marks: Vec<String> = (1..=vals.len()).map(|i| format!("${i}")).collect();
                let sql = format!(
                    "INSERT INTO {table} ({}) VALUES ({})",
                    names.join(", "),
                    marks.join(", ")
                );
                tx.exec(&sql, &vals)?;
                n += 1;
            }
            if tx.dialect().is_postgres() {
                // Serial columns' sequences move past the loaded ids (SQLite's AUTOINCREMENT
                // follows the largest id inserted by itself).
                for table in DUMP_TABLES {
                    for (col, t) in &columns[*table] {
                        if *t == ColType::Serial {
                            tx.exec(
                                &format!(
                                    "SELECT setval(pg_get_serial_sequence('{table}', '{col}'), \
                                     COALESCE((SELECT MAX({col}) FROM {table}), 0) + 1, false)"
                                ),
                                vals![],
                            )?;
                        }
                    }
                }
            }
            // A dump from before v5 has no allocated bytes; one from v5 has them right: count.
            super::common::recount_all(tx)?;
            // Likewise each inode's xattr count (a dump from before v9 has none).
            super::common::recount_xattrs(tx)?;
            Ok(n)
        })
    }

    fn object_refs(&self) -> Result<Vec<ObjectRef>> {
        self.d.read(|tx| {
            let mut v = Vec::new();
            tx.query_each(
                "SELECT target, obj, ino, obj_off + len, CAST(NULL AS BIGINT) FROM slices \
                 WHERE obj IS NOT NULL \
                 UNION ALL SELECT target, obj, ino, len, id FROM trash",
                vals![],
                &mut |r| {
                    v.push(ObjectRef {
                        target: r.u32(0)?,
                        obj: r.u64(1)?,
                        ino: r.u64(2)?,
                        end: r.u64(3)?,
                        trash: r.opt_i64(4)?.map(|i| i as u64),
                    });
                    Ok(())
                },
            )?;
            Ok(v)
        })
    }

    fn object_id_counter(&self) -> Result<u64> {
        self.d.read(|tx| {
            Ok(tx.int(
                "SELECT value FROM counters WHERE name = 'next_object'",
                vals![],
            )? as u64)
        })
    }

    fn meta_issues(&self, timeout_ns: i64) -> Result<Vec<MetaIssue>> {
        // by the database's clock, as heartbeats are stamped
        let limit = Sessions::db_now(self)? - timeout_ns;
        let unheld = format!("SELECT i.ino FROM inodes i WHERE {UNHELD} ORDER BY i.ino");
        self.d.read(|tx| {
            let mut out = Vec::new();
            tx.query_each(
                "SELECT d.parent, d.name, d.ino FROM dentries d \
                 WHERE NOT EXISTS (SELECT 1 FROM inodes i WHERE i.ino = d.ino) ORDER BY d.id",
                vals![],
                &mut |r| {
                    out.push(MetaIssue::DanglingEntry {
                        parent: ino_of(&r, 0)?,
                        name: r.blob(1)?,
                        ino: ino_of(&r, 2)?,
                    });
                    Ok(())
                },
            )?;
            tx.query_each(&unheld, vals![], &mut |r| {
                out.push(MetaIssue::UnheldOrphan {
                    ino: ino_of(&r, 0)?,
                });
                Ok(())
            })?;
            tx.query_each(
                "SELECT o.ino, o.session FROM open_files o WHERE NOT EXISTS \
                 (SELECT 1 FROM sessions s WHERE s.id = o.session AND s.heartbeat >= $1) \
                 ORDER BY o.session, o.ino",
                vals![limit],
                &mut |r| {
                    out.push(MetaIssue::StaleOpen {
                        ino: ino_of(&r, 0)?,
                        session: r.u64(1)?,
                    });
                    Ok(())
                },
            )?;
            tx.query_each(
                "SELECT DISTINCT l.ino, l.session FROM locks l WHERE NOT EXISTS \
                 (SELECT 1 FROM sessions s WHERE s.id = l.session AND s.heartbeat >= $1) \
                 ORDER BY l.session, l.ino",
                vals![limit],
                &mut |r| {
                    out.push(MetaIssue::StaleLock {
                        ino: ino_of(&r, 0)?,
                        session: r.u64(1)?,
                    });
                    Ok(())
                },
            )?;
            tx.query_each(
                "SELECT l.ino, l.client, l.dirty FROM pcc_leases l WHERE NOT EXISTS \
                 (SELECT 1 FROM sessions s WHERE s.client_name = l.client AND s.heartbeat >= $1) \
                 ORDER BY l.ino",
                vals![limit],
                &mut |r| {
                    out.push(MetaIssue::StaleLease {
                        ino: ino_of(&r, 0)?,
                        client: r.text(1)?,
                        dirty: r.bool(2)?,
                    });
                    Ok(())
                },
            )?;
            tx.query_each(
                "SELECT i.ino, i.xattr_count, \
                 (SELECT COUNT(*) FROM xattrs x WHERE x.ino = i.ino) FROM inodes i \
                 WHERE i.xattr_count <> 0 OR i.ino IN (SELECT ino FROM xattrs) ORDER BY i.ino",
                vals![],
                &mut |r| {
                    let (recorded, actual) = (r.u32(1)?, r.u32(2)?);
                    if recorded != actual {
                        out.push(MetaIssue::XattrCount {
                            ino: ino_of(&r, 0)?,
                            recorded,
                            actual,
                        });
                    }
                    Ok(())
                },
            )?;
            super::hsm::fsck_issues(tx, &mut out)?;
            Ok(out)
        })
    }

    fn repair_issue(&self, issue: &MetaIssue, timeout_ns: i64) -> Result<bool> {
        // by the database's clock, as heartbeats are stamped
        let limit = Sessions::db_now(self)? - timeout_ns;
        let unheld =
            format!("SELECT EXISTS (SELECT 1 FROM inodes i WHERE i.ino = $1 AND {UNHELD})");
        self.d.write(|tx| match issue {
            MetaIssue::DanglingEntry { parent, name, ino } => {
                lock_rows(tx, &[*parent])?;
                let kind = tx.query_opt(
                    "DELETE FROM dentries WHERE parent = $1 AND name = $2 AND ino = $3 \
                     AND NOT EXISTS (SELECT 1 FROM inodes WHERE ino = $3) RETURNING kind",
                    vals![*parent, name.as_slice(), *ino],
                )?;
                match kind {
                    Some(k) => {
                        if k.i64(0)? == Kind::Dir as i64 {
                            // The parent loses the subdirectory's link.
                            tx.exec(
                                "UPDATE inodes SET mtime = $2, ctime = $2, nlink = nlink - 1 \
                                 WHERE ino = $1",
                                vals![*parent, now_nanos()],
                            )?;
                        }
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }
            MetaIssue::UnheldOrphan { ino } => {
                lock_rows(tx, &[*ino])?;
                let still = tx.exists(&unheld, vals![*ino])?;
                if still {
                    purge_inode(tx, *ino)?;
                }
                Ok(still)
            }
            MetaIssue::StaleOpen { ino, session } => match session_state(tx, *session, limit)? {
                Some(true) => Ok(false),
                Some(false) => {
                    end_sessions(tx, &[*session])?;
                    Ok(true)
                }
                None => {
                    lock_rows(tx, &[*ino])?;
                    let n = tx.exec(
                        "DELETE FROM open_files WHERE session = $1 AND ino = $2",
                        vals![*session, *ino],
                    )?;
                    purge_if_orphan(tx, *ino)?;
                    Ok(n > 0)
                }
            },
            MetaIssue::StaleLock { ino, session } => match session_state(tx, *session, limit)? {
                Some(true) => Ok(false),
                Some(false) => {
                    end_sessions(tx, &[*session])?;
                    Ok(true)
                }
                None => {
                    let n = tx.exec(
                        "DELETE FROM locks WHERE session = $1 AND ino = $2",
                        vals![*session, *ino],
                    )?;
                    Ok(n > 0)
                }
            },
            MetaIssue::StaleLease { ino, client, .. } => {
                lock_rows(tx, &[*ino])?;
                let n = tx.exec(
                    "DELETE FROM pcc_leases WHERE ino = $1 AND client = $2 AND dirty = 0 \
                     AND NOT EXISTS (SELECT 1 FROM sessions s \
                         WHERE s.client_name = $2 AND s.heartbeat >= $3)",
                    vals![*ino, client.as_str(), limit],
                )?;
                if n > 0 {
                    tx.exec("DELETE FROM pcc_revokes WHERE ino = $1", vals![*ino])?;
                }
                Ok(n > 0)
            }
            MetaIssue::XattrCount { ino, .. } => {
                lock_rows(tx, &[*ino])?;
                let n = tx.exec(
                    "UPDATE inodes SET xattr_count = \
                     (SELECT COUNT(*) FROM xattrs x WHERE x.ino = inodes.ino) \
                     WHERE ino = $1 AND xattr_count <> \
                     (SELECT COUNT(*) FROM xattrs x WHERE x.ino = inodes.ino)",
                    vals![*ino],
                )?;
                Ok(n > 0)
            }
            _ => super::hsm::fsck_repair(tx, issue),
        })
    }

    fn listen(&self, client: &str, channels: &[Channel]) -> Result<Option<Box<dyn Listener>>> {
        self.d.listen(client, channels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dump_columns_come_from_the_schema() {
        let names =
            |t: &str| -> Vec<String> { table_columns(t).into_iter().map(|(c, _)| c).collect() };
        // CREATE TABLE, then the columns later versions added, in table order.
        let inodes = names("inodes");
        assert_eq!(inodes.first().map(String::as_str), Some("ino"));
        assert_eq!(inodes.last().map(String::as_str), Some("xattr_count"));
        assert!(inodes.contains(&"symlink".to_string()));
        assert_eq!(names("pcc_rules").last().map(String::as_str), Some("quota"));
        // Table constraints are not columns; quoted names lose their quotes.
        assert_eq!(names("xattrs"), ["ino", "name", "value"]);
        assert!(names("locks").contains(&"end".to_string()));
        let slices = table_columns("slices");
        assert_eq!(slices[0], ("seq".to_string(), ColType::Serial));
        assert!(slices.contains(&("inline".to_string(), ColType::Blob)));
        // Every dumped table is known.
        for t in DUMP_TABLES {
            assert!(!table_columns(t).is_empty(), "{t}");
        }
        assert!(table_columns("no_such_table").is_empty());
    }

    #[test]
    fn loaded_values_follow_their_column() {
        let v = |d, t| load_value(d, t, "t", "c");
        assert_eq!(
            v(DumpValue::Text("42".into()), ColType::Int).unwrap(),
            Value::Int(42)
        );
        assert_eq!(
            v(DumpValue::Int(7), ColType::Text).unwrap(),
            Value::Text("7".into())
        );
        assert_eq!(
            v(DumpValue::Text("ab".into()), ColType::Blob).unwrap(),
            Value::Blob(b"ab".to_vec())
        );
        assert!(matches!(
            v(DumpValue::Text("x".into()), ColType::Int),
            Err(MetaError::Invalid(_))
        ));
        assert!(matches!(
            v(DumpValue::Blob(vec![0xff]), ColType::Text),
            Err(MetaError::Invalid(_))
        ));
        assert_eq!(v(DumpValue::Null, ColType::Blob).unwrap(), Value::Null);
    }
}
