//! Metadata URLs: `sqlite:///path/to/meta.db` (PostgreSQL follows in cluster mode).

use std::path::PathBuf;
use std::sync::Arc;

use crate::engine::MetaEngine;
use crate::error::{MetaError, Result};
use crate::sqlite::SqliteEngine;
use crate::types::FormatParams;

/// A parsed metadata URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaUrl {
    Sqlite(PathBuf),
}

impl MetaUrl {
    pub fn parse(s: &str) -> Result<MetaUrl> {
        if let Some(rest) = s.strip_prefix("sqlite://") {
            if rest.is_empty() {
                return Err(MetaError::BadUrl(s.to_string()));
            }
            return Ok(MetaUrl::Sqlite(PathBuf::from(rest)));
        }
        Err(MetaError::BadUrl(s.to_string()))
    }
}

/// Opens an existing filesystem's metadata engine.
pub fn open_engine(url: &str) -> Result<Arc<dyn MetaEngine>> {
    match MetaUrl::parse(url)? {
        MetaUrl::Sqlite(p) => Ok(Arc::new(SqliteEngine::open(&p)?)),
    }
}

/// Formats a new filesystem and returns its engine.
pub fn format_engine(url: &str, params: &FormatParams) -> Result<Arc<dyn MetaEngine>> {
    match MetaUrl::parse(url)? {
        MetaUrl::Sqlite(p) => Ok(Arc::new(SqliteEngine::format(&p, params)?)),
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
}
