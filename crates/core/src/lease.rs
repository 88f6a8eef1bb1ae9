//! Deferred lease waits: a front end whose threads serve many users asks a backend's opens
//! not to wait for a lease's break on the calling thread (docs/security.md P12).
//!
//! A blocking open(2) of a file someone holds a lease on (`F_SETLEASE`) waits until the
//! holder gives it up or the kernel breaks it (`/proc/sys/fs/lease-break-time`, 45 s). Inside
//! [`defer_lease_waits`] a backend that would wait so ([`lease_waits_deferred`] tells it)
//! fails the open with EAGAIN instead and calls [`note_lease_wait_deferred`]; the caller then
//! repeats the open where waiting holds no one else up.

use std::cell::Cell;

thread_local! {
    static DEFER: Cell<bool> = const { Cell::new(false) };
    static DEFERRED: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` on this thread with lease waits deferred (module docs): `f`'s result, and whether
/// an open in it was failed rather than waiting for a lease's break.
pub fn defer_lease_waits<R>(f: impl FnOnce() -> R) -> (R, bool) {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            DEFER.with(|d| d.set(self.0));
        }
    }
    let _reset = Reset(DEFER.with(|d| d.replace(true)));
    DEFERRED.with(|d| d.set(false));
    let r = f();
    (r, DEFERRED.with(|d| d.replace(false)))
}

/// Whether an open on this thread must not wait for a lease's break.
pub fn lease_waits_deferred() -> bool {
    DEFER.with(|d| d.get())
}

/// A backend failed an open (EAGAIN) rather than wait for a lease's break.
pub fn note_lease_wait_deferred() {
    DEFERRED.with(|d| d.set(true));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deferred_only_inside_and_reported_once() {
        assert!(!lease_waits_deferred());
        let ((), d) = defer_lease_waits(|| {
            assert!(lease_waits_deferred());
            note_lease_wait_deferred();
        });
        assert!(d);
        assert!(!lease_waits_deferred());
        let ((), d) = defer_lease_waits(|| ());
        assert!(!d);
    }
}
