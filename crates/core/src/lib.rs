//! # dircache-core
//!
//! A user-level directory cache after Tsai et al., *How to Get More Value From Your File
//! System Directory Cache* (SOSP'15): a direct-lookup hash table keyed by keyed signatures of
//! full paths, a per-credential prefix-check cache validated by version counters, directory
//! completeness, deep negative entries, symlink aliases, mounts and namespaces. Lookups take no
//! global lock (McKenney et al., scalable dentry cache), except as the fallback of a backend
//! call that renames raced three times. The crate does no I/O of its own: everything below
//! the cache is a [`Backend`].
//!
//! See `docs/core.md` in the repository for the invariants and the code paths that keep them.

#![forbid(unsafe_code)]

mod backend;
mod cache;
mod config;
mod cred;
pub mod delegated;
mod error;
pub mod file;
pub mod lease;
pub mod memory;
mod policy;
pub mod stats;
mod types;

pub use backend::{
    before_backend_call, set_before_backend_call, Backend, Change, ChangeFeed, Walked, XattrTarget,
    XATTR_UNSUPPORTED,
};
pub use cache::{
    At, Cache, Creds, Dentry, DirHandle, Held, Invalidation, LoadReport, MountOptions, MountSource,
    Namespace, NodeKind, NodeRef, Persist, PersistError, SaveReport,
};
pub use config::{Config, DotDot};
pub use cred::Cred;
pub use delegated::{SearchCall, SearchEvent, SearchHit, SearchHits};
pub use error::{Error, Result};
pub use file::{BackendFile, FdFile, Whence};
pub use lease::defer_lease_waits;
pub use policy::{AccessPolicy, PosixPolicy};
pub use stats::StatsSnapshot;
pub use types::*;
