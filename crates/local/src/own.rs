//! Writes a front end serves without seeing them: FUSE passthrough writes are made by the
//! kernel on the backing file in the writing thread's context, so fanotify reports them as
//! that thread's, like any outside write. The front end registers (thread, file) for as long
//! as it lets that thread write the file ([`Backend::own_writes_begin`]); the fanotify reader
//! marks an event that is a FAN_MODIFY and nothing else, caused by a registered thread, on
//! the very file registered for it (same file system id and file handle), and the front end
//! asks for the mark ([`Backend::own_write_change`]) to skip the kernel invalidation the
//! kernel made itself. Any other event, by any other thread or on any other file, is
//! reported as before. A released handle's registration stays until the reader has found its
//! queue empty twice ([`OwnWrites::end`]): the last writes' events are often read after the
//! release. The inotify fallback reports no thread: nothing is marked there.
//!
//! [`Backend::own_writes_begin`]: dircache_core::Backend::own_writes_begin
//! [`Backend::own_write_change`]: dircache_core::Backend::own_write_change

use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// A file as fanotify names it: file system id and `struct file_handle` bytes (handle size,
/// type and handle).
pub(crate) type FileId = ([u8; 8], Vec<u8>);

/// Marks are dropped past this many unconsumed ones (a front end that never asks): reported
/// changes then go through the ordinary path again.
const MAX_MARKS: usize = 4096;

/// A registration: the token of its handle, the file, and once the handle is released,
/// the feed's drain count at that moment (see [`OwnWrites::end`]).
struct Reg {
    token: u64,
    file: FileId,
    ended_at: Option<u64>,
}

#[derive(Default)]
struct Regs {
    by_tid: HashMap<i32, Vec<Reg>>,
    tid_of: HashMap<u64, i32>,
}

#[derive(Default)]
pub(crate) struct OwnWrites {
    /// Whether any registration exists, ended ones included (the feed's fast path).
    any: AtomicBool,
    /// Registrations: thread -> handles.
    regs: Mutex<Regs>,
    /// How many times a feed reader found its queue empty ([`OwnWrites::drained`]).
    drains: AtomicU64,
    /// Whether a released handle's registration waits for the feed (the reader then drains
    /// its queue without waiting for an event: [`OwnWrites::ending`]).
    ending: AtomicBool,
    /// Feed readers that mark own writes ([`Reader`]): with none, nothing waits in a queue
    /// and a released handle's registration goes at once.
    readers: AtomicUsize,
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
        regs.by_tid.entry(tid).or_default().push(Reg {
            token,
            file: id,
            ended_at: None,
        });
        regs.tid_of.insert(token, tid);
        self.any.store(true, Ordering::Release);
    }

    /// The handle `token` is released: no write through it can follow, but the events of
    /// its last writes may still wait in the feed's queue (fanotify queues an event in the
    /// writing syscall; the reader takes it later). The registration is kept until the
    /// reader has found its queue empty twice since: the first such moment may have been
    /// seen just before this call, the second began after it, so every event queued before
    /// the release was parsed by then. Ending at once reported those last writes as outside
    /// changes, and the kernel's attributes were invalidated for nothing (a GETATTR and a
    /// GETXATTR `security.capability` at the next open).
    pub(crate) fn end(&self, token: u64) {
        let mut regs = self.regs.lock();
        let Some(tid) = regs.tid_of.remove(&token) else {
            return;
        };
        let now = self.drains.load(Ordering::Acquire);
        let keep = self.readers.load(Ordering::Acquire) > 0;
        if let Some(v) = regs.by_tid.get_mut(&tid) {
            if keep {
                for r in v
                    .iter_mut()
                    .filter(|r| r.token == token && r.ended_at.is_none())
                {
                    r.ended_at = Some(now);
                }
                self.ending.store(true, Ordering::Release);
            } else {
                v.retain(|r| r.token != token);
                if v.is_empty() {
                    regs.by_tid.remove(&tid);
                }
            }
        }
        if regs.by_tid.is_empty() {
            self.any.store(false, Ordering::Release);
        }
    }

    /// A feed reader found its queue empty: drop the registrations ended two drains ago or
    /// earlier (see [`OwnWrites::end`]). With several readers the count runs faster and a
    /// registration may go before the other reader parsed its last events: such an event is
    /// then reported as an outside change (a kernel invalidation too many, never one missed).
    pub(crate) fn drained(&self) {
        let now = self.drains.fetch_add(1, Ordering::AcqRel) + 1;
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut regs = self.regs.lock();
        let mut ending = false;
        regs.by_tid.retain(|_, v| {
            v.retain(|r| r.ended_at.is_none_or(|e| now < e + 2));
            ending |= v.iter().any(|r| r.ended_at.is_some());
            !v.is_empty()
        });
        self.ending.store(ending, Ordering::Release);
        if regs.by_tid.is_empty() {
            self.any.store(false, Ordering::Release);
        }
    }

    /// Whether a released handle's registration waits for the feed's reader to find its
    /// queue empty: the reader then reads without waiting for an event, so the registration
    /// lasts two read cycles, not until the next change anywhere on the file system (an
    /// outside write by the same thread to the same file in between would be taken for one
    /// of the handle's: the window a registration of an open handle has, kept this short).
    pub(crate) fn ending(&self) -> bool {
        self.ending.load(Ordering::Acquire)
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
            .is_some_and(|v| v.iter().any(|r| &r.file == object))
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

/// A feed reader that marks own writes: while one exists, a released handle's registration
/// waits for its queued events ([`OwnWrites::end`]).
pub(crate) struct Reader(Arc<OwnWrites>);

impl Reader {
    pub(crate) fn new(own: Arc<OwnWrites>) -> Self {
        own.readers.fetch_add(1, Ordering::AcqRel);
        Self(own)
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.0.readers.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::ops::Deref for Reader {
    type Target = OwnWrites;

    fn deref(&self) -> &OwnWrites {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn file() -> (tempfile::NamedTempFile, FileId) {
        let f = tempfile::NamedTempFile::new().unwrap();
        let id = file_id(f.as_file().as_fd()).expect("a file handle for a temporary file");
        (f, id)
    }

    /// With a feed reader, a released handle's writes still queued are the handle's until
    /// the reader found its queue empty twice; then the thread's events are outside changes
    /// again.
    #[test]
    fn a_released_handle_is_kept_for_two_drains_of_the_feed() {
        let own = Arc::new(OwnWrites::default());
        let reader = Reader::new(own.clone());
        let (f, id) = file();
        own.begin(7, 42, f.as_file().as_fd());
        assert!(own.is_own(42, &id));
        assert!(
            !own.is_own(43, &id),
            "another thread's write is not the handle's"
        );
        assert!(!own.ending());
        own.end(7);
        assert!(own.ending());
        assert!(own.is_own(42, &id), "a write queued before the release");
        reader.drained();
        assert!(
            own.is_own(42, &id),
            "the first drain may have begun before the release"
        );
        reader.drained();
        assert!(!own.is_own(42, &id), "kept past the second drain");
        assert!(!own.ending());
    }

    /// A handle released while another of the same thread stays open: only the released
    /// one goes.
    #[test]
    fn ending_one_handle_keeps_the_others() {
        let own = Arc::new(OwnWrites::default());
        let _reader = Reader::new(own.clone());
        let (a, ida) = file();
        let (b, idb) = file();
        own.begin(1, 42, a.as_file().as_fd());
        own.begin(2, 42, b.as_file().as_fd());
        own.end(1);
        own.drained();
        own.drained();
        assert!(!own.is_own(42, &ida));
        assert!(own.is_own(42, &idb));
    }

    /// Without a feed reader nothing can be queued: a release ends the registration at once
    /// (nothing would ever drop it otherwise).
    #[test]
    fn without_a_reader_a_release_ends_at_once() {
        let own = OwnWrites::default();
        let (f, id) = file();
        own.begin(7, 42, f.as_file().as_fd());
        own.end(7);
        assert!(!own.is_own(42, &id));
        assert!(!own.ending());
        assert!(own.regs.lock().by_tid.is_empty());
    }
}
