//! Plain data types shared by the cache, the backends and the front ends.

use serde::{Deserialize, Serialize};

/// Largest file name component, as Linux's NAME_MAX.
pub const NAME_MAX: usize = 255;
/// Largest path, including the terminating NUL, as Linux's PATH_MAX.
pub const PATH_MAX: usize = 4096;
/// Most symbolic links followed in one lookup, as Linux (ELOOP after 40).
pub const MAX_SYMLINKS: u32 = 40;

/// A point in time as the kernel stores it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

/// The type of a file, from the `S_IFMT` bits of its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileType {
    Regular,
    Directory,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

impl FileType {
    /// The type encoded in a `st_mode` value.
    pub fn from_mode(mode: u32) -> FileType {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FileType::Directory,
            libc::S_IFLNK => FileType::Symlink,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFBLK => FileType::BlockDevice,
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFSOCK => FileType::Socket,
            _ => FileType::Regular,
        }
    }

    /// The `S_IFMT` bits for this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => libc::S_IFREG,
            FileType::Directory => libc::S_IFDIR,
            FileType::Symlink => libc::S_IFLNK,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::BlockDevice => libc::S_IFBLK,
            FileType::Fifo => libc::S_IFIFO,
            FileType::Socket => libc::S_IFSOCK,
        }
    }

    /// The `d_type` value getdents64 reports for this type.
    pub fn dtype(self) -> u8 {
        match self {
            FileType::Regular => libc::DT_REG,
            FileType::Directory => libc::DT_DIR,
            FileType::Symlink => libc::DT_LNK,
            FileType::CharDevice => libc::DT_CHR,
            FileType::BlockDevice => libc::DT_BLK,
            FileType::Fifo => libc::DT_FIFO,
            FileType::Socket => libc::DT_SOCK,
        }
    }
}

/// File attributes, as `statx` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Attr {
    pub ino: u64,
    /// Device of the file system holding the file.
    pub dev: u64,
    /// Type and permission bits (`st_mode`).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    pub blocks: u64,
    pub blksize: u32,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// Which file this is, beyond `(dev, ino)`: a nonzero digest of statx's birth time
    /// (STATX_BTIME), 0 when the file system gives none. Not shown to programs: it tells a
    /// new file that reused a removed one's inode number from that one ([`Attr::same_birth`]).
    pub birth: u32,
}

/// The [`Attr::birth`] of a birth time: a nonzero 32-bit digest.
pub fn birth_digest(sec: i64, nsec: u32) -> u32 {
    let h = (sec as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(17)
        ^ u64::from(nsec).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    ((h ^ (h >> 32)) as u32).max(1)
}

impl Attr {
    /// The attributes statx(2) reported (the one conversion every crate uses).
    pub fn from_statx(s: &rustix::fs::Statx) -> Attr {
        let ts = |t: &rustix::fs::StatxTimestamp| Timespec {
            sec: t.tv_sec,
            nsec: t.tv_nsec,
        };
        Attr {
            ino: s.stx_ino,
            dev: rustix::fs::makedev(s.stx_dev_major, s.stx_dev_minor),
            mode: u32::from(s.stx_mode),
            nlink: s.stx_nlink,
            uid: s.stx_uid,
            gid: s.stx_gid,
            rdev: rustix::fs::makedev(s.stx_rdev_major, s.stx_rdev_minor),
            size: s.stx_size,
            blocks: s.stx_blocks,
            blksize: s.stx_blksize,
            atime: ts(&s.stx_atime),
            mtime: ts(&s.stx_mtime),
            ctime: ts(&s.stx_ctime),
            birth: if s.stx_mask & rustix::fs::StatxFlags::BTIME.bits() != 0 {
                birth_digest(s.stx_btime.tv_sec, s.stx_btime.tv_nsec)
            } else {
                0
            },
        }
    }

    /// Whether `self` and `other` (both of inode `(dev, ino)`) can be the same file: the same
    /// birth time, or one of them unknown. ext4 gives a removed file's inode number to the
    /// next new file at once; the birth time tells them apart unless both were made within
    /// one tick of the file system's clock (new inodes get the coarse time, 4 ms at HZ=250).
    pub fn same_birth(a: u32, b: u32) -> bool {
        a == b || a == 0 || b == 0
    }

    pub fn kind(&self) -> FileType {
        FileType::from_mode(self.mode)
    }
    pub fn is_dir(&self) -> bool {
        self.kind() == FileType::Directory
    }
    /// Permission bits only (`mode & 07777`).
    pub fn perm(&self) -> u32 {
        self.mode & 0o7777
    }
}

/// One entry of a directory listing. `attr` is present when the backend (or the cache)
/// knows it, as with readdirplus; entries learned only from a plain readdir have none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub kind: FileType,
    pub ino: u64,
    pub attr: Option<Attr>,
}

/// How to set a timestamp: `None` in [`SetAttr`] is UTIME_OMIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSet {
    /// UTIME_NOW.
    Now,
    At(Timespec),
}

/// The changes of one setattr call (chmod, chown, truncate, utimens). `None` leaves a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

impl SetAttr {
    /// Whether this change can alter who may search a directory (mode, owner or group).
    pub fn changes_permissions(&self) -> bool {
        self.mode.is_some() || self.uid.is_some() || self.gid.is_some()
    }
}

/// The flavour of a rename, as renameat2(2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum RenameMode {
    /// Replace the target if it exists (rename(2)).
    #[default]
    Replace,
    /// RENAME_NOREPLACE: fail with EEXIST if the target exists.
    NoReplace,
    /// RENAME_EXCHANGE: swap source and target atomically; both must exist.
    Exchange,
    /// RENAME_WHITEOUT: as `Replace`, and leave a whiteout (a 0/0 character device) at the
    /// source name (overlayfs uses it; the caller needs CAP_MKNOD).
    Whiteout,
    /// RENAME_WHITEOUT | RENAME_NOREPLACE.
    WhiteoutNoReplace,
}

impl RenameMode {
    /// Whether a whiteout is left at the source name.
    pub fn whiteout(self) -> bool {
        matches!(self, RenameMode::Whiteout | RenameMode::WhiteoutNoReplace)
    }

    /// The mode without the whiteout: what the checks on source and target follow.
    pub fn base(self) -> RenameMode {
        match self {
            RenameMode::Whiteout => RenameMode::Replace,
            RenameMode::WhiteoutNoReplace => RenameMode::NoReplace,
            m => m,
        }
    }
}

/// How a path lookup treats its final component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LookupFlags {
    /// Follow a symbolic link in the final component (stat rather than lstat).
    pub follow: bool,
    /// The final component must be a directory (as a trailing slash demands).
    pub directory: bool,
}

impl LookupFlags {
    pub const FOLLOW: LookupFlags = LookupFlags {
        follow: true,
        directory: false,
    };
    pub const NOFOLLOW: LookupFlags = LookupFlags {
        follow: false,
        directory: false,
    };
}

/// Access mask bits, as access(2).
pub const R_OK: u32 = 4;
pub const W_OK: u32 = 2;
pub const X_OK: u32 = 1;

/// File-system statistics (statfs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}
