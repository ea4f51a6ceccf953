//! POSIX access control lists (`system.posix_acl_access`, `system.posix_acl_default`), kept as
//! the kernel's binary xattr format (a little-endian u32 version 2, then 8-byte entries: u16
//! tag, u16 permissions, u32 uid or gid) in the file's extended attributes.
//!
//! With `FUSE_POSIX_ACL` the kernel reads them and enforces access; the daemon does the rest, as
//! ext4 does with the same rules (fs/posix_acl.c): an access ACL sets the mode's permission bits
//! (and is stored only when the mode cannot say it all), chmod rewrites the ACL's owner,
//! mask (or group) and other entries, and a new inode in a directory with a default ACL takes
//! it as its access ACL masked by the mode asked for (no umask), directories as their default
//! ACL too.

use thiserror::Error;

pub const ACCESS: &[u8] = b"system.posix_acl_access";
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const HEADER: usize = 4;
const ENTRY: usize = 8;
pub const USER_OBJ: u16 = 0x01;
pub const USER: u16 = 0x02;
pub const GROUP_OBJ: u16 = 0x04;
pub const GROUP: u16 = 0x08;
pub const MASK: u16 = 0x10;
pub const OTHER: u16 = 0x20;
/// The id of the entries that name no user or group.
const UNDEFINED_ID: u32 = u32::MAX;
/// Most entries an ACL may have (as the kernel's xattr size limit allows).
const MAX_ENTRIES: usize = (65536 - HEADER) / ENTRY;

/// A malformed ACL: the caller gets EINVAL.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum AclError {
    #[error("ACL: {0} bytes is not a header and whole entries")]
    Size(usize),
    #[error("ACL: version {0}, expected 2")]
    Version(u32),
    #[error("ACL: unknown tag {0:#x}")]
    Tag(u16),
    #[error("ACL: permissions {0:#o} beyond rwx")]
    Perm(u16),
    #[error("ACL: entries out of order or repeated")]
    Order,
    #[error("ACL: a user-owner, group-owner and other entry are required")]
    Missing,
    #[error("ACL: named users or groups need a mask entry")]
    NoMask,
}

impl AclError {
    pub fn errno(&self) -> i32 {
        libc::EINVAL
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// A valid ACL: entries in the kernel's order (user owner, named users by uid, group owner,
/// named groups by gid, mask, other).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Decodes and validates an xattr value; `None` for an ACL of no entries (the kernel's way
    /// of saying "remove it").
    pub fn decode(b: &[u8]) -> Result<Option<Acl>, AclError> {
        if b.len() < HEADER || !(b.len() - HEADER).is_multiple_of(ENTRY) {
            return Err(AclError::Size(b.len()));
        }
        let n = (b.len() - HEADER) / ENTRY;
        if n > MAX_ENTRIES {
            return Err(AclError::Size(b.len()));
        }
        let version = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if version != VERSION {
            return Err(AclError::Version(version));
        }
        if n == 0 {
            return Ok(None);
        }
        let entries = b[HEADER..]
            .chunks_exact(ENTRY)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        let acl = Acl { entries };
        acl.validate()?;
        Ok(Some(acl))
    }

    /// The kernel's posix_acl_valid: each kind of entry in its place, named entries sorted and
    /// unique, a mask when there are named entries.
    fn validate(&self) -> Result<(), AclError> {
        let rank = |tag| match tag {
            USER_OBJ => Ok(0),
            USER => Ok(1),
            GROUP_OBJ => Ok(2),
            GROUP => Ok(3),
            MASK => Ok(4),
            OTHER => Ok(5),
            t => Err(AclError::Tag(t)),
        };
        let mut prev: Option<(u8, u32)> = None;
        let (mut user_obj, mut group_obj, mut other, mut mask, mut named) =
            (false, false, false, false, false);
        for e in &self.entries {
            let r = rank(e.tag)?;
            if e.perm & !7 != 0 {
                return Err(AclError::Perm(e.perm));
            }
            let named_entry = e.tag == USER || e.tag == GROUP;
            let key = (r, if named_entry { e.id } else { 0 });
            if let Some(p) = prev {
                // strictly increasing: one of each unnamed kind, named ones by id
                if key <= p {
                    return Err(AclError::Order);
                }
            }
            prev = Some(key);
            match e.tag {
                USER_OBJ => user_obj = true,
                GROUP_OBJ => group_obj = true,
                OTHER => other = true,
                MASK => mask = true,
                _ => named = true,
            }
        }
        if !(user_obj && group_obj && other) {
            return Err(AclError::Missing);
        }
        if named && !mask {
            return Err(AclError::NoMask);
        }
        Ok(())
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER + ENTRY * self.entries.len());
        b.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            b.extend_from_slice(&e.tag.to_le_bytes());
            b.extend_from_slice(&e.perm.to_le_bytes());
            let id = if e.tag == USER || e.tag == GROUP {
                e.id
            } else {
                UNDEFINED_ID
            };
            b.extend_from_slice(&id.to_le_bytes());
        }
        b
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    fn perm_of(&self, tag: u16) -> Option<u32> {
        self.entries
            .iter()
            .find(|e| e.tag == tag)
            .map(|e| e.perm as u32)
    }

    /// The permission bits (0o777) the mode shows for this ACL: owner, mask (or group owner
    /// when there is no mask), other.
    pub fn mode_bits(&self) -> u32 {
        let u = self.perm_of(USER_OBJ).unwrap_or(0);
        let g = self
            .perm_of(MASK)
            .or_else(|| self.perm_of(GROUP_OBJ))
            .unwrap_or(0);
        let o = self.perm_of(OTHER).unwrap_or(0);
        (u << 6) | (g << 3) | o
    }

    /// Whether the mode says all this ACL says (only the three owner/group/other entries): then
    /// it is stored as the mode alone.
    pub fn is_mode(&self) -> bool {
        self.entries
            .iter()
            .all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER))
    }

    /// chmod (posix_acl_chmod): the owner, mask (or group owner) and other entries take the
    /// new mode's bits; named entries are kept.
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.entries.iter().any(|e| e.tag == MASK);
        for e in &mut self.entries {
            match e.tag {
                USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
                MASK => e.perm = ((mode >> 3) & 7) as u16,
                GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
                OTHER => e.perm = (mode & 7) as u16,
                _ => {}
            }
        }
    }

    /// A new inode's access ACL from its directory's default ACL (posix_acl_create_masq): the
    /// owner, mask (or group owner) and other entries are limited by the mode asked for, and
    /// the mode's permission bits by them. Returns the mode (the bits above 0o777 kept).
    pub fn create_masq(&mut self, mode: u32) -> u32 {
        let mut m = mode & 0o777;
        let has_mask = self.entries.iter().any(|e| e.tag == MASK);
        for e in &mut self.entries {
            match e.tag {
                USER_OBJ => {
                    e.perm &= ((m >> 6) & 7) as u16;
                    m = (m & !0o700) | ((e.perm as u32) << 6);
                }
                OTHER => {
                    e.perm &= (m & 7) as u16;
                    m = (m & !0o007) | e.perm as u32;
                }
                MASK => {
                    e.perm &= ((m >> 3) & 7) as u16;
                }
                GROUP_OBJ if !has_mask => {
                    e.perm &= ((m >> 3) & 7) as u16;
                }
                _ => {}
            }
        }
        let g = self
            .perm_of(MASK)
            .or_else(|| self.perm_of(GROUP_OBJ))
            .unwrap_or(0);
        m = (m & !0o070) | (g << 3);
        (mode & !0o777) | m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut b = VERSION.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            b.extend_from_slice(&tag.to_le_bytes());
            b.extend_from_slice(&perm.to_le_bytes());
            b.extend_from_slice(&id.to_le_bytes());
        }
        b
    }

    const U: u32 = UNDEFINED_ID;

    #[test]
    fn decode_encode_round_trip() {
        let b = acl(&[
            (USER_OBJ, 7, U),
            (USER, 6, 1000),
            (USER, 4, 1001),
            (GROUP_OBJ, 5, U),
            (GROUP, 1, 2000),
            (MASK, 7, U),
            (OTHER, 0, U),
        ]);
        let a = Acl::decode(&b).unwrap().unwrap();
        assert_eq!(a.entries().len(), 7);
        assert_eq!(a.encode(), b);
        assert!(!a.is_mode());
        assert_eq!(a.mode_bits(), 0o770);
    }

    #[test]
    fn mode_only_acl() {
        let a = Acl::decode(&acl(&[(USER_OBJ, 6, U), (GROUP_OBJ, 4, U), (OTHER, 4, U)]))
            .unwrap()
            .unwrap();
        assert!(a.is_mode());
        assert_eq!(a.mode_bits(), 0o644);
        // a mask alone makes it more than a mode (the group owner's bits hide behind it)
        let a = Acl::decode(&acl(&[
            (USER_OBJ, 6, U),
            (GROUP_OBJ, 6, U),
            (MASK, 4, U),
            (OTHER, 4, U),
        ]))
        .unwrap()
        .unwrap();
        assert!(!a.is_mode());
        assert_eq!(a.mode_bits(), 0o644);
    }

    #[test]
    fn empty_acl_means_remove() {
        assert_eq!(Acl::decode(&acl(&[])), Ok(None));
    }

    #[test]
    fn malformed_acls_are_rejected() {
        let ok = [(USER_OBJ, 6, U), (GROUP_OBJ, 4, U), (OTHER, 4, U)];
        let cases: Vec<(Vec<u8>, AclError)> = vec![
            (vec![2, 0, 0], AclError::Size(3)),
            (acl(&ok)[..10].to_vec(), AclError::Size(10)),
            (
                {
                    let mut b = acl(&ok);
                    b[0] = 1;
                    b
                },
                AclError::Version(1),
            ),
            (
                acl(&[(USER_OBJ, 6, U), (0x40, 4, U), (OTHER, 4, U)]),
                AclError::Tag(0x40),
            ),
            (
                acl(&[(USER_OBJ, 8, U), (GROUP_OBJ, 4, U), (OTHER, 4, U)]),
                AclError::Perm(8),
            ),
            (
                acl(&[(GROUP_OBJ, 4, U), (USER_OBJ, 6, U), (OTHER, 4, U)]),
                AclError::Order,
            ),
            (
                acl(&[
                    (USER_OBJ, 6, U),
                    (USER_OBJ, 6, U),
                    (GROUP_OBJ, 4, U),
                    (OTHER, 4, U),
                ]),
                AclError::Order,
            ),
            (
                acl(&[
                    (USER_OBJ, 6, U),
                    (USER, 6, 1001),
                    (USER, 6, 1000),
                    (GROUP_OBJ, 4, U),
                    (MASK, 6, U),
                    (OTHER, 4, U),
                ]),
                AclError::Order,
            ),
            (
                acl(&[
                    (USER_OBJ, 6, U),
                    (USER, 6, 1000),
                    (USER, 6, 1000),
                    (GROUP_OBJ, 4, U),
                    (MASK, 6, U),
                    (OTHER, 4, U),
                ]),
                AclError::Order,
            ),
            (acl(&[(USER_OBJ, 6, U), (OTHER, 4, U)]), AclError::Missing),
            (
                acl(&[
                    (USER_OBJ, 6, U),
                    (USER, 6, 1000),
                    (GROUP_OBJ, 4, U),
                    (OTHER, 4, U),
                ]),
                AclError::NoMask,
            ),
        ];
        for (b, want) in cases {
            assert_eq!(Acl::decode(&b), Err(want.clone()), "{b:?}");
            assert_eq!(want.errno(), libc::EINVAL);
        }
    }

    #[test]
    fn chmod_updates_owner_mask_other() {
        let mut a = Acl::decode(&acl(&[
            (USER_OBJ, 7, U),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, U),
            (MASK, 7, U),
            (OTHER, 5, U),
        ]))
        .unwrap()
        .unwrap();
        a.chmod(0o640);
        let perms: Vec<(u16, u16)> = a.entries().iter().map(|e| (e.tag, e.perm)).collect();
        assert_eq!(
            perms,
            vec![
                (USER_OBJ, 6),
                (USER, 7),
                (GROUP_OBJ, 5),
                (MASK, 4),
                (OTHER, 0)
            ],
            "the mask, not the group owner, takes the group bits; named entries stay"
        );
        assert_eq!(a.mode_bits(), 0o640);
        let mut b = Acl::decode(&acl(&[(USER_OBJ, 7, U), (GROUP_OBJ, 5, U), (OTHER, 5, U)]))
            .unwrap()
            .unwrap();
        b.chmod(0o751);
        assert_eq!(b.mode_bits(), 0o751);
    }

    #[test]
    fn create_masq_like_the_kernel() {
        // default u::rwx,u:1000:rwx,g::r-x,m::rwx,o::r-x; open(0666) -> rw-rw-r--, mask rw-
        let d = Acl::decode(&acl(&[
            (USER_OBJ, 7, U),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, U),
            (MASK, 7, U),
            (OTHER, 5, U),
        ]))
        .unwrap()
        .unwrap();
        let mut a = d.clone();
        assert_eq!(a.create_masq(0o100666), 0o100664);
        let perms: Vec<u16> = a.entries().iter().map(|e| e.perm).collect();
        assert_eq!(perms, vec![6, 7, 5, 6, 4]);
        // mkdir(0777) keeps the default's bits
        let mut a = d.clone();
        assert_eq!(a.create_masq(0o40777), 0o40775);
        // without a mask the group owner is masked
        let mut b = Acl::decode(&acl(&[(USER_OBJ, 7, U), (GROUP_OBJ, 7, U), (OTHER, 0, U)]))
            .unwrap()
            .unwrap();
        assert_eq!(b.create_masq(0o4750), 0o4750);
        assert!(b.is_mode());
        assert_eq!(b.mode_bits(), 0o750);
    }
}
