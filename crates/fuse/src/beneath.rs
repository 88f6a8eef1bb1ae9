//! Opening a file below SRC by a backend path of any length.
//!
//! PATH_MAX bounds one syscall's path argument, not how deep a file lies: a path longer than
//! one openat2 takes is resolved in pieces, each cut at a `/` and opened from the previous
//! piece's descriptor with the same RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS (backend paths have
//! no `.`/`..` components, so no piece leaves the directory it starts from).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Longest path handed to one openat2 (PATH_MAX includes the NUL).
const CHUNK: usize = libc::PATH_MAX as usize - 1;

/// openat2(`base`, `path`, `flags`, `resolve`); paths longer than [`CHUNK`] bytes are resolved
/// piece by piece, the intermediate pieces as O_PATH directories.
pub(crate) fn open_beneath(
    base: BorrowedFd<'_>,
    path: &[u8],
    flags: OFlags,
    resolve: ResolveFlags,
) -> Result<OwnedFd, Errno> {
    if path.len() <= CHUNK {
        return rustix::fs::openat2(base, path, flags, Mode::empty(), resolve);
    }
    let mut cur: Option<OwnedFd> = None;
    let mut rest = path;
    while rest.len() > CHUNK {
        let cut = match rest[..=CHUNK].iter().rposition(|&b| b == b'/') {
            Some(i) if i > 0 => i,
            // A component longer than a whole piece: no file system has one.
            _ => return Err(Errno::NAMETOOLONG),
        };
        let at = cur.as_ref().map_or(base, |f| f.as_fd());
        let fd = rustix::fs::openat2(
            at,
            &rest[..cut],
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            resolve,
        )?;
        cur = Some(fd);
        rest = &rest[cut + 1..];
    }
    let at = cur.as_ref().map_or(base, |f| f.as_fd());
    rustix::fs::openat2(at, rest, flags, Mode::empty(), resolve)
}
