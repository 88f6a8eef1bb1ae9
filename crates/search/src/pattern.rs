//! Search patterns (paper §3).
//!
//! * `*` matches any run of bytes (possibly empty) except `/`;
//! * `?` matches zero or one byte except `/` (the paper's definition, unlike fnmatch);
//! * `|` separates alternatives (logical OR);
//! * `/` separates components and matches literally.
//!
//! Every alternative is anchored at the end of the path: its last component must match the
//! file name. An alternative without a leading `/` matches a *trailing part* of the path
//! relative to the searched directory, starting at a component boundary (`linux/Makefile`
//! matches `src/linux/Makefile`, not `xlinux/Makefile`), and makes the search recursive. An
//! alternative with a leading `/` must match the whole relative path, so it only reaches a fixed
//! depth (non-recursive). The alternative `/` alone lists the searched directory (it means
//! `/*`, the paper's `ls` example). Matching is on bytes (one `?` is one byte). There is no
//! escape character; an empty alternative, an empty component (`a//b`, `a/`) or a NUL byte is
//! an invalid pattern.
//!
//! **Bounds**: a pattern has at most [`MAX_PATTERN_BYTES`] bytes and [`MAX_ALTERNATIVES`]
//! alternatives (a clear error otherwise). Parsing and decomposition are linear in the
//! pattern; matching one name costs at most the pattern's length times the name's.

use std::collections::HashSet;

use crate::SearchError;

/// Longest pattern accepted, in bytes.
pub const MAX_PATTERN_BYTES: usize = 32 * 1024;
/// Most `|`-separated alternatives accepted.
pub const MAX_ALTERNATIVES: usize = 4096;

/// One component of an alternative: a glob over bytes without `/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Glob {
    /// No wildcard: equality.
    Literal(Vec<u8>),
    /// `*`: anything.
    Any,
    /// `*suffix` (suffix literal).
    Suffix(Vec<u8>),
    /// `prefix*` (prefix literal).
    Prefix(Vec<u8>),
    /// Anything else: a small NFA over the tokens.
    General(Vec<Tok>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Tok {
    Byte(u8),
    Star,
    Opt,
}

impl Glob {
    fn parse(s: &[u8]) -> Glob {
        let toks: Vec<Tok> = s
            .iter()
            .map(|&b| match b {
                b'*' => Tok::Star,
                b'?' => Tok::Opt,
                b => Tok::Byte(b),
            })
            .collect();
        let wild = toks.iter().filter(|t| !matches!(t, Tok::Byte(_))).count();
        if wild == 0 {
            return Glob::Literal(s.to_vec());
        }
        if toks.iter().all(|t| *t == Tok::Star) {
            return Glob::Any;
        }
        if wild == 1 && toks[0] == Tok::Star {
            return Glob::Suffix(s[1..].to_vec());
        }
        if wild == 1 && toks[toks.len() - 1] == Tok::Star {
            return Glob::Prefix(s[..s.len() - 1].to_vec());
        }
        Glob::General(toks)
    }

    pub(crate) fn literal(&self) -> Option<&[u8]> {
        match self {
            Glob::Literal(l) => Some(l),
            _ => None,
        }
    }

    /// Whether the glob matches the whole of `name`.
    pub(crate) fn matches(&self, name: &[u8]) -> bool {
        match self {
            Glob::Literal(l) => l == name,
            Glob::Any => true,
            Glob::Suffix(s) => name.ends_with(s),
            Glob::Prefix(p) => name.starts_with(p),
            Glob::General(toks) => nfa_match(toks, name),
        }
    }
}

/// Thompson-style simulation: `states[i]` = the first `i` tokens can match the input so far.
fn nfa_match(toks: &[Tok], name: &[u8]) -> bool {
    let n = toks.len();
    let mut cur = vec![false; n + 1];
    let mut next = vec![false; n + 1];
    cur[0] = true;
    closure(toks, &mut cur);
    for &c in name {
        if c == b'/' {
            return false;
        }
        next.iter_mut().for_each(|x| *x = false);
        for i in 0..n {
            if !cur[i] {
                continue;
            }
            match toks[i] {
                Tok::Byte(b) if b == c => next[i + 1] = true,
                Tok::Byte(_) => {}
                Tok::Star => next[i] = true,
                Tok::Opt => next[i + 1] = true,
            }
        }
        closure(toks, &mut next);
        if !next.iter().any(|&x| x) {
            return false;
        }
        std::mem::swap(&mut cur, &mut next);
    }
    cur[n]
}

/// Epsilon moves: `*` and `?` may match nothing.
fn closure(toks: &[Tok], st: &mut [bool]) {
    for i in 0..toks.len() {
        if st[i] && matches!(toks[i], Tok::Star | Tok::Opt) {
            st[i + 1] = true;
        }
    }
}

/// One `|`-separated alternative.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Alt {
    /// Leading `/`: must match the whole relative path (non-recursive).
    pub(crate) anchored: bool,
    pub(crate) comps: Vec<Glob>,
    /// The source text of the components, for decomposition and display.
    pub(crate) text: Vec<Vec<u8>>,
}

/// A compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    pub(crate) alts: Vec<Alt>,
}

impl Pattern {
    /// Parse a pattern (module docs for the syntax).
    pub fn parse(s: &str) -> Result<Pattern, SearchError> {
        Self::parse_bytes(s.as_bytes())
    }

    pub fn parse_bytes(s: &[u8]) -> Result<Pattern, SearchError> {
        let bad = |why: &str| {
            SearchError::InvalidPattern(String::from_utf8_lossy(s).into_owned(), why.into())
        };
        if s.is_empty() {
            return Err(bad("empty pattern"));
        }
        if s.len() > MAX_PATTERN_BYTES {
            return Err(SearchError::InvalidPattern(
                format!("{}...", String::from_utf8_lossy(&s[..64])),
                format!("longer than {MAX_PATTERN_BYTES} bytes"),
            ));
        }
        if s.contains(&0) {
            return Err(bad("NUL byte"));
        }
        let n_alts = s.iter().filter(|&&b| b == b'|').count() + 1;
        if n_alts > MAX_ALTERNATIVES {
            return Err(SearchError::InvalidPattern(
                format!("{}...", String::from_utf8_lossy(&s[..s.len().min(64)])),
                format!("{n_alts} alternatives (at most {MAX_ALTERNATIVES})"),
            ));
        }
        let mut alts = Vec::new();
        for a in s.split(|&b| b == b'|') {
            if a.is_empty() {
                return Err(bad("empty alternative"));
            }
            let (anchored, body) = match a.strip_prefix(b"/") {
                Some(rest) => (true, rest),
                None => (false, a),
            };
            // `/` alone: list the searched directory.
            let body: &[u8] = if anchored && body.is_empty() {
                b"*"
            } else {
                body
            };
            let mut comps = Vec::new();
            let mut text = Vec::new();
            for c in body.split(|&b| b == b'/') {
                if c.is_empty() {
                    return Err(bad("empty path component (`//` or trailing `/`)"));
                }
                comps.push(Glob::parse(c));
                text.push(c.to_vec());
            }
            alts.push(Alt {
                anchored,
                comps,
                text,
            });
        }
        Ok(Pattern { alts })
    }

    /// Whether some alternative is recursive (no leading `/`).
    pub fn is_recursive(&self) -> bool {
        self.alts.iter().any(|a| !a.anchored)
    }

    /// The deepest level any anchored alternative reaches (1 = entries of the searched dir).
    pub fn max_anchored_depth(&self) -> usize {
        self.alts
            .iter()
            .filter(|a| a.anchored)
            .map(|a| a.comps.len())
            .max()
            .unwrap_or(0)
    }

    /// Whether no alternative can match anything.
    pub fn is_empty(&self) -> bool {
        self.alts.is_empty()
    }

    /// Whether the relative path with components `comps` (`comps.last()` is the file name)
    /// matches.
    pub fn matches(&self, comps: &[&[u8]]) -> bool {
        let Some(last) = comps.last() else {
            return false;
        };
        self.alts.iter().any(|a| {
            let n = a.comps.len();
            if a.anchored && n != comps.len() || n > comps.len() {
                return false;
            }
            // Check the file name first: the cheap, usually failing, test.
            if !a.comps[n - 1].matches(last) {
                return false;
            }
            let off = comps.len() - n;
            a.comps[..n - 1]
                .iter()
                .zip(&comps[off..])
                .all(|(g, c)| g.matches(c))
        })
    }

    /// A quick necessary condition of [`Pattern::matches`] for an entry `name` at `depth`
    /// components below the searched directory (1 for its direct entries): `false` only when
    /// no alternative can match it, judged by the file name alone.
    pub fn may_match_name(&self, depth: usize, name: &[u8]) -> bool {
        self.alts.iter().any(|a| {
            let n = a.comps.len();
            !(a.anchored && n != depth || n > depth || n == 0) && a.comps[n - 1].matches(name)
        })
    }

    /// Whether a search must descend into directory `comps` (its path relative to the searched
    /// directory): some alternative could match something below it.
    pub fn may_descend(&self, comps: &[&[u8]]) -> bool {
        self.alts.iter().any(|a| {
            !a.anchored
                || (a.comps.len() > comps.len()
                    && a.comps.iter().zip(comps).all(|(g, c)| g.matches(c)))
        })
    }

    /// If every alternative that can match an entry of directory `comps` names it literally,
    /// the names to look up instead of listing the directory (PATH and library searches).
    pub fn literal_children(&self, comps: &[&[u8]]) -> Option<Vec<&[u8]>> {
        let d = comps.len();
        let mut names: Vec<&[u8]> = Vec::new();
        let mut seen: HashSet<&[u8]> = HashSet::new();
        for a in &self.alts {
            if !a.anchored {
                return None;
            }
            if a.comps.len() <= d || !a.comps.iter().zip(comps).all(|(g, c)| g.matches(c)) {
                continue;
            }
            let lit = a.comps[d].literal()?;
            if lit == b"." || lit == b".." {
                continue; // never listed, so never matched
            }
            if seen.insert(lit) {
                names.push(lit);
            }
        }
        Some(names)
    }

    /// Pattern decomposition at a file-system boundary (paper §4): the pattern a *child search*
    /// rooted at directory `mount` (its path relative to this search's root) must run so that
    /// its results, prefixed with `mount`, are exactly this search's results below `mount`.
    ///
    /// * an anchored alternative `/c1/../cn` whose first k components match `mount`'s k
    ///   components becomes `/c(k+1)/../cn`; otherwise it is dropped;
    /// * a recursive alternative `c1/../cn` is kept (it can match entirely inside the mount),
    ///   and for every split j < n where `c1/../cj` matches the last j components of `mount`,
    ///   the anchored `/c(j+1)/../cn` is added (the paper's `tmp/foo` searched from `/var` with
    ///   `/var/tmp` mounted becomes `tmp/foo|/foo`).
    ///
    /// The added alternatives are always non-recursive. An empty result means the child search
    /// can be skipped.
    pub fn decompose(&self, mount: &[&[u8]]) -> Pattern {
        let k = mount.len();
        let mut out: Vec<Alt> = Vec::new();
        let mut seen: HashSet<Alt> = HashSet::new();
        let mut push = |out: &mut Vec<Alt>, alt: Alt| {
            if seen.insert(alt.clone()) {
                out.push(alt);
            }
        };
        for a in &self.alts {
            let n = a.comps.len();
            if a.anchored {
                if n > k && a.comps[..k].iter().zip(mount).all(|(g, c)| g.matches(c)) {
                    push(
                        &mut out,
                        Alt {
                            anchored: true,
                            comps: a.comps[k..].to_vec(),
                            text: a.text[k..].to_vec(),
                        },
                    );
                }
                continue;
            }
            push(&mut out, a.clone());
            for j in 1..n {
                if j <= k
                    && a.comps[..j]
                        .iter()
                        .zip(&mount[k - j..])
                        .all(|(g, c)| g.matches(c))
                {
                    push(
                        &mut out,
                        Alt {
                            anchored: true,
                            comps: a.comps[j..].to_vec(),
                            text: a.text[j..].to_vec(),
                        },
                    );
                }
            }
        }
        Pattern { alts: out }
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, a) in self.alts.iter().enumerate() {
            if i > 0 {
                f.write_str("|")?;
            }
            if a.anchored {
                f.write_str("/")?;
            }
            let parts: Vec<String> = a
                .text
                .iter()
                .map(|t| String::from_utf8_lossy(t).into_owned())
                .collect();
            f.write_str(&parts.join("/"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `may_match_name` never says no where `matches` says yes (a held listing leaves out
    /// what it says no to), and does say no to names no alternative's last component takes.
    #[test]
    fn may_match_name_is_a_necessary_condition() {
        let pats = [
            "*.c",
            "x1/*.c",
            "/a/x1/f1.c",
            "deep/*|*.h",
            "/b/*",
            "*er",
            "er/g*",
            "a?b*|/n0",
            "/",
            "*",
        ];
        let names: [&[u8]; 9] = [
            b"a", b"b", b"x1", b"f1.c", b"g1.h", b"deep", b"er", b"ab", b"n0",
        ];
        for p in pats {
            let pat = Pattern::parse(p).unwrap_or_else(|e| panic!("{p}: {e}"));
            // Every path of up to 3 components over these names.
            let mut paths: Vec<Vec<&[u8]>> = names.iter().map(|n| vec![*n]).collect();
            for _ in 0..2 {
                let longer: Vec<Vec<&[u8]>> = paths
                    .iter()
                    .filter(|v| v.len() == paths.last().map_or(0, Vec::len))
                    .flat_map(|v| {
                        names.iter().map(move |n| {
                            let mut w = v.clone();
                            w.push(*n);
                            w
                        })
                    })
                    .collect();
                paths.extend(longer);
            }
            for c in &paths {
                let last = c.last().copied().unwrap_or_default();
                if pat.matches(c) {
                    assert!(pat.may_match_name(c.len(), last), "{p}: {c:?}");
                }
            }
        }
        let pat = Pattern::parse("*.c").unwrap_or_else(|e| panic!("{e}"));
        assert!(!pat.may_match_name(1, b"f.h"));
        let pat = Pattern::parse("/a/b.c").unwrap_or_else(|e| panic!("{e}"));
        assert!(!pat.may_match_name(1, b"b.c") && pat.may_match_name(2, b"b.c"));
    }

    fn m(p: &str, path: &str) -> bool {
        let comps: Vec<&[u8]> = path.split('/').map(|s| s.as_bytes()).collect();
        Pattern::parse(p)
            .map(|p| p.matches(&comps))
            .unwrap_or(false)
    }

    #[test]
    fn globs() {
        assert!(m("*.c", "a.c"));
        assert!(m("*.c", "x/y/a.c"));
        assert!(!m("*.c", "a.h"));
        assert!(m("f*/b*", "foo/bar"));
        assert!(!m("/f*/b*", "foo/xyz/bar"));
        assert!(!m("f*/b*", "foo/xyz/bar"));
        assert!(m("f*/b*", "xyz/foo/bar"));
        assert!(m("a?c", "ac"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "abbc"));
        assert!(m("linux/Makefile", "src/linux/Makefile"));
        assert!(!m("linux/Makefile", "src/xlinux/Makefile"));
        assert!(m("/chmod", "chmod"));
        assert!(!m("/chmod", "x/chmod"));
        assert!(m("/", "anything"));
        assert!(!m("/", "a/b"));
        assert!(m("x|*.h", "a.h"));
        assert!(m("a*b?c*", "aXXbcZ"));
        assert!(m("*a*", "bab"));
        assert!(!m("*a*", "bbb"));
    }

    #[test]
    fn invalid() {
        for p in ["", "a||b", "a//b", "a/", "|", "//"] {
            assert!(Pattern::parse(p).is_err(), "{p}");
        }
    }

    /// CPU time this thread has used: the work it did, which the machine's load (other
    /// processes keeping it off a core) does not stretch, unlike elapsed time.
    fn thread_cpu() -> std::time::Duration {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
    }

    #[test]
    fn bounded_patterns() {
        // 80,000 alternatives: a clear error at once, not seconds of work.
        let big = (0..80_000)
            .map(|i| format!("/n{i}"))
            .collect::<Vec<_>>()
            .join("|");
        let t = thread_cpu();
        let e = Pattern::parse(&big).err();
        assert!(thread_cpu() - t < std::time::Duration::from_millis(200));
        assert!(
            matches!(&e, Some(SearchError::InvalidPattern(_, why)) if why.contains("longer")),
            "{e:?}"
        );
        // Short enough, but too many alternatives: counted before any is parsed.
        let many = vec!["/a"; MAX_ALTERNATIVES + 1].join("|");
        assert!(many.len() <= MAX_PATTERN_BYTES);
        let e = Pattern::parse(&many).err();
        assert!(
            matches!(&e, Some(SearchError::InvalidPattern(_, why)) if why.contains("alternatives")),
            "{e:?}"
        );
        let long = "a".repeat(MAX_PATTERN_BYTES + 1);
        assert!(Pattern::parse(&long).is_err());
        // The most alternatives allowed: listing the literal names is linear.
        let most: Vec<String> = (0..MAX_ALTERNATIVES).map(|i| format!("/n{i}")).collect();
        let p = Pattern::parse(&most.join("|")).unwrap_or_else(|e| panic!("{e}"));
        let t = thread_cpu();
        let names = p.literal_children(&[]).unwrap_or_default();
        assert_eq!(names.len(), MAX_ALTERNATIVES);
        let d = p.decompose(&[]);
        assert_eq!(d.alts.len(), MAX_ALTERNATIVES);
        let used = thread_cpu() - t;
        assert!(used < std::time::Duration::from_millis(500), "{used:?}");
    }

    #[test]
    fn decomposition_paper_example() {
        let p = Pattern::parse("tmp/foo").unwrap_or_else(|e| panic!("{e}"));
        let d = p.decompose(&[b"tmp"]);
        assert_eq!(d.to_string(), "tmp/foo|/foo");
        let p = Pattern::parse("/a/b/*.c|*.h").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.decompose(&[b"a"]).to_string(), "/b/*.c|*.h");
        assert_eq!(p.decompose(&[b"x"]).to_string(), "*.h");
        assert!(Pattern::parse("/x")
            .unwrap_or_else(|e| panic!("{e}"))
            .decompose(&[b"x"])
            .is_empty());
    }
}
