//! Inode numbers read out of the file handles fanotify reports, without asking the kernel.
//!
//! A file handle is opaque in general, but the file systems a source tree usually lives on
//! encode the inode number plainly: ext2/3/4 and XFS (`FILEID_INO32_GEN`: 32-bit inode,
//! generation; XFS's 64-bit form: 64-bit inode, generation), tmpfs (generation, then the
//! 64-bit inode number in two halves), and the kernel's generic `FILEID_INO64_GEN` for file
//! systems without export operations. The change feed uses the decoded number to drop events
//! about inodes the backend never served as hard-linked without an `open_by_handle_at`
//! (`watch.rs`). A layout is trusted only for the file system types listed here, and only
//! after the handle of the mount's root decodes to the root's own inode number
//! ([`Codec::for_fd`]); any other file system has no codec and the feed asks the kernel.

use std::os::fd::{AsRawFd, BorrowedFd};

const EXT4_SUPER_MAGIC: i64 = 0xEF53;
const XFS_SUPER_MAGIC: i64 = 0x5846_5342;
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// `FILEID_INO32_GEN`.
const INO32_GEN: i32 = 1;
/// `FILEID_INO64_GEN` (also XFS's `XFS_FILEID_TYPE_64FLAG | FILEID_INO32_GEN`).
const INO64_GEN: i32 = 0x81;

/// How one file system lays out the inode number in its handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    /// ext2/3/4, XFS: `{u32 ino, u32 gen}` (type 1) or `{u64 ino, u32 gen}` (type 0x81).
    Ino32Gen,
    /// tmpfs: `{u32 gen, u32 ino_lo, u32 ino_hi}` (type 1).
    Shmem,
}

fn u32_at(f: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(f.get(i..i + 4)?.try_into().ok()?))
}

fn u64_at(f: &[u8], i: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(f.get(i..i + 8)?.try_into().ok()?))
}

impl Codec {
    /// The inode number in `h`, a `struct file_handle` as fanotify reports it
    /// (`u32 handle_bytes`, `i32 handle_type`, the handle), if this codec knows its layout.
    pub(crate) fn ino(self, h: &[u8]) -> Option<u64> {
        let len = u32_at(h, 0)? as usize;
        let ty = i32::from_ne_bytes(h.get(4..8)?.try_into().ok()?);
        let f = h.get(8..8usize.checked_add(len)?)?;
        match (self, ty, len) {
            (Codec::Ino32Gen, INO32_GEN, 8) => u32_at(f, 0).map(u64::from),
            (Codec::Ino32Gen | Codec::Shmem, INO64_GEN, 12) => u64_at(f, 0),
            (Codec::Shmem, INO32_GEN, 12) => {
                Some(u64::from(u32_at(f, 4)?) | (u64::from(u32_at(f, 8)?) << 32))
            }
            _ => None,
        }
    }

    /// The codec of the file system `fd` is on, if it is one of the known types and the
    /// handle of `fd` itself decodes to its inode number.
    pub(crate) fn for_fd(fd: BorrowedFd<'_>) -> Option<Codec> {
        // SAFETY: statfs is plain old data; zeroed is a valid value.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is live and `st` is a writable statfs.
        if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
            return None;
        }
        #[allow(clippy::unnecessary_cast)] // f_type's width differs between architectures
        let codec = match st.f_type as i64 {
            EXT4_SUPER_MAGIC | XFS_SUPER_MAGIC => Codec::Ino32Gen,
            TMPFS_MAGIC => Codec::Shmem,
            _ => return None,
        };
        let want = rustix::fs::statx(
            fd,
            c"",
            rustix::fs::AtFlags::EMPTY_PATH,
            rustix::fs::StatxFlags::INO,
        )
        .ok()?
        .stx_ino;
        let h = handle_of(fd)?;
        (codec.ino(&h) == Some(want)).then_some(codec)
    }
}

/// The handle of the object `fd` refers to, encoded as fanotify encodes it (`AT_HANDLE_FID`),
/// as a `struct file_handle` in bytes.
fn handle_of(fd: BorrowedFd<'_>) -> Option<Vec<u8>> {
    const MAX: usize = 128; // MAX_HANDLE_SZ
    let mut buf = vec![0u64; (8 + MAX) / 8];
    // handle_bytes: the room for the handle.
    let room = (MAX as u32).to_ne_bytes();
    // SAFETY: `buf` has 8 + MAX bytes; we write its first four.
    unsafe { std::ptr::copy_nonoverlapping(room.as_ptr(), buf.as_mut_ptr().cast::<u8>(), 4) };
    let mut mnt: libc::c_int = 0;
    // SAFETY: `fd` is live, the path is an empty C string, `buf` is an 8-byte aligned
    // file_handle with handle_bytes = MAX and MAX bytes of room, `mnt` is writable.
    let r = unsafe {
        libc::name_to_handle_at(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast::<libc::file_handle>(),
            &mut mnt,
            libc::AT_EMPTY_PATH | libc::AT_HANDLE_FID,
        )
    };
    if r != 0 {
        return None;
    }
    // SAFETY: `buf` is 8 + MAX initialised bytes.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), 8 + MAX) };
    let len = u32_at(bytes, 0)? as usize;
    bytes.get(..8 + len).map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fh(ty: i32, words: &[u32]) -> Vec<u8> {
        let mut v = ((words.len() * 4) as u32).to_ne_bytes().to_vec();
        v.extend_from_slice(&ty.to_ne_bytes());
        for w in words {
            v.extend_from_slice(&w.to_ne_bytes());
        }
        v
    }

    #[test]
    fn layouts() {
        assert_eq!(Codec::Ino32Gen.ino(&fh(1, &[1234, 7])), Some(1234));
        assert_eq!(Codec::Shmem.ino(&fh(1, &[7, 5, 1])), Some(5 | (1 << 32)));
        // Wrong length or type for the codec: unknown, never a guess.
        assert_eq!(Codec::Ino32Gen.ino(&fh(1, &[7, 5, 1])), None);
        assert_eq!(Codec::Shmem.ino(&fh(1, &[1234, 7])), None);
        assert_eq!(Codec::Ino32Gen.ino(&fh(0x4d, &[1, 2, 3, 4, 5])), None);
        // Truncated.
        assert_eq!(Codec::Ino32Gen.ino(&fh(1, &[1234, 7])[..12]), None);
    }

    #[test]
    fn handles_on_ext4_and_tmpfs_decode_to_their_inodes() {
        use std::os::fd::AsFd;
        use std::os::unix::fs::MetadataExt;
        // /tmp (ext4 here) and /dev/shm (tmpfs): a directory and a file on each.
        for base in ["/tmp", "/dev/shm"] {
            let Ok(d) = tempfile::tempdir_in(base) else {
                continue;
            };
            std::fs::write(d.path().join("f"), b"x").unwrap();
            let dir = std::fs::File::open(d.path()).unwrap();
            // SAFETY: statfs is plain old data; `dir` is live.
            let mut st: libc::statfs = unsafe { std::mem::zeroed() };
            assert_eq!(unsafe { libc::fstatfs(dir.as_raw_fd(), &mut st) }, 0);
            #[allow(clippy::unnecessary_cast)]
            let known = matches!(st.f_type as i64, EXT4_SUPER_MAGIC | TMPFS_MAGIC);
            let Some(c) = Codec::for_fd(dir.as_fd()) else {
                assert!(!known, "{base}: no codec for a known file system");
                continue;
            };
            for p in [d.path().to_path_buf(), d.path().join("f")] {
                let f = std::fs::File::open(&p).unwrap();
                let h = handle_of(f.as_fd()).unwrap();
                assert_eq!(c.ino(&h), Some(f.metadata().unwrap().ino()), "{p:?}");
            }
        }
    }
}
