//! The small SQL layer the metadata core is written over.
//!
//! - [`Value`]: an owned SQL value (parameters and row cells), with `From` impls for the usual
//!   Rust types and their `Option`s.
//! - [`Row`]: one result row, with typed getters that tolerate the integer/boolean confusion of
//!   the engines (SQLite has no booleans; PostgreSQL's `EXISTS` is one).
//! - [`Tx`]: a transaction (or, for reads, a connection): `exec`, `query`, `query_opt`, `one`,
//!   streaming `query_each`. Implemented over a SQLite connection ([`sqlite`]) and a PostgreSQL
//!   connection ([`postgres`]) inside the transaction their [`Driver`] began.
//! - [`Dialect`]: SQL is written ONCE, in PostgreSQL's style (`$1` placeholders, `GREATEST`,
//!   `FOR UPDATE`, `= ANY($1)` with a list parameter, `ON CONFLICT ... DO UPDATE`, `RETURNING`);
//!   the dialect renders it for SQLite (`?1`, `MAX`, no row locks, `IN (SELECT value FROM
//!   json_each(?1))`), and caches what it rendered.
//! - [`Driver`]: what an engine keeps for itself: its dialect, write transactions with its own
//!   retry classification, reads, durability, housekeeping and notifications. The core
//!   ([`crate::core::SqlMeta`]) does the rest.

pub mod fault;
pub mod postgres;
pub mod sqlite;

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::engine::{Channel, Listener};
use crate::error::{MetaError, Result};

/// An owned SQL value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
    Blob(Vec<u8>),
    Bool(bool),
    /// A list of integers, for `= ANY($n)` (PostgreSQL: an array; SQLite: a JSON list that
    /// the dialect reads with `json_each`).
    IntList(Vec<i64>),
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::Int(v as i64)
            }
        }
    )*};
}
// u64 values (inode numbers, sizes, object ids) are stored as their i64 bit pattern cast, as
// the engines always did (`x as i64`).
from_int!(i8, i16, i32, i64, u8, u16, u32, u64, usize);

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_string())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Value {
        Value::Text(v.clone())
    }
}
impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Value {
        Value::Blob(v.to_vec())
    }
}
impl<const N: usize> From<&[u8; N]> for Value {
    fn from(v: &[u8; N]) -> Value {
        Value::Blob(v.to_vec())
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Value {
        Value::Blob(v)
    }
}
impl From<&Vec<u8>> for Value {
    fn from(v: &Vec<u8>) -> Value {
        Value::Blob(v.clone())
    }
}
impl From<Vec<i64>> for Value {
    fn from(v: Vec<i64>) -> Value {
        Value::IntList(v)
    }
}
impl From<&[i64]> for Value {
    fn from(v: &[i64]) -> Value {
        Value::IntList(v.to_vec())
    }
}
impl From<&[u64]> for Value {
    fn from(v: &[u64]) -> Value {
        Value::IntList(v.iter().map(|x| *x as i64).collect())
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        match v {
            Some(x) => x.into(),
            None => Value::Null,
        }
    }
}

/// Builds a `&[Value]` parameter list: `vals![ino, name, now]`.
#[macro_export]
macro_rules! vals {
    () => { &[] as &[$crate::sql::Value] };
    ($($e:expr),+ $(,)?) => { &[$($crate::sql::Value::from($e)),+] as &[$crate::sql::Value] };
}
pub use vals;

fn bad_type(i: usize, want: &str, got: &Value) -> MetaError {
    MetaError::Db(format!("column {i}: expected {want}, found {got:?}"))
}

/// One result row (owned).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Row {
    pub vals: Vec<Value>,
}

impl Row {
    pub fn new(vals: Vec<Value>) -> Row {
        Row { vals }
    }

    pub fn len(&self) -> usize {
        self.vals.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vals.is_empty()
    }

    /// The raw value of column `i` (`Null` past the end is an error).
    pub fn value(&self, i: usize) -> Result<&Value> {
        self.vals
            .get(i)
            .ok_or_else(|| MetaError::Db(format!("no column {i} in a row of {}", self.vals.len())))
    }

    pub fn is_null(&self, i: usize) -> Result<bool> {
        Ok(matches!(self.value(i)?, Value::Null))
    }

    /// An integer (a boolean reads as 0/1).
    pub fn i64(&self, i: usize) -> Result<i64> {
        match self.value(i)? {
            Value::Int(v) => Ok(*v),
            Value::Bool(b) => Ok(*b as i64),
            v => Err(bad_type(i, "an integer", v)),
        }
    }

    pub fn opt_i64(&self, i: usize) -> Result<Option<i64>> {
        match self.value(i)? {
            Value::Null => Ok(None),
            _ => self.i64(i).map(Some),
        }
    }

    /// An integer read as unsigned (the `as u64` of the stored i64).
    pub fn u64(&self, i: usize) -> Result<u64> {
        Ok(self.i64(i)? as u64)
    }

    pub fn u32(&self, i: usize) -> Result<u32> {
        Ok(self.i64(i)? as u32)
    }

    /// A boolean (an integer reads as `!= 0`).
    pub fn bool(&self, i: usize) -> Result<bool> {
        match self.value(i)? {
            Value::Bool(b) => Ok(*b),
            Value::Int(v) => Ok(*v != 0),
            v => Err(bad_type(i, "a boolean", v)),
        }
    }

    pub fn text(&self, i: usize) -> Result<String> {
        match self.value(i)? {
            Value::Text(s) => Ok(s.clone()),
            Value::Blob(b) => String::from_utf8(b.clone()).map_err(|_| {
                MetaError::Db(format!("column {i}: expected text, found non-UTF-8 bytes"))
            }),
            v => Err(bad_type(i, "text", v)),
        }
    }

    pub fn opt_text(&self, i: usize) -> Result<Option<String>> {
        match self.value(i)? {
            Value::Null => Ok(None),
            _ => self.text(i).map(Some),
        }
    }

    /// Bytes (text reads as its UTF-8 bytes).
    pub fn blob(&self, i: usize) -> Result<Vec<u8>> {
        match self.value(i)? {
            Value::Blob(b) => Ok(b.clone()),
            Value::Text(s) => Ok(s.as_bytes().to_vec()),
            v => Err(bad_type(i, "bytes", v)),
        }
    }

    pub fn opt_blob(&self, i: usize) -> Result<Option<Vec<u8>>> {
        match self.value(i)? {
            Value::Null => Ok(None),
            _ => self.blob(i).map(Some),
        }
    }

    /// Takes column `i`'s bytes out of the row (no copy).
    pub fn take_blob(&mut self, i: usize) -> Result<Option<Vec<u8>>> {
        let v = self
            .vals
            .get_mut(i)
            .ok_or_else(|| MetaError::Db(format!("no column {i}")))?;
        match std::mem::replace(v, Value::Null) {
            Value::Null => Ok(None),
            Value::Blob(b) => Ok(Some(b)),
            Value::Text(s) => Ok(Some(s.into_bytes())),
            other => {
                let e = bad_type(i, "bytes", &other);
                *v = other;
                Err(e)
            }
        }
    }
}

/// A transaction of a [`Driver`] (or a connection outside one, for [`Driver::read`]).
/// SQL is PostgreSQL-style; the implementation renders it through its [`Dialect`].
pub trait Tx {
    fn dialect(&self) -> &Dialect;
    /// Runs a statement; returns the number of rows it changed.
    fn exec(&mut self, sql: &str, params: &[Value]) -> Result<u64>;
    /// Calls `f` with each row of `sql`, in order, without collecting them.
    fn query_each(
        &mut self,
        sql: &str,
        params: &[Value],
        f: &mut dyn FnMut(Row) -> Result<()>,
    ) -> Result<()>;
    /// Runs an `INSERT` (without `RETURNING`) into a table whose auto id (`SERIAL`) is
    /// `id_col`, and returns the id of the new row. PostgreSQL: `... RETURNING id_col`.
    /// SQLite: the connection's last insert rowid, because an `INSERT ... RETURNING` there
    /// opens a statement journal (a page copy and an allocation per statement).
    fn insert_id(&mut self, sql: &str, params: &[Value], id_col: &str) -> Result<i64>;
    /// Runs statements without parameters (DDL), as the dialect's text (not rendered).
    fn batch(&mut self, sql: &str) -> Result<()>;
    /// Sends a notification at commit (PostgreSQL `NOTIFY`); engines without notifications
    /// ignore it (their clients poll).
    fn notify(&mut self, _channel: &str, _payload: &str) -> Result<()> {
        Ok(())
    }

    /// Every row of `sql`.
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>> {
        let mut v = Vec::new();
        self.query_each(sql, params, &mut |r| {
            v.push(r);
            Ok(())
        })?;
        Ok(v)
    }
    /// The first row of `sql`, if any.
    fn query_opt(&mut self, sql: &str, params: &[Value]) -> Result<Option<Row>>;
    /// The one row of `sql`; `NotFound` when there is none.
    fn one(&mut self, sql: &str, params: &[Value]) -> Result<Row> {
        self.query_opt(sql, params)?.ok_or(MetaError::NotFound)
    }
    /// Column 0 of the one row of `sql`, as an integer.
    fn int(&mut self, sql: &str, params: &[Value]) -> Result<i64> {
        self.one(sql, params)?.i64(0)
    }
    /// Column 0 of the one row of `sql`, as a boolean (`SELECT EXISTS (...)`).
    fn exists(&mut self, sql: &str, params: &[Value]) -> Result<bool> {
        self.one(sql, params)?.bool(0)
    }
}

/// Which SQL dialect a driver speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DialectKind {
    Sqlite,
    Postgres,
}

/// A SQL dialect: renders the core's PostgreSQL-style SQL into the engine's, with a cache.
pub struct Dialect {
    kind: DialectKind,
    cache: RwLock<RenderCache>,
}

/// Renderings by statement text, and a faster path by the text's address: the core's
/// statements are mostly `&'static str`, the same address every time, so most lookups hash two
/// numbers and compare the text once instead of hashing it (this matters: SQLite runs a small
/// statement in a few microseconds). An address entry is only used when its text still
/// matches (a heap string's address may be reused for another text); the address map is
/// emptied when it grows past [`ADDR_ENTRIES`] (texts built anew each time get new addresses).
#[derive(Default)]
struct RenderCache {
    by_text: HashMap<Box<str>, Arc<str>>,
    by_addr: ByAddr,
}

/// (address, length) of a statement text -> (the text, its rendering).
type ByAddr = HashMap<(usize, usize), (Arc<str>, Arc<str>), BuildHasherDefault<AddrHasher>>;

/// Most address entries kept (see [`RenderCache`]).
const ADDR_ENTRIES: usize = 4096;

/// A hasher for (address, length) keys.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// SQL rendered for a dialect: the original text or a cached rendering.
pub enum Rendered<'a> {
    Same(&'a str),
    Cached(Arc<str>),
}

impl std::ops::Deref for Rendered<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            Rendered::Same(s) => s,
            Rendered::Cached(s) => s,
        }
    }
}

impl Dialect {
    pub fn new(kind: DialectKind) -> Dialect {
        Dialect {
            kind,
            cache: RwLock::new(RenderCache::default()),
        }
    }

    pub fn kind(&self) -> DialectKind {
        self.kind
    }

    pub fn is_postgres(&self) -> bool {
        self.kind == DialectKind::Postgres
    }

    pub fn is_sqlite(&self) -> bool {
        self.kind == DialectKind::Sqlite
    }

    /// Whether transactions take row locks (`FOR UPDATE`) to serialise writers on one row.
    /// SQLite has one writer at a time and renders them away; the core may then skip whole
    /// statements whose only purpose is a lock.
    pub fn row_locks(&self) -> bool {
        self.is_postgres()
    }

    /// `sql` in this dialect (cached: the text is rendered once per distinct statement; the
    /// cache holds as many entries as the program has distinct statements).
    pub fn render<'a>(&self, sql: &'a str) -> Rendered<'a> {
        if self.kind == DialectKind::Postgres {
            return Rendered::Same(sql);
        }
        let addr = (sql.as_ptr() as usize, sql.len());
        let known = {
            let c = self.cache.read();
            if let Some((text, r)) = c.by_addr.get(&addr) {
                if **text == *sql {
                    return Rendered::Cached(r.clone());
                }
            }
            c.by_text.get(sql).cloned()
        };
        let r = known.unwrap_or_else(|| Arc::from(render_sqlite(sql).as_ref()));
        let mut c = self.cache.write();
        if !c.by_text.contains_key(sql) {
            c.by_text.insert(sql.into(), r.clone());
        }
        if c.by_addr.len() >= ADDR_ENTRIES {
            c.by_addr.clear();
        }
        c.by_addr.insert(addr, (Arc::from(sql), r.clone()));
        Rendered::Cached(r)
    }
}

/// Renders PostgreSQL-style SQL for SQLite: `$n` -> `?n`, `GREATEST(`/`LEAST(` ->
/// `MAX(`/`MIN(`, `FOR UPDATE` dropped, `= ANY($n)` -> `IN (SELECT value FROM json_each(?n))`
/// (the list parameter is bound as JSON). String literals and quoted identifiers are copied
/// as they are.
pub fn render_sqlite(sql: &str) -> Cow<'_, str> {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 16);
    let mut i = 0;
    let word_at = |i: usize, w: &str| -> bool {
        let wb = w.as_bytes();
        b.len() >= i + wb.len()
            && b[i..i + wb.len()].eq_ignore_ascii_case(wb)
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
    };
    while i < b.len() {
        let c = b[i];
        match c {
            b'\'' | b'"' => {
                // Copy a literal or quoted identifier through its closing quote.
                let q = c;
                let start = i;
                i += 1;
                while i < b.len() {
                    if b[i] == q {
                        if i + 1 < b.len() && b[i + 1] == q {
                            i += 2;
                            continue;
                        }
                        break;
                    }
                    i += 1;
                }
                i = (i + 1).min(b.len());
                out.push_str(&sql[start..i]);
            }
            b'$' if i + 1 < b.len() && b[i + 1].is_ascii_digit() => {
                out.push('?');
                i += 1;
            }
            b'=' if any_list_at(b, i).is_some() => {
                let (n, end) = any_list_at(b, i).expect("checked");
                out.push_str("IN (SELECT value FROM json_each(?");
                out.push_str(n);
                out.push_str("))");
                i = end;
            }
            _ if word_at(i, "GREATEST(") => {
                out.push_str("MAX(");
                i += "GREATEST(".len();
            }
            _ if word_at(i, "LEAST(") => {
                out.push_str("MIN(");
                i += "LEAST(".len();
            }
            _ if word_at(i, "FOR UPDATE") => {
                // Drop it, and the blank before it.
                while out.ends_with(' ') {
                    out.pop();
                }
                i += "FOR UPDATE".len();
            }
            _ => {
                let ch = sql[i..].chars().next().expect("in bounds");
                out.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    Cow::Owned(out)
}

/// At `b[i] == '='`: `= ANY($n)` (blanks allowed) -> (n, index after the `)`).
fn any_list_at(b: &[u8], i: usize) -> Option<(&str, usize)> {
    let mut j = i + 1;
    while j < b.len() && b[j] == b' ' {
        j += 1;
    }
    if b.len() < j + 5 || !b[j..j + 4].eq_ignore_ascii_case(b"ANY(") || b[j + 4] != b'$' {
        return None;
    }
    let ds = j + 5;
    let mut de = ds;
    while de < b.len() && b[de].is_ascii_digit() {
        de += 1;
    }
    if de == ds || de >= b.len() || b[de] != b')' {
        return None;
    }
    Some((std::str::from_utf8(&b[ds..de]).ok()?, de + 1))
}

/// What an engine keeps for itself; everything else is the core's
/// ([`crate::core::SqlMeta`]).
pub trait Driver: Send + Sync + 'static {
    fn dialect(&self) -> &Dialect;
    /// Runs `f` in one write transaction, retrying it (with a fresh transaction) while the
    /// engine classifies the failure as transient (SQLite: busy; PostgreSQL: serialization
    /// failure or deadlock); so `f` may run several times. An inner `Err` is committed (work
    /// done before a reported failure is kept); an outer one rolls back.
    fn write_commit<T>(&self, f: impl FnMut(&mut dyn Tx) -> Result<Result<T>>)
        -> Result<Result<T>>;
    /// Runs `f` in one write transaction; any error rolls back. See [`Driver::write_commit`].
    fn write<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.write_commit(|tx| f(tx).map(Ok))?
    }
    /// A write that is ONE statement, sent as its own transaction: on PostgreSQL one round
    /// trip instead of three (no `BEGIN`/`COMMIT`; the pool's connections default to
    /// `REPEATABLE READ`, the isolation of [`Driver::write`]'s transactions, so the statement
    /// sees one snapshot and a concurrent update of a row it updates is a serialization
    /// failure, retried as a transaction's is). `f` must send exactly one statement (a second
    /// one is refused, as a bug) and be idempotent: a pooled connection found dead when the
    /// statement is sent is replaced and the statement sent again. SQLite: [`Driver::write`].
    fn write_one<T>(&self, f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.write(f)
    }
    /// Like [`Driver::write_one`], for a statement that is NOT idempotent (a create, an
    /// unlink): sent at most once. A pooled connection already known to be closed is replaced
    /// before the statement is sent; a failure of the connection after it was sent is
    /// returned (`Unavailable`, EIO), as a failed `COMMIT` is, since the statement may have
    /// committed. Serialization failures and deadlocks are retried (nothing was committed).
    /// SQLite: [`Driver::write`].
    fn write_once<T>(&self, f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.write(f)
    }
    /// Like [`Driver::write`], for the session's heartbeat: on a connection of its own that no
    /// other work uses (PostgreSQL), so that a pool held by long transactions or a burst of
    /// I/O never delays it past the session timeout. SQLite: [`Driver::write`] (embedded: no
    /// pool to wait for; one writer at a time, each transaction short).
    fn write_priority<T>(&self, f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.write(f)
    }
    /// Runs `f` in one transaction that excludes every other `exclusive` one of any client of
    /// the database (schema migrations and formatting): SQLite's write lock; PostgreSQL's
    /// advisory lock, taken before the transaction reads anything. Not retried.
    fn exclusive<T>(&self, f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T>;
    /// Runs read-only `f` outside a write transaction (each statement sees one snapshot;
    /// SQLite reads beside the writer).
    fn read<T>(&self, f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T>;
    /// Makes committed transactions durable against power loss.
    fn sync(&self) -> Result<()>;
    /// The engine's own housekeeping (SQLite: checkpoint the write-ahead log).
    fn maintain(&self) -> Result<()>;
    /// Subscribes to notifications (see [`crate::engine::Admin::listen`]); `Ok(None)` when
    /// the engine has none (clients poll).
    fn listen(&self, _client: &str, _channels: &[Channel]) -> Result<Option<Box<dyn Listener>>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_rendering() {
        let r = |s| render_sqlite(s).into_owned();
        assert_eq!(
            r("SELECT a FROM t WHERE x = $1 AND y = $12"),
            "SELECT a FROM t WHERE x = ?1 AND y = ?12"
        );
        assert_eq!(
            r("UPDATE inodes SET allocated = GREATEST(0, allocated + $2) WHERE ino = $1"),
            "UPDATE inodes SET allocated = MAX(0, allocated + ?2) WHERE ino = ?1"
        );
        assert_eq!(
            r("SELECT ino FROM inodes WHERE ino = $1 FOR UPDATE"),
            "SELECT ino FROM inodes WHERE ino = ?1"
        );
        assert_eq!(
            r("DELETE FROM t WHERE id = ANY($3)"),
            "DELETE FROM t WHERE id IN (SELECT value FROM json_each(?3))"
        );
        // Literals and quoted names are left alone.
        assert_eq!(
            r("SELECT '$1 GREATEST(', \"end\" FROM t"),
            "SELECT '$1 GREATEST(', \"end\" FROM t"
        );
        assert_eq!(r("SELECT 'it''s $2' || $1"), "SELECT 'it''s $2' || ?1");
        // Words that merely end in a keyword stay.
        assert_eq!(r("SELECT XGREATEST(1)"), "SELECT XGREATEST(1)");
    }

    #[test]
    fn dialect_caches_and_postgres_is_identity() {
        let d = Dialect::new(DialectKind::Sqlite);
        let a = d.render("SELECT $1");
        assert_eq!(&*a, "SELECT ?1");
        let b = d.render("SELECT $1");
        match (a, b) {
            (Rendered::Cached(x), Rendered::Cached(y)) => assert!(Arc::ptr_eq(&x, &y)),
            _ => panic!("not cached"),
        }
        // A text at an address that held another text before renders as itself.
        let mut buf = String::from("SELECT $1 FROM a");
        assert_eq!(&*d.render(&buf), "SELECT ?1 FROM a");
        buf.replace_range(.., "SELECT $2 FROM b");
        assert_eq!(&*d.render(&buf), "SELECT ?2 FROM b");
        let p = Dialect::new(DialectKind::Postgres);
        assert_eq!(&*p.render("SELECT $1 FOR UPDATE"), "SELECT $1 FOR UPDATE");
    }

    #[test]
    fn row_getters_tolerate_int_and_bool() {
        let r = Row::new(vec![
            Value::Bool(true),
            Value::Int(0),
            Value::Null,
            Value::Text("x".into()),
        ]);
        assert_eq!(r.i64(0).unwrap(), 1);
        assert!(!r.bool(1).unwrap());
        assert_eq!(r.opt_i64(2).unwrap(), None);
        assert_eq!(r.blob(3).unwrap(), b"x");
        assert!(r.i64(3).is_err());
        assert!(r.i64(9).is_err());
    }
}
