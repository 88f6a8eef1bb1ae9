//! `{"op":"cached"}` on the control socket (`dircache cached MNT [PATH]`): what the core
//! cache holds under a directory of the mount: for each cached directory its version, whether
//! its listing is complete, how many positive entries (directories, files, symlinks) it holds
//! and the names it holds as negative entries; totals; bounded output.
//!
//! ## Who sees which names
//! This is answered outside a FUSE request, so the kernel has checked nothing: the names in
//! a directory (positive counts, negative names, the names of its subdirectories below) are
//! shown only to a caller who could list that directory through the mount, i.e. who may
//! search every directory on the way and read the directory itself. For a local mount the
//! kernel decides (docs/security.md, principle 2): on a thread switched to the caller's fs
//! uid, fs gid and groups with no capabilities (the peer's credentials the kernel recorded at
//! connect), the daemon opens the directory `O_RDONLY` beneath SRC
//! (`dircache_search::DirectSource`: no symlink followed) and checks that the descriptor is the
//! inode the cache holds; ACLs, capabilities-free root and LSMs count as natively. A remote
//! mount (no local SRC) asks the core's access policy (mode bits of the attributes the server
//! reported) and, since the client kernel also applies the server's POSIX ACLs, shows nothing
//! of a directory on whose way a directory the caller does not own has an access ACL (or one
//! that cannot be read): conservative, an ACL that would grant is not evaluated. uid 0 sees
//! everything (the control socket cannot see a root caller's capabilities).
//!
//! A directory the caller may not list is reported as `denied` with nothing about its
//! contents; the walk does not go below it (a subdirectory's name is a name of its parent).
//! The start path itself must be listable by the caller, else the answer is the kernel's
//! error (EACCES, ENOENT, ENOTDIR).

use std::os::fd::OwnedFd;
use std::sync::Arc;

use dircache_core::{
    At, Cache, Cred, Error, FileType, LookupFlags, NodeKind, NodeRef, XattrTarget, R_OK,
};
use dircache_search::source::Source;
use serde_json::{json, Value};

/// Directories listed at most (more are counted in `more_dirs`), by default and at most.
pub const DEFAULT_DIRS: usize = 200;
pub const MAX_DIRS: usize = 10_000;
/// Negative names shown per directory at most (more are counted), by default and at most.
pub const DEFAULT_NAMES: usize = 20;
pub const MAX_NAMES: usize = 1_000;
/// Cached entries visited at most per request (the rest is reported as `truncated`).
pub const MAX_VISIT: usize = 2_000_000;

/// How access is decided for the caller.
enum Checker<'a> {
    /// uid 0: everything.
    All,
    /// The kernel, as the caller, beneath SRC (`root` is SRC opened `O_PATH` as the caller).
    Kernel {
        src: dircache_search::DirectSource,
        root: OwnedFd,
    },
    /// The core's access policy (remote mounts), and no POSIX ACL on the way for a caller
    /// who does not own the directory.
    Policy {
        cache: &'a Cache,
        creds: dircache_core::Creds,
        cred: Cred,
    },
}

impl Checker<'_> {
    /// May the caller list directory `rel` (search on the way, read on it)? `node` is the
    /// cached dentry for it, whose identity the kernel's directory must have.
    fn may_list(&self, rel: &[u8], node: Option<&NodeRef>) -> Result<(), Error> {
        match self {
            Checker::All => Ok(()),
            Checker::Policy { cache, creds, cred } => {
                let target: &[u8] = if rel.is_empty() { b"." } else { rel };
                cache.access(creds, At::Root, target, R_OK)?;
                // The core's policy reads mode bits only, while the client's kernel also
                // applies the server's POSIX ACLs: a named-user or named-group entry can deny
                // what the mode bits allow. A directory on the way (the root, each ancestor,
                // the directory itself) that has an access ACL, or whose ACL cannot be read,
                // is not shown to a caller who does not own it (for its owner the mode's
                // owner bits are the ACL's owner entry: exact).
                let mut at = Vec::with_capacity(rel.len());
                let parts = rel.split(|b| *b == b'/').filter(|c| !c.is_empty());
                for c in std::iter::once(&b""[..]).chain(parts) {
                    if !c.is_empty() {
                        if !at.is_empty() {
                            at.push(b'/');
                        }
                        at.extend_from_slice(c);
                    }
                    let here: &[u8] = if at.is_empty() { b"." } else { &at };
                    let owner = cache.stat(creds, At::Root, here, LookupFlags::FOLLOW)?.uid;
                    if owner == cred.uid {
                        continue;
                    }
                    let target = XattrTarget {
                        path: &at,
                        expect: None,
                        birth: 0,
                        open: None,
                    };
                    match cache
                        .backend()
                        .getxattr(cred, target, b"system.posix_acl_access")
                    {
                        Err(e) if e.errno() == libc::ENODATA || e.errno() == libc::EOPNOTSUPP => {}
                        _ => return Err(Error::Access),
                    }
                }
                Ok(())
            }
            Checker::Kernel { src, root } => {
                let fd = src.open_dir(root, rel)?;
                let Some(node) = node else {
                    return Ok(());
                };
                let st = rustix::fs::fstat(&fd).map_err(|e| Error::from_errno(e.raw_os_error()))?;
                let (dev, ino) = node.identity();
                if (ino != 0 && ino != st.st_ino) || (dev != 0 && dev != st.st_dev) {
                    // SRC holds another directory there now (a change the feed has not
                    // reported yet): the caller's right to list this one is unknown.
                    return Err(Error::Stale);
                }
                Ok(())
            }
        }
    }
}

fn err(e: Error) -> Value {
    json!({"ok": false, "error": e.to_string(), "errno": e.errno()})
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Split a request path (relative to the mount root) into components; `.` and empty parts
/// are dropped, `..` is refused.
fn components(path: &str) -> Result<Vec<&[u8]>, Error> {
    let mut v = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(Error::Invalid),
            c => v.push(c.as_bytes()),
        }
    }
    Ok(v)
}

/// Answer `{"op":"cached","path":P,"max_dirs":N,"max_names":M}` for `cred`. `base` is SRC
/// opened `O_PATH` (local mounts), `None` for a backend without a local tree.
pub fn answer(cache: &Cache, base: Option<&Arc<OwnedFd>>, cred: &Cred, req: &Value) -> Value {
    let path = req.get("path").and_then(Value::as_str).unwrap_or("");
    let limit = |k: &str, d: usize, m: usize| {
        req.get(k)
            .and_then(Value::as_u64)
            .map_or(d, |n| usize::try_from(n).unwrap_or(m).min(m))
    };
    let max_dirs = limit("max_dirs", DEFAULT_DIRS, MAX_DIRS);
    let max_names = limit("max_names", DEFAULT_NAMES, MAX_NAMES);
    let comps = match components(path) {
        Ok(c) => c,
        Err(e) => return err(e),
    };
    let Some(base) = base else {
        let checker = if cred.uid == 0 {
            Checker::All
        } else {
            Checker::Policy {
                cache,
                creds: cache.credentials(cred.clone()),
                cred: cred.clone(),
            }
        };
        return view(cache, &checker, &comps, max_dirs, max_names);
    };
    if cred.uid == 0 {
        return view(cache, &Checker::All, &comps, max_dirs, max_names);
    }
    let src = match dircache_search::proto::source_for(base.clone(), cred) {
        Ok(s) => s,
        Err(e) => return json!({"ok": false, "error": e.to_string(), "errno": libc::EACCES}),
    };
    // On a thread of its own: the switch to the caller's credentials lasts until it ends.
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            // SRC as the caller (open_root switches for itself), then this thread as the
            // caller until it ends (for every open below).
            let root = match src.open_root(b"/") {
                Ok(r) => r,
                Err(e) => return err(e),
            };
            if let Err(e) = src.thread_init() {
                return err(e);
            }
            view(
                cache,
                &Checker::Kernel { src, root },
                &comps,
                max_dirs,
                max_names,
            )
        });
        h.join().unwrap_or_else(|_| err(Error::Os(libc::EIO)))
    })
}

#[derive(Default)]
struct Totals {
    dirs: u64,
    complete: u64,
    positive: u64,
    subdirs: u64,
    files: u64,
    symlinks: u64,
    negatives: u64,
    denied: u64,
}

fn view(
    cache: &Cache,
    checker: &Checker<'_>,
    comps: &[&[u8]],
    max_dirs: usize,
    max_names: usize,
) -> Value {
    let rel = comps.join(&b'/');
    // The caller must be able to list the start directory (the kernel's answer if not),
    // whatever the cache holds there.
    let mut node = Some(cache.root());
    for c in comps {
        node = node.and_then(|n| n.cached_child(c));
    }
    let node = node.filter(|n| !n.is_dead());
    if let Err(e) = checker.may_list(&rel, node.as_ref()) {
        return err(e);
    }
    let Some(node) = node else {
        return json!({"ok": true, "path": text(&rel), "cached": false});
    };
    match node.kind() {
        NodeKind::Positive(FileType::Directory) => {}
        NodeKind::Positive(_) => return err(Error::NotDir),
        NodeKind::Negative(e) => return err(e),
    }
    let mut t = Totals::default();
    let mut dirs = Vec::new();
    let mut more_dirs = 0u64;
    let mut visited = 0usize;
    let mut truncated = false;
    // Depth first, names in order; every directory on the stack was found listable.
    let mut stack: Vec<(Vec<u8>, NodeRef)> = vec![(rel, node)];
    while let Some((path, d)) = stack.pop() {
        let mut kids = d.cached_children();
        kids.retain(|k| !k.is_dead());
        kids.sort_by_key(|k| k.name());
        visited += kids.len();
        let (mut sub, mut files, mut links, mut other) = (0u64, 0u64, 0u64, 0u64);
        let mut negatives: Vec<Vec<u8>> = Vec::new();
        let mut next = Vec::new();
        for k in &kids {
            let name = k.name();
            match k.kind() {
                NodeKind::Positive(FileType::Directory) => {
                    sub += 1;
                    if k.has_children() || k.is_complete() {
                        next.push((name, k.clone()));
                    }
                    continue;
                }
                NodeKind::Positive(FileType::Regular) => files += 1,
                NodeKind::Positive(FileType::Symlink) => links += 1,
                NodeKind::Positive(_) => other += 1,
                NodeKind::Negative(_) => negatives.push(name.clone()),
            }
            // Negatives hanging below a negative or a file (`missing/x`, `file/x`).
            if k.has_children() {
                let mut deep = vec![(name, k.clone())];
                while let Some((p, n)) = deep.pop() {
                    for c in n.cached_children() {
                        if c.is_dead() || visited >= MAX_VISIT {
                            continue;
                        }
                        visited += 1;
                        let cp = [&p[..], b"/", &c.name()[..]].concat();
                        negatives.push(cp.clone());
                        deep.push((cp, c));
                    }
                }
            }
        }
        negatives.sort();
        let positive = sub + files + links + other;
        t.dirs += 1;
        t.complete += u64::from(d.is_complete());
        t.positive += positive;
        t.subdirs += sub;
        t.files += files;
        t.symlinks += links;
        t.negatives += negatives.len() as u64;
        if dirs.len() < max_dirs {
            let more = negatives.len().saturating_sub(max_names);
            negatives.truncate(max_names);
            dirs.push(json!({
                "path": text(&path),
                "version": d.version(),
                "complete": d.is_complete(),
                "pending": d.is_pending(),
                "positive": positive,
                "dirs": sub,
                "files": files,
                "symlinks": links,
                "other": other,
                "negatives": negatives.iter().map(|n| text(n)).collect::<Vec<_>>(),
                "more_negatives": more,
            }));
        } else {
            more_dirs += 1;
        }
        if visited >= MAX_VISIT {
            truncated = true;
            break;
        }
        // Reverse, so that the stack pops them in name order.
        for (name, k) in next.into_iter().rev() {
            let p = if path.is_empty() {
                name
            } else {
                [&path[..], b"/", &name[..]].concat()
            };
            match checker.may_list(&p, Some(&k)) {
                Ok(()) => stack.push((p, k)),
                Err(_) => {
                    t.denied += 1;
                    if dirs.len() < max_dirs {
                        dirs.push(json!({"path": text(&p), "denied": true}));
                    } else {
                        more_dirs += 1;
                    }
                }
            }
        }
    }
    json!({
        "ok": true,
        "path": text(&stack_root(comps)),
        "cached": true,
        "dirs": dirs,
        "more_dirs": more_dirs,
        "truncated": truncated,
        "totals": {
            "dirs": t.dirs,
            "complete": t.complete,
            "positive": t.positive,
            "subdirs": t.subdirs,
            "files": t.files,
            "symlinks": t.symlinks,
            "negatives": t.negatives,
            "denied": t.denied,
        },
    })
}

fn stack_root(comps: &[&[u8]]) -> Vec<u8> {
    comps.join(&b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_split_and_dotdot_refused() {
        assert_eq!(
            components("a//b/./c/").unwrap(),
            vec![&b"a"[..], b"b", b"c"]
        );
        assert!(components("").unwrap().is_empty());
        assert_eq!(components("a/../b"), Err(Error::Invalid));
    }
}
