//! `dircache search PATHS PATTERN`: the paper's search(), one path per line like find.
//!
//! Exit status as find: 0 when all went well, 1 when errors were met (reported on stderr,
//! the search went on, or a mount's daemon failed us), 2 for bad input (empty paths, invalid
//! pattern, a path that does not exist or is not a directory, a bad `--threads`).
//!
//! A search whose roots lie in a dircache mount is handed to that mount's daemon, which
//! answers with the kernel deciding every access for the caller; the daemon is believed only
//! if it is the mount's (see `dircache_search::proto`), and a caller holding CAP_DAC_* searches
//! by itself (the daemon never applies capabilities).

use std::io::Write;

use dircache_search::proto::{delegate_inline, Delegation};
use dircache_search::{
    search_with, ClientConfig, DirectSource, Flags, SearchError, SearchOptions, SearchRequest,
    SearchResult, MAX_THREADS,
};

#[derive(clap::Args, Debug)]
pub struct SearchArgs {
    /// Colon-separated list of directories, searched in order.
    pub paths: String,
    /// Pattern: `*` any run except `/`, `?` zero or one character, `|` alternatives, a leading
    /// `/` anchors at the searched directory (non-recursive).
    pub pattern: String,
    /// Stop at the first match (STOPATFIRST).
    #[arg(long)]
    pub first: bool,
    /// Attributes of every result, as `ls -l` prints them (METADATA; `--json` keeps the raw
    /// numbers).
    #[arg(long)]
    pub stat: bool,
    /// Prefix results with the directory they were found in (INCLUDEROOT).
    #[arg(long)]
    pub root: bool,
    /// Only results the caller may read (R_OK).
    #[arg(short = 'r')]
    pub read: bool,
    /// Only results the caller may write (W_OK).
    #[arg(short = 'w')]
    pub write: bool,
    /// Only results the caller may execute (X_OK).
    #[arg(short = 'x')]
    pub exec: bool,
    /// One JSON object per result and line.
    #[arg(long, conflicts_with = "print0")]
    pub json: bool,
    /// Separate paths with NUL instead of newline.
    #[arg(short = '0', long = "print0")]
    pub print0: bool,
    /// Never hand the search to a dircache mount's daemon.
    #[arg(long)]
    pub no_delegate: bool,
    /// Report on stderr whether the search was delegated.
    #[arg(long)]
    pub verbose: bool,
    /// Worker threads (0 = available parallelism; at most 256).
    #[arg(long, default_value_t = 0)]
    pub threads: u64,
}

fn flags_of(a: &SearchArgs) -> Flags {
    let mut f = Flags::NONE;
    for (on, fl) in [
        (a.first, Flags::STOPATFIRST),
        (a.stat, Flags::METADATA),
        (a.root, Flags::INCLUDEROOT),
        (a.read, Flags::R_OK),
        (a.write, Flags::W_OK),
        (a.exec, Flags::X_OK),
    ] {
        if on {
            f |= fl;
        }
    }
    f
}

fn shown_path(r: &SearchResult, roots: &[&str]) -> String {
    if r.path.is_empty() {
        roots
            .get(r.root as usize)
            .copied()
            .unwrap_or("")
            .to_string()
    } else {
        String::from_utf8_lossy(&r.path).into_owned()
    }
}

pub fn run(a: SearchArgs) -> anyhow::Result<i32> {
    let req = SearchRequest::new(a.paths.clone(), a.pattern.clone(), flags_of(&a));
    if let Err(e) = req.validate() {
        eprintln!("dircache search: {e}");
        return Ok(2);
    }
    let threads = match usize::try_from(a.threads) {
        Ok(n) if n <= MAX_THREADS => n,
        _ => {
            eprintln!(
                "dircache search: --threads {}: at most {MAX_THREADS}",
                a.threads
            );
            return Ok(2);
        }
    };
    // A root that does not exist is bad input (an unreadable one is reported in the results).
    for r in req.roots() {
        if let Err(e) = std::fs::metadata(r) {
            if e.kind() == std::io::ErrorKind::NotFound {
                eprintln!("dircache search: ‘{r}’: No such file or directory");
                return Ok(2);
            }
        }
    }
    let no_delegate = a.no_delegate || std::env::var_os("DIRCACHE_NO_DELEGATE").is_some();
    let client = ClientConfig::default();
    let opts = SearchOptions {
        threads,
        delegate_mounts: !no_delegate,
        client: client.clone(),
        ..Default::default()
    };
    let local = || search_with(&req, std::sync::Arc::new(DirectSource::new()), &opts);
    let started = if no_delegate {
        local()
    } else {
        match delegate_inline(&req, &client) {
            Ok(Delegation::Taken(s)) => {
                if a.verbose {
                    eprintln!("dircache search: delegated to the mount's daemon");
                }
                Ok(s)
            }
            Ok(Delegation::Local(why)) => {
                if why.starts_with("untrusted") {
                    eprintln!("dircache search: warning: {why}; searching without it");
                } else if a.verbose {
                    eprintln!("dircache search: searching locally ({why})");
                }
                local()
            }
            Err(e) => Err(e),
        }
    };
    let stream = match started {
        Ok(s) => s,
        Err(e @ SearchError::Daemon(_)) => {
            eprintln!("dircache search: {e}");
            return Ok(1);
        }
        Err(e) => {
            eprintln!("dircache search: {e}");
            return Ok(2);
        }
    };
    let roots = req.roots();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, stdout.lock());
    let mut status = 0;
    // Only `--stat` prints ls lines: the time zone database is read then, not for every search.
    let mut ls: Option<crate::lsline::LsLine> = None;
    for r in stream {
        if let Some(e) = r.error {
            status = 1;
            let msg = std::io::Error::from_raw_os_error(e.errno);
            if a.json {
                let line = serde_json::json!({
                    "root": r.root,
                    "path": shown_path(&r, &roots),
                    "error": {"source": format!("{:?}", e.source), "errno": e.errno, "message": msg.to_string()},
                });
                if writeln!(out, "{line}").is_err() {
                    return Ok(status);
                }
            }
            // find's style: `find: ‘path’: Permission denied`
            let mut text = msg.to_string();
            if e.source == dircache_search::ErrorSource::Delegate {
                text = format!("the mount's daemon failed: {text}");
            }
            let text = text.split(" (os error").next().unwrap_or(&text);
            eprintln!("dircache search: ‘{}’: {}", shown_path(&r, &roots), text);
            continue;
        }
        let res = if a.json {
            let line = serde_json::json!({
                "root": r.root,
                "path": shown_path(&r, &roots),
                "stat": r.stat,
            });
            writeln!(out, "{line}")
        } else if let Some(st) = r.stat.filter(|_| a.stat) {
            out.write_all(
                ls.get_or_insert_with(crate::lsline::LsLine::new)
                    .prefix(&st)
                    .as_bytes(),
            )
            .and_then(|_| out.write_all(&r.path))
            .and_then(|_| out.write_all(if a.print0 { b"\0" } else { b"\n" }))
        } else {
            out.write_all(&r.path)
                .and_then(|_| out.write_all(if a.print0 { b"\0" } else { b"\n" }))
        };
        if res.is_err() {
            // Broken pipe (`| head`): stop quietly.
            return Ok(status);
        }
    }
    if out.flush().is_err() {
        return Ok(status);
    }
    Ok(status)
}
