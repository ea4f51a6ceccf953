//! Object naming. Each slice of file data is one immutable object, named by its object id:
//! `objects/<id / 65536>/<id>`, so no directory of a local target grows past 65536 entries.

use object_store::path::Path;

pub fn object_path(obj: u64) -> Path {
    Path::from(format!("objects/{}/{}", obj >> 16, obj))
}

/// The object id a path under a target names (`objects/<id / 65536>/<id>`), or `None` for any
/// other name (a target's own marker files, foreign files): those are never tierfs objects.
pub fn parse_object_path(path: &str) -> Option<u64> {
    let rest = path.strip_prefix("objects/")?;
    let (dir, name) = rest.split_once('/')?;
    let id = parse_id(name)?;
    (parse_id(dir)? == id >> 16).then_some(id)
}

/// A decimal id as tierfs writes it (digits only, no sign, no leading zero).
pub(crate) fn parse_id(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_only_object_names() {
        use super::parse_object_path as p;
        assert_eq!(p("objects/0/5"), Some(5));
        assert_eq!(p("objects/3/196609"), Some(196609));
        assert_eq!(p("objects/2/196609"), None);
        assert_eq!(p("objects/0/05"), None);
        assert_eq!(p("objects/0/5#1"), None);
        assert_eq!(p("objects/0/5/6"), None);
        assert_eq!(p(".tierfs-target"), None);
        assert_eq!(p("objects/x/5"), None);
    }

    #[test]
    fn names_spread_over_directories() {
        assert_eq!(super::object_path(5).as_ref(), "objects/0/5");
        assert_eq!(
            super::object_path(65536 * 3 + 1).as_ref(),
            "objects/3/196609"
        );
    }
}
