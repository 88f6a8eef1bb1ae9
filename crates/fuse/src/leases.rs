//! Opens that wait for a lease's break, off the request threads (docs/security.md P12).
//!
//! A blocking open(2) of a file someone holds a lease on (`F_SETLEASE`) waits until the
//! holder gives the lease up or the kernel breaks it, after `/proc/sys/fs/lease-break-time`
//! (45 s by default). Any user can take a lease on its own files in SRC and ignore the
//! request to give it up; the daemon's request threads (4 by default) serve every user, so
//! one user opening a few such files through the mount stopped the mount for everyone.
//!
//! A request thread therefore opens with the lease wait deferred
//! ([`dircache_core::defer_lease_waits`]: the local backend's the `O_NONBLOCK` try starts the lease's break and
//! fails with EAGAIN) and hands the OPEN or CREATE, reply included, to a waiter thread of the
//! requester's uid, which repeats it with waiting allowed and replies when it is done: the
//! opener waits as natively, the request threads do not. Each uid gets at most
//! [`PER_UID`] waiter threads (one user's waits never take another's), started when needed
//! and ended when its queue is empty; the waits queued beyond them are each a process of that
//! uid blocked in open(2) (the kernel keeps an OPEN's caller waiting for the reply, even when
//! killed), so the queue is bounded by that user's processes, and what it holds per wait is
//! a few hundred bytes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

/// Waiter threads per uid.
pub const PER_UID: usize = 4;

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    threads: usize,
}

/// The lease waiters of a mount (module docs).
#[derive(Default)]
pub struct LeaseWaits {
    by_uid: Mutex<HashMap<u32, Queue>>,
}

impl LeaseWaits {
    /// Run `job` (an open that may wait for a lease's break, and its reply) on a waiter
    /// thread of `uid`. If no thread can be started, it runs on the calling thread (the
    /// behaviour before waiters: it holds that thread for the wait).
    pub fn submit(self: &Arc<Self>, uid: u32, job: Job) {
        let mut all = self.by_uid.lock();
        let q = all.entry(uid).or_default();
        q.jobs.push_back(job);
        if q.threads >= PER_UID {
            return;
        }
        q.threads += 1;
        drop(all);
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("dircache-lease-{uid}"))
            .spawn(move || me.serve(uid));
        if let Err(e) = spawned {
            tracing::warn!("no lease waiter thread ({e}): waiting on the request thread");
            let mut all = self.by_uid.lock();
            let job = all.get_mut(&uid).and_then(|q| {
                q.threads -= 1;
                q.jobs.pop_back()
            });
            drop(all);
            if let Some(job) = job {
                job();
            }
        }
    }

    /// A waiter thread of `uid`: runs its jobs until none is left.
    fn serve(&self, uid: u32) {
        loop {
            let job = {
                let mut all = self.by_uid.lock();
                let Some(q) = all.get_mut(&uid) else {
                    return;
                };
                match q.jobs.pop_front() {
                    Some(j) => j,
                    None => {
                        q.threads -= 1;
                        if q.threads == 0 {
                            all.remove(&uid);
                        }
                        return;
                    }
                }
            };
            job();
        }
    }

    /// Waiter threads running now (for tests).
    pub fn threads(&self) -> usize {
        self.by_uid.lock().values().map(|q| q.threads).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn at_most_per_uid_threads_and_every_job_runs() {
        let w = Arc::new(LeaseWaits::default());
        let (tx, rx) = crossbeam_channel::bounded::<()>(0);
        let running = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..10 {
            let (rx, running, done) = (rx.clone(), running.clone(), done.clone());
            w.submit(
                7,
                Box::new(move || {
                    running.fetch_add(1, Ordering::SeqCst);
                    let _ = rx.recv();
                    running.fetch_sub(1, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                }),
            );
        }
        // Another uid is not held by uid 7's waits.
        let (otx, orx) = crossbeam_channel::bounded::<()>(1);
        w.submit(
            8,
            Box::new(move || {
                let _ = otx.send(());
            }),
        );
        assert!(orx.recv_timeout(Duration::from_secs(5)).is_ok());
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(running.load(Ordering::SeqCst), PER_UID);
        for _ in 0..10 {
            tx.send(()).unwrap();
        }
        let t = std::time::Instant::now();
        while w.threads() > 0 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(done.load(Ordering::SeqCst), 10);
        assert_eq!(w.threads(), 0);
    }
}
