//! Metadata URLs: `sqlite:///path/to/meta.db` (embedded) and
//! `postgres://user[:password]@host[:port]/db` or `postgresql://...` (cluster mode; without a
//! password in the URL, `PGPASSWORD` is used).

use std::path::PathBuf;
use std::sync::Arc;

use crate::engine::MetaEngine;
use crate::error::{MetaError, Result};
use crate::postgres::{PgMeta, PgUrl};
use crate::sqlite::SqliteMeta;
use crate::types::FormatParams;

/// A parsed metadata URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaUrl {
    Sqlite(PathBuf),
    /// Prints without its password.
    Postgres(PgUrl),
}

impl MetaUrl {
    pub fn parse(s: &str) -> Result<MetaUrl> {
        if let Some(rest) = s.strip_prefix("sqlite://") {
            if rest.is_empty() {
                return Err(MetaError::BadUrl(s.to_string()));
            }
            return Ok(MetaUrl::Sqlite(PathBuf::from(rest)));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            return Ok(MetaUrl::Postgres(PgUrl::parse(s)?));
        }
        Err(MetaError::BadUrl(crate::postgres::redact(s)))
    }
}

/// Opens an existing filesystem's metadata engine.
pub fn open_engine(url: &str) -> Result<Arc<dyn MetaEngine>> {
    match MetaUrl::parse(url)? {
        MetaUrl::Sqlite(p) => Ok(Arc::new(SqliteMeta::open(&p)?)),
        MetaUrl::Postgres(u) => Ok(Arc::new(PgMeta::open(u.secret())?)),
    }
}

/// The schema version of an existing filesystem, read without opening it as an engine (which
/// would upgrade an older schema): `None` when there is nothing formatted to read (the open
/// that follows then says what is wrong). For commands that must not upgrade a filesystem
/// behind the back of clients still running an older tierfs.
pub fn schema_version(url: &str) -> Result<Option<i64>> {
    match MetaUrl::parse(url)? {
        MetaUrl::Sqlite(p) => {
            if !p.exists() {
                return Ok(None);
            }
            let c = rusqlite::Connection::open_with_flags(
                &p,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(|e| MetaError::Db(format!("{}: {e}", p.display())))?;
            let v: i64 = c
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .map_err(|e| MetaError::Db(format!("{}: {e}", p.display())))?;
            Ok((v > 0).then_some(v))
        }
        MetaUrl::Postgres(u) => {
            let mut c = u
                .config()?
                .connect(postgres::NoTls)
                .map_err(|e| MetaError::Unavailable(format!("{u}: {e}")))?;
            let db = |e: postgres::Error| MetaError::Db(e.to_string());
            let exists: bool = c
                .query_one("SELECT to_regclass('schema_version') IS NOT NULL", &[])
                .map_err(db)?
                .get(0);
            if !exists {
                return Ok(None);
            }
            let row = c
                .query_opt("SELECT version FROM schema_version", &[])
                .map_err(db)?;
            Ok(row.map(|r| r.get::<_, i64>(0)))
        }
    }
}

/// Formats a new filesystem and returns its engine.
pub fn format_engine(url: &str, params: &FormatParams) -> Result<Arc<dyn MetaEngine>> {
    match MetaUrl::parse(url)? {
        MetaUrl::Sqlite(p) => Ok(Arc::new(SqliteMeta::format(&p, params)?)),
        MetaUrl::Postgres(u) => Ok(Arc::new(PgMeta::format(u.secret(), params)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sqlite_and_rejects_others() {
        assert_eq!(
            MetaUrl::parse("sqlite:///srv/m.db").unwrap(),
            MetaUrl::Sqlite(PathBuf::from("/srv/m.db"))
        );
        assert!(matches!(
            MetaUrl::parse("redis://x"),
            Err(MetaError::BadUrl(_))
        ));
        assert!(matches!(
            MetaUrl::parse("sqlite://"),
            Err(MetaError::BadUrl(_))
        ));
        assert!(matches!(
            MetaUrl::parse("/plain/path"),
            Err(MetaError::BadUrl(_))
        ));
    }

    #[test]
    fn parses_postgres_urls_and_hides_passwords() {
        for ok in [
            "postgres://tierfs@db1/tierfs",
            "postgresql://tierfs@db1:5433/tierfs",
            "postgres://tierfs:s3cret@10.0.0.1/fs",
        ] {
            let u = MetaUrl::parse(ok).unwrap();
            assert!(matches!(u, MetaUrl::Postgres(_)), "{ok}");
            let shown = format!("{u:?}");
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        let MetaUrl::Postgres(u) = MetaUrl::parse("postgres://a:s3cret@h/db").unwrap() else {
            unreachable!()
        };
        assert_eq!(u.to_string(), "postgres://a:***@h/db");
        assert_eq!(u.secret(), "postgres://a:s3cret@h/db");
        for bad in [
            "postgres://",
            "postgres://u@h",
            "postgres://u:s3cret@h:notaport/db",
        ] {
            match MetaUrl::parse(bad) {
                Err(MetaError::BadUrl(m)) => assert!(!m.contains("s3cret"), "{m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
