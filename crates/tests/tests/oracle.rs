//! Model-based randomized differential test: the cache against the kernel as oracle.
//!
//! Two identical real trees: `C` sits under the cache, `K` is touched only by the kernel.
//! * A mutation runs through the cache on `C` and directly (same user, fs credentials switched
//!   on a jail thread chrooted into `K`) on `K`; results and errno must agree, and the
//!   attributes the cache returns must be those the kernel now reports for `C`.
//! * A query (stat, lstat, access, readdir, readlink, opendir + relative lookups) is answered by
//!   the cache on `C` and by the kernel, as the same user, on the same state of `C` (a jail
//!   thread chrooted into `C`, so `/`, absolute symlinks and `..` above the root resolve as the
//!   cache resolves them at its root).
//! * Every few operations the two trees are compared entry by entry as root, so a mutation that
//!   did something different (e.g. created a file as the wrong user) is caught.
//! * Changes behind the cache's back: done as root on both trees, then `cache.invalidate`.
//!
//! `ORACLE_SEED=n` replays one seed, `ORACLE_OPS=n` sets the number of operations,
//! `ORACLE_NO_TIMES=1` leaves mtime/ctime out of attribute comparisons, `ORACLE_LOG=file`
//! writes the whole operation log there on failure. For exploring past a known bug class:
//! `ORACLE_NO_BEHIND=1` (no outside changes), `ORACLE_NO_HANDLES=1` (no directory handles);
//! `ORACLE_STOP_AT=i` makes an errno disagreement at op i fatal (to shrink it);
//! `ORACLE_TRACE=1` prints every operation before it runs (to find a hang);
//! `ORACLE_SHRINK_HANG=i` shrinks the sequence ending in op i that hangs (forked replays).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dircache_core::{
    At, Attr, Backend, Cache, Config, Cred, Creds, DirHandle, Error, FileType, LookupFlags,
    RenameMode, SetAttr,
};
use dircache_tests::kernel::{self, c, KResult};
use dircache_tests::{Jail, KernelBackend};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const NAMES: &[&str] = &["a", "b", "c", "d", "f", "g", "l1", "l2", "l3"];
const DIR_MODES: &[u32] = &[
    0o755, 0o700, 0o711, 0o750, 0o000, 0o1777, 0o775, 0o770, 0o701,
];
const FILE_MODES: &[u32] = &[0o644, 0o600, 0o755, 0o640, 0o000, 0o604];

fn creds_list() -> Vec<Cred> {
    vec![
        Cred::root(),
        Cred::new(1001, 1001, [3000]),
        Cred::new(1002, 1002, [3000, 3001]),
    ]
}

/// One operation, with everything needed to replay it (printed on failure).
#[derive(Debug, Clone)]
enum Op {
    Stat {
        who: usize,
        at: Option<usize>,
        path: Vec<u8>,
        follow: bool,
    },
    Access {
        who: usize,
        at: Option<usize>,
        path: Vec<u8>,
        mask: u32,
    },
    Readdir {
        who: usize,
        at: Option<usize>,
        path: Vec<u8>,
    },
    Readlink {
        who: usize,
        at: Option<usize>,
        path: Vec<u8>,
    },
    Opendir {
        who: usize,
        at: Option<usize>,
        path: Vec<u8>,
    },
    CloseDir {
        idx: usize,
    },
    Mkdir {
        who: usize,
        at: Option<usize>,
        path: Vec<u8>,
        mode: u32,
    },
    Mknod {
        who: usize,
        at: Option<usize>,
        path: Vec<u8>,
        mode: u32,
    },
    Unlink {
        who: usize,
        at: Option<usize>,
        path: Vec<u8>,
    },
    Rmdir {
        who: usize,
        at: Option<usize>,
        path: Vec<u8>,
    },
    Rename {
        who: usize,
        at: Option<usize>,
        old: Vec<u8>,
        new: Vec<u8>,
        mode: RenameMode,
    },
    Link {
        who: usize,
        at: Option<usize>,
        old: Vec<u8>,
        new: Vec<u8>,
    },
    Symlink {
        who: usize,
        at: Option<usize>,
        target: Vec<u8>,
        path: Vec<u8>,
    },
    Chmod {
        who: usize,
        at: Option<usize>,
        path: Vec<u8>,
        mode: u32,
    },
    Chown {
        who: usize,
        at: Option<usize>,
        path: Vec<u8>,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    Truncate {
        who: usize,
        at: Option<usize>,
        path: Vec<u8>,
        size: u64,
    },
    /// A change made as root directly on both trees, then `invalidate`d.
    Behind {
        change: BehindChange,
    },
}

#[derive(Debug, Clone)]
enum BehindChange {
    Chmod { path: Vec<u8>, mode: u32 },
    Chown { path: Vec<u8>, uid: u32, gid: u32 },
    Create { path: Vec<u8> },
    Mkdir { path: Vec<u8> },
    Remove { path: Vec<u8> },
    Rename { old: Vec<u8>, new: Vec<u8> },
    Symlink { target: Vec<u8>, path: Vec<u8> },
}

fn show(p: &[u8]) -> String {
    let s = String::from_utf8_lossy(p);
    if s.len() > 80 {
        format!("{}…({} bytes)", &s[..60], s.len())
    } else {
        format!("{s:?}")
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&bytes_as_strings(&format!("{self:?}")))
    }
}

/// Rewrite every `[98, 47, 99]` in a Debug string as `"b/c"` (long ones abbreviated).
fn bytes_as_strings(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('[') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let Some(j) = after.find(']') else {
            out.push_str(&rest[i..]);
            return out;
        };
        let inner = &after[..j];
        let bytes: Option<Vec<u8>> = inner
            .split(", ")
            .map(|t| t.trim().parse::<u8>().ok())
            .collect();
        match bytes {
            Some(b) if !inner.is_empty() => out.push_str(&show(&b)),
            _ if inner.is_empty() => out.push_str("\"\""),
            _ => out.push_str(&rest[i..i + 1 + j + 1]),
        }
        rest = &after[j + 1..];
    }
    out.push_str(rest);
    out
}

/// An open directory on all three sides.
struct Handle {
    cache: DirHandle,
    cfd: i32,
    kfd: i32,
}

struct World {
    _tmp: tempfile::TempDir,
    cdir: std::path::PathBuf,
    kdir: std::path::PathBuf,
    jc: Jail,
    jk: Jail,
    cache: Arc<Cache>,
    creds: Vec<Creds>,
    raw: Vec<Cred>,
    handles: Vec<Option<Handle>>,
    times: bool,
    /// Paths of every entry of C, from the last walk.
    known: Vec<Vec<u8>>,
    known_dirs: Vec<Vec<u8>>,
}

fn errno_of<T>(r: &Result<T, Error>) -> Option<i32> {
    r.as_ref().err().map(|e| e.errno())
}

fn kerrno<T>(r: &KResult<T>) -> Option<i32> {
    r.as_ref().err().copied()
}

fn ename(e: Option<i32>) -> String {
    match e {
        None => "Ok".into(),
        Some(e) => format!("{} ({})", std::io::Error::from_raw_os_error(e), e),
    }
}

/// Compare attributes: identity and ownership always, link count and size always, times when
/// asked.
fn attr_diff(what: &str, cache: &Attr, kern: &Attr, times: bool) -> Option<String> {
    let mut d = Vec::new();
    macro_rules! f {
        ($x:ident) => {
            if cache.$x != kern.$x {
                d.push(format!(
                    "{}: cache {:?} kernel {:?}",
                    stringify!($x),
                    cache.$x,
                    kern.$x
                ));
            }
        };
    }
    f!(ino);
    f!(mode);
    f!(uid);
    f!(gid);
    f!(nlink);
    f!(size);
    f!(dev);
    if times {
        f!(mtime);
        f!(ctime);
    }
    if d.is_empty() {
        None
    } else {
        Some(format!("{what}: attributes differ: {}", d.join("; ")))
    }
}

fn setup_tree(root: &Path) {
    use std::os::unix::fs::{chown, symlink, PermissionsExt};
    let mk = |p: &str, mode: u32, uid: u32, gid: u32| {
        let full = root.join(p);
        std::fs::create_dir(&full).unwrap();
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode)).unwrap();
        chown(&full, Some(uid), Some(gid)).unwrap();
    };
    let file = |p: &str, mode: u32, uid: u32, gid: u32| {
        let full = root.join(p);
        std::fs::write(&full, p.as_bytes()).unwrap();
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode)).unwrap();
        chown(&full, Some(uid), Some(gid)).unwrap();
    };
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
    mk("a", 0o755, 0, 0);
    mk("a/b", 0o755, 1001, 1001);
    mk("a/b/c", 0o750, 1001, 3000);
    mk("a/b/c/d", 0o755, 1001, 1001);
    file("a/b/c/d/f", 0o644, 1001, 1001);
    mk("b", 0o1777, 0, 0);
    mk("b/a", 0o700, 1002, 1002);
    file("b/a/f", 0o600, 1002, 1002);
    mk("c", 0o711, 0, 3001);
    mk("c/d", 0o770, 0, 3001);
    file("c/d/g", 0o640, 1002, 3001);
    file("f", 0o644, 0, 0);
    file("a/f", 0o755, 0, 0);
    symlink("a/b", root.join("l1")).unwrap();
    symlink("/a/b/c", root.join("a/l2")).unwrap();
    symlink("l1/c/d", root.join("l3")).unwrap();
    symlink("l2", root.join("b/l2")).unwrap(); // self-loop
    symlink("missing/x", root.join("a/b/l1")).unwrap(); // dangling
}

impl World {
    fn new(backend_kind: BackendKind, config: &Config) -> World {
        let tmp = tempfile::Builder::new()
            .prefix("dircache-oracle")
            .tempdir()
            .unwrap();
        let cdir = tmp.path().join("c");
        let kdir = tmp.path().join("k");
        std::fs::create_dir(&cdir).unwrap();
        std::fs::create_dir(&kdir).unwrap();
        setup_tree(&cdir);
        setup_tree(&kdir);
        let backend: Arc<dyn Backend> = match backend_kind {
            BackendKind::Reference => Arc::new(KernelBackend::new(&cdir).unwrap()),
            BackendKind::Local => local_backend(&cdir),
        };
        let cache = Cache::new(backend, config.clone()).expect("Cache::new");
        let raw = creds_list();
        let creds = raw.iter().map(|c| cache.credentials(c.clone())).collect();
        let jc = Jail::new(&cdir);
        let jk = Jail::new(&kdir);
        let times = std::env::var("ORACLE_NO_TIMES").is_err();
        let mut w = World {
            _tmp: tmp,
            cdir,
            kdir,
            jc,
            jk,
            cache,
            creds,
            raw,
            handles: Vec::new(),
            times,
            known: Vec::new(),
            known_dirs: Vec::new(),
        };
        w.rescan();
        w
    }

    fn rescan(&mut self) {
        let snap = snapshot(&self.cdir);
        self.known = snap.keys().cloned().collect();
        self.known_dirs = snap
            .iter()
            .filter(|(_, e)| e.kind == FileType::Directory)
            .map(|(k, _)| k.clone())
            .collect();
    }

    fn at(&self, at: Option<usize>) -> (At<'_>, i32, i32) {
        match at.and_then(|i| self.handles.get(i).and_then(|h| h.as_ref())) {
            Some(h) => (At::Dir(&h.cache), h.cfd, h.kfd),
            None => (At::Root, libc::AT_FDCWD, libc::AT_FDCWD),
        }
    }

    /// Run a kernel closure on tree C as user `who`.
    fn kc<R: Send + 'static>(&self, who: usize, f: impl FnOnce() -> R + Send + 'static) -> R {
        self.jc.run_as(&self.raw[who], f)
    }

    fn kk<R: Send + 'static>(&self, who: usize, f: impl FnOnce() -> R + Send + 'static) -> R {
        self.jk.run_as(&self.raw[who], f)
    }

    /// Apply one op; `Err(description)` on a disagreement.
    fn apply(&mut self, op: &Op) -> Result<String, String> {
        let times = self.times;
        match op.clone() {
            Op::Stat {
                who,
                at,
                path,
                follow,
            } => {
                let (a, cfd, _) = self.at(at);
                let flags = if follow {
                    LookupFlags::FOLLOW
                } else {
                    LookupFlags::NOFOLLOW
                };
                let r = self.cache.stat(&self.creds[who], a, &path, flags);
                let p = path.clone();
                let k = self.kc(who, move || kernel::fstatat(cfd, &c(&p), follow));
                cmp_attr_result("stat", &r, &k, times)
            }
            Op::Access {
                who,
                at,
                path,
                mask,
            } => {
                let (a, cfd, _) = self.at(at);
                let r = self.cache.access(&self.creds[who], a, &path, mask);
                let p = path.clone();
                let k = self.kc(who, move || kernel::faccess(cfd, &c(&p), mask));
                cmp_unit("access", &r, &k)
            }
            Op::Readdir { who, at, path } => {
                let (a, cfd, _) = self.at(at);
                let r = self.cache.readdir(&self.creds[who], a, &path);
                let p = path.clone();
                let k = self.kc(who, move || kernel::readdir_at(cfd, &c(&p)));
                match (&r, &k) {
                    (Ok(cl), Ok(kl)) => {
                        let mut cl: Vec<_> =
                            cl.iter().map(|e| (e.name.clone(), e.kind, e.ino)).collect();
                        cl.sort_by(|a, b| a.0.cmp(&b.0));
                        let kl: Vec<_> =
                            kl.iter().map(|e| (e.name.clone(), e.kind, e.ino)).collect();
                        if cl != kl {
                            return Err(format!(
                                "readdir listing differs:\n  cache  {:?}\n  kernel {:?}",
                                lst(&cl),
                                lst(&kl)
                            ));
                        }
                        Ok(format!("{} entries", cl.len()))
                    }
                    _ => cmp_errno("readdir", errno_of(&r), kerrno(&k)),
                }
            }
            Op::Readlink { who, at, path } => {
                let (a, cfd, _) = self.at(at);
                let r = self.cache.readlink(&self.creds[who], a, &path);
                let p = path.clone();
                let k = self.kc(who, move || kernel::readlinkat(cfd, &c(&p)));
                match (&r, &k) {
                    (Ok(x), Ok(y)) if x != y => {
                        Err(format!("readlink: cache {} kernel {}", show(x), show(y)))
                    }
                    _ => cmp_errno("readlink", errno_of(&r), kerrno(&k)),
                }
            }
            Op::Opendir { who, at, path } => {
                let (a, cfd, kfd) = self.at(at);
                let r = self.cache.opendir(&self.creds[who], a, &path);
                let p = path.clone();
                let kc = self.kc(who, move || kernel::open_dir_path(cfd, &c(&p)));
                let p = path.clone();
                let kk = self.kk(who, move || kernel::open_dir_path(kfd, &c(&p)));
                let res = cmp_errno("opendir", errno_of(&r), kerrno(&kc));
                match (r, kc, kk) {
                    (Ok(h), Ok(cfd), Ok(kfd)) => {
                        self.handles.push(Some(Handle { cache: h, cfd, kfd }));
                        res.map(|_| format!("handle {}", self.handles.len() - 1))
                    }
                    (_, kc, kk) => {
                        if let Ok(fd) = kc {
                            kernel::close(fd);
                        }
                        if let Ok(fd) = kk {
                            kernel::close(fd);
                        }
                        res
                    }
                }
            }
            Op::CloseDir { idx } => {
                if let Some(Some(h)) = self.handles.get_mut(idx).map(|h| h.take()) {
                    kernel::close(h.cfd);
                    kernel::close(h.kfd);
                }
                Ok("closed".into())
            }
            Op::Mkdir {
                who,
                at,
                path,
                mode,
            } => {
                let (a, cfd, kfd) = self.at(at);
                let r = self.cache.mkdir(&self.creds[who], a, &path, mode);
                let p = path.clone();
                let k = self.kk(who, move || kernel::mkdirat(kfd, &c(&p), mode));
                self.check_created("mkdir", &r, &k, cfd, &path, false)
            }
            Op::Mknod {
                who,
                at,
                path,
                mode,
            } => {
                let (a, cfd, kfd) = self.at(at);
                let r = self.cache.mknod(&self.creds[who], a, &path, mode, 0);
                let p = path.clone();
                let k = self.kk(who, move || kernel::mknodat(kfd, &c(&p), mode, 0));
                self.check_created("mknod", &r, &k, cfd, &path, false)
            }
            Op::Symlink {
                who,
                at,
                target,
                path,
            } => {
                let (a, cfd, kfd) = self.at(at);
                let r = self.cache.symlink(&self.creds[who], &target, a, &path);
                let p = path.clone();
                let k = self.kk(who, move || kernel::symlinkat(&c(&target), kfd, &c(&p)));
                self.check_created("symlink", &r, &k, cfd, &path, false)
            }
            Op::Link { who, at, old, new } => {
                let (a, cfd, kfd) = self.at(at);
                let r = self.cache.link(&self.creds[who], a, &old, &new);
                let (o, n) = (old.clone(), new.clone());
                let k = self.kk(who, move || kernel::linkat(kfd, &c(&o), &c(&n)));
                self.check_created("link", &r, &k, cfd, &new, false)
            }
            Op::Unlink { who, at, path } => {
                let (a, _, kfd) = self.at(at);
                let r = self.cache.unlink(&self.creds[who], a, &path);
                let p = path.clone();
                let k = self.kk(who, move || kernel::unlinkat(kfd, &c(&p), false));
                cmp_unit("unlink", &r, &k)
            }
            Op::Rmdir { who, at, path } => {
                let (a, _, kfd) = self.at(at);
                let r = self.cache.rmdir(&self.creds[who], a, &path);
                let p = path.clone();
                let k = self.kk(who, move || kernel::unlinkat(kfd, &c(&p), true));
                cmp_unit("rmdir", &r, &k)
            }
            Op::Rename {
                who,
                at,
                old,
                new,
                mode,
            } => {
                let (a, _, kfd) = self.at(at);
                let r = self.cache.rename(&self.creds[who], a, &old, &new, mode);
                let (o, n) = (old.clone(), new.clone());
                let k = self.kk(who, move || {
                    kernel::renameat2(kfd, &c(&o), kfd, &c(&n), mode)
                });
                cmp_unit("rename", &r, &k)
            }
            Op::Chmod {
                who,
                at,
                path,
                mode,
            } => {
                let set = SetAttr {
                    mode: Some(mode),
                    ..Default::default()
                };
                self.setattr(who, at, &path, set)
            }
            Op::Chown {
                who,
                at,
                path,
                uid,
                gid,
            } => {
                let set = SetAttr {
                    uid,
                    gid,
                    ..Default::default()
                };
                self.setattr(who, at, &path, set)
            }
            Op::Truncate {
                who,
                at,
                path,
                size,
            } => {
                let set = SetAttr {
                    size: Some(size),
                    ..Default::default()
                };
                self.setattr(who, at, &path, set)
            }
            Op::Behind { change } => {
                self.behind(&change);
                Ok("applied and invalidated".into())
            }
        }
    }

    fn setattr(
        &self,
        who: usize,
        at: Option<usize>,
        path: &[u8],
        set: SetAttr,
    ) -> Result<String, String> {
        let (a, cfd, kfd) = self.at(at);
        let r = self
            .cache
            .setattr(&self.creds[who], a, path, &set, LookupFlags::FOLLOW);
        let p = path.to_vec();
        let k = self.kk(who, move || kernel::setattr_follow(kfd, &c(&p), &set, true));
        self.check_created("setattr", &r, &k, cfd, path, true)
    }

    /// Compare a mutation's result with the kernel's on K, and the attributes the cache
    /// returned with what C now holds at `path`.
    fn check_created(
        &self,
        what: &str,
        r: &Result<Attr, Error>,
        k: &KResult<()>,
        cfd: i32,
        path: &[u8],
        follow: bool,
    ) -> Result<String, String> {
        cmp_errno(what, errno_of(r), kerrno(k))?;
        if let Ok(got) = r {
            let p = path.to_vec();
            let now = self.jc.run(move || kernel::fstatat(cfd, &c(&p), follow));
            match now {
                Ok(now) => {
                    // Times of a fresh object can only be compared loosely: the cache may
                    // return the attributes it read right after the call.
                    if let Some(d) = attr_diff(&format!("{what} result"), got, &now, false) {
                        return Err(d);
                    }
                }
                Err(e) => {
                    return Err(format!(
                        "{what}: succeeded but C has no {} ({})",
                        show(path),
                        e
                    ))
                }
            }
        }
        Ok(ename(errno_of(r)))
    }

    fn behind(&mut self, ch: &BehindChange) {
        // Outside changes name backend paths: every parent component must be a real directory
        // (a shrunk or replayed sequence may hand us a path through a symlink: skip it then).
        let involved: Vec<&Vec<u8>> = match ch {
            BehindChange::Chmod { path, .. }
            | BehindChange::Chown { path, .. }
            | BehindChange::Create { path }
            | BehindChange::Mkdir { path }
            | BehindChange::Remove { path }
            | BehindChange::Symlink { path, .. } => vec![path],
            BehindChange::Rename { old, new } => vec![old, new],
        };
        let canonical = |p: &[u8]| {
            let mut prefix = self.cdir.clone();
            let comps: Vec<&[u8]> = p.split(|&b| b == b'/').collect();
            comps[..comps.len() - 1].iter().all(|c| {
                prefix.push(String::from_utf8_lossy(c).as_ref());
                std::fs::symlink_metadata(&prefix)
                    .map(|m| m.is_dir())
                    .unwrap_or(false)
            })
        };
        if !involved.iter().all(|p| canonical(p)) {
            return;
        }
        let run = |root: &Path| -> std::io::Result<()> {
            use std::os::unix::fs::{lchown, symlink, PermissionsExt};
            let j = |p: &[u8]| root.join(String::from_utf8_lossy(p).as_ref());
            match ch {
                BehindChange::Chmod { path, mode } => {
                    // Never through a symlink: the change must be at `path` itself.
                    if std::fs::symlink_metadata(j(path))?.file_type().is_symlink() {
                        return Ok(());
                    }
                    std::fs::set_permissions(j(path), std::fs::Permissions::from_mode(*mode))
                }
                BehindChange::Chown { path, uid, gid } => lchown(j(path), Some(*uid), Some(*gid)),
                BehindChange::Create { path } => {
                    // O_EXCL: never through an existing name (a symlink would be followed).
                    use std::io::Write;
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(j(path))?;
                    f.write_all(b"behind")
                }
                BehindChange::Mkdir { path } => std::fs::create_dir(j(path)),
                BehindChange::Remove { path } => {
                    let p = j(path);
                    if std::fs::symlink_metadata(&p)?.is_dir() {
                        std::fs::remove_dir_all(p)
                    } else {
                        std::fs::remove_file(p)
                    }
                }
                BehindChange::Rename { old, new } => std::fs::rename(j(old), j(new)),
                BehindChange::Symlink { target, path } => {
                    symlink(String::from_utf8_lossy(target).as_ref(), j(path))
                }
            }
        };
        // Inodes (with their link counts) of the entries at and below the paths this change
        // removes or moves: other names of those inodes see their link count (and ctime)
        // change, which a real change feed reports as an attribute change of each such name
        // (inotify IN_ATTRIB); below they are sent as `Change::Attr`.
        let before: Vec<(Vec<u8>, u64, u64)> = snapshot_inodes(&self.cdir);
        let touched: Vec<Vec<u8>> = match ch {
            BehindChange::Remove { path } | BehindChange::Rename { old: path, .. } => {
                vec![path.clone()]
            }
            _ => Vec::new(),
        };
        let under =
            |p: &[u8], t: &[u8]| p == t || (p.starts_with(t) && p.get(t.len()) == Some(&b'/'));
        let mut inodes: std::collections::HashSet<u64> = before
            .iter()
            .filter(|(p, _, _)| touched.iter().any(|t| under(p, t)))
            .map(|(_, i, _)| *i)
            .collect();
        if let BehindChange::Chmod { path, .. } | BehindChange::Chown { path, .. } = ch {
            inodes.extend(
                before
                    .iter()
                    .filter(|(p, _, _)| p == path)
                    .map(|(_, i, _)| *i),
            );
        }
        let rc = run(&self.cdir).map_err(|e| e.raw_os_error());
        let rk = run(&self.kdir).map_err(|e| e.raw_os_error());
        assert_eq!(
            rc, rk,
            "behind-the-back change behaved differently on the two trees"
        );
        let parent = |p: &[u8]| -> Vec<u8> {
            match p.iter().rposition(|&b| b == b'/') {
                Some(i) => p[..i].to_vec(),
                None => Vec::new(),
            }
        };
        let mut paths: Vec<(Vec<u8>, bool)> = Vec::new();
        match ch {
            BehindChange::Chmod { path, .. } | BehindChange::Chown { path, .. } => {
                paths.push((path.clone(), true))
            }
            BehindChange::Create { path }
            | BehindChange::Mkdir { path }
            | BehindChange::Remove { path }
            | BehindChange::Symlink { path, .. } => {
                paths.push((path.clone(), false));
                paths.push((parent(path), true));
            }
            BehindChange::Rename { old, new } => {
                paths.push((old.clone(), false));
                paths.push((new.clone(), false));
                paths.push((parent(old), true));
                paths.push((parent(new), true));
            }
        }
        if !inodes.is_empty() {
            for (p, i, _) in snapshot_inodes(&self.cdir) {
                if inodes.contains(&i) {
                    paths.push((p, true));
                }
            }
        }
        for (p, attr_only) in paths {
            if attr_only {
                self.cache
                    .apply_change(&dircache_core::Change::Attr { path: p });
            } else {
                self.cache.invalidate(&p);
            }
        }
    }
}

fn lst(v: &[(Vec<u8>, FileType, u64)]) -> Vec<String> {
    v.iter()
        .map(|(n, t, i)| format!("{}:{:?}:{}", String::from_utf8_lossy(n), t, i))
        .collect()
}

fn cmp_errno(what: &str, cache: Option<i32>, kern: Option<i32>) -> Result<String, String> {
    if cache != kern {
        Err(format!(
            "{what}: cache says {}, kernel says {}",
            ename(cache),
            ename(kern)
        ))
    } else {
        Ok(ename(cache))
    }
}

fn cmp_unit(what: &str, r: &Result<(), Error>, k: &KResult<()>) -> Result<String, String> {
    cmp_errno(what, errno_of(r), kerrno(k))
}

fn cmp_attr_result(
    what: &str,
    r: &Result<Attr, Error>,
    k: &KResult<Attr>,
    times: bool,
) -> Result<String, String> {
    match (r, k) {
        (Ok(a), Ok(b)) => match attr_diff(what, a, b, times) {
            Some(d) => Err(d),
            None => Ok(format!("ino {} mode {:o}", a.ino, a.mode)),
        },
        _ => cmp_errno(what, errno_of(r), kerrno(k)),
    }
}

/// What a tree holds, for comparing C with K.
#[derive(Debug, PartialEq, Eq, Clone)]
struct SnapEntry {
    kind: FileType,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u64,
    size: Option<u64>,
    target: Option<Vec<u8>>,
}

fn snapshot(root: &Path) -> BTreeMap<Vec<u8>, SnapEntry> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![(root.to_path_buf(), Vec::<u8>::new())];
    while let Some((dir, rel)) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            let mut r = rel.clone();
            if !r.is_empty() {
                r.push(b'/');
            }
            r.extend_from_slice(e.file_name().as_bytes());
            let kind = FileType::from_mode(md.mode());
            let target = if kind == FileType::Symlink {
                Some(
                    std::fs::read_link(e.path())
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec(),
                )
            } else {
                None
            };
            if kind == FileType::Directory {
                stack.push((e.path(), r.clone()));
            }
            out.insert(
                r,
                SnapEntry {
                    kind,
                    mode: md.mode(),
                    uid: md.uid(),
                    gid: md.gid(),
                    nlink: md.nlink(),
                    size: (kind != FileType::Directory).then_some(md.size()),
                    target,
                },
            );
        }
    }
    out
}

/// (path, inode, link count) of every entry of a tree, not following symlinks.
fn snapshot_inodes(root: &Path) -> Vec<(Vec<u8>, u64, u64)> {
    snapshot(root)
        .into_keys()
        .filter_map(|p| {
            let md =
                std::fs::symlink_metadata(root.join(String::from_utf8_lossy(&p).as_ref())).ok()?;
            Some((p, md.ino(), md.nlink()))
        })
        .collect()
}

fn compare_trees(w: &World) -> Result<(), String> {
    let c = snapshot(&w.cdir);
    let k = snapshot(&w.kdir);
    if c != k {
        let mut d = Vec::new();
        for (p, e) in &c {
            match k.get(p) {
                None => d.push(format!("only in C: {} {:?}", show(p), e)),
                Some(f) if f != e => d.push(format!("{}: C {:?} K {:?}", show(p), e, f)),
                _ => {}
            }
        }
        for (p, e) in &k {
            if !c.contains_key(p) {
                d.push(format!("only in K: {} {:?}", show(p), e));
            }
        }
        return Err(format!("trees diverged:\n  {}", d.join("\n  ")));
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Operation generator.

struct Gen<'a> {
    rng: StdRng,
    w: &'a World,
}

impl Gen<'_> {
    fn name(&mut self) -> Vec<u8> {
        NAMES.choose(&mut self.rng).unwrap().as_bytes().to_vec()
    }

    /// A path: an existing one (often), a random one, with decorations now and then.
    fn path(&mut self, rel: bool) -> Vec<u8> {
        let r = self.rng.gen_range(0..100);
        let mut p: Vec<u8> = if r < 55 && !self.w.known.is_empty() {
            self.w.known.choose(&mut self.rng).unwrap().clone()
        } else if r < 65 && !self.w.known_dirs.is_empty() {
            let mut d = self.w.known_dirs.choose(&mut self.rng).unwrap().clone();
            d.push(b'/');
            d.extend(self.name());
            d
        } else {
            let n = self.rng.gen_range(1..=5);
            let mut v = Vec::new();
            for i in 0..n {
                if i > 0 {
                    v.push(b'/');
                }
                v.extend(self.name());
            }
            v
        };
        // Decorations.
        let d = self.rng.gen_range(0..100);
        match d {
            0..=4 => p.extend_from_slice(b"/"),
            5..=7 => p.extend_from_slice(b"/."),
            8..=11 => p.extend_from_slice(b"/.."),
            12..=14 => p = insert_at_slash(&p, b"/./", &mut self.rng),
            15..=17 => p = insert_at_slash(&p, b"//", &mut self.rng),
            18..=22 => p = insert_at_slash(&p, b"/../", &mut self.rng),
            23..=25 => p.extend_from_slice(b"/missing/x/y"),
            26..=27 => {
                p.push(b'/');
                p.extend(std::iter::repeat_n(b'n', 255));
            }
            28 => {
                p.push(b'/');
                p.extend(std::iter::repeat_n(b'n', 256));
            }
            29 => {
                // Near PATH_MAX: pad with "./" so the path lands at 4094..4097 bytes.
                let target = self.rng.gen_range(4094..=4097usize);
                let mut q = Vec::new();
                while q.len() + 2 + p.len() <= target {
                    q.extend_from_slice(b"./");
                }
                if q.len() + p.len() < target {
                    q.insert(0, b'/');
                }
                q.extend_from_slice(&p);
                p = q;
            }
            30..=31 => p = [b"../".as_slice(), &p].concat(),
            _ => {}
        }
        if !rel && self.rng.gen_bool(0.15) {
            p.insert(0, b'/');
        }
        if p.is_empty() {
            p.push(b'.');
        }
        p
    }

    fn who(&mut self) -> usize {
        // Users more often than root: permission checks are the interesting part.
        [0, 1, 1, 2, 2].choose(&mut self.rng).copied().unwrap()
    }

    fn at(&mut self) -> Option<usize> {
        let open: Vec<usize> = self
            .w
            .handles
            .iter()
            .enumerate()
            .filter(|(_, h)| h.is_some())
            .map(|(i, _)| i)
            .collect();
        if !open.is_empty() && self.rng.gen_bool(0.2) {
            open.choose(&mut self.rng).copied()
        } else {
            None
        }
    }

    fn symlink_target(&mut self) -> Vec<u8> {
        match self.rng.gen_range(0..6) {
            0 => self.path(true),                              // relative, maybe dangling
            1 => [b"/".as_slice(), &self.path(true)].concat(), // absolute (cache root)
            2 => b"l1".to_vec(),                               // chain
            3 => b"../l3".to_vec(),
            4 => self.name(),           // possibly itself: loop
            _ => b"../../a/b".to_vec(), // climbs
        }
    }

    fn op(&mut self) -> Op {
        let who = self.who();
        let at = self.at();
        let rel = at.is_some();
        let r = self.rng.gen_range(0..1000);
        match r {
            0..=219 => Op::Stat {
                who,
                at,
                path: self.path(rel),
                follow: self.rng.gen_bool(0.6),
            },
            220..=299 => Op::Access {
                who,
                at,
                path: self.path(rel),
                mask: self.rng.gen_range(0..8),
            },
            300..=369 => Op::Readdir {
                who,
                at,
                path: self.path(rel),
            },
            370..=399 => Op::Readlink {
                who,
                at,
                path: self.path(rel),
            },
            400..=439 => {
                if std::env::var("ORACLE_NO_HANDLES").is_ok() {
                    Op::Readdir {
                        who,
                        at,
                        path: self.path(rel),
                    }
                } else if self.w.handles.iter().filter(|h| h.is_some()).count() > 6 {
                    let idx = self.rng.gen_range(0..self.w.handles.len());
                    Op::CloseDir { idx }
                } else {
                    Op::Opendir {
                        who,
                        at,
                        path: self.path(rel),
                    }
                }
            }
            440..=499 => Op::Mkdir {
                who,
                at,
                path: self.path(rel),
                mode: *DIR_MODES[..4].choose(&mut self.rng).unwrap(),
            },
            500..=559 => Op::Mknod {
                who,
                at,
                path: self.path(rel),
                mode: *FILE_MODES.choose(&mut self.rng).unwrap()
                    | if self.rng.gen_bool(0.1) {
                        libc::S_IFIFO
                    } else {
                        0
                    },
            },
            560..=599 => Op::Unlink {
                who,
                at,
                path: self.path(rel),
            },
            600..=629 => Op::Rmdir {
                who,
                at,
                path: self.path(rel),
            },
            630..=699 => {
                let mode = match self.rng.gen_range(0..6) {
                    0 => RenameMode::NoReplace,
                    1 => RenameMode::Exchange,
                    _ => RenameMode::Replace,
                };
                Op::Rename {
                    who,
                    at,
                    old: self.path(rel),
                    new: self.path(rel),
                    mode,
                }
            }
            700..=729 => Op::Link {
                who,
                at,
                old: self.path(rel),
                new: self.path(rel),
            },
            730..=789 => Op::Symlink {
                who,
                at,
                target: self.symlink_target(),
                path: self.path(rel),
            },
            790..=879 => {
                let mode = if self.rng.gen_bool(0.8) {
                    *DIR_MODES.choose(&mut self.rng).unwrap()
                } else {
                    *FILE_MODES.choose(&mut self.rng).unwrap()
                };
                // Mostly root (it can chmod anything), users for their own files.
                let who = if self.rng.gen_bool(0.6) { 0 } else { who };
                Op::Chmod {
                    who,
                    at,
                    path: self.path(rel),
                    mode,
                }
            }
            880..=919 => {
                let (uid, gid) = match self.rng.gen_range(0..5) {
                    0 => (Some(1001), Some(1001)),
                    1 => (Some(1002), Some(3001)),
                    2 => (None, Some(3000)),
                    3 => (None, Some(3001)),
                    _ => (Some(0), Some(0)),
                };
                let who = if self.rng.gen_bool(0.5) { 0 } else { who };
                Op::Chown {
                    who,
                    at,
                    path: self.path(rel),
                    uid,
                    gid,
                }
            }
            920..=934 => Op::Truncate {
                who,
                at,
                path: self.path(rel),
                size: self.rng.gen_range(0..5000),
            },
            _ if std::env::var("ORACLE_NO_BEHIND").is_ok() => Op::Stat {
                who,
                at,
                path: self.path(rel),
                follow: true,
            },
            _ => Op::Behind {
                change: self.behind(),
            },
        }
    }

    fn behind(&mut self) -> BehindChange {
        let existing = self
            .w
            .known
            .choose(&mut self.rng)
            .cloned()
            .unwrap_or_else(|| b"a".to_vec());
        let dir = self
            .w
            .known_dirs
            .choose(&mut self.rng)
            .cloned()
            .unwrap_or_default();
        let fresh = |g: &mut Self| {
            let mut p = dir.clone();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend(g.name());
            p
        };
        match self.rng.gen_range(0..7) {
            0 => BehindChange::Chmod {
                path: existing,
                mode: *DIR_MODES.choose(&mut self.rng).unwrap(),
            },
            1 => BehindChange::Chown {
                path: existing,
                uid: 1001 + self.rng.gen_range(0..2),
                gid: 3000 + self.rng.gen_range(0..2),
            },
            2 => BehindChange::Create { path: fresh(self) },
            3 => BehindChange::Mkdir { path: fresh(self) },
            4 => BehindChange::Remove { path: existing },
            5 => BehindChange::Rename {
                old: existing,
                new: fresh(self),
            },
            _ => BehindChange::Symlink {
                target: self.symlink_target(),
                path: fresh(self),
            },
        }
    }
}

fn insert_at_slash(p: &[u8], ins: &[u8], rng: &mut StdRng) -> Vec<u8> {
    let slashes: Vec<usize> = p
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == b'/')
        .map(|(i, _)| i)
        .collect();
    match slashes.choose(rng) {
        Some(&i) => [&p[..i], ins, &p[i + 1..]].concat(),
        None => p.to_vec(),
    }
}

// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum BackendKind {
    /// The tests' own `KernelBackend` (isolates the core from the local backend).
    Reference,
    /// `dircache_local::LocalBackend`.
    Local,
}

fn local_backend(dir: &Path) -> Arc<dyn Backend> {
    Arc::new(dircache_local::LocalBackend::new(dir).expect("LocalBackend::new"))
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Run `ops` random operations from `seed`; panics with the seed, the op index and the tail of
/// the log on the first disagreement.
fn run(kind: BackendKind, config: &Config, seed: u64, ops: usize) {
    let mut w = World::new(kind, config);
    // Watchdog: a hang (deadlock in the cache, or a syscall that blocks) aborts with the seed
    // and the operation index instead of stalling the test run.
    let current = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    /// Stops the watchdog however `run` ends (a mismatch panics).
    struct Stop(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let _stop = Stop(done.clone());
    let watchdog = {
        let (current, done) = (current.clone(), done.clone());
        let limit = Duration::from_secs(env_u64("ORACLE_TIMEOUT").unwrap_or(40));
        std::thread::spawn(move || {
            let start = Instant::now();
            while !done.load(Ordering::Acquire) {
                if start.elapsed() > limit {
                    // Straight to fd 2: the test harness captures eprintln! output, and the
                    // abort below would lose it.
                    use std::io::Write;
                    let _ = writeln!(
                        std::io::stderr(),
                        "oracle watchdog: seed={seed} stuck at op#{} after {limit:?}; aborting \
                         (replay with ORACLE_SEED={seed} ORACLE_OPS={} ORACLE_LOG=file)",
                        current.load(Ordering::Acquire),
                        current.load(Ordering::Acquire) + 1
                    );
                    std::process::abort();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let mut log: Vec<String> = Vec::new();
    let mut soft: Vec<(String, String)> = Vec::new();
    let mut history: Vec<Op> = Vec::new();
    let mut rng = StdRng::seed_from_u64(seed);
    let shrink_hang = env_u64("ORACLE_SHRINK_HANG");
    for i in 0..ops {
        let op = {
            let mut g = Gen {
                rng: StdRng::seed_from_u64(rng.gen()),
                w: &w,
            };
            g.op()
        };
        history.push(op.clone());
        current.store(i, Ordering::Release);
        if shrink_hang == Some(i as u64) {
            // The op that hung under the watchdog: shrink the sequence that still hangs.
            done.store(true, Ordering::Release);
            let min = shrink(kind, config, &history, "HANG");
            panic!(
                "seed={seed}: op#{i} hangs; shrunk to {} ops:\n{}",
                min.len(),
                min.iter()
                    .map(|o| format!("  {o}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        if std::env::var("ORACLE_TRACE").is_ok() {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "#{i} {op}");
        }
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.apply(&op)));
        let res = match res {
            Ok(r) => r,
            Err(p) => Err(format!(
                "PANIC: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
        };
        let mutation = !matches!(
            op,
            Op::Stat { .. }
                | Op::Access { .. }
                | Op::Readdir { .. }
                | Op::Readlink { .. }
                | Op::Opendir { .. }
                | Op::CloseDir { .. }
        );
        let res = res.and_then(|s| {
            if mutation && (i % 10 == 0 || matches!(op, Op::Behind { .. })) {
                compare_trees(&w).map(|_| s)
            } else {
                Ok(s)
            }
        });
        // Both sides failed, with different errno values: the state is unchanged, so record
        // the disagreement (one example per kind) and go on to find more; the test still fails
        // at the end.
        let res = match res {
            Err(e)
                if e.contains(": cache says ")
                    && !e.contains(" says Ok")
                    && env_u64("ORACLE_STOP_AT") != Some(i as u64) =>
            {
                let kind_key = format!(
                    "{}: {}",
                    op_name(&op),
                    e.split(": ").skip(1).collect::<Vec<_>>().join(": ")
                );
                if !soft.iter().any(|(k, _)| *k == kind_key) {
                    soft.push((kind_key, format!("seed={seed} op#{i} {op} => {e}")));
                }
                Ok(format!("ERRNO MISMATCH {e}"))
            }
            other => other,
        };
        match res {
            Ok(s) => log.push(format!("#{i} {op} -> {s}")),
            Err(e) => {
                let soft_list = soft
                    .iter()
                    .map(|(_, ex)| ex.as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                let shrunk = if std::env::var("ORACLE_SHRINK").is_ok() {
                    done.store(true, Ordering::Release);
                    let sig = signature(&e);
                    let min = shrink(kind, config, &history, &sig);
                    format!(
                        "\nshrunk to {} ops (same failure \"{sig}\"):\n{}",
                        min.len(),
                        min.iter()
                            .map(|o| format!("  {o}"))
                            .collect::<Vec<_>>()
                            .join("\n")
                    )
                } else {
                    String::from("\n(ORACLE_SHRINK=1 to shrink the sequence)")
                };
                if let Ok(f) = std::env::var("ORACLE_LOG") {
                    let _ = std::fs::write(f, log.join("\n"));
                }
                let tail = log
                    .iter()
                    .rev()
                    .take(40)
                    .rev()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n");
                panic!(
                    "oracle mismatch ({kind:?} backend) seed={seed} op#{i}\n{op}\n=> {e}\n\
                     replay: ORACLE_SEED={seed} ORACLE_OPS={}\nlast ops:\n{tail}\n\
                     errno disagreements seen before (both sides failed):\n{soft_list}{shrunk}",
                    i + 1
                );
            }
        }
        if mutation {
            w.rescan();
        }
    }
    done.store(true, Ordering::Release);
    let _ = watchdog.join();
    compare_trees(&w).unwrap_or_else(|e| panic!("seed={seed} at end: {e}"));
    assert!(
        soft.is_empty(),
        "oracle ({kind:?} backend) seed={seed}: {} kinds of errno disagreement (both sides \
         failed, different errno), one example each:\n{}",
        soft.len(),
        soft.iter()
            .map(|(_, ex)| ex.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    for h in w.handles.drain(..).flatten() {
        kernel::close(h.cfd);
        kernel::close(h.kfd);
    }
}

/// The kind of a failure, for shrinking: the text before the first number (the operation, the
/// side that differs, and the errno names or the attribute that differs).
fn signature(e: &str) -> String {
    let cut = e.find(|c: char| c.is_ascii_digit()).unwrap_or(e.len());
    e[..cut.min(60)].to_string()
}

/// Replay `ops` in a forked child (so a hang can be killed); whether the last op hangs (more
/// than 5 s). For shrinking a hang found by the watchdog (`ORACLE_SHRINK_HANG=1`).
fn replay_hangs(kind: BackendKind, config: &Config, ops: &[Op]) -> bool {
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut w = World::new(kind, config);
            for op in ops {
                let _ = w.apply(op);
            }
        }));
        unsafe { libc::_exit(if r.is_ok() { 0 } else { 1 }) };
    }
    let start = Instant::now();
    loop {
        let mut status = 0;
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return false;
        }
        if start.elapsed() > Duration::from_secs(5) {
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Replay `ops` on a fresh world; whether the last op fails with `sig`.
fn replay_fails(kind: BackendKind, config: &Config, ops: &[Op], sig: &str) -> bool {
    if sig == "HANG" {
        return replay_hangs(kind, config, ops);
    }
    let mut w = World::new(kind, config);
    for (i, op) in ops.iter().enumerate() {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.apply(op)));
        if i + 1 == ops.len() {
            return matches!(r, Ok(Err(e)) if signature(&e) == sig);
        }
    }
    for h in w.handles.drain(..).flatten() {
        kernel::close(h.cfd);
        kernel::close(h.kfd);
    }
    false
}

/// Delta-debugging style shrink: drop chunks of operations (never the failing last one) as
/// long as the same failure still happens at the end.
fn shrink(kind: BackendKind, config: &Config, history: &[Op], sig: &str) -> Vec<Op> {
    let mut cur = history.to_vec();
    let deadline =
        Instant::now() + Duration::from_secs(env_u64("ORACLE_SHRINK_SECS").unwrap_or(240));
    let mut chunk = (cur.len() / 2).max(1);
    loop {
        let mut i = 0;
        let mut removed_any = false;
        while i + 1 < cur.len() && Instant::now() < deadline {
            let end = (i + chunk).min(cur.len() - 1);
            let mut cand = cur[..i].to_vec();
            cand.extend_from_slice(&cur[end..]);
            if replay_fails(kind, config, &cand, sig) {
                cur = cand;
                removed_any = true;
            } else {
                i = end;
            }
        }
        if Instant::now() >= deadline || (chunk == 1 && !removed_any) {
            break;
        }
        if !removed_any || chunk > 1 {
            chunk = (chunk / 2).max(1);
        }
    }
    cur
}

fn op_name(op: &Op) -> String {
    let s = format!("{op:?}");
    s.split(' ').next().unwrap_or("").to_string()
}

fn seeds(default: &[u64]) -> Vec<u64> {
    match env_u64("ORACLE_SEED") {
        Some(s) => vec![s],
        None => default.to_vec(),
    }
}

fn ops() -> usize {
    env_u64("ORACLE_OPS").unwrap_or(3000) as usize
}

#[test]
fn oracle_reference_backend() {
    for seed in seeds(&[101, 102, 103, 104]) {
        eprintln!("oracle (reference backend): seed {seed}");
        run(BackendKind::Reference, &Config::default(), seed, ops());
    }
}

#[test]
fn oracle_local_backend() {
    for seed in seeds(&[1, 2, 3, 4, 5, 6, 7, 8]) {
        eprintln!("oracle (local backend): seed {seed}");
        run(BackendKind::Local, &Config::default(), seed, ops());
    }
}

/// Every optimization off: the plain component-at-a-time cache must agree with the kernel too.
#[test]
fn oracle_baseline_config() {
    for seed in seeds(&[201, 202, 203, 204]) {
        eprintln!("oracle (baseline config): seed {seed}");
        run(BackendKind::Local, &Config::baseline(), seed, ops());
    }
}

/// A tiny cache (constant eviction, which must clear completeness), a tiny PCC (constant
/// collisions in its slots) and full-path verification on fast-path hits.
#[test]
fn oracle_tiny_cache_with_eviction() {
    let config = Config {
        verify_path: true,
        max_entries: 48,
        pcc_slots: 4,
        ..Config::default()
    };
    for seed in seeds(&[301, 302, 303, 304]) {
        eprintln!("oracle (tiny cache): seed {seed}");
        run(BackendKind::Local, &config, seed, ops());
    }
}

/// The harness itself: fs credentials really switch on the jail thread, the jail resolves `/`
/// and `..` at its root, and the reference backend never follows a symlink. If this fails,
/// every comparison above would be meaningless (root compared with root).
#[test]
fn harness_self_check() {
    let tmp = tempfile::tempdir().unwrap();
    setup_tree(tmp.path());
    let j = Jail::new(tmp.path());
    let a = Cred::new(1001, 1001, [3000]);
    let b = Cred::new(1002, 1002, [3000, 3001]);
    // b/a is 0700 owned by B.
    assert_eq!(
        j.run_as(&a, || kernel::fstatat(libc::AT_FDCWD, c"b/a/f", false)
            .err()),
        Some(libc::EACCES)
    );
    assert!(j
        .run_as(&b, || kernel::fstatat(libc::AT_FDCWD, c"b/a/f", false))
        .is_ok());
    assert!(j
        .run(|| kernel::fstatat(libc::AT_FDCWD, c"b/a/f", false))
        .is_ok());
    // c/d is 0770 root:3001: B (in 3001) may list it, A may not.
    assert_eq!(
        j.run_as(&a, || kernel::readdir_at(libc::AT_FDCWD, c"c/d").err()),
        Some(libc::EACCES)
    );
    assert_eq!(
        j.run_as(&b, || kernel::readdir_at(libc::AT_FDCWD, c"c/d")
            .map(|v| v.len())),
        Ok(1)
    );
    // access() uses the fs ids (AT_EACCESS), not the real ones.
    assert_eq!(
        j.run_as(&a, || kernel::faccess(
            libc::AT_FDCWD,
            c"f",
            libc::W_OK as u32
        )
        .err()),
        Some(libc::EACCES)
    );
    assert_eq!(
        j.run(|| kernel::faccess(libc::AT_FDCWD, c"f", libc::W_OK as u32).err()),
        None
    );
    // Root of the jail: absolute symlink a/l2 -> /a/b/c resolves inside; `..` stays at root.
    let inside = j
        .run(|| kernel::fstatat(libc::AT_FDCWD, c"a/l2", true))
        .unwrap();
    let real = std::fs::metadata(tmp.path().join("a/b/c")).unwrap();
    assert_eq!(inside.ino, real.ino());
    let top = j
        .run(|| kernel::fstatat(libc::AT_FDCWD, c"/../../a", false))
        .unwrap();
    assert_eq!(
        top.ino,
        std::fs::metadata(tmp.path().join("a")).unwrap().ino()
    );
    // Mutations by a user create files owned by that user, and credentials are restored.
    j.run_as(&b, || kernel::mknodat(libc::AT_FDCWD, c"b/x", 0o644, 0))
        .unwrap();
    let md = std::fs::metadata(tmp.path().join("b/x")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1002, 1002));
    assert!(j
        .run(|| kernel::fstatat(libc::AT_FDCWD, c"b/a/f", false))
        .is_ok());
    // The reference backend refuses to walk through a symlink.
    let kb = KernelBackend::new(tmp.path()).unwrap();
    assert!(kb.getattr(b"l1/c").is_err());
    assert_eq!(kb.getattr(b"a/b/c").unwrap().ino, real.ino());
    assert_eq!(kb.readdir(b"a/b/c", false).unwrap().len(), 1);
    // A long lookup sequence: tree snapshots of identical trees compare equal.
    let tmp2 = tempfile::tempdir().unwrap();
    setup_tree(tmp2.path());
    std::fs::write(tmp2.path().join("b/x"), b"").unwrap();
    std::os::unix::fs::chown(tmp2.path().join("b/x"), Some(1002), Some(1002)).unwrap();
    assert_eq!(snapshot(tmp.path()), snapshot(tmp2.path()));
}
