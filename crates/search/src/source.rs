//! Where a search reads directories from: the real file system ([`DirectSource`]) or a
//! dircache [`Cache`] ([`CacheSource`]). Both give the same answers for the same tree.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use dircache_core::{At, Attr, Cache, Cred, Creds, Error, FileType, LookupFlags, NodeRef};
use dircache_local::creds::{ActAs, Caps};
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, ResolveFlags, StatxFlags};
use rustix::io::Errno;

/// One directory entry as a source reports it.
#[derive(Debug, Clone)]
pub struct RawEntry {
    pub name: Vec<u8>,
    /// `None` when the file system did not say (DT_UNKNOWN): the engine then asks [`Source::lstat`].
    pub kind: Option<FileType>,
    /// Attributes, when the source has them for free (readdirplus, cache).
    pub attr: Option<Attr>,
}

/// The operations a search needs. `rel` paths are relative to a root opened by
/// [`Source::open_root`]: components separated by `/`, no `.`/`..`, empty for the root itself.
/// No symbolic link is ever followed below a root (like `find -P`).
pub trait Source: Send + Sync + 'static {
    /// An opened search root.
    type Root: Send + Sync;
    /// An opened directory.
    type Dir;

    /// Open a search root given by the caller (symbolic links in it *are* followed, so that
    /// `/bin -> usr/bin` works). `Err(Error::NotDir)` if it is not a directory.
    fn open_root(&self, path: &[u8]) -> Result<Self::Root, Error>;
    /// Open directory `rel` below `root` for reading (needs read permission on it and search
    /// permission on the way), never following a symbolic link.
    fn open_dir(&self, root: &Self::Root, rel: &[u8]) -> Result<Self::Dir, Error>;
    /// The device (file system) a directory lives on.
    fn dev(&self, dir: &Self::Dir) -> Result<u64, Error>;
    /// Append all entries (without `.` and `..`) to `out`; `plus` asks for attributes.
    fn read_dir(
        &self,
        dir: &mut Self::Dir,
        plus: bool,
        out: &mut Vec<RawEntry>,
    ) -> Result<(), Error>;
    /// Attributes of `dir/name`, not following a final symlink.
    fn lstat(&self, dir: &Self::Dir, name: &[u8]) -> Result<Attr, Error>;
    /// `dir/name` if it exists (`Ok(None)` for ENOENT).
    fn lookup(&self, dir: &Self::Dir, name: &[u8]) -> Result<Option<RawEntry>, Error> {
        match self.lstat(dir, name) {
            Ok(a) => Ok(Some(RawEntry {
                name: name.to_vec(),
                kind: Some(a.kind()),
                attr: Some(a),
            })),
            Err(Error::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }
    /// Whether the caller may access `dir/name` with `mask` (R_OK=4|W_OK=2|X_OK=1), following
    /// symlinks, as access(2) decides.
    fn access(&self, dir: &Self::Dir, name: &[u8], mask: u32) -> bool;
    /// Called once at the start of every worker thread (e.g. to take on the caller's ids).
    fn thread_init(&self) -> Result<(), Error> {
        Ok(())
    }
}

fn errno(e: Errno) -> Error {
    Error::from_errno(e.raw_os_error())
}

/// The real file system through rustix: `openat2(RESOLVE_NO_SYMLINKS)`, `getdents64`, and
/// `statx` only when needed (METADATA, DT_UNKNOWN, literal lookups).
///
/// **Who "the caller" is**: the access checks (R_OK/W_OK/X_OK) use `faccessat(AT_EACCESS)`,
/// i.e. the *effective/file-system* ids of the searching thread - the same ids that decide
/// whether the search itself may open a directory. access(2) itself uses the real ids; the two
/// differ only in set-user-id programs.
///
/// **Searching for someone else** ([`DirectSource::as_cred`], [`DirectSource::beneath`]): every
/// operation of the search - opening the roots included - runs on a thread switched to the
/// caller's fs uid, fs gid and groups with no effective capability ([`dircache_local::creds`], [`Caps::Empty`]), so the
/// kernel decides every access exactly as it would for that caller (mode bits, POSIX ACLs,
/// search permission on every directory, LSMs). Needs CAP_SETUID/CAP_SETGID.
/// With [`DirectSource::beneath`], roots are paths below an opened directory (a daemon's SRC),
/// resolved from it with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`: what lies above that
/// directory is not checked, as it is not for a caller reaching it through a mount.
#[derive(Debug, Clone, Default)]
pub struct DirectSource {
    cred: Option<Cred>,
    base: Option<Arc<OwnedFd>>,
    mount: MountAccess,
}

/// Options of the mount a search answers for that the kernel applies in access(2) on top of
/// the permission check: a read-only mount denies W_OK (EROFS) except on device files, FIFOs
/// and sockets; a `noexec` mount denies X_OK on regular files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MountAccess {
    pub read_only: bool,
    pub noexec: bool,
}

impl DirectSource {
    pub fn new() -> DirectSource {
        DirectSource {
            cred: None,
            base: None,
            mount: MountAccess::default(),
        }
    }
    /// Search as `cred` (see the type docs).
    pub fn as_cred(cred: Cred) -> DirectSource {
        DirectSource {
            cred: Some(cred),
            base: None,
            mount: MountAccess::default(),
        }
    }
    /// Roots are paths below `base` (`/` is `base` itself), searched as `cred` (or as the
    /// calling process when `None`).
    pub fn beneath(base: Arc<OwnedFd>, cred: Option<Cred>) -> DirectSource {
        DirectSource {
            cred,
            base: Some(base),
            mount: MountAccess::default(),
        }
    }

    /// Answer R_OK/W_OK/X_OK as the kernel does through a mount with these options.
    pub fn on_mount(mut self, mount: MountAccess) -> DirectSource {
        self.mount = mount;
        self
    }

    fn switch(&self) -> Result<Option<ActAs>, Error> {
        match &self.cred {
            Some(c) => ActAs::switch(c, Caps::Empty).map(Some),
            None => Ok(None),
        }
    }
}

thread_local! {
    /// A search worker's switched credentials, restored when the thread ends.
    static WORKER_CRED: RefCell<Option<ActAs>> = const { RefCell::new(None) };
}

/// Paths up to this length are opened in one openat2; longer ones in chunks.
const CHUNK: usize = 3000;

fn open_beneath(root: &OwnedFd, rel: &[u8]) -> Result<OwnedFd, Error> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let res = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    if rel.is_empty() {
        return rfs::openat(root, c".", flags, Mode::empty()).map_err(errno);
    }
    if rel.len() <= CHUNK {
        return rfs::openat2(root, rel, flags, Mode::empty(), res).map_err(errno);
    }
    // Deeper than PATH_MAX allows: resolve chunk by chunk (O_PATH for the intermediate
    // pieces), at most two descriptors at a time.
    let mut cur: Option<OwnedFd> = None;
    let mut rest = rel;
    while !rest.is_empty() {
        let last = rest.len() <= CHUNK;
        let cut = if last {
            rest.len()
        } else {
            match rest[..CHUNK].iter().rposition(|&b| b == b'/') {
                Some(0) | None => return Err(Error::NameTooLong),
                Some(i) => i,
            }
        };
        let (piece, tail) = rest.split_at(cut);
        let fl = if last {
            flags
        } else {
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
        };
        let base: &OwnedFd = cur.as_ref().unwrap_or(root);
        let fd = rfs::openat2(base, piece, fl, Mode::empty(), res).map_err(errno)?;
        cur = Some(fd);
        rest = tail.strip_prefix(b"/").unwrap_or(tail);
    }
    cur.ok_or(Error::Invalid)
}

fn attr_of(s: &rfs::Statx) -> Attr {
    Attr::from_statx(s)
}

fn kind_of(t: rfs::FileType) -> Option<FileType> {
    Some(match t {
        rfs::FileType::RegularFile => FileType::Regular,
        rfs::FileType::Directory => FileType::Directory,
        rfs::FileType::Symlink => FileType::Symlink,
        rfs::FileType::CharacterDevice => FileType::CharDevice,
        rfs::FileType::BlockDevice => FileType::BlockDevice,
        rfs::FileType::Fifo => FileType::Fifo,
        rfs::FileType::Socket => FileType::Socket,
        _ => return None,
    })
}

thread_local! {
    static DENTS_BUF: RefCell<Vec<MaybeUninit<u8>>> = RefCell::new(vec![MaybeUninit::uninit(); 64 * 1024]);
}

impl Source for DirectSource {
    type Root = OwnedFd;
    type Dir = OwnedFd;

    fn open_root(&self, path: &[u8]) -> Result<OwnedFd, Error> {
        if path.is_empty() {
            return Err(Error::NotFound);
        }
        // Opened as the caller (a no-op guard for a plain local search).
        let _g = self.switch()?;
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        match &self.base {
            None => rfs::openat(rfs::CWD, path, flags, Mode::empty()).map_err(errno),
            Some(base) => {
                let rel = path.strip_prefix(b"/").unwrap_or(path);
                let rel: &[u8] = if rel.is_empty() { b"." } else { rel };
                rfs::openat2(
                    &**base,
                    rel,
                    flags,
                    Mode::empty(),
                    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
                )
                .map_err(errno)
            }
        }
    }

    fn open_dir(&self, root: &OwnedFd, rel: &[u8]) -> Result<OwnedFd, Error> {
        open_beneath(root, rel)
    }

    fn dev(&self, dir: &OwnedFd) -> Result<u64, Error> {
        let s = rfs::statx(dir, c"", AtFlags::EMPTY_PATH, StatxFlags::TYPE).map_err(errno)?;
        Ok(rfs::makedev(s.stx_dev_major, s.stx_dev_minor))
    }

    fn read_dir(
        &self,
        dir: &mut OwnedFd,
        plus: bool,
        out: &mut Vec<RawEntry>,
    ) -> Result<(), Error> {
        DENTS_BUF.with(|b| {
            let mut buf = b.borrow_mut();
            let mut it = rfs::RawDir::new(dir.as_fd(), &mut buf[..]);
            while let Some(ent) = it.next() {
                let ent = ent.map_err(errno)?;
                let name = ent.file_name().to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                out.push(RawEntry {
                    name: name.to_vec(),
                    kind: kind_of(ent.file_type()),
                    attr: None,
                });
            }
            Ok::<(), Error>(())
        })?;
        if plus {
            // A file that vanished since getdents is reported by the engine's lstat.
            for e in out.iter_mut() {
                if let Ok(a) = self.lstat(dir, &e.name) {
                    e.kind = Some(a.kind());
                    e.attr = Some(a);
                }
            }
        }
        Ok(())
    }

    fn lstat(&self, dir: &OwnedFd, name: &[u8]) -> Result<Attr, Error> {
        rfs::statx(
            dir,
            name,
            AtFlags::SYMLINK_NOFOLLOW,
            StatxFlags::BASIC_STATS | StatxFlags::BTIME,
        )
        .map(|s| attr_of(&s))
        .map_err(errno)
    }

    fn access(&self, dir: &OwnedFd, name: &[u8], mask: u32) -> bool {
        let a = rfs::Access::from_bits_truncate(mask);
        if rfs::accessat(dir, name, a, AtFlags::EACCESS).is_err() {
            return false;
        }
        let w = mask & 2 != 0 && self.mount.read_only;
        let x = mask & 1 != 0 && self.mount.noexec;
        if !w && !x {
            return true;
        }
        // What do_faccessat adds for the mount (following symlinks, as access(2) does).
        let Ok(st) = rfs::statx(dir, name, AtFlags::empty(), StatxFlags::TYPE) else {
            return false;
        };
        let kind = rfs::FileType::from_raw_mode(u32::from(st.stx_mode));
        let special = matches!(
            kind,
            rfs::FileType::CharacterDevice
                | rfs::FileType::BlockDevice
                | rfs::FileType::Fifo
                | rfs::FileType::Socket
        );
        !(w && !special || x && kind == rfs::FileType::RegularFile)
    }

    fn thread_init(&self) -> Result<(), Error> {
        // Search worker threads live for one search: the switch lasts until the thread ends.
        let g = self.switch()?;
        WORKER_CRED.with(|w| *w.borrow_mut() = g);
        Ok(())
    }
}

/// A search answered by a dircache [`Cache`]: listings come from the cache where directories
/// are complete and from its backend otherwise; permissions are decided by the cache's access
/// policy for `creds` (mode bits: no POSIX ACLs, no capabilities). It is therefore **not** what
/// a daemon answers other users with: a delegated search runs a [`DirectSource`] beneath SRC as
/// the caller, so the kernel decides (see [`crate::proto`]). Roots are paths in the cache's initial namespace (relative ones are
/// taken from its root).
pub struct CacheSource {
    cache: Arc<Cache>,
    creds: Creds,
}

impl CacheSource {
    pub fn new(cache: Arc<Cache>, creds: Creds) -> CacheSource {
        CacheSource { cache, creds }
    }
}

/// An opened directory of a [`CacheSource`]: its dentry and its absolute path.
pub struct CacheDir {
    node: NodeRef,
    path: Vec<u8>,
    /// The listing, read when the directory is opened (so that a directory we may not read
    /// fails at open, as with open(2) in the direct source).
    entries: Option<Vec<dircache_core::DirEntry>>,
}

fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut p = a.to_vec();
    if !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(b);
    p
}

impl Source for CacheSource {
    type Root = CacheDir;
    type Dir = CacheDir;

    fn open_root(&self, path: &[u8]) -> Result<CacheDir, Error> {
        if path.is_empty() {
            return Err(Error::NotFound);
        }
        let abs = if path.starts_with(b"/") {
            path.to_vec()
        } else {
            join(b"/", path)
        };
        let node = self.cache.lookup(
            &self.creds,
            At::Root,
            &abs,
            LookupFlags {
                follow: true,
                directory: true,
            },
        )?;
        Ok(CacheDir {
            node,
            path: abs,
            entries: None,
        })
    }

    fn open_dir(&self, root: &CacheDir, rel: &[u8]) -> Result<CacheDir, Error> {
        let mut node = root.node.clone();
        if !rel.is_empty() {
            for c in rel.split(|&b| b == b'/') {
                node = self.cache.lookup_child(&self.creds, &node, c)?;
            }
        }
        match node.file_type() {
            Some(FileType::Directory) => {}
            Some(_) => return Err(Error::NotDir),
            None => return Err(Error::NotFound),
        }
        let path = if rel.is_empty() {
            root.path.clone()
        } else {
            join(&root.path, rel)
        };
        // Opening a directory for reading needs read permission, as open(2) in the direct
        // source does, so that both report the same error from the same step: list it now
        // (readdir_node checks read permission itself).
        let entries = self.cache.readdir_node(&self.creds, &node, false)?;
        Ok(CacheDir {
            node,
            path,
            entries: Some(entries),
        })
    }

    fn dev(&self, dir: &CacheDir) -> Result<u64, Error> {
        Ok(self.cache.getattr(&dir.node)?.dev)
    }

    fn read_dir(
        &self,
        dir: &mut CacheDir,
        plus: bool,
        out: &mut Vec<RawEntry>,
    ) -> Result<(), Error> {
        let entries = match dir.entries.take() {
            Some(e) if !plus => e,
            _ => self.cache.readdir_node(&self.creds, &dir.node, plus)?,
        };
        for e in entries {
            out.push(RawEntry {
                name: e.name,
                kind: Some(e.kind),
                attr: e.attr,
            });
        }
        Ok(())
    }

    fn lstat(&self, dir: &CacheDir, name: &[u8]) -> Result<Attr, Error> {
        let n = self.cache.lookup_child(&self.creds, &dir.node, name)?;
        self.cache.getattr(&n)
    }

    fn access(&self, dir: &CacheDir, name: &[u8], mask: u32) -> bool {
        self.cache
            .access(&self.creds, At::Root, &join(&dir.path, name), mask)
            .is_ok()
    }
}
