//! Progress indicators of the long commands (the benches, `dircache hoard`, `dircache
//! warm`): on stderr, drawn only when stderr is a terminal (indicatif hides a terminal target
//! that is not one), with what is running. Notes printed through [`Progress::note`] go above
//! the bar, and are printed whether or not the bar is drawn. Drop clears the bar.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar of `total` steps with an ETA, named `what` (e.g. "bench apps").
    pub fn new(what: &str, total: u64) -> Progress {
        let p = Progress::styled(
            Some(total),
            "{prefix} {elapsed_precise} [{bar:30}] {pos}/{len} ETA {eta} {wide_msg}",
        );
        p.bar.set_prefix(what.to_string());
        p
    }

    /// A bar of `total` bytes (`dircache hoard`): [`Progress::inc_by`] the bytes done.
    pub fn bytes(total: u64) -> Progress {
        Progress::styled(
            Some(total),
            "{spinner} [{elapsed_precise}] {bytes}/{total_bytes} {wide_msg}",
        )
    }

    /// A spinner of a task of unknown length (`dircache warm`: "warming"), redrawn ten times
    /// a second, the message after `what`.
    pub fn spinner(what: &str) -> Progress {
        let p = Progress::styled(None, "{spinner} {elapsed} {prefix}: {msg}");
        p.bar.set_prefix(what.to_string());
        p.bar.enable_steady_tick(Duration::from_millis(100));
        p
    }

    fn styled(total: Option<u64>, template: &str) -> Progress {
        let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
        let style = match total {
            Some(_) => ProgressStyle::with_template(template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            None => ProgressStyle::with_template(template)
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        };
        bar.set_style(style);
        Progress { bar }
    }

    /// The number of steps, once known.
    pub fn set_total(&self, total: u64) {
        self.bar.set_length(total);
    }

    /// The step about to run (shown after the bar).
    pub fn running(&self, msg: String) {
        self.bar.set_message(msg);
    }

    /// One step done.
    pub fn inc(&self) {
        self.bar.inc(1);
    }

    /// `n` steps (or bytes) done.
    pub fn inc_by(&self, n: u64) {
        self.bar.inc(n);
    }

    /// A line on stderr above the bar.
    pub fn note(&self, line: &str) {
        self.bar.suspend(|| eprintln!("{line}"));
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
