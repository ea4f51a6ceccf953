//! [`Tx`] over a PostgreSQL connection of the engine's pool, inside the transaction its driver
//! began (or outside one for single-statement reads).
//!
//! Statements are prepared once per connection (the pool's cache). Each [`Value`] is sent as
//! the exact type the prepared statement's parameter wants (`INT4`, `INT8`, `BOOL`, `BYTEA`,
//! `INT8[]`, ...), so the core's SQL never casts and never cares which integer width a column
//! has. Result cells are read back by their column type.

use std::error::Error;

use bytes::BytesMut;
use postgres::types::{IsNull, ToSql, Type};

use super::{Dialect, Row, Tx, Value};
use crate::error::{MetaError, Result};
use crate::postgres::pg_err;
use crate::postgres::PgConn;

type BoxErr = Box<dyn Error + Sync + Send>;

/// A [`Value`] bound to the type the statement's parameter has.
#[derive(Debug)]
struct Param<'a>(&'a Value);

fn int_as(v: i64, ty: &Type, out: &mut BytesMut) -> std::result::Result<IsNull, BoxErr> {
    match *ty {
        Type::INT8 => v.to_sql(ty, out),
        Type::INT4 => i32::try_from(v)?.to_sql(ty, out),
        Type::INT2 => i16::try_from(v)?.to_sql(ty, out),
        Type::OID => u32::try_from(v)?.to_sql(ty, out),
        Type::BOOL => (v != 0).to_sql(ty, out),
        Type::FLOAT8 => (v as f64).to_sql(ty, out),
        Type::FLOAT4 => (v as f32).to_sql(ty, out),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
            v.to_string().as_str().to_sql(&Type::TEXT, out)
        }
        _ => Err(format!("cannot send an integer as {ty}").into()),
    }
}

impl ToSql for Param<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> std::result::Result<IsNull, BoxErr> {
        match self.0 {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(v) => int_as(*v, ty, out),
            Value::Bool(b) => match *ty {
                Type::BOOL => b.to_sql(ty, out),
                _ => int_as(*b as i64, ty, out),
            },
            Value::Text(s) => match *ty {
                Type::BYTEA => s.as_bytes().to_sql(ty, out),
                _ => s.as_str().to_sql(ty, out),
            },
            Value::Blob(b) => match *ty {
                Type::BYTEA => b.as_slice().to_sql(ty, out),
                _ => match std::str::from_utf8(b) {
                    Ok(s) => s.to_sql(ty, out),
                    Err(_) => Err(format!("cannot send non-UTF-8 bytes as {ty}").into()),
                },
            },
            Value::IntList(v) => match *ty {
                Type::INT8_ARRAY => v.to_sql(ty, out),
                Type::INT4_ARRAY => {
                    let w = v
                        .iter()
                        .map(|x| i32::try_from(*x))
                        .collect::<std::result::Result<Vec<i32>, _>>()?;
                    w.to_sql(ty, out)
                }
                _ => Err(format!("cannot send an integer list as {ty}").into()),
            },
        }
    }

    fn accepts(_ty: &Type) -> bool {
        // Checked per value in `to_sql`, against the statement's real parameter type.
        true
    }

    postgres::types::to_sql_checked!();
}

fn cell(r: &postgres::Row, i: usize) -> Result<Value> {
    let ty = r.columns()[i].type_();
    let e = |e: postgres::Error| MetaError::Db(format!("column {i} ({ty}): {e}"));
    Ok(match *ty {
        Type::INT8 => r.try_get::<_, Option<i64>>(i).map_err(e)?.map(Value::Int),
        Type::INT4 => r
            .try_get::<_, Option<i32>>(i)
            .map_err(e)?
            .map(|v| Value::Int(v as i64)),
        Type::INT2 => r
            .try_get::<_, Option<i16>>(i)
            .map_err(e)?
            .map(|v| Value::Int(v as i64)),
        Type::OID => r
            .try_get::<_, Option<u32>>(i)
            .map_err(e)?
            .map(|v| Value::Int(v as i64)),
        Type::BOOL => r.try_get::<_, Option<bool>>(i).map_err(e)?.map(Value::Bool),
        Type::BYTEA => r
            .try_get::<_, Option<Vec<u8>>>(i)
            .map_err(e)?
            .map(Value::Blob),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => r
            .try_get::<_, Option<String>>(i)
            .map_err(e)?
            .map(Value::Text),
        Type::INT8_ARRAY => r
            .try_get::<_, Option<Vec<i64>>>(i)
            .map_err(e)?
            .map(Value::IntList),
        _ => {
            return Err(MetaError::Db(format!(
                "column {i} has type {ty}, which the SQL layer does not read (cast it to BIGINT)"
            )))
        }
    }
    .unwrap_or(Value::Null))
}

fn to_row(r: &postgres::Row) -> Result<Row> {
    let n = r.len();
    let mut vals = Vec::with_capacity(n);
    for i in 0..n {
        vals.push(cell(r, i)?);
    }
    Ok(Row::new(vals))
}

/// A pooled PostgreSQL connection seen as a [`Tx`].
pub struct PgTx<'a> {
    conn: &'a mut PgConn,
    dialect: &'a Dialect,
    /// Statements this one may still send (None: any number): a one-statement write
    /// ([`crate::sql::Driver::write_one`]) runs outside a transaction, where a second
    /// statement would not be atomic with the first.
    left: Option<u32>,
}

impl<'a> PgTx<'a> {
    pub fn new(conn: &'a mut PgConn, dialect: &'a Dialect) -> PgTx<'a> {
        PgTx {
            conn,
            dialect,
            left: None,
        }
    }

    /// A [`PgTx`] outside any transaction that may send one statement only.
    pub fn single(conn: &'a mut PgConn, dialect: &'a Dialect) -> PgTx<'a> {
        PgTx {
            conn,
            dialect,
            left: Some(1),
        }
    }

    /// Counts a statement about to be sent; refuses one past the allowance.
    fn send(&mut self) -> Result<()> {
        match &mut self.left {
            None => Ok(()),
            Some(0) => Err(MetaError::Db(
                "a one-statement write tried a second statement (a bug)".into(),
            )),
            Some(n) => {
                *n -= 1;
                Ok(())
            }
        }
    }

    /// The connection itself (for what the driver does outside the core).
    pub fn conn(&mut self) -> &mut PgConn {
        self.conn
    }
}

fn params(v: &[Value]) -> Vec<Param<'_>> {
    v.iter().map(Param).collect()
}

fn refs<'a>(p: &'a [Param<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    p.iter().map(|x| x as &(dyn ToSql + Sync)).collect()
}

impl Tx for PgTx<'_> {
    fn dialect(&self) -> &Dialect {
        self.dialect
    }

    fn exec(&mut self, sql: &str, params_: &[Value]) -> Result<u64> {
        self.send()?;
        let p = params(params_);
        self.conn.exec(sql, &refs(&p))
    }

    fn query_each(
        &mut self,
        sql: &str,
        params_: &[Value],
        f: &mut dyn FnMut(Row) -> Result<()>,
    ) -> Result<()> {
        use postgres::fallible_iterator::FallibleIterator;
        self.send()?;
        let p = params(params_);
        let st = self.conn.prep(sql)?;
        let mut it = self.conn.client.query_raw(&st, refs(&p)).map_err(pg_err)?;
        while let Some(r) = it.next().map_err(pg_err)? {
            f(to_row(&r)?)?;
        }
        Ok(())
    }

    fn query(&mut self, sql: &str, params_: &[Value]) -> Result<Vec<Row>> {
        self.send()?;
        let p = params(params_);
        self.conn
            .query(sql, &refs(&p))?
            .iter()
            .map(to_row)
            .collect()
    }

    fn query_opt(&mut self, sql: &str, params_: &[Value]) -> Result<Option<Row>> {
        use postgres::fallible_iterator::FallibleIterator;
        self.send()?;
        let p = params(params_);
        let st = self.conn.prep(sql)?;
        let mut it = self.conn.client.query_raw(&st, refs(&p)).map_err(pg_err)?;
        // The first row; the rest (if any) are dropped with the iterator.
        match it.next().map_err(pg_err)? {
            Some(r) => Ok(Some(to_row(&r)?)),
            None => Ok(None),
        }
    }

    fn insert_id(&mut self, sql: &str, params: &[Value], id_col: &str) -> Result<i64> {
        self.int(&format!("{sql} RETURNING {id_col}"), params)
    }

    fn batch(&mut self, sql: &str) -> Result<()> {
        self.send()?;
        self.conn.batch(sql)
    }

    fn notify(&mut self, channel: &str, payload: &str) -> Result<()> {
        self.send()?;
        self.conn
            .exec("SELECT pg_notify($1, $2)", &[&channel, &payload])
            .map(|_| ())
    }
}
