//! Cache drops made by other programs on the machine: `echo N > /proc/sys/vm/drop_caches`
//! empties the dentry, inode and page caches of every file system (negative dentries and
//! unused directory dentries of a FUSE mount too: the kernel FORGETs them and LOOKUPs each
//! again). A warm run with such a drop since the previous run is not warm; the kernel
//! counts every drop in /proc/vmstat (`drop_pagecache`, `drop_slab`).

/// Times a warm run is done again after a drop by another program before it is kept anyway.
pub const WARM_REDOS: usize = 5;
/// Untimed runs after a drop before the timed one. One is not enough on a FUSE mount: it
/// LOOKUPs the names again and READDIRPLUSes every directory again (the listings cached in
/// the page cache went with the drop), and an uncached readdir leaves the directory's atime
/// stale in the kernel (fs/fuse/readdir.c, `fuse_invalidate_atime`), so the run after it
/// sends one GETATTR per directory (80k-entry tree: `find` 1,492, on a mount whose quiet
/// warm runs send none); the second untimed run takes those.
pub const WARM_UP_RUNS: usize = 2;

/// A warm run that no other program's `drop_caches` disturbed (`bench apps` and `bench
/// remote`; the machine is shared, and a drop empties the kernel's dentries of every file
/// system: on a FUSE mount each name is looked up again). `run` runs the workload once on one
/// system. `last` is the drop count before that system's previous (warming or timed) run: a
/// drop since then makes [`WARM_UP_RUNS`] untimed runs warm the caches again first (counted
/// once in `rewarmed`); a drop during the timed run makes it done again, up to
/// [`WARM_REDOS`] times (then the last one is kept).
pub fn warm_run<T, E>(
    last: &mut Option<u64>,
    rewarmed: &mut usize,
    run: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    warm_run_counted(count, last, rewarmed, run)
}

/// [`warm_run`] with the drop counter `count`.
fn warm_run_counted<T, E>(
    count: impl Fn() -> Option<u64>,
    last: &mut Option<u64>,
    rewarmed: &mut usize,
    mut run: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let mut redos = 0;
    loop {
        let now = count();
        if now != *last {
            *last = now;
            *rewarmed += 1;
            for _ in 0..WARM_UP_RUNS {
                run()?;
            }
        }
        let res = run()?;
        if count() == *last || redos == WARM_REDOS {
            return Ok(res);
        }
        redos += 1;
    }
}

/// The note for a row whose warm runs were warmed again `n` times.
pub fn rewarmed_note(workload: &str, system: &str, cache: &str, n: usize) -> String {
    format!("{workload} ({system}, {cache}): warmed again {n} times after a drop_caches by another program")
}

/// Drops so far (both kinds), or None where /proc/vmstat has no drop counters.
pub fn count() -> Option<u64> {
    parse(&std::fs::read_to_string("/proc/vmstat").ok()?)
}

/// The sum of `drop_pagecache` and `drop_slab` in /proc/vmstat's text.
fn parse(vmstat: &str) -> Option<u64> {
    let mut found = None;
    for line in vmstat.lines() {
        let mut f = line.split_whitespace();
        if let (Some("drop_pagecache" | "drop_slab"), Some(n)) = (f.next(), f.next()) {
            found = Some(found.unwrap_or(0) + n.parse::<u64>().ok()?);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::{parse, warm_run_counted, WARM_REDOS, WARM_UP_RUNS};
    use std::cell::Cell;

    /// Runs `warm_run_counted` from drop count `last` = 7 with a counter that `drops(i)`
    /// moves by that much during run `i` (0-based), and one moved by `before` before the
    /// call: (runs made, rewarmed, the run kept).
    fn scenario(before: u64, drops: impl Fn(usize) -> u64) -> (usize, usize, usize) {
        let counter = Cell::new(7 + before);
        let runs = Cell::new(0);
        let (mut last, mut rewarmed) = (Some(7), 0);
        let kept = warm_run_counted(
            || Some(counter.get()),
            &mut last,
            &mut rewarmed,
            || -> Result<usize, ()> {
                let i = runs.get();
                counter.set(counter.get() + drops(i));
                runs.set(i + 1);
                Ok(i)
            },
        )
        .unwrap();
        (runs.get(), rewarmed, kept)
    }

    #[test]
    fn a_quiet_run_is_kept() {
        assert_eq!(scenario(0, |_| 0), (1, 0, 0));
    }

    #[test]
    fn a_drop_since_the_last_run_warms_again_first() {
        assert_eq!(scenario(1, |_| 0), (3, 1, 2));
    }

    /// After a drop, the timed run comes after two untimed ones: the first LOOKUPs and
    /// READDIRPLUSes again, the second sends the GETATTRs the first's readdirs left due.
    #[test]
    fn a_drop_is_followed_by_two_untimed_runs() {
        assert_eq!(WARM_UP_RUNS, 2);
        let (runs, rewarmed, kept) = scenario(1, |_| 0);
        assert_eq!((runs - 1, rewarmed, kept), (2, 1, 2));
    }

    #[test]
    fn a_drop_during_the_timed_run_redoes_it_after_warming() {
        // Run 0 (timed) sees a drop: runs 1 and 2 warm, run 3 is timed and kept.
        assert_eq!(scenario(0, |i| u64::from(i == 0)), (4, 1, 3));
        // A drop during the first warming run (after `last` was taken): the timed run after
        // the second is not warm either, and is done again after warming again.
        assert_eq!(scenario(1, |i| u64::from(i == 0)), (6, 2, 5));
    }

    #[test]
    fn drops_during_every_run_stop_after_the_redos() {
        let (runs, rewarmed, kept) = scenario(0, |_| 1);
        assert_eq!(rewarmed, WARM_REDOS);
        assert_eq!(runs, 1 + (1 + WARM_UP_RUNS) * WARM_REDOS);
        assert_eq!(kept, runs - 1);
    }

    #[test]
    fn without_counters_the_first_run_is_kept() {
        let mut last = None;
        let mut rewarmed = 0;
        let mut runs = 0;
        let r: Result<(), ()> = warm_run_counted(
            || None,
            &mut last,
            &mut rewarmed,
            || {
                runs += 1;
                Ok(())
            },
        );
        assert_eq!((r, runs, rewarmed), (Ok(()), 1, 0));
    }

    #[test]
    fn an_error_ends_the_run() {
        let mut last = Some(1);
        let mut rewarmed = 0;
        let r: Result<(), &str> =
            warm_run_counted(|| Some(2), &mut last, &mut rewarmed, || Err("x"));
        assert_eq!((r, rewarmed), (Err("x"), 1));
    }

    #[test]
    fn sums_both_drop_counters() {
        let v = "nr_free_pages 4\ndrop_pagecache 9659\ndrop_slab 9721\npginodesteal 7\n";
        assert_eq!(parse(v), Some(9659 + 9721));
        assert_eq!(parse("drop_slab 3\n"), Some(3));
    }

    #[test]
    fn none_without_counters_or_on_garbage() {
        assert_eq!(parse("nr_free_pages 4\n"), None);
        assert_eq!(parse("drop_slab x\n"), None);
    }
}
