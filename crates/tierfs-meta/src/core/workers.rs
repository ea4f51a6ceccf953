//! The workers domain (reports of the clients' background workers). Owned by the workers
//! work; empty until then.

use super::SqlMeta;
use crate::engine::Workers;
use crate::sql::Driver;

impl<D: Driver> Workers for SqlMeta<D> {}
