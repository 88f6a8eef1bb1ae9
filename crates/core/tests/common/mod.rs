//! Shared helpers for the core's integration tests: a cache over the in-memory backend, and
//! a "twin" of the same tree in a temporary directory so that the local kernel can serve as
//! the oracle for path resolution (rootless: `openat2` with `RESOLVE_IN_ROOT` treats the
//! temporary directory as `/`, so `..` at the top stays there and absolute symlink targets
//! resolve inside it, as they do in the cache).
#![allow(dead_code)] // each test file uses a different part

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use dircache_core::memory::MemoryBackend;
use dircache_core::{At, Cache, Config, Cred, Creds, Error, LookupFlags};
use rustix::fs::{Mode, OFlags, ResolveFlags};

/// A cache over a fresh memory backend built from `spec` (see [`MemoryBackend::populate`]).
pub fn cache_with(spec: &[&str], config: Config) -> (Arc<MemoryBackend>, Arc<Cache>) {
    let m = Arc::new(MemoryBackend::new());
    m.populate(spec);
    let c = Cache::new(m.clone(), config).expect("cache over a memory backend");
    (m, c)
}

/// Root credentials that the cache checks (root passes the mode-bit policy except for X_OK
/// on files without any x bit).
pub fn root(c: &Cache) -> Creds {
    c.credentials(Cred::root())
}

/// An ordinary user, checked by the cache's policy.
pub fn user(c: &Cache, uid: u32) -> Creds {
    c.credentials(Cred::new(uid, uid, []))
}

/// What a resolution ended in: the backend path of the node (`""` for the root), or errno.
pub type Outcome = Result<String, i32>;

/// Resolve `path` in the cache and name the result by its backend path.
pub fn resolve(c: &Cache, cr: &Creds, at: At<'_>, path: &str, flags: LookupFlags) -> Outcome {
    match c.lookup(cr, at, path.as_bytes(), flags) {
        Ok(n) => c
            .node_path(&n)
            .map(|p| String::from_utf8_lossy(&p).into_owned())
            .map_err(Error::errno),
        Err(e) => Err(e.errno()),
    }
}

/// The same tree in the memory backend and in a temporary directory.
pub struct Twin {
    pub dir: tempfile::TempDir,
    pub mem: Arc<MemoryBackend>,
}

impl Twin {
    /// Build `spec` in both places: `d/` a directory, `l -> t` a symlink, else an empty file.
    pub fn new(spec: &[&str]) -> Twin {
        let dir = tempfile::tempdir().expect("tempdir");
        for s in spec {
            let (path, target) = match s.split_once(" -> ") {
                Some((p, t)) => (p, Some(t)),
                None => (*s, None),
            };
            let is_dir = path.ends_with('/');
            let path = path.trim_end_matches('/');
            let full = dir.path().join(path);
            if let Some(parent) = full.parent() {
                std::fs::create_dir_all(parent).expect("mkdir -p");
            }
            if is_dir {
                std::fs::create_dir_all(&full).expect("mkdir");
            } else if let Some(t) = target {
                std::os::unix::fs::symlink(t, &full).expect("symlink");
            } else {
                std::fs::write(&full, b"").expect("create");
            }
        }
        let mem = Arc::new(MemoryBackend::new());
        mem.populate(spec);
        Twin { dir, mem }
    }

    pub fn cache(&self, config: Config) -> Arc<Cache> {
        Cache::new(self.mem.clone(), config).expect("cache over a memory backend")
    }

    /// The kernel's answer for `path` relative to (and confined in) the temporary directory,
    /// named by the path of the inode it found.
    pub fn kernel(&self, path: &str, flags: LookupFlags) -> Outcome {
        self.kernel_in(self.dir.path(), path, flags)
    }

    /// As [`Twin::kernel`], but relative to directory `start` (inside the temporary directory),
    /// still confined in the temporary directory: `..` from `start` may climb up to it.
    pub fn kernel_in(&self, start: &Path, path: &str, flags: LookupFlags) -> Outcome {
        let names = self.inode_names();
        let root = rustix::fs::open(
            self.dir.path(),
            OFlags::PATH | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .expect("open tempdir");
        // Walk to `start` first (it lies below the root; no symlinks on the way).
        let rel_start = start
            .strip_prefix(self.dir.path())
            .expect("start lies in the tempdir");
        let mut p = rel_start.as_os_str().as_bytes().to_vec();
        if !p.is_empty() && !path.starts_with('/') {
            p.push(b'/');
            p.extend_from_slice(path.as_bytes());
        } else if path.starts_with('/') || p.is_empty() {
            p = path.as_bytes().to_vec();
        }
        if p.is_empty() {
            return Err(libc::ENOENT);
        }
        let mut o = OFlags::PATH;
        if !flags.follow {
            o |= OFlags::NOFOLLOW;
        }
        // `LookupFlags::directory` means what a trailing slash means (it also follows a final
        // symlink), not O_DIRECTORY|O_NOFOLLOW (which fails with ENOTDIR on a symlink).
        if flags.directory {
            p.push(b'/');
        }
        let fd = rustix::fs::openat2(&root, p.as_slice(), o, Mode::empty(), ResolveFlags::IN_ROOT)
            .map_err(|e| e.raw_os_error())?;
        let st = rustix::fs::fstat(&fd).map_err(|e| e.raw_os_error())?;
        Ok(names
            .get(&st.st_ino)
            .cloned()
            .unwrap_or_else(|| panic!("kernel found inode {} outside the tree", st.st_ino)))
    }

    /// Inode number -> path relative to the temporary directory (`""` for itself).
    fn inode_names(&self) -> HashMap<u64, String> {
        fn walk(dir: &Path, rel: &str, out: &mut HashMap<u64, String>) {
            for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let r = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                let md = e.metadata().expect("lstat");
                out.insert(std::os::unix::fs::MetadataExt::ino(&md), r.clone());
                if md.is_dir() {
                    walk(&e.path(), &r, out);
                }
            }
        }
        let mut out = HashMap::new();
        let md = std::fs::metadata(self.dir.path()).expect("stat tempdir");
        out.insert(std::os::unix::fs::MetadataExt::ino(&md), String::new());
        walk(self.dir.path(), "", &mut out);
        out
    }
}

/// A lexically cleaned path (Plan 9's rules, written independently of the cache's own): drop
/// empty and `.` components, let `..` remove the previous name; at the top, `..` is dropped
/// for an absolute path and kept for a relative one (it climbs above the start).
pub fn plan9_clean(path: &str) -> String {
    let abs = path.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => match out.last() {
                Some(&l) if l != ".." => {
                    out.pop();
                }
                _ if !abs => out.push(".."),
                _ => {}
            },
            c => out.push(c),
        }
    }
    let body = out.join("/");
    let trailing = path.ends_with('/') || path.ends_with("/.") || path.ends_with("/..");
    let mut s = if abs { format!("/{body}") } else { body };
    if s.is_empty() {
        s.push('.');
    }
    if trailing && !s.ends_with('/') {
        s.push('/');
    }
    s
}
