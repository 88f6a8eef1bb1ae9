//! Typed errors that map one-to-one onto Linux errno values.

/// Every error the cache, a backend or a front end can return.
///
/// The variants name the errno values the cache produces itself; anything else a backend
/// reports travels as [`Error::Os`]. `Error` is `Copy` so negative results can be cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Error {
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("permission denied")]
    Access,
    #[error("operation not permitted")]
    Perm,
    #[error("too many levels of symbolic links")]
    Loop,
    #[error("file name too long")]
    NameTooLong,
    #[error("file exists")]
    Exists,
    #[error("directory not empty")]
    NotEmpty,
    #[error("invalid argument")]
    Invalid,
    #[error("read-only file system")]
    ReadOnly,
    #[error("invalid cross-device link")]
    CrossDevice,
    #[error("device or resource busy")]
    Busy,
    #[error("function not implemented")]
    NotSupported,
    #[error("stale file handle")]
    Stale,
    #[error("os error {0}")]
    Os(i32),
}

impl Error {
    /// The errno value Linux would return for this error.
    pub fn errno(self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::Access => libc::EACCES,
            Error::Perm => libc::EPERM,
            Error::Loop => libc::ELOOP,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::Exists => libc::EEXIST,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::Invalid => libc::EINVAL,
            Error::ReadOnly => libc::EROFS,
            Error::CrossDevice => libc::EXDEV,
            Error::Busy => libc::EBUSY,
            Error::NotSupported => libc::ENOSYS,
            Error::Stale => libc::ESTALE,
            Error::Os(e) => e,
        }
    }

    /// The error for an errno value (the inverse of [`Error::errno`]).
    pub fn from_errno(errno: i32) -> Error {
        match errno {
            libc::ENOENT => Error::NotFound,
            libc::ENOTDIR => Error::NotDir,
            libc::EISDIR => Error::IsDir,
            libc::EACCES => Error::Access,
            libc::EPERM => Error::Perm,
            libc::ELOOP => Error::Loop,
            libc::ENAMETOOLONG => Error::NameTooLong,
            libc::EEXIST => Error::Exists,
            libc::ENOTEMPTY => Error::NotEmpty,
            libc::EINVAL => Error::Invalid,
            libc::EROFS => Error::ReadOnly,
            libc::EXDEV => Error::CrossDevice,
            libc::EBUSY => Error::Busy,
            libc::ENOSYS => Error::NotSupported,
            libc::ESTALE => Error::Stale,
            e => Error::Os(e),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::from_errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::from_raw_os_error(e.errno())
    }
}

/// Result alias used throughout dircache.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_round_trips() {
        for e in 1..140 {
            assert_eq!(Error::from_errno(e).errno(), e);
        }
    }
}
