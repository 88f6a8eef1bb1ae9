//! The benches' progress bars: the CLI's one progress helper (crates/cli/src/progress.rs).

pub use crate::progress::Progress;
