//! The metadata core: every metadata operation written once, over the SQL layer
//! ([`crate::sql`]), for every engine. [`SqlMeta<D>`] implements the domain traits of
//! [`crate::engine`] on top of a [`Driver`] (SQLite or PostgreSQL), which keeps only what is
//! the engine's own: connections, transactions and their retry classification, durability,
//! housekeeping and notifications. Every domain is ported: the engines hold no metadata
//! logic of their own any more.

pub mod admin;
pub mod changelog;
pub mod common;
pub mod data;
pub mod hsm;
pub mod locks;
pub mod namespace;
pub mod pcc;
pub mod schema;
pub mod session;
pub mod workers;

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::sql::Driver;
use crate::types::Ino;

/// The metadata engine: the shared core over driver `D`.
pub struct SqlMeta<D: Driver> {
    d: D,
    /// What directories handed down to the last files created in them, as those creates
    /// found it: the guess an RW-PCC create on PostgreSQL asks its rule about
    /// (`pcc::SqlMeta::pg_create_leased`). A hint only: a wrong one costs a transaction.
    handed: Mutex<HashMap<Ino, namespace::HandedDown>>,
}

impl<D: Driver> SqlMeta<D> {
    pub fn new(driver: D) -> SqlMeta<D> {
        SqlMeta {
            d: driver,
            handed: Mutex::new(HashMap::new()),
        }
    }

    /// The engine's driver (its own settings and tools: a path, a URL, the pool).
    pub fn driver(&self) -> &D {
        &self.d
    }

    /// The engine's driver, mutably (tests tune it).
    pub fn driver_mut(&mut self) -> &mut D {
        &mut self.d
    }
}

#[cfg(test)]
pub(crate) mod fault_tests;
#[cfg(test)]
pub(crate) mod upgrade_tests;
