//! `tierfs dump` / `tierfs load` for PostgreSQL: the persistent tables, row by row, typed by
//! the table's own column types.

use postgres::types::{ToSql, Type};

use super::pool::PgConn;
use crate::error::{MetaError, Result};
use crate::types::{DumpRow, DumpValue, DUMP_TABLES};

fn db(e: postgres::Error) -> MetaError {
    MetaError::Db(e.to_string())
}

/// Serial columns whose sequences must move past loaded ids.
const SERIALS: &[(&str, &str)] = &[
    ("inodes", "ino"),
    ("dentries", "id"),
    ("slices", "seq"),
    ("trash", "id"),
    ("pcc_rules", "id"),
];

pub(super) fn export(c: &mut PgConn) -> Result<Vec<DumpRow>> {
    let mut out = Vec::new();
    for table in DUMP_TABLES {
        for row in c.query(&format!("SELECT * FROM {table}"), &[])? {
            let mut vals = Vec::with_capacity(row.len());
            for (i, col) in row.columns().iter().enumerate() {
                let t = col.type_();
                let v = if *t == Type::INT8 || *t == Type::INT4 || *t == Type::INT2 {
                    let n: Option<i64> = match *t {
                        Type::INT8 => row.try_get(i).map_err(db)?,
                        Type::INT4 => row.try_get::<_, Option<i32>>(i).map_err(db)?.map(i64::from),
                        _ => row.try_get::<_, Option<i16>>(i).map_err(db)?.map(i64::from),
                    };
                    n.map(DumpValue::Int)
                } else if *t == Type::BYTEA {
                    row.try_get::<_, Option<Vec<u8>>>(i)
                        .map_err(db)?
                        .map(DumpValue::Blob)
                } else if *t == Type::FLOAT8 {
                    row.try_get::<_, Option<f64>>(i)
                        .map_err(db)?
                        .map(DumpValue::Real)
                } else {
                    row.try_get::<_, Option<String>>(i)
                        .map_err(db)?
                        .map(DumpValue::Text)
                };
                vals.push((col.name().to_string(), v.unwrap_or(DumpValue::Null)));
            }
            out.push((table.to_string(), vals));
        }
    }
    Ok(out)
}

/// A value as the column's type wants it (SQLite dumps are loosely typed).
fn param(v: &DumpValue, t: &Type) -> Result<Box<dyn ToSql + Sync>> {
    let bad = || MetaError::Invalid(format!("dump value {v:?} does not fit a {t} column"));
    Ok(match (v, t) {
        (DumpValue::Null, t) if *t == Type::BYTEA => Box::new(None::<Vec<u8>>),
        (DumpValue::Null, t) if *t == Type::TEXT || *t == Type::VARCHAR => Box::new(None::<String>),
        (DumpValue::Null, t) if *t == Type::FLOAT8 => Box::new(None::<f64>),
        (DumpValue::Null, _) => Box::new(None::<i64>),
        (DumpValue::Int(n), t) if *t == Type::INT8 => Box::new(*n),
        (DumpValue::Int(n), t) if *t == Type::INT4 => {
            Box::new(i32::try_from(*n).map_err(|_| bad())?)
        }
        (DumpValue::Int(n), t) if *t == Type::TEXT => Box::new(n.to_string()),
        (DumpValue::Real(f), t) if *t == Type::FLOAT8 => Box::new(*f),
        (DumpValue::Text(s), t) if *t == Type::TEXT || *t == Type::VARCHAR => Box::new(s.clone()),
        (DumpValue::Text(s), t) if *t == Type::INT8 => {
            Box::new(s.parse::<i64>().map_err(|_| bad())?)
        }
        (DumpValue::Text(s), t) if *t == Type::BYTEA => Box::new(s.clone().into_bytes()),
        (DumpValue::Blob(b), t) if *t == Type::BYTEA => Box::new(b.clone()),
        _ => return Err(bad()),
    })
}

pub(super) fn import(c: &mut PgConn, rows: &[DumpRow]) -> Result<u64> {
    let files = c.i64("SELECT COUNT(*) FROM inodes", &[])?;
    if files > 1 {
        return Err(MetaError::Invalid(
            "the target filesystem is not empty (load needs a freshly formatted one)".into(),
        ));
    }
    for table in DUMP_TABLES.iter().rev() {
        c.exec(&format!("DELETE FROM {table}"), &[])?;
    }
    let mut n = 0u64;
    for (table, cols) in rows {
        if !DUMP_TABLES.contains(&table.as_str()) {
            return Err(MetaError::Invalid(format!(
                "unknown table '{table}' in the dump"
            )));
        }
        for (col, _) in cols {
            if !col
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
            {
                return Err(MetaError::Invalid(format!("bad column name '{col}'")));
            }
        }
        let names: Vec<&str> = cols.iter().map(|(c, _)| c.as_str()).collect();
        let marks: Vec<String> = (1..=cols.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "INSERT INTO {table} ({}) VALUES ({})",
            names.join(", "),
            marks.join(", ")
        );
        let stmt = c.client.prepare(&sql).map_err(db)?;
        let params: Vec<Box<dyn ToSql + Sync>> = cols
            .iter()
            .zip(stmt.params())
            .map(|((_, v), t)| param(v, t))
            .collect::<Result<_>>()?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|b| b.as_ref()).collect();
        c.client.execute(&stmt, &refs).map_err(db)?;
        n += 1;
    }
    for (table, col) in SERIALS {
        c.exec(
            &format!(
                "SELECT setval(pg_get_serial_sequence('{table}', '{col}'), \
                 COALESCE((SELECT MAX({col}) FROM {table}), 0) + 1, false)"
            ),
            &[],
        )?;
    }
    // A dump from before v5 has no allocated bytes; one from v5 has them right: count.
    super::recount_all(c)?;
    Ok(n)
}
