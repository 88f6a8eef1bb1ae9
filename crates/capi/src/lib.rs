//! The C API of dircache search (`include/dircache_search.h`): `opensearch`, `readsearch`,
//! `closesearch`, built as `libdircachesearch.so`.
//!
//! A search runs on background threads and streams into the handle; `readsearch` blocks
//! until the next result. Nothing here unwinds into C: panics are caught and become EIO.

use std::ffi::{c_char, c_int, c_uint, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use dircache_search::proto::search_auto;
use dircache_search::{ErrorSource, Flags, SearchError, SearchRequest, SearchStream};

/// The opaque `SEARCH` handle.
pub struct Search {
    stream: SearchStream,
    path: CString,
    st: libc::stat,
}

/// `struct search_result` of the header.
#[repr(C)]
pub struct SearchResultC {
    pub path: *const c_char,
    pub info: *const libc::stat,
    pub errsource: c_int,
    pub err: c_int,
    pub root: c_uint,
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

fn errno_of(e: &SearchError) -> c_int {
    match e {
        SearchError::InvalidPattern(..) | SearchError::EmptyPaths => libc::EINVAL,
        SearchError::NotADirectory(_) => libc::ENOTDIR,
        SearchError::Root(_, e) => e.errno(),
        SearchError::Spawn(_) => libc::EAGAIN,
        SearchError::Daemon(_) => libc::EIO,
    }
}

/// # Safety
/// `paths` and `pattern` must be NUL-terminated strings (or NULL, which fails with EINVAL).
#[no_mangle]
pub unsafe extern "C" fn opensearch(
    paths: *const c_char,
    pattern: *const c_char,
    flags: c_int,
) -> *mut Search {
    if paths.is_null() || pattern.is_null() || flags < 0 || (flags as u32) & !Flags::ALL.0 != 0 {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: both pointers are non-null and the caller promises NUL-terminated strings.
    let (paths, pattern) = unsafe { (CStr::from_ptr(paths), CStr::from_ptr(pattern)) };
    let (Ok(paths), Ok(pattern)) = (paths.to_str(), pattern.to_str()) else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    let req = SearchRequest::new(paths, pattern, Flags(flags as u32));
    let started = catch_unwind(|| search_auto(&req));
    match started {
        Ok(Ok(stream)) => Box::into_raw(Box::new(Search {
            stream,
            path: CString::default(),
            // SAFETY: libc::stat is plain old data; all-zero is a valid value.
            st: unsafe { std::mem::zeroed() },
        })),
        Ok(Err(e)) => {
            set_errno(errno_of(&e));
            ptr::null_mut()
        }
        Err(_) => {
            set_errno(libc::EIO);
            ptr::null_mut()
        }
    }
}

fn fill_stat(st: &mut libc::stat, a: &dircache_search::SearchAttr) {
    st.st_dev = a.dev as _;
    st.st_ino = a.ino as _;
    st.st_mode = a.mode as _;
    st.st_nlink = a.nlink as _;
    st.st_uid = a.uid as _;
    st.st_gid = a.gid as _;
    st.st_rdev = a.rdev as _;
    st.st_size = a.size as _;
    st.st_blksize = a.blksize as _;
    st.st_blocks = a.blocks as _;
    st.st_atime = a.atime.sec as _;
    st.st_atime_nsec = a.atime.nsec as _;
    st.st_mtime = a.mtime.sec as _;
    st.st_mtime_nsec = a.mtime.nsec as _;
    st.st_ctime = a.ctime.sec as _;
    st.st_ctime_nsec = a.ctime.nsec as _;
}

/// # Safety
/// `search` must come from `opensearch` and not be closed; `out` must point to writable memory
/// for one `struct search_result`.
#[no_mangle]
pub unsafe extern "C" fn readsearch(search: *mut Search, out: *mut SearchResultC) -> c_int {
    if search.is_null() || out.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: non-null, from opensearch (Box::into_raw), exclusively used by this call.
    let s = unsafe { &mut *search };
    let next = catch_unwind(AssertUnwindSafe(|| s.stream.next()));
    let r = match next {
        Ok(Some(r)) => r,
        Ok(None) => return 0,
        Err(_) => {
            set_errno(libc::EIO);
            return -1;
        }
    };
    // File names never hold NUL; should one appear, cut there rather than fail.
    let mut bytes = r.path;
    if let Some(i) = bytes.iter().position(|&b| b == 0) {
        bytes.truncate(i);
    }
    s.path = CString::new(bytes).unwrap_or_default();
    let info = match &r.stat {
        Some(a) if r.error.is_none() => {
            fill_stat(&mut s.st, a);
            &s.st as *const libc::stat
        }
        _ => ptr::null(),
    };
    let (errsource, err) = match r.error {
        None => (0, 0),
        Some(e) => (
            match e.source {
                ErrorSource::Open => 1,
                ErrorSource::Readdir => 2,
                ErrorSource::Stat => 3,
                ErrorSource::Delegate => 4,
            },
            e.errno,
        ),
    };
    let res = SearchResultC {
        path: s.path.as_ptr(),
        info,
        errsource,
        err,
        root: r.root,
    };
    // SAFETY: `out` is non-null and the caller promises it is writable.
    unsafe { out.write(res) };
    1
}

/// # Safety
/// `search` must come from `opensearch` and not be closed already (NULL is ignored).
#[no_mangle]
pub unsafe extern "C" fn closesearch(search: *mut Search) -> c_int {
    if !search.is_null() {
        // SAFETY: from Box::into_raw in opensearch, closed only once per the contract.
        let b = unsafe { Box::from_raw(search) };
        let _ = catch_unwind(AssertUnwindSafe(move || drop(b)));
    }
    0
}
