//! The changelog domain (records written in the same transaction as each change, registered
//! readers). Owned by the changelog work; empty until then.

use super::SqlMeta;
use crate::engine::Changelog;
use crate::sql::Driver;

impl<D: Driver> Changelog for SqlMeta<D> {}
