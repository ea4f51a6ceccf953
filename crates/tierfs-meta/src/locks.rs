//! Byte-range lock arithmetic shared by every engine: how one owner's locks change when it
//! takes, converts or releases a range (POSIX semantics: ranges split and merge).

use crate::types::{LockRange, LockType};

/// Whether two locks of different owners conflict.
pub fn conflicts(a: &LockRange, b: &LockRange) -> bool {
    let same_owner = a.session == b.session && a.owner == b.owner;
    !same_owner
        && a.flock == b.flock
        && a.start <= b.end
        && b.start <= a.end
        && (a.typ == LockType::Write || b.typ == LockType::Write)
}

/// The locks an owner holds after applying `new` to the ones it held (`own`, all of the same
/// owner and kind). Overlapped parts of older ranges are replaced; touching ranges of the same
/// type merge.
pub fn apply(own: &[LockRange], new: &LockRange) -> Vec<LockRange> {
    let mut out: Vec<LockRange> = Vec::with_capacity(own.len() + 2);
    for l in own {
        if l.end < new.start || l.start > new.end {
            out.push(l.clone());
            continue;
        }
        if l.start < new.start {
            let mut left = l.clone();
            left.end = new.start - 1;
            out.push(left);
        }
        if l.end > new.end {
            let mut right = l.clone();
            right.start = new.end + 1;
            out.push(right);
        }
    }
    if new.typ != LockType::Unlock {
        out.push(new.clone());
    }
    out.sort_by_key(|l| l.start);
    let mut merged: Vec<LockRange> = Vec::with_capacity(out.len());
    for l in out {
        if let Some(last) = merged.last_mut() {
            if last.typ == l.typ && last.end != u64::MAX && last.end + 1 >= l.start {
                last.end = last.end.max(l.end);
                continue;
            }
        }
        merged.push(l);
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lk(typ: LockType, start: u64, end: u64) -> LockRange {
        LockRange {
            session: 1,
            owner: 7,
            flock: false,
            typ,
            start,
            end,
            pid: 1,
        }
    }

    #[test]
    fn unlock_in_the_middle_splits() {
        let own = vec![lk(LockType::Write, 0, 99)];
        let out = apply(&own, &lk(LockType::Unlock, 10, 19));
        assert_eq!(
            out,
            vec![lk(LockType::Write, 0, 9), lk(LockType::Write, 20, 99)]
        );
    }

    #[test]
    fn adjacent_same_type_merges_and_conversion_splits() {
        let own = vec![lk(LockType::Read, 0, 9)];
        let out = apply(&own, &lk(LockType::Read, 10, 19));
        assert_eq!(out, vec![lk(LockType::Read, 0, 19)]);
        let out = apply(&out, &lk(LockType::Write, 5, 7));
        assert_eq!(
            out,
            vec![
                lk(LockType::Read, 0, 4),
                lk(LockType::Write, 5, 7),
                lk(LockType::Read, 8, 19)
            ]
        );
    }

    #[test]
    fn conflicts_only_between_owners_and_with_a_writer() {
        let a = lk(LockType::Read, 0, 10);
        let mut b = lk(LockType::Read, 5, 6);
        b.owner = 8;
        assert!(!conflicts(&a, &b));
        b.typ = LockType::Write;
        assert!(conflicts(&a, &b));
        b.owner = 7;
        assert!(!conflicts(&a, &b), "an owner never conflicts with itself");
        b.owner = 8;
        b.flock = true;
        assert!(!conflicts(&a, &b), "flock and POSIX locks are independent");
    }
}
