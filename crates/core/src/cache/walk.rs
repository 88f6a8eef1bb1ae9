//! Path resolution: the fast path (one DLHT probe + one PCC probe) and the slow path
//! (component at a time, permission check at every directory, backend on misses).

use std::borrow::Cow;
use std::hash::Hasher;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use siphasher::sip128::SipHasher13;

use super::dentry::{Dentry, COMPLETE, DEAD, EVICTED, HAS_CHILDREN, PENDING};
use super::dlht::{finish, norm_lex, raw_key, sig_of, EntryExtra, FastEntry, Seen, FOLLOW_MARK};
use super::invalidate::OPTIMISTIC_TRIES;
use super::path::{self, check_path};
use super::{
    At, Cache, CredState, Creds, DirHandle, Mount, MountOptions, Namespace, NodeKind, NodeRef,
};
use crate::{Attr, DotDot, Error, FileType, LookupFlags, Result, MAX_SYMLINKS, NAME_MAX, X_OK};

/// Where a walk starts.
pub(crate) struct Start<'a> {
    pub(crate) ns: &'a Arc<Namespace>,
    pub(crate) mnt: &'a Arc<Mount>,
    pub(crate) node: &'a NodeRef,
    /// The handle, for relative walks from one.
    pub(crate) handle: Option<&'a DirHandle>,
}

/// What a slow-path walk found.
pub(crate) struct Walk {
    pub(crate) mnt: Arc<Mount>,
    /// The final dentry; may be negative.
    pub(crate) node: NodeRef,
    /// Version of `node` when the walk reached it.
    pub(crate) ver: u64,
    /// `node`'s parent and its version then.
    pub(crate) up: Option<(NodeRef, u64)>,
    /// Symlinks followed, as seen when followed.
    pub(crate) deps: Vec<Seen>,
    /// Index in `deps` of the symlink that was the path's own final component, when it was
    /// followed.
    pub(crate) final_link: Option<usize>,
    /// Nodes reached right before a `..` in the original path while no symlink had been
    /// followed yet: (byte offset of the `..`, node, version), published as prefixes so the
    /// fast path can check `..` later.
    pub(crate) dotdot: Vec<(usize, Arc<Mount>, Seen)>,
    /// The walk called the backend (its answer, even a negative one, is a miss).
    pub(crate) missed: bool,
}

enum Next {
    Done,
    Comp {
        comp: Vec<u8>,
        last: bool,
        at: usize,
        depth: usize,
    },
}

fn next_component(stack: &mut Vec<(Cow<'_, [u8]>, usize)>) -> Next {
    loop {
        let Some((buf, pos)) = stack.last_mut() else {
            return Next::Done;
        };
        let mut i = *pos;
        while i < buf.len() && buf[i] == b'/' {
            i += 1;
        }
        if i == buf.len() {
            stack.pop();
            continue;
        }
        let s = i;
        while i < buf.len() && buf[i] != b'/' {
            i += 1;
        }
        *pos = i;
        let comp = buf[s..i].to_vec();
        let depth = stack.len();
        let last = !stack
            .iter()
            .any(|(b, p)| b[*p..].iter().any(|&c| c != b'/'));
        return Next::Comp {
            comp,
            last,
            at: s,
            depth,
        };
    }
}

impl Cache {
    pub(crate) fn start<'a>(&'a self, at: At<'a>) -> Start<'a> {
        match at {
            At::Root => Start {
                ns: &self.ns,
                mnt: &self.ns.root,
                node: &self.ns.root.root,
                handle: None,
            },
            At::Dir(h) => Start {
                ns: &h.ns,
                mnt: &h.mnt,
                node: &h.node,
                handle: Some(h),
            },
        }
    }

    /// Resolve a path and hand the final dentry (positive) and its mount's options to `f`.
    /// Negative results come back as their errors.
    pub(crate) fn resolve<R>(
        &self,
        c: &Creds,
        at: At<'_>,
        path: &[u8],
        flags: LookupFlags,
        f: impl FnOnce(&NodeRef, MountOptions) -> R,
    ) -> Result<R> {
        let st = self.start(at);
        let mut f = Some(f);
        if let Some(r) = self.fast(&c.0, &st, path, flags, &mut f) {
            return r;
        }
        let w = self.slow(&c.0, &st, path, flags)?;
        match w.node.kind() {
            NodeKind::Negative(e) => {
                if !w.missed {
                    self.stats.negative_hits.inc();
                }
                Err(e)
            }
            NodeKind::Positive(_) => match f.take() {
                Some(f) => Ok(f(&w.node, w.mnt.opts)),
                None => Err(Error::Invalid),
            },
        }
    }

    // ----------------------------------------------------------------------------------
    // Fast path.

    /// One DLHT probe and one PCC probe; `None` sends the caller to the slow path.
    #[inline]
    fn fast<R>(
        &self,
        cs: &CredState,
        st: &Start<'_>,
        path: &[u8],
        flags: LookupFlags,
        f: &mut Option<impl FnOnce(&NodeRef, MountOptions) -> R>,
    ) -> Option<Result<R>> {
        if !self.config.fastpath || path.len() >= crate::PATH_MAX {
            return None;
        }
        let ns = st.ns;
        let abs = path.first() == Some(&b'/');
        let rel = if abs {
            let i = path.iter().position(|&b| b != b'/')?;
            &path[i..]
        } else {
            path
        };
        // The base: namespace root, or a handle whose lexical path still names it.
        let (base, lex): (&SipHasher13, &[u8]) = match (abs, st.handle) {
            (true, _) | (false, None) => (&ns.base, b""),
            (false, Some(h)) => {
                let lex = h.lex.as_deref()?;
                if h.node.version.load(Ordering::Acquire) != h.ver {
                    return None;
                }
                (&h.hasher, lex)
            }
        };
        let mut must_dir = flags.directory;
        let mut follow = flags.follow;
        let mut x_final = false;
        let normalized;
        // Paths without `..` are keyed by their bytes as given (`a//b/./c` is its own key,
        // published by the slow path when it resolved exactly that string); only `..` needs the
        // lexical form, checked against the prefix it climbs out of.
        // The key is hashed after `hb` (the namespace's keyed state, or a handle's state after
        // its lexical path): one-shot (`hash128`), cheaper than streaming `write` + `finish`.
        let (hb, full): (&SipHasher13, Option<Vec<u8>>) = match path::has_dotdot(rel) {
            false => {
                if rel.last() == Some(&b'/') {
                    must_dir = true;
                    follow = true;
                } else if rel == b"." || rel.ends_with(b"/.") {
                    must_dir = true;
                    follow = true;
                    x_final = true;
                }
                (base, None)
            }
            true => {
                normalized = self.fast_normalize(cs, ns, lex, rel)?;
                let (buf, md, xf) = normalized;
                if md {
                    must_dir = true;
                    follow = true;
                }
                x_final = xf;
                (&ns.base, Some(buf))
            }
        };
        let key = full.as_deref().unwrap_or(rel);
        let sig = sig_of(hb, key);
        let guard = ns.dlht.guard();
        let mut e = ns.dlht.get(sig, &guard)?;
        let mut mount = self.fast_entry_ok(cs, ns, e, sig, lex, rel, full.as_deref())?;
        if let NodeKind::Positive(FileType::Symlink) = e.node.kind() {
            if follow || must_dir {
                let mut hf = *hb;
                hf.write(key);
                hf.write(FOLLOW_MARK);
                let sigf = finish(&hf);
                let ef = ns.dlht.get(sigf, &guard)?;
                mount = self.fast_entry_ok(cs, ns, ef, sigf, lex, rel, full.as_deref())?;
                e = ef;
            }
        }
        let node = &e.node;
        node.touch();
        match node.kind() {
            NodeKind::Negative(err) => {
                self.stats.fastpath_hits.inc();
                self.stats.negative_hits.inc();
                Some(Err(err))
            }
            NodeKind::Positive(t) => {
                if must_dir && t != FileType::Directory {
                    return Some(Err(Error::NotDir));
                }
                if x_final && cs.check {
                    let a = node.attr_copy()?;
                    if let Err(err) = self.policy.permission(&cs.cred, &a, X_OK) {
                        return Some(Err(err));
                    }
                }
                self.stats.fastpath_hits.inc();
                let f = f.take()?;
                Some(Ok(f(node, mount)))
            }
        }
    }

    /// The entry's mount options if it may answer this lookup (valid, the path it keeps if
    /// any is this one, and this credential's PCC confirms it).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn fast_entry_ok(
        &self,
        cs: &CredState,
        ns: &Namespace,
        e: &FastEntry,
        sig: u128,
        lex: &[u8],
        rel: &[u8],
        full: Option<&[u8]>,
    ) -> Option<MountOptions> {
        let mount = ns.dlht.with_extra(e, |x| {
            if !e.valid(x) {
                return None;
            }
            let Some(p) = x.and_then(|x| x.path.as_deref()) else {
                return Some(x.map_or_else(MountOptions::default, |x| x.mount));
            };
            let same = match full {
                Some(full) => *p == *full,
                None if lex.is_empty() => *p == *rel,
                None => {
                    p.len() == lex.len() + 1 + rel.len()
                        && p.starts_with(lex)
                        && p[lex.len()] == b'/'
                        && p.ends_with(rel)
                }
            };
            same.then(|| x.map_or_else(MountOptions::default, |x| x.mount))
        })??;
        if cs.check && !cs.pcc.check(sig, e.stamp) {
            self.stats.pcc_misses.inc();
            return None;
        }
        Some(mount)
    }

    /// Normalize `lex/rel` for the fast path: drop empty and `.` components, resolve `..`
    /// against prefixes the fast path can vouch for. Returns (path, must be a directory,
    /// needs search permission on the final directory), or `None` for the slow path.
    fn fast_normalize(
        &self,
        cs: &CredState,
        ns: &Namespace,
        lex: &[u8],
        rel: &[u8],
    ) -> Option<(Vec<u8>, bool, bool)> {
        check_path(rel).ok()?;
        let mut buf = Vec::with_capacity(lex.len() + 1 + rel.len());
        buf.extend_from_slice(lex);
        let mut last_dot = false;
        for c in path::components(rel) {
            last_dot = false;
            match c {
                b"." => last_dot = true,
                b".." => {
                    last_dot = true;
                    if self.config.dotdot == DotDot::Posix && !buf.is_empty() {
                        // `prefix/..` needs prefix to be a searchable directory reached
                        // without symlinks; then it is lexically the parent.
                        let sig = sig_of(&ns.base, &buf);
                        let guard = ns.dlht.guard();
                        let e = ns.dlht.get(sig, &guard)?;
                        let direct = ns
                            .dlht
                            .with_extra(e, |x| e.valid(x) && x.is_none_or(|x| x.deps.is_empty()));
                        if direct != Some(true) || !e.node.is_dir() {
                            return None;
                        }
                        if cs.check {
                            if !cs.pcc.check(sig, e.stamp) {
                                return None;
                            }
                            let a = e.node.attr_copy()?;
                            self.policy.permission(&cs.cred, &a, X_OK).ok()?;
                        }
                    }
                    match buf.iter().rposition(|&b| b == b'/') {
                        Some(i) => buf.truncate(i),
                        None => buf.clear(),
                    }
                }
                c => {
                    if c.len() > NAME_MAX {
                        return None;
                    }
                    if !buf.is_empty() {
                        buf.push(b'/');
                    }
                    buf.extend_from_slice(c);
                }
            }
        }
        if buf.is_empty() {
            // The namespace root itself: no DLHT entry; the slow path answers at once.
            return None;
        }
        let must_dir = last_dot || rel.last() == Some(&b'/');
        Some((buf, must_dir, last_dot))
    }

    // ----------------------------------------------------------------------------------
    // Slow path.

    /// Walk component by component and publish the result for the fast path.
    pub(crate) fn slow(
        &self,
        cs: &CredState,
        st: &Start<'_>,
        path: &[u8],
        flags: LookupFlags,
    ) -> Result<Walk> {
        // Read the invalidation counters before anything else (SOSP'15 §3.2).
        let e0 = self.inval_end.load(Ordering::SeqCst);
        let s0 = self.inval_start.load(Ordering::SeqCst);
        let lexical;
        let p = if self.config.dotdot == DotDot::Lexical {
            check_path(path)?;
            lexical = path::lexical(path, true);
            &lexical[..]
        } else {
            path
        };
        let w = self.walk(cs, st, p, flags)?;
        if self.config.fastpath && s0 == e0 {
            self.publish(cs, st, p, &w, s0);
        }
        Ok(w)
    }

    /// Walk a path given as one syscall-style argument: ENAMETOOLONG at PATH_MAX.
    pub(crate) fn walk(
        &self,
        cs: &CredState,
        st: &Start<'_>,
        path: &[u8],
        flags: LookupFlags,
    ) -> Result<Walk> {
        check_path(path)?;
        self.walk_any_length(cs, st, path, flags)
    }

    /// Walk a path the cache was handed as a backend path (a change feed's report, an
    /// `invalidate`): no PATH_MAX limit, since PATH_MAX bounds a syscall's argument, not how
    /// deep a node lies (names are still checked against NAME_MAX on the way).
    pub(crate) fn walk_any_length(
        &self,
        cs: &CredState,
        st: &Start<'_>,
        path: &[u8],
        flags: LookupFlags,
    ) -> Result<Walk> {
        self.stats.slowpath_walks.inc();
        if path.is_empty() {
            return Err(Error::NotFound);
        }
        if path.contains(&0) {
            return Err(Error::Invalid);
        }
        let ns = st.ns;
        let (mut mnt, mut cur) = if path[0] == b'/' {
            (ns.root.clone(), ns.root.root.clone())
        } else {
            (st.mnt.clone(), st.node.clone())
        };
        // `directory` means what a trailing slash means: the final symlink is followed (as the
        // fast path does).
        let mut follow_final = flags.follow || flags.directory;
        let mut must_dir = flags.directory;
        if path::wants_dir(path) {
            follow_final = true;
            must_dir = true;
        }
        let mut stack: Vec<(Cow<'_, [u8]>, usize)> = vec![(Cow::Borrowed(path), 0)];
        let mut links = 0u32;
        let mut w = Walk {
            mnt: mnt.clone(),
            ver: cur.version(),
            up: None,
            node: cur.clone(),
            deps: Vec::new(),
            final_link: None,
            dotdot: Vec::new(),
            missed: false,
        };
        let mut missed = false;
        loop {
            let (comp, last, at, depth) = match next_component(&mut stack) {
                Next::Done => break,
                Next::Comp {
                    comp,
                    last,
                    at,
                    depth,
                } => (comp, last, at, depth),
            };
            // The current node must be a directory we may search.
            match cur.kind() {
                NodeKind::Positive(FileType::Directory) => {}
                k => {
                    let err = match k {
                        NodeKind::Negative(e) => e,
                        _ => Error::NotDir,
                    };
                    if !self.config.deep_negatives
                        || comp == b"."
                        || comp == b".."
                        || comp.len() > NAME_MAX
                    {
                        return Err(err);
                    }
                    // Deep negative: remember `cur/comp` fails the same way.
                    cur = self.negative_child(&cur, &comp, err);
                    continue;
                }
            }
            if cs.check {
                let a = self.attr_of_counted(&cur, &mut missed)?;
                self.policy.permission(&cs.cred, &a, X_OK)?;
            }
            if comp == b"." {
                continue;
            }
            if comp == b".." {
                if depth == 1 && w.deps.is_empty() {
                    w.dotdot.push((at, mnt.clone(), Seen::now(&cur)));
                }
                let (m, n) = self.dotdot(ns, &mnt, &cur);
                mnt = m;
                cur = n;
                continue;
            }
            if comp.len() > NAME_MAX {
                return Err(Error::NameTooLong);
            }
            let child = self.child_batched(&cur, &comp, &stack, &mut missed)?;
            let (cmnt, child) = self.cross(ns, &mnt, child);
            if child.kind() == NodeKind::Positive(FileType::Symlink) && (!last || follow_final) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(Error::Loop);
                }
                let target = self.link_target_counted(&child, &mut missed)?;
                if last && depth == 1 {
                    w.final_link = Some(w.deps.len());
                }
                w.deps.push(Seen::now(&child));
                if target.is_empty() {
                    return Err(Error::NotFound);
                }
                if last && path::wants_dir(&target) {
                    // The path ends in this link and its body ends in a slash (or `.`/`..`):
                    // what it leads to must be a directory, as for a trailing slash.
                    follow_final = true;
                    must_dir = true;
                }
                if target[0] == b'/' {
                    mnt = ns.root.clone();
                    cur = ns.root.root.clone();
                }
                stack.push((Cow::Owned(target), 0));
                continue;
            }
            mnt = cmnt;
            cur = child;
        }
        if must_dir {
            match cur.kind() {
                NodeKind::Positive(FileType::Directory) | NodeKind::Negative(_) => {}
                _ => return Err(Error::NotDir),
            }
        }
        if missed {
            self.stats.misses.inc();
            self.stats.walk_misses.inc();
        } else {
            self.stats.hits.inc();
            self.stats.walk_hits.inc();
        }
        w.missed = missed;
        let seen = Seen::now(&cur);
        w.ver = seen.ver;
        w.up = seen.up;
        w.node = cur;
        w.mnt = mnt;
        Ok(w)
    }

    /// Publish a slow-path result in the DLHT and this credential's PCC, then undo it if an
    /// invalidation started meanwhile (SOSP'15 §3.2's global counter protocol).
    fn publish(&self, cs: &CredState, st: &Start<'_>, path: &[u8], w: &Walk, s0: u64) {
        // Every version this walk recorded was read before this point. If no invalidation
        // window opened since the walk began, any window opening later bumps those versions
        // after we read them, so what we publish can only be invalidated, never stale.
        // Checking only after publishing (and retracting) would leave a gap in which a lookup
        // starting after a completed chmod could hit the entry (found by the shuttle model and
        // the concurrency test).
        // Reserve the stamps (validity bounds, see `FastEntry`) of every entry this walk may
        // publish *before* the check below: a window that opens after the check bumps with
        // values above them, so those bumps invalidate what we publish.
        // Two values per entry, the first even (dlht.rs, "Stamp parity"), plus one to align.
        let want = 2 * (w.dotdot.len() as u64 + 2) + 1;
        let mut next = self.seq.fetch_add(want, Ordering::SeqCst);
        let end = next + want;
        next += next & 1;
        if self.inval_start.load(Ordering::SeqCst) != s0 {
            return;
        }
        let mut stamp = || {
            let s = next;
            next += 2;
            debug_assert!(s + 1 < end);
            s
        };
        let ns = st.ns;
        let abs = path.first() == Some(&b'/');
        let lex: &[u8] = match (abs, st.handle) {
            (true, _) | (false, None) => b"",
            (false, Some(h)) => match h.lex.as_deref() {
                Some(l) if h.node.version() == h.ver => l,
                _ => return,
            },
        };
        let mut published: Vec<(u128, u64)> = Vec::new();
        // Prefixes before `..` components.
        for (at, mnt, seen) in &w.dotdot {
            let full = norm_lex(lex, &path[..*at]);
            if full.is_empty() {
                continue;
            }
            if let Some(p) = self.publish_one(cs, ns, &full, false, seen, &[], mnt.opts, stamp()) {
                published.push(p);
            }
        }
        // The path itself, when its lexical form names what the walk found.
        let has_dotdot = path::components(path).any(|c| c == b"..");
        if !has_dotdot || w.deps.is_empty() {
            // The same key the fast path computes: bytes as given unless `..` may occur.
            let full = if path::has_dotdot(path) {
                norm_lex(lex, path)
            } else {
                raw_key(lex, path)
            };
            if !full.is_empty() && (w.node.kind() != NodeKind::Negative(Error::Loop)) {
                let (deps, link) = match w.final_link {
                    Some(i) => (&w.deps[..i], w.deps.get(i)),
                    None => (&w.deps[..], None),
                };
                let target = Seen {
                    node: w.node.clone(),
                    ver: w.ver,
                    up: w.up.clone(),
                };
                match link {
                    Some(l) => {
                        // path -> the link itself; path + FOLLOW_MARK -> the target.
                        if let Some(p) =
                            self.publish_one(cs, ns, &full, false, l, deps, w.mnt.opts, stamp())
                        {
                            published.push(p);
                        }
                        if let Some(p) = self.publish_one(
                            cs,
                            ns,
                            &full,
                            true,
                            &target,
                            &w.deps,
                            w.mnt.opts,
                            stamp(),
                        ) {
                            published.push(p);
                        }
                    }
                    None => {
                        if let Some(p) = self.publish_one(
                            cs,
                            ns,
                            &full,
                            false,
                            &target,
                            deps,
                            w.mnt.opts,
                            stamp(),
                        ) {
                            published.push(p);
                        }
                    }
                }
            }
        }
        fence(Ordering::SeqCst);
        if self.inval_start.load(Ordering::SeqCst) != s0 {
            for (sig, stamp) in published {
                cs.pcc.remove(sig, stamp);
                ns.dlht.remove(sig, stamp);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn publish_one(
        &self,
        cs: &CredState,
        ns: &Namespace,
        full: &[u8],
        follow_key: bool,
        seen: &Seen,
        deps: &[Seen],
        mount: MountOptions,
        fresh: u64,
    ) -> Option<(u128, u64)> {
        // Every version the walk recorded is still current (a store before `fresh` was
        // reserved that the walk did not see is caught here; later ones are `>= fresh`).
        if !seen.valid() || !deps.iter().all(Seen::valid) {
            return None;
        }
        if !deps.is_empty() && !self.config.symlink_aliases {
            // A path through a symlink is an alias (§4.2): switched off, it takes the slow path.
            return None;
        }
        let mut h = ns.base;
        h.write(full);
        if follow_key {
            h.write(FOLLOW_MARK);
        }
        let sig = finish(&h);
        let guard = ns.dlht.guard();
        let reuse = ns.dlht.get(sig, &guard).and_then(|e| {
            // A valid entry for the same dentry and parent describes the state this walk saw
            // (a bump since its publication would have made it invalid).
            let same = e.same_target(seen)
                && ns.dlht.with_extra(e, |x| {
                    let d: &[Seen] = x.map_or(&[], |x| &x.deps);
                    d.len() == deps.len()
                        && d.iter().zip(deps).all(|(a, b)| a.same(b))
                        && e.valid(x)
                }) == Some(true);
            same.then_some(e.stamp)
        });
        let stamp = match reuse {
            Some(s) => s,
            None => {
                let extra = (!deps.is_empty()
                    || mount != MountOptions::default()
                    || self.config.verify_path)
                    .then(|| EntryExtra {
                        deps: deps.to_vec().into_boxed_slice(),
                        mount,
                        path: self.config.verify_path.then(|| full.into()),
                    });
                // `fresh` is even; its odd successor (reserved with it) marks an entry with
                // uncommon parts (dlht.rs, "Stamp parity").
                let stamp = if extra.is_some() { fresh | 1 } else { fresh };
                let e = FastEntry {
                    node: seen.node.clone(),
                    up: seen.up.as_ref().map(|(p, _)| p.clone()),
                    stamp,
                };
                ns.dlht.insert(sig, e, extra);
                if self.dlht_inserts.fetch_add(1, Ordering::Relaxed)
                    > self.entries.load(Ordering::Relaxed) + 4096
                {
                    self.dlht_inserts.store(0, Ordering::Relaxed);
                    self.sweep_dlht();
                }
                stamp
            }
        };
        if cs.check && cs.pcc.insert(sig, stamp) {
            self.grow_pcc(cs, sig, stamp);
        }
        Some((sig, stamp))
    }

    // ----------------------------------------------------------------------------------
    // Dentry-level helpers shared by the walk, mutations and front ends.

    /// Child `name` of directory `dir`, from the cache or the backend. Negative dentries are
    /// returned as such (not as errors).
    pub(crate) fn child(&self, dir: &NodeRef, name: &[u8], missed: &mut bool) -> Result<NodeRef> {
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        if !self.trusts_cache() {
            *missed = true;
            return self.child_bypass(dir, name);
        }
        {
            let inner = dir.inner.read();
            if let Some(c) = inner.child(name) {
                c.touch();
                return Ok(c.clone());
            }
            if self.config.completeness && dir.has(COMPLETE) {
                drop(inner);
                return Ok(self.negative_child(dir, name, Error::NotFound));
            }
        }
        if dir.has(PENDING) && self.take_pending(dir, true) {
            return self.child(dir, name, missed);
        }
        *missed = true;
        let mut tries = 0;
        loop {
            tries += 1;
            let (r, gen0, ver0) = self.by_path(dir, |dpath| {
                let (gen0, ver0) = (dir.inner.read().gen(), dir.version());
                let r = self
                    .stats
                    .backend
                    .lookup
                    .time(|| dir.sb.backend.lookup(dpath, name));
                (r, gen0, ver0)
            })?;
            let (kind, attr) = match r {
                Ok(a) => (NodeKind::Positive(a.kind()), Some(a)),
                Err(Error::NotFound) => {
                    self.stats.negative_misses.inc();
                    (NodeKind::Negative(Error::NotFound), None)
                }
                Err(e) => return Err(e),
            };
            let cacheable = attr.is_some() || self.config.negatives;
            let node = self.insert_child(dir, name, gen0, ver0, kind, attr);
            // `dir` changed while the backend was asked (a change reported from outside, even
            // of another name in it; a mutation through the cache): the answer was not cached
            // and the dentry returned is dead, which gives no attributes or path to whoever
            // holds it (a FUSE LOOKUP would answer ENOENT for a name that exists). Ask again,
            // as `by_path` does for renames; a directory that keeps changing gets the last
            // answer, uncached.
            if !node.has(DEAD) || !cacheable || dir.has(DEAD | EVICTED) || tries >= OPTIMISTIC_TRIES
            {
                return Ok(node);
            }
        }
    }

    /// `child` with the search-permission check on `dir` and `.`/`..` handling, for the node
    /// API.
    pub(crate) fn child_checked(&self, c: &Creds, dir: &NodeRef, name: &[u8]) -> Result<NodeRef> {
        self.child_checked_counted(c, dir, name, &mut false)
    }

    /// `child_checked`, telling whether the backend was asked (`missed`).
    pub(crate) fn child_checked_counted(
        &self,
        c: &Creds,
        dir: &NodeRef,
        name: &[u8],
        was_missed: &mut bool,
    ) -> Result<NodeRef> {
        match dir.kind() {
            NodeKind::Positive(FileType::Directory) => {}
            NodeKind::Positive(_) => return Err(Error::NotDir),
            NodeKind::Negative(e) => return Err(e),
        }
        if c.0.check {
            let a = self.attr_of(dir)?;
            self.policy.permission(&c.0.cred, &a, X_OK)?;
        }
        if dir.has(DEAD) {
            return Err(Error::NotFound);
        }
        match name {
            b"" => Err(Error::NotFound),
            b"." => Ok(dir.clone()),
            b".." => Ok(dir.parent_ref().unwrap_or_else(|| dir.clone())),
            _ => {
                let mut missed = false;
                let n = self.child(dir, name, &mut missed)?;
                *was_missed = missed;
                if missed {
                    self.stats.misses.inc();
                } else {
                    self.stats.hits.inc();
                }
                Ok(n)
            }
        }
    }

    /// Insert a child learned from the backend, unless `dir` changed since the backend was
    /// asked (then the answer is returned but not cached).
    pub(crate) fn insert_child(
        &self,
        dir: &NodeRef,
        name: &[u8],
        gen0: u64,
        ver0: u64,
        kind: NodeKind,
        attr: Option<Attr>,
    ) -> NodeRef {
        self.insert_child_new(dir, name, gen0, ver0, kind, attr).0
    }

    /// `insert_child`, also telling whether the dentry returned is a new one this call created
    /// and cached: then its version at creation (its `gen` was 0), against which children
    /// learned from the same backend answer are checked before they are cached below it.
    pub(crate) fn insert_child_new(
        &self,
        dir: &NodeRef,
        name: &[u8],
        gen0: u64,
        ver0: u64,
        kind: NodeKind,
        attr: Option<Attr>,
    ) -> (NodeRef, Option<u64>) {
        let cacheable = match kind {
            NodeKind::Negative(_) => self.config.negatives,
            NodeKind::Positive(_) => true,
        };
        let mut inner = dir.inner.write();
        if let Some(c) = inner.child(name) {
            return (c.clone(), None);
        }
        let fresh = inner.gen() == gen0 && dir.version() == ver0 && !dir.has(DEAD | EVICTED);
        let revived = match (kind, attr) {
            (NodeKind::Positive(FileType::Directory), Some(a)) if fresh => {
                self.revive(dir, name, &a)
            }
            _ => None,
        };
        let was_revived = revived.is_some();
        let node = revived.unwrap_or_else(|| self.new_dentry(dir, name, kind, attr));
        let mut created = None;
        if cacheable && fresh {
            if !was_revived {
                created = Some(node.version());
            }
            inner.children_mut().insert(dir, node.clone());
            let first = dir.flags.fetch_or(HAS_CHILDREN, Ordering::AcqRel) & HAS_CHILDREN == 0;
            drop(inner);
            if first && !dir.is_dir() {
                // A file or negative with deep negatives below it is now interior: its parent's
                // invalidations must reach it (directories were listed when inserted).
                if let Some(p) = dir.parent_ref() {
                    p.inner.write().children_mut().add_interior(&p, dir);
                }
            }
            self.account_new(&node);
            if was_revived {
                self.revive_below(&node);
            }
        } else {
            node.set(DEAD);
        }
        (node, created)
    }

    pub(crate) fn new_dentry(
        &self,
        parent: &NodeRef,
        name: &[u8],
        kind: NodeKind,
        attr: Option<Attr>,
    ) -> NodeRef {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let ver = self.seq.fetch_add(1, Ordering::SeqCst);
        let n = Arc::new(Dentry::new(
            id,
            parent.sb.clone(),
            kind,
            Some(parent.clone()),
            name,
            ver,
            attr,
        ));
        if let Some(a) = attr {
            self.note_links(&n, &a);
        }
        n
    }

    /// Attributes of a dentry, from the cache or the backend.
    pub(crate) fn attr_of(&self, node: &NodeRef) -> Result<Attr> {
        let mut missed = false;
        self.attr_of_counted(node, &mut missed)
    }

    pub(crate) fn attr_of_counted(&self, node: &NodeRef, missed: &mut bool) -> Result<Attr> {
        if let NodeKind::Negative(e) = node.kind() {
            return Err(e);
        }
        if let Some(a) = node.attr_copy().filter(|_| self.trusts_cache()) {
            self.stats.attr_hits.inc();
            return Ok(a);
        }
        if node.has(DEAD) {
            // Removed (or moved out of sight): Linux still checks an open descriptor's inode
            // with its last attributes before saying ENOENT.
            return node.attr.load_last().ok_or(Error::NotFound);
        }
        *missed = true;
        self.stats.attr_misses.inc();
        let (r, v0, s0) = self.by_path(node, |p| {
            // What the answer will be checked against before it is cached: a change of the
            // node's attributes (or an invalidation of it) during the call makes it older.
            let (v0, s0) = (node.version(), node.attr.stamp());
            let r = self
                .stats
                .backend
                .getattr
                .time(|| node.sb.backend.getattr(p));
            (r, v0, s0)
        })?;
        let a = r?;
        if !self.trusts_cache() {
            self.bypass_check_attr(node, &a)?;
        }
        // Another inode at the name (same device, another number): replaced behind the
        // cache's back, the change not reported yet. Its attributes are the answer about the
        // name, but the dentry stands for the inode it was made for: caching them would make
        // the report's revalidation (`still_same`, which compares the inode number) take the
        // dentry for the new inode and keep it, with its map. Torture seed 540: a directory
        // renamed over a listed empty one in SRC, a file created through the mount in the
        // old one before the report (the creation forgets the parent's attributes, the next
        // GETATTR fetched the new directory's by path), and the old directory's listing (the
        // new file only) was served for the name for good.
        // (A number made up by the backend while disconnected, replaced by the real one, is
        // the same object.)
        let replaced = node.attr.load_last().is_some_and(|old| {
            old.dev == a.dev && old.ino != a.ino && !node.sb.backend.provisional(old.dev, old.ino)
        });
        if !replaced
            && node.version() == v0
            && node.file_type() == Some(a.kind())
            && node.attr.store_if_unchanged(s0, &a)
        {
            self.note_links(node, &a);
        }
        Ok(a)
    }

    /// The backend path of a dentry.
    pub(crate) fn path_of(&self, node: &Dentry) -> Result<Vec<u8>> {
        let mut names: Vec<super::dentry::Name> = Vec::new();
        if node.has(DEAD) {
            return Err(Error::NotFound);
        }
        let first = node.link();
        let mut parent = first.parent.as_ref().map(|w| w.upgrade());
        if parent.is_some() {
            names.push(first.name.clone());
        }
        while let Some(p) = parent {
            let p = p.ok_or(Error::NotFound)?;
            if p.has(DEAD) {
                return Err(Error::NotFound);
            }
            let l = p.link();
            match &l.parent {
                Some(pp) => {
                    names.push(l.name.clone());
                    parent = Some(pp.upgrade());
                }
                None => parent = None,
            }
        }
        let mut out = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
        for (i, n) in names.iter().rev().enumerate() {
            if i > 0 {
                out.push(b'/');
            }
            out.extend_from_slice(n);
        }
        Ok(out)
    }

    pub(crate) fn link_target(&self, node: &NodeRef) -> Result<Vec<u8>> {
        let mut missed = false;
        self.link_target_counted(node, &mut missed)
    }

    fn link_target_counted(&self, node: &NodeRef, missed: &mut bool) -> Result<Vec<u8>> {
        if let Some(t) = node.inner.read().target().filter(|_| self.trusts_cache()) {
            self.stats.symlink_hits.inc();
            return Ok(t.to_vec());
        }
        *missed = true;
        self.stats.symlink_misses.inc();
        let t = self.by_path(node, |p| {
            self.stats
                .backend
                .readlink
                .time(|| node.sb.backend.readlink(p))
        })??;
        // A symlink's target never changes (a new link is a new dentry).
        if self.trusts_cache() {
            node.inner.write().set_target(&t);
        }
        Ok(t)
    }

    pub(crate) fn open_dir_handle(&self, c: &Creds, at: At<'_>, path: &[u8]) -> Result<DirHandle> {
        let st = self.start(at);
        let w = self.slow(
            &c.0,
            &st,
            path,
            LookupFlags {
                follow: true,
                directory: true,
            },
        )?;
        match w.node.kind() {
            NodeKind::Negative(e) => return Err(e),
            NodeKind::Positive(FileType::Directory) => {}
            NodeKind::Positive(_) => return Err(Error::NotDir),
        }
        let abs = path.first() == Some(&b'/');
        let base_lex: Option<&[u8]> = match (abs, st.handle) {
            (true, _) | (false, None) => Some(b""),
            (false, Some(h)) if h.node.version() == h.ver => h.lex.as_deref(),
            _ => None,
        };
        // The handle keeps a lexical path for fast relative lookups only when the path that
        // opened it went through no symlink (otherwise the link could change under it).
        let lex = match base_lex {
            Some(l) if w.deps.is_empty() => Some(norm_lex(l, path)),
            _ => None,
        };
        let mut hasher = st.ns.base;
        if let Some(l) = &lex {
            if !l.is_empty() {
                hasher.write(l);
                hasher.write(b"/");
            }
        }
        w.node.pin();
        Ok(DirHandle {
            ns: st.ns.clone(),
            mnt: w.mnt,
            ver: w.ver,
            node: w.node,
            lex: lex.map(Vec::into_boxed_slice),
            hasher,
        })
    }

    /// Resolve the directory a new name will be created in; returns it and the final name.
    /// `dot_err` is the error for a final `.` or `..`.
    pub(crate) fn parent_for_create<'p>(
        &self,
        c: &Creds,
        at: At<'_>,
        path: &'p [u8],
        dot_err: Error,
    ) -> Result<(NodeRef, &'p [u8])> {
        let (dir, name) = path::split_last(path)?;
        let (parent, opts) = self.parent_dir(c, at, dir)?;
        if name == b"." || name == b".." {
            return Err(dot_err);
        }
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        if opts.read_only {
            // EEXIST wins over EROFS, as in Linux's filename_create.
            if let Ok(n) = self.child_checked(c, &parent, name) {
                if matches!(n.kind(), NodeKind::Positive(_)) {
                    return Err(Error::Exists);
                }
            }
            return Err(Error::ReadOnly);
        }
        Ok((parent, name))
    }

    pub(crate) fn parent_for_remove<'p>(
        &self,
        c: &Creds,
        at: At<'_>,
        path: &'p [u8],
    ) -> Result<(NodeRef, &'p [u8])> {
        let (dir, name) = path::split_last(path)?;
        let (parent, opts) = self.parent_dir(c, at, dir)?;
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        if opts.read_only {
            return Err(Error::ReadOnly);
        }
        Ok((parent, name))
    }

    /// The directory holding a path's last component. As Linux's `link_path_walk`, search
    /// permission on it is checked before anything about the last component.
    fn parent_dir(&self, c: &Creds, at: At<'_>, dir: &[u8]) -> Result<(NodeRef, MountOptions)> {
        let (node, opts) = if dir.is_empty() {
            let st = self.start(at);
            (st.node.clone(), st.mnt.opts)
        } else {
            let flags = LookupFlags {
                follow: true,
                directory: true,
            };
            self.resolve(c, at, dir, flags, |n, o| (n.clone(), o))?
        };
        if c.0.check {
            let a = self.attr_of(&node)?;
            self.policy.permission(&c.0.cred, &a, X_OK)?;
        }
        Ok((node, opts))
    }
}
