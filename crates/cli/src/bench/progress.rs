//! The benches' progress bars: the CLI's one progress helper (crates/cli/src/progress.rs).

pub use crate::progress::Progress;

/// Interleaved rounds: `runs` rounds, each running every one of the systems named `names`
/// once, the order rotated by one system per round (round r starts with system r mod n).
/// Before each run the bar shows `label(round, name)` (rounds counted from 1), and counts
/// the run when `run(i)` (for system `i`) has returned; an error of `run` ends the rounds.
pub fn interleaved_rounds(
    progress: &Progress,
    runs: usize,
    names: &[&str],
    label: impl Fn(usize, &str) -> String,
    mut run: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let n = names.len();
    for r in 0..runs {
        for k in 0..n {
            let i = (k + r) % n;
            progress.running(label(r + 1, names[i]));
            run(i)?;
            progress.inc();
        }
    }
    Ok(())
}
