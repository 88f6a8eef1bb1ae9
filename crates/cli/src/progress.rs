//! Progress bars of the long benches: on stderr, drawn only when stderr is a terminal
//! (indicatif hides a terminal target that is not one), with what is running and an ETA.
//! Notes printed through [`Progress::note`] go above the bar, and are printed whether or
//! not the bar is drawn.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar of `total` steps, named `what` (e.g. "bench apps").
    pub fn new(what: &str, total: u64) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{prefix} {elapsed_precise} [{bar:30}] {pos}/{len} ETA {eta} {wide_msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(what.to_string());
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
