//! Object naming. Each slice of file data is one immutable object, named by its object id:
//! `objects/<id / 65536>/<id>`, so no directory of a local target grows past 65536 entries.

use object_store::path::Path;

pub fn object_path(obj: u64) -> Path {
    Path::from(format!("objects/{}/{}", obj >> 16, obj))
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_spread_over_directories() {
        assert_eq!(super::object_path(5).as_ref(), "objects/0/5");
        assert_eq!(
            super::object_path(65536 * 3 + 1).as_ref(),
            "objects/3/196609"
        );
    }
}
