//! [`Tx`] over a SQLite connection (inside the transaction its driver began, or outside one
//! for single-statement reads). Statements are rendered by the [`Dialect`] (cached) and
//! prepared through rusqlite's per-connection statement cache.

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::Connection;

use super::{Dialect, Row, Tx, Value};
use crate::error::Result;

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Value::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            Value::Int(v) => ToSqlOutput::Borrowed(ValueRef::Integer(*v)),
            Value::Bool(b) => ToSqlOutput::Borrowed(ValueRef::Integer(*b as i64)),
            Value::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
            Value::Blob(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
            Value::IntList(v) => {
                // Read back by `json_each` (see `render_sqlite`).
                let mut s = String::with_capacity(v.len() * 8 + 2);
                s.push('[');
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        s.push(',');
                    }
                    s.push_str(&x.to_string());
                }
                s.push(']');
                ToSqlOutput::Owned(rusqlite::types::Value::Text(s))
            }
        })
    }
}

fn cell(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Int(f as i64),
        ValueRef::Text(t) => match std::str::from_utf8(t) {
            Ok(s) => Value::Text(s.to_string()),
            Err(_) => Value::Blob(t.to_vec()),
        },
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

fn to_row(r: &rusqlite::Row<'_>, n: usize) -> rusqlite::Result<Row> {
    let mut vals = Vec::with_capacity(n);
    for i in 0..n {
        vals.push(cell(r.get_ref(i)?));
    }
    Ok(Row::new(vals))
}

/// A SQLite connection seen as a [`Tx`].
pub struct SqliteTx<'a> {
    conn: &'a Connection,
    dialect: &'a Dialect,
}

impl<'a> SqliteTx<'a> {
    pub fn new(conn: &'a Connection, dialect: &'a Dialect) -> SqliteTx<'a> {
        SqliteTx { conn, dialect }
    }

    /// The connection itself (for what the driver does outside the core).
    pub fn conn(&self) -> &Connection {
        self.conn
    }
}

impl Tx for SqliteTx<'_> {
    fn dialect(&self) -> &Dialect {
        self.dialect
    }

    fn exec(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        let sql = self.dialect.render(sql);
        let mut st = self.conn.prepare_cached(&sql)?;
        Ok(st.execute(rusqlite::params_from_iter(params.iter()))? as u64)
    }

    fn insert_id(&mut self, sql: &str, params: &[Value], _id_col: &str) -> Result<i64> {
        self.exec(sql, params)?;
        Ok(self.conn.last_insert_rowid())
    }

    fn query_each(
        &mut self,
        sql: &str,
        params: &[Value],
        f: &mut dyn FnMut(Row) -> Result<()>,
    ) -> Result<()> {
        let sql = self.dialect.render(sql);
        let mut st = self.conn.prepare_cached(&sql)?;
        let n = st.column_count();
        let mut rows = st.query(rusqlite::params_from_iter(params.iter()))?;
        while let Some(r) = rows.next()? {
            f(to_row(r, n)?)?;
        }
        Ok(())
    }

    fn query_opt(&mut self, sql: &str, params: &[Value]) -> Result<Option<Row>> {
        let sql = self.dialect.render(sql);
        let mut st = self.conn.prepare_cached(&sql)?;
        let n = st.column_count();
        let mut rows = st.query(rusqlite::params_from_iter(params.iter()))?;
        match rows.next()? {
            Some(r) => Ok(Some(to_row(r, n)?)),
            None => Ok(None),
        }
    }

    fn batch(&mut self, sql: &str) -> Result<()> {
        self.conn.execute_batch(sql)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::DialectKind;
    use crate::vals;

    #[test]
    fn values_round_trip_and_lists_bind_as_json() {
        let c = Connection::open_in_memory().unwrap();
        let d = Dialect::new(DialectKind::Sqlite);
        let mut tx = SqliteTx::new(&c, &d);
        tx.batch("CREATE TABLE t (id INTEGER PRIMARY KEY, name BLOB, note TEXT, flag INTEGER)")
            .unwrap();
        for i in 1..=5i64 {
            let n = tx
                .exec(
                    "INSERT INTO t (id, name, note, flag) VALUES ($1, $2, $3, $4)",
                    vals![i, &b"n\xff"[..], Some("x"), i % 2 == 0],
                )
                .unwrap();
            assert_eq!(n, 1);
        }
        let rows = tx
            .query(
                "SELECT id, name, note, flag FROM t WHERE id = ANY($1) ORDER BY id",
                vals![vec![2i64, 4, 9]],
            )
            .unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].i64(0).unwrap(), 2);
        assert_eq!(rows[0].blob(1).unwrap(), b"n\xff");
        assert_eq!(rows[0].text(2).unwrap(), "x");
        assert!(rows[0].bool(3).unwrap());
        let g = tx
            .one("SELECT GREATEST(0, $1 - 10)", vals![3i64])
            .unwrap()
            .i64(0)
            .unwrap();
        assert_eq!(g, 0);
        assert!(matches!(
            tx.one("SELECT id FROM t WHERE id = $1", vals![99i64]),
            Err(crate::MetaError::NotFound)
        ));
        let id = tx
            .int(
                "INSERT INTO t (name, note, flag) VALUES ($1, NULL, 0) RETURNING id",
                vals![&b"z"[..]],
            )
            .unwrap();
        assert_eq!(id, 6);
        let id = tx
            .insert_id(
                "INSERT INTO t (name, note, flag) VALUES ($1, NULL, 0)",
                vals![&b"y"[..]],
                "id",
            )
            .unwrap();
        assert_eq!(id, 7);
    }
}
