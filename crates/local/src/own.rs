//! Writes a front end serves without seeing them: FUSE passthrough writes are made by the
//! kernel on the backing file in the writing thread's context, so fanotify reports them as
//! that thread's, like any outside write. The front end registers (thread, file) for as long
//! as it lets that thread write the file ([`Backend::own_writes_begin`]); the fanotify reader
//! marks an event that is a FAN_MODIFY and nothing else, caused by a registered thread, on
//! the very file registered for it (same file system id and file handle), and the front end
//! asks for the mark ([`Backend::own_write_change`]) to skip the kernel invalidation the
//! kernel made itself. Any other event, by any other thread or on any other file, is
//! reported as before. The inotify fallback reports no thread: nothing is marked there.
//!
//! [`Backend::own_writes_begin`]: dircache_core::Backend::own_writes_begin
//! [`Backend::own_write_change`]: dircache_core::Backend::own_write_change

use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// A file as fanotify names it: file system id and `struct file_handle` bytes (handle size,
/// type and handle).
pub(crate) type FileId = ([u8; 8], Vec<u8>);

/// Marks are dropped past this many unconsumed ones (a front end that never asks): reported
/// changes then go through the ordinary path again.
const MAX_MARKS: usize = 4096;

#[derive(Default)]
struct Regs {
    by_tid: HashMap<i32, Vec<(u64, FileId)>>,
    tid_of: HashMap<u64, i32>,
}

#[derive(Default)]
pub(crate) struct OwnWrites {
    /// Whether any registration exists (the feed's fast path).
    any: AtomicBool,
    /// Registrations: thread -> (token, file).
    regs: Mutex<Regs>,
    /// Paths reported for own writes, not yet asked about (with a count).
    marks: Mutex<HashMap<Vec<u8>, u32>>,
}

/// The fanotify identity of the file open on `fd`: the fsid statfs reports (as fanotify's
/// records carry) and the handle `name_to_handle_at` gives (the encoding fanotify's FID
/// records use for a non-directory).
pub(crate) fn file_id(fd: BorrowedFd<'_>) -> Option<FileId> {
    const MAX_HANDLE_SZ: usize = 128;
    let mut buf = [0u64; (8 + MAX_HANDLE_SZ) / 8];
    // handle_bytes (the first u32) is the room for the handle.
    // SAFETY: buf has 8 + MAX_HANDLE_SZ bytes; the first 4 are the u32 handle_bytes.
    unsafe { *buf.as_mut_ptr().cast::<u32>() = MAX_HANDLE_SZ as u32 };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: fd is live, the path is an empty NUL-terminated string (AT_EMPTY_PATH: the file
    // of fd itself), buf is a writable file_handle with room for MAX_HANDLE_SZ bytes, and
    // mount_id a writable int.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr(),
            &mut mount_id as *mut libc::c_int,
            libc::AT_EMPTY_PATH,
        )
    };
    if r != 0 {
        return None;
    }
    // SAFETY: buf holds the kernel's file_handle now; view it as bytes.
    let bytes: &[u8] =
        unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), 8 + MAX_HANDLE_SZ) };
    let hb = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    if hb > MAX_HANDLE_SZ {
        return None;
    }
    // SAFETY: statfs is plain old data; zeroed is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fd is live and st a writable statfs.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    // SAFETY: fsid_t is two 32-bit integers (8 bytes, no padding), as in fanotify's records.
    let fsid: [u8; 8] = unsafe { std::mem::transmute_copy(&st.f_fsid) };
    Some((fsid, bytes[..8 + hb].to_vec()))
}

impl OwnWrites {
    pub(crate) fn begin(&self, token: u64, tid: i32, fd: BorrowedFd<'_>) {
        let Some(id) = file_id(fd) else {
            return;
        };
        let mut regs = self.regs.lock();
        regs.by_tid.entry(tid).or_default().push((token, id));
        regs.tid_of.insert(token, tid);
        self.any.store(true, Ordering::Release);
    }

    pub(crate) fn end(&self, token: u64) {
        let mut regs = self.regs.lock();
        let Some(tid) = regs.tid_of.remove(&token) else {
            return;
        };
        if let Some(v) = regs.by_tid.get_mut(&tid) {
            v.retain(|(t, _)| *t != token);
            if v.is_empty() {
                regs.by_tid.remove(&tid);
            }
        }
        if regs.tid_of.is_empty() {
            self.any.store(false, Ordering::Release);
        }
    }

    /// Whether an event caused by thread `tid` on the file `object` is an own write.
    pub(crate) fn is_own(&self, tid: i32, object: &FileId) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        self.regs
            .lock()
            .by_tid
            .get(&tid)
            .is_some_and(|v| v.iter().any(|(_, id)| id == object))
    }

    /// Mark `path` as reported for an own write (before the report is sent).
    pub(crate) fn mark(&self, path: &[u8]) {
        let mut m = self.marks.lock();
        if m.len() >= MAX_MARKS {
            m.clear();
        }
        *m.entry(path.to_vec()).or_insert(0) += 1;
    }

    /// Consume a mark of `path`.
    pub(crate) fn take(&self, path: &[u8]) -> bool {
        let mut m = self.marks.lock();
        match m.get_mut(path) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                m.remove(path);
                true
            }
            None => false,
        }
    }
}
