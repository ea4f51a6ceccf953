//! A failure-injecting [`Driver`]: wraps a real driver and makes the Nth statement from now
//! fail, as a lost connection, a busy database, a database error, or after a delay (a slow
//! server). `SqlMeta<FaultDriver<D>>` is then a whole metadata engine whose failures tests
//! choose, to check that errors reach the caller with the right errno and that a failed
//! transaction leaves nothing half done.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::{Dialect, Driver, Row, Tx, Value};
use crate::engine::{Channel, Listener};
use crate::error::{MetaError, Result};

/// What an injected fault does.
#[derive(Clone, Debug)]
pub enum Fault {
    /// The connection is lost (`Unavailable`, EIO).
    Disconnect,
    /// The database is busy or the transaction conflicts (`Busy`): the driver's own retry
    /// classification sees it, so a write is retried.
    Busy,
    /// Any other database error (`Db`, EIO).
    Error,
    /// The statement takes this long, then runs.
    Delay(Duration),
}

/// A driver whose statements fail on demand; see the module doc.
pub struct FaultDriver<D: Driver> {
    inner: D,
    /// Statements run since the driver was made.
    count: AtomicU64,
    /// (statement number counted from 1, fault): each fires once.
    plan: Mutex<Vec<(u64, Fault)>>,
}

impl<D: Driver> FaultDriver<D> {
    pub fn new(inner: D) -> FaultDriver<D> {
        FaultDriver {
            inner,
            count: AtomicU64::new(0),
            plan: Mutex::new(Vec::new()),
        }
    }

    /// The wrapped driver.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Statements run so far (through `Tx`; not BEGIN/COMMIT, which the inner driver sends).
    pub fn statements(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Makes the `n`th statement from now (1: the next one) fail with `fault`.
    pub fn fail_in(&self, n: u64, fault: Fault) {
        let at = self.statements() + n.max(1);
        self.plan.lock().push((at, fault));
    }

    /// Faults planned that have not fired yet.
    pub fn pending(&self) -> usize {
        self.plan.lock().len()
    }

    /// Drops every planned fault that has not fired.
    pub fn clear(&self) {
        self.plan.lock().clear();
    }

    /// Counts one statement; the fault planned for it, if any.
    fn next(&self) -> Option<Fault> {
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        let mut plan = self.plan.lock();
        let i = plan.iter().position(|(at, _)| *at == n)?;
        Some(plan.remove(i).1)
    }
}

/// A transaction of a [`FaultDriver`].
struct FaultTx<'a, D: Driver> {
    tx: &'a mut dyn Tx,
    d: &'a FaultDriver<D>,
}

impl<D: Driver> FaultTx<'_, D> {
    fn check(&self) -> Result<()> {
        match self.d.next() {
            None => Ok(()),
            Some(Fault::Disconnect) => Err(MetaError::Unavailable(
                "injected fault: connection lost".into(),
            )),
            Some(Fault::Busy) => Err(MetaError::Busy(0)),
            Some(Fault::Error) => Err(MetaError::Db("injected fault".into())),
            Some(Fault::Delay(t)) => {
                std::thread::sleep(t);
                Ok(())
            }
        }
    }
}

impl<D: Driver> Tx for FaultTx<'_, D> {
    fn dialect(&self) -> &Dialect {
        self.tx.dialect()
    }
    fn exec(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        self.check()?;
        self.tx.exec(sql, params)
    }
    fn query_each(
        &mut self,
        sql: &str,
        params: &[Value],
        f: &mut dyn FnMut(Row) -> Result<()>,
    ) -> Result<()> {
        self.check()?;
        self.tx.query_each(sql, params, f)
    }
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>> {
        self.check()?;
        self.tx.query(sql, params)
    }
    fn query_opt(&mut self, sql: &str, params: &[Value]) -> Result<Option<Row>> {
        self.check()?;
        self.tx.query_opt(sql, params)
    }
    fn insert_id(&mut self, sql: &str, params: &[Value], id_col: &str) -> Result<i64> {
        self.check()?;
        self.tx.insert_id(sql, params, id_col)
    }
    fn batch(&mut self, sql: &str) -> Result<()> {
        self.check()?;
        self.tx.batch(sql)
    }
    fn notify(&mut self, channel: &str, payload: &str) -> Result<()> {
        self.check()?;
        self.tx.notify(channel, payload)
    }
}

impl<D: Driver> Driver for FaultDriver<D> {
    fn dialect(&self) -> &Dialect {
        self.inner.dialect()
    }
    fn write_commit<T>(
        &self,
        mut f: impl FnMut(&mut dyn Tx) -> Result<Result<T>>,
    ) -> Result<Result<T>> {
        self.inner
            .write_commit(|tx| f(&mut FaultTx { tx, d: self }))
    }
    fn write_one<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.inner.write_one(|tx| f(&mut FaultTx { tx, d: self }))
    }
    fn write_once<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.inner.write_once(|tx| f(&mut FaultTx { tx, d: self }))
    }
    fn read<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.inner.read(|tx| f(&mut FaultTx { tx, d: self }))
    }
    fn exclusive<T>(&self, mut f: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        self.inner.exclusive(|tx| f(&mut FaultTx { tx, d: self }))
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
    fn maintain(&self) -> Result<()> {
        self.inner.maintain()
    }
    fn listen(&self, client: &str, channels: &[Channel]) -> Result<Option<Box<dyn Listener>>> {
        self.inner.listen(client, channels)
    }
}
