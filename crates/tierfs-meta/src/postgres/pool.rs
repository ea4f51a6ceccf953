//! A small connection pool with a per-connection prepared-statement cache.
//!
//! Why not r2d2_postgres or deadpool-postgres: r2d2 checks each connection with a round trip
//! on every checkout by default (doubling the cost of a lookup) and has nowhere to keep
//! prepared statements; deadpool is async and would need a runtime bridge on every call. What
//! the engine needs is small: reuse idle connections, cap how many are open, keep each
//! connection's prepared statements, and never hand back a connection that broke (the next
//! checkout then connects anew, which is how the engine recovers when the database returns).

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Statement};

use super::pg_err;
use crate::error::{MetaError, Result};

/// A query parameter.
pub type P<'a> = &'a (dyn ToSql + Sync);

/// One connection and its prepared statements.
pub struct PgConn {
    pub client: Client,
    stmts: HashMap<String, Statement>,
}

impl PgConn {
    pub fn new(client: Client) -> PgConn {
        PgConn {
            client,
            stmts: HashMap::new(),
        }
    }

    /// The prepared form of `sql`, prepared once per connection.
    pub fn prep(&mut self, sql: &str) -> Result<Statement> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql).map_err(pg_err)?;
        self.stmts.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    pub fn query(&mut self, sql: &str, params: &[P<'_>]) -> Result<Vec<Row>> {
        let st = self.prep(sql)?;
        self.client.query(&st, params).map_err(pg_err)
    }

    pub fn opt(&mut self, sql: &str, params: &[P<'_>]) -> Result<Option<Row>> {
        let st = self.prep(sql)?;
        self.client.query_opt(&st, params).map_err(pg_err)
    }

    /// The one row of `sql`; `NotFound` when there is none.
    pub fn one(&mut self, sql: &str, params: &[P<'_>]) -> Result<Row> {
        self.opt(sql, params)?.ok_or(MetaError::NotFound)
    }

    pub fn exec(&mut self, sql: &str, params: &[P<'_>]) -> Result<u64> {
        let st = self.prep(sql)?;
        self.client.execute(&st, params).map_err(pg_err)
    }

    pub fn exists(&mut self, sql: &str, params: &[P<'_>]) -> Result<bool> {
        Ok(self.one(sql, params)?.get::<_, bool>(0))
    }

    pub fn i64(&mut self, sql: &str, params: &[P<'_>]) -> Result<i64> {
        Ok(self.one(sql, params)?.get::<_, i64>(0))
    }

    /// Runs statements without parameters (BEGIN, COMMIT, DDL) in one round trip.
    pub fn batch(&mut self, sql: &str) -> Result<()> {
        self.client.batch_execute(sql).map_err(pg_err)
    }
}

struct State {
    idle: Vec<PgConn>,
    open: usize,
}

pub struct Pool {
    config: postgres::Config,
    max: usize,
    wait: Duration,
    state: Mutex<State>,
    freed: Condvar,
}

impl Pool {
    pub fn new(config: postgres::Config, max: usize, wait: Duration) -> Pool {
        Pool {
            config,
            max: max.max(1),
            wait,
            state: Mutex::new(State {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
        }
    }

    /// A new connection outside the pool (LISTEN, administration).
    pub fn connect(&self) -> Result<Client> {
        self.config.connect(NoTls).map_err(pg_err)
    }

    /// An idle connection, or a new one while fewer than `max` are open; otherwise waits for
    /// one to come back (at most `wait`). The boolean says whether the connection was reused
    /// (and so may have died since its last use).
    pub fn get(&self) -> Result<(Pooled<'_>, bool)> {
        let deadline = Instant::now() + self.wait;
        let mut st = self.state.lock();
        loop {
            if let Some(c) = st.idle.pop() {
                return Ok((
                    Pooled {
                        pool: self,
                        conn: Some(c),
                        broken: false,
                    },
                    true,
                ));
            }
            if st.open < self.max {
                st.open += 1;
                drop(st);
                return match self.connect() {
                    Ok(client) => Ok((
                        Pooled {
                            pool: self,
                            conn: Some(PgConn::new(client)),
                            broken: false,
                        },
                        false,
                    )),
                    Err(e) => {
                        let mut st = self.state.lock();
                        st.open -= 1;
                        self.freed.notify_one();
                        Err(e)
                    }
                };
            }
            if self.freed.wait_until(&mut st, deadline).timed_out() {
                return Err(MetaError::Busy(0));
            }
        }
    }

    fn put(&self, conn: Option<PgConn>, broken: bool) {
        let mut st = self.state.lock();
        match conn {
            Some(c) if !broken && !c.client.is_closed() => st.idle.push(c),
            _ => st.open -= 1,
        }
        self.freed.notify_one();
    }

    /// Closes every idle connection (tests; after the database restarted).
    #[allow(dead_code)]
    pub fn clear(&self) {
        let mut st = self.state.lock();
        let n = st.idle.len();
        st.idle.clear();
        st.open -= n;
    }
}

/// A checked-out connection; goes back to the pool when dropped, unless marked broken.
pub struct Pooled<'a> {
    pool: &'a Pool,
    conn: Option<PgConn>,
    broken: bool,
}

impl Pooled<'_> {
    /// Drops the connection instead of returning it (its state is unknown after an error).
    pub fn discard(&mut self) {
        self.broken = true;
    }
}

impl Deref for Pooled<'_> {
    type Target = PgConn;
    fn deref(&self) -> &PgConn {
        self.conn.as_ref().expect("connection present until drop")
    }
}

impl DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut PgConn {
        self.conn.as_mut().expect("connection present until drop")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        self.pool.put(self.conn.take(), self.broken);
    }
}
