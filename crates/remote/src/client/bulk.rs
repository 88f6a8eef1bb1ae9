//! Streamed bulk subtree calls (crate::prefetch): a `Subtree` call runs on a thread of its own
//! and stores each directory's listing in the prefetch buffer as soon as its frame arrives, so
//! a walker is served while the rest of the subtree is still on the wire (or still being read
//! on the server). Whoever wants a listing that a call in flight may still bring waits for it
//! ([`RemoteBackend::wait_for_listing`]) instead of asking the server itself: a cold walk pays
//! no round trip per directory, and no second bulk call races the first. A listing the call
//! brought already is not waited for again (another caller took it meanwhile: before, the
//! second caller waited for the whole rest of the call). A caller still waiting after
//! [`HURRY_AFTER_MS`] sends `ClientMsg::Hurry`, so that the server reads that directory next
//! (and what is below it depth first) rather than when its breadth-first pass gets there.
//! Waits are counted ([`WaitStats`], `dircache stats`: `bulk_waits`, `bulk_wait_ms`, ...)
//! and logged at debug level, each with its directory and how many listings had come.
//!
//! Coherence is the prefetch buffer's invariant, part by part: each part is stored only while
//! its call is still in flight and the buffer's generation has not moved since the call was
//! sent (`Prefetch::store_part`); a callback or a mutation by this client marks what it
//! touches stale in every call in flight (those listings are dropped when they arrive, their
//! waiters ask the server; the rest of the call is kept), and `Inode`, `Overflow` or a lost
//! connection ends every call. A directory's listing
//! may come in pieces over several frames: the last directory of a frame is held back until
//! the next frame shows whether it continues, so only whole listings are stored.
//!
//! With `NAMES` granted a call brings each directory's names first (`Reply::Names`, stored
//! apart: crate::prefetch) and its full listing later: a caller that needs names only
//! (a listing without attributes) takes the names as soon as they come, one that needs
//! attributes waits for the full listing (and hurries it, the server then reads that full
//! listing next).
//!
//! [`RemoteBackend::prefetch_root`] starts one for the whole tree when a mount starts, so the
//! first walk finds its listings arriving or already there.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use parking_lot::{Condvar, Mutex};

use super::{Frame, RemoteBackend};
use crate::prefetch::{parent, Prefetch, WaitStats, HURRY_AFTER_MS};
use crate::proto::{features, Reply, Request, SubtreeDir, ENTRIES_PER_FRAME};

/// Longest a caller waits for a listing a bulk call in flight may bring; then it asks the
/// server itself.
pub const MAX_WAIT: Duration = Duration::from_secs(15);

impl RemoteBackend {
    /// Start streaming `root`'s subtree (at most `budget` entries below it; `root`'s own
    /// listing kept when `with_root`) into the prefetch buffer on a thread of its own. False
    /// when no call was started (prefetching off, no connection, no thread).
    pub(super) fn bulk_start(&self, root: &[u8], budget: u64, with_root: bool) -> bool {
        // Disconnected: no bulk call, and no wait for the reconnection either (the caller
        // answers from what is cached: client/disconnected.rs).
        if self.cfg.disconnected.as_ref().is_some_and(|d| d.offline()) {
            return false;
        }
        let Ok(c) = self.conn() else { return false };
        if c.features & features::SUBTREE == 0 {
            return false;
        }
        let (gen, token) = {
            let mut p = self.prefetch.lock();
            if !p.enabled() {
                return false;
            }
            // None: a mutation in flight makes all of it stale.
            let Some(token) = p.begin(root) else {
                return false;
            };
            (p.generation(), token)
        };
        // Restored containers are revalidated from the parts (client/container.rs): only
        // while no callback came after the call was sent.
        let containers = self
            .cfg
            .containers
            .as_ref()
            .map(|cc| (cc.clone(), cc.gen()));
        let end = |p: &Mutex<Prefetch>, cv: &Condvar| {
            p.lock().end(token);
            cv.notify_all();
        };
        let rx = match c.start_id(
            &c.own.clone(),
            Request::Subtree {
                path: root.to_vec(),
                budget,
            },
        ) {
            Ok((id, rx)) => {
                self.prefetch.lock().sent(token, id);
                rx
            }
            Err(_) => {
                end(&self.prefetch, &self.arrived);
                return false;
            }
        };
        let call = Call {
            prefetch: self.prefetch.clone(),
            arrived: self.arrived.clone(),
            root: root.to_vec(),
            budget,
            with_root,
            gen,
            token,
            containers,
            whole_frames: c.features & features::HURRY != 0,
        };
        let spawned = std::thread::Builder::new()
            .name("dircache-remote-bulk".into())
            .spawn(move || call.run(rx));
        if spawned.is_err() {
            end(&self.prefetch, &self.arrived);
            return false;
        }
        true
    }

    /// Wait while a streamed bulk call in flight may still bring `dir`'s listing (at most
    /// [`MAX_WAIT`]; with `names_ok` its names are enough); whether the listing (or with
    /// `names_ok` the names) is held now. A wait longer than
    /// [`HURRY_AFTER_MS`] tells the server (`ClientMsg::Hurry`, once per directory and call,
    /// and once more when its names came and its full listing is still awaited):
    /// it reads `dir` next, and what is below it depth first, instead of when its breadth
    /// first pass would reach it (a depth-first `find` would otherwise wait for most of the
    /// pass before its first deep directory comes).
    pub(super) fn wait_for_listing(&self, dir: &[u8], names_ok: bool) -> bool {
        let ready = |p: &Prefetch| p.holds(dir) || (names_ok && p.holds_names(dir));
        let mut p = self.prefetch.lock();
        if ready(&p) || !p.coming(dir) {
            let held = ready(&p);
            if held && p.in_flight() {
                p.waits.early += 1;
            }
            return held;
        }
        let t0 = Instant::now();
        let deadline = t0 + MAX_WAIT;
        let hurry_at = t0 + Duration::from_millis(HURRY_AFTER_MS);
        let mut hurried = false;
        while !ready(&p) && p.coming(dir) && Instant::now() < deadline {
            // Once past the delay, at every wake-up: the names may have come meanwhile, and
            // the full listing is hurried then (`to_hurry` sends each once).
            if Instant::now() >= hurry_at {
                hurried = true;
                let calls = p.to_hurry(dir);
                if !calls.is_empty() {
                    drop(p);
                    let c = self.conn.lock().clone();
                    let sent = calls.iter().filter(|(id, rel)| c.hurry(*id, rel)).count();
                    p = self.prefetch.lock();
                    p.waits.hurries += sent as u64;
                    continue;
                }
            }
            // Parts are announced; a callback ending the calls is not (it is rare): poll too.
            let until = if hurried { 20 } else { HURRY_AFTER_MS };
            self.arrived.wait_for(&mut p, Duration::from_millis(until));
        }
        let waited = t0.elapsed();
        let us = waited.as_micros() as u64;
        let held = ready(&p);
        let w = &mut p.waits;
        w.waits += 1;
        w.wait_us += us;
        w.max_wait_us = w.max_wait_us.max(us);
        if held {
            w.early += 1;
        }
        let stored = w.stored;
        drop(p);
        tracing::debug!(
            "waited {:.1} ms for {:?} from a bulk call{} ({} listings stored so far)",
            waited.as_secs_f64() * 1e3,
            String::from_utf8_lossy(dir),
            if hurried { ", hurried" } else { "" },
            stored
        );
        held
    }

    /// How callers waited for bulk calls in flight so far (statistics, tests).
    pub fn bulk_waits(&self) -> WaitStats {
        self.prefetch.lock().waits
    }

    /// Whether a streamed bulk call is in flight (for tests and statistics).
    pub fn bulk_in_flight(&self) -> bool {
        self.prefetch.lock().in_flight()
    }

    /// Start fetching the whole tree in bulk (as much as the prefetch buffer holds), so the
    /// first walk of a fresh mount finds its listings arriving or there (the mount calls this
    /// once connected). False when prefetching is off.
    pub fn prefetch_root(&self) -> bool {
        let budget = {
            let p = self.prefetch.lock();
            if !p.enabled() || p.holds(b"") || p.coming(b"") || p.was_listed(b"") {
                return false;
            }
            p.max as u64
        };
        self.bulk_start(b"", budget, true)
    }

    /// `dir`'s listing through a bulk call: below a cut bulk call, that call's root again with
    /// the next budget (so that its other unlisted directories come along), else the subtree
    /// of `dir`'s parent when its listing is known, else `dir`'s own subtree; waits for
    /// `dir`'s part. Whether `dir`'s listing is held now.
    pub(super) fn bulk(&self, dir: &[u8], names_ok: bool) -> bool {
        if self.wait_for_listing(dir, names_ok) {
            return true;
        }
        let (budget, root) = {
            let mut p = self.prefetch.lock();
            if !p.enabled() {
                return false;
            }
            if p.was_listed(dir) {
                // The cache had this listing and dropped it after a change: the listings
                // below are still there; this one alone.
                (0, None)
            } else {
                let b = p.next_budget();
                // Below a cut call that will not be asked again (its budget was the largest):
                // the parent's subtree when the parent's listing is known (held, or handed
                // to the cache), so that the siblings a walker lists next come along (one
                // call per parent, not one per directory: a 1M-entry tree's leaves).
                let par = parent(dir);
                let root = p.cut_root_for(dir, b).or_else(|| {
                    (!dir.is_empty() && (p.holds(par) || p.was_listed(par))).then(|| par.to_vec())
                });
                (b, root)
            }
        };
        if let Some(root) = root.filter(|r| r != dir) {
            if self.bulk_start(&root, budget, false) && self.wait_for_listing(dir, names_ok) {
                return true;
            }
        }
        self.bulk_start(dir, budget, true) && self.wait_for_listing(dir, names_ok)
    }
}

/// One streamed bulk call.
struct Call {
    prefetch: Arc<Mutex<Prefetch>>,
    arrived: Arc<Condvar>,
    root: Vec<u8>,
    budget: u64,
    with_root: bool,
    gen: u64,
    token: u64,
    containers: Option<(Arc<super::Containers>, u64)>,
    /// The server splits a directory over frames only where a piece is full
    /// ([`ENTRIES_PER_FRAME`]): a frame's last listing is whole unless its piece is (with
    /// `HURRY`, docs/protocol.md). Else it is held until the next frame shows.
    whole_frames: bool,
}

impl Call {
    fn run(self, rx: Receiver<Frame>) {
        // The last directory of the previous frame: it may continue in the next one.
        let mut held: Option<SubtreeDir> = None;
        // The same for names-only frames (whose pieces are adjacent frames too).
        let mut held_names: Option<SubtreeDir> = None;
        let t0 = Instant::now();
        let (mut listings, mut entries, mut kept_all) = (0usize, 0usize, true);
        loop {
            let (last, dirs, complete) = match rx.recv() {
                Ok(Ok((last, Ok(Reply::Subtree { dirs, complete })))) => (last, dirs, complete),
                Ok(Ok((false, Ok(Reply::Names(dirs))))) => {
                    let whole = join_pieces(&mut held_names, dirs);
                    let stored = self.prefetch.lock().store_names(
                        self.gen,
                        self.token,
                        &self.root,
                        whole,
                        self.with_root,
                    );
                    kept_all &= stored == Some(true);
                    self.arrived.notify_all();
                    if stored.is_none() {
                        break;
                    }
                    continue;
                }
                _ => break,
            };
            let mut whole = Vec::with_capacity(dirs.len());
            // Entries of the frame's last piece.
            let mut piece = ENTRIES_PER_FRAME;
            for sd in dirs {
                piece = sd.entries.len();
                match &mut held {
                    Some(h) if h.dir == sd.dir => {
                        h.entries.extend(sd.entries);
                        h.bare.extend(sd.bare);
                    }
                    _ => whole.extend(held.replace(sd)),
                }
            }
            let done = self.whole_frames && piece < ENTRIES_PER_FRAME;
            if last || done {
                whole.extend(held.take());
            }
            listings += whole.len();
            entries += whole.iter().map(|d| d.entries.len()).sum::<usize>();
            let learned = self
                .containers
                .as_ref()
                .map(|(cc, _)| cc.scan(&self.root, &whole));
            let mut p = self.prefetch.lock();
            let stored = p.store_part(self.gen, self.token, &self.root, whole, self.with_root);
            let kept = stored.is_some();
            kept_all &= stored == Some(true);
            if kept && last && !complete && self.budget > 0 {
                p.mark_cut(&self.root, self.budget);
            }
            drop(p);
            // Only a part kept whole: a listing dropped as stale teaches nothing.
            if let (Some(true), Some((cc, gen)), Some(l)) = (stored, &self.containers, learned) {
                cc.learn(l, *gen);
            }
            self.arrived.notify_all();
            if !kept || last {
                break;
            }
        }
        if held_names.is_some() {
            tracing::debug!("a names-only listing was cut short");
        }
        // Dropping `rx` discards whatever else comes for this call.
        self.prefetch.lock().end(self.token);
        self.arrived.notify_all();
        tracing::debug!(
            "bulk call for {:?}: {listings} listings, {entries} entries in {:.3} s{}",
            String::from_utf8_lossy(&self.root),
            t0.elapsed().as_secs_f64(),
            if kept_all {
                ""
            } else {
                " (ended or cut by a change)"
            }
        );
    }
}

/// Names first: the whole names-only listings of a `Reply::Names` frame. A listing continues
/// in the next names frame only when its piece in this one is full ([`ENTRIES_PER_FRAME`]):
/// such a last piece is held in `held` until then.
fn join_pieces(held: &mut Option<SubtreeDir>, dirs: Vec<SubtreeDir>) -> Vec<SubtreeDir> {
    let mut whole = Vec::with_capacity(dirs.len());
    let mut piece = ENTRIES_PER_FRAME;
    for sd in dirs {
        piece = sd.entries.len();
        match held {
            Some(h) if h.dir == sd.dir => h.entries.extend(sd.entries),
            _ => whole.extend(held.replace(sd)),
        }
    }
    if piece < ENTRIES_PER_FRAME {
        whole.extend(held.take());
    }
    whole
}
