//! Fuzz target of the control-socket protocol, run by `cargo test` for a bounded time
//! (`DIRCACHE_FUZZ_SECS`, default 3 s; a fixed seed, `DIRCACHE_FUZZ_SEED` to vary it):
//! random mutations of valid request and response frames (bit flips, insertions, deletions,
//! truncations, forged length fields, splices, garbage) are fed to the frame decoder, the
//! request and response parsers and the pattern compiler. Every input must give a value or a
//! typed error - no panic - and decoding may never allocate much more than the bytes it was
//! given (a declared length is never allocated up front).
//!
//! The same inputs are sent to a live server in crates/fuse/tests/control.rs
//! (`control_socket_survives_random_frames`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dircache_search::proto::{
    read_frame_bytes, read_frame_limited, read_request, read_request_encoding, read_response,
    read_results, write_binary, Request, Response, MAX_REQUEST, MAX_RESPONSE,
};
use dircache_search::{ErrorSource, Flags, Pattern, ResultError, SearchRequest, SearchResult};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Counts live heap bytes and their peak, to check decoding stays bounded.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: same contract as System::alloc.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: same contract as System::dealloc.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: same contract as System::realloc.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
            let now = LIVE.fetch_add(new, Ordering::Relaxed) + new;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static A: Counting = Counting;

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// Valid frames of every kind the protocol has.
pub fn corpus() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (paths, pat, flags) in [
        ("/", "*", Flags::NONE),
        ("/a:/b", "*.c|/x/y*|lib?/*.h", Flags::METADATA | Flags::X_OK),
        ("/", "/", Flags::STOPATFIRST | Flags::INCLUDEROOT),
        ("/deep/er", "a*b?c*d|/n0|/n1|/n2", Flags::ALL),
    ] {
        let req = Request::Search(SearchRequest::new(paths, pat, flags));
        out.push(frame(&serde_json::to_vec(&req).unwrap_or_default()));
    }
    // Binary results frames (asked for with "results":"bin"), as a daemon writes them.
    let attr = dircache_search::SearchAttr {
        ino: 1,
        dev: 2,
        mode: 0o100644,
        nlink: 1,
        size: 3,
        ..Default::default()
    };
    let results = [
        SearchResult {
            root: 0,
            path: b"a/b".to_vec(),
            stat: None,
            error: None,
        },
        SearchResult {
            root: 1,
            path: vec![b'a', 0xff],
            stat: Some(attr),
            error: None,
        },
        SearchResult {
            root: 0,
            path: b"x".to_vec(),
            stat: None,
            error: Some(ResultError {
                source: ErrorSource::Open,
                errno: 13,
            }),
        },
    ];
    let mut bin = Vec::new();
    let mut body = Vec::new();
    write_binary(&mut bin, &mut body, &results).unwrap_or_default();
    out.push(bin);
    let mut bin = Vec::new();
    write_binary(&mut bin, &mut body, &[]).unwrap_or_default();
    out.push(bin);
    for v in [
        r#"{"op":"search","paths":"/","pattern":"*","flags":2,"results":"bin"}"#,
        r#"{"op":"stats"}"#,
        r#"{"op":"ping"}"#,
        r#"{"op":"search","paths":"/","pattern":"*","flags":2}"#,
        r#"{"ok":true,"results":[{"root":0,"path":"a/b","stat":null,"error":null},{"root":1,"path":[97,255],"stat":null,"error":{"source":"Open","errno":13}}]}"#,
        r#"{"ok":true,"results":[{"root":0,"path":"x","stat":{"ino":1,"dev":2,"mode":33188,"nlink":1,"uid":0,"gid":0,"rdev":0,"size":3,"blocks":8,"blksize":4096,"atime":{"sec":1,"nsec":2},"mtime":{"sec":1,"nsec":2},"ctime":{"sec":1,"nsec":2}},"error":null}]}"#,
        r#"{"ok":true,"results":[]}"#,
        r#"{"ok":true,"end":true}"#,
        r#"{"ok":false,"error":"busy"}"#,
    ] {
        out.push(frame(v.as_bytes()));
    }
    out
}

/// One random mutation of `input` (or of a splice with `other`).
pub fn mutate(rng: &mut StdRng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..rng.gen_range(1..4) {
        match rng.gen_range(0..9) {
            0 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                v[i] ^= 1 << rng.gen_range(0..8);
            }
            1 => {
                let i = rng.gen_range(0..=v.len());
                let b = *b"{}[]\",:0\\u9-eE.tfn/|*?"
                    .get(rng.gen_range(0..23))
                    .unwrap_or(&b'x');
                v.insert(i, b);
            }
            2 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                let n = rng.gen_range(1..=(v.len() - i).min(16));
                v.drain(i..i + n);
            }
            3 => {
                let n = rng.gen_range(0..=v.len());
                v.truncate(n);
            }
            4 if v.len() >= 4 => {
                let len: u32 = match rng.gen_range(0..4) {
                    0 => u32::MAX,
                    1 => rng.gen_range(0..64),
                    2 => (MAX_REQUEST as u32) + rng.gen_range(0..3) - 1,
                    _ => rng.gen(),
                };
                v[..4].copy_from_slice(&len.to_be_bytes());
            }
            5 => {
                let i = rng.gen_range(0..=v.len());
                let j = rng.gen_range(0..=other.len());
                v.truncate(i);
                v.extend_from_slice(&other[j..]);
            }
            6 => {
                let n = rng.gen_range(0..64);
                v = (0..n).map(|_| rng.gen()).collect();
            }
            7 if v.len() > 4 => {
                // Repeat a piece of the body (deep nesting, long arrays).
                let i = rng.gen_range(4..v.len());
                let n = rng.gen_range(1..=(v.len() - i).min(8));
                let piece = v[i..i + n].to_vec();
                for _ in 0..rng.gen_range(1..200) {
                    v.splice(i..i, piece.iter().copied());
                }
            }
            _ => v.extend_from_slice(other),
        }
    }
    v
}

/// Decode `input` every way a daemon or a client would; return how much memory it took at
/// most beyond what was live before.
fn decode_all(input: &[u8]) -> usize {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    // The daemon: one request.
    let mut r = input;
    if let Ok(Some(req)) = read_request(&mut r) {
        if let Ok(p) = req.validate() {
            let _ = p.to_string();
        }
        let _ = Pattern::parse(&req.pattern);
    }
    let mut r = input;
    let _ = read_frame_limited::<_, serde_json::Value>(&mut r, MAX_REQUEST);
    // The client: a response stream.
    let mut n = 0;
    for x in read_results(input) {
        n += 1;
        if x.is_err() || n > 100_000 {
            break;
        }
    }
    let mut r = input;
    let _ = read_frame_limited::<_, Response>(&mut r, MAX_RESPONSE);
    let mut r = input;
    let _ = read_response(&mut r, MAX_RESPONSE);
    let mut r = input;
    let _ = read_request_encoding(&mut r);
    PEAK.load(Ordering::Relaxed).saturating_sub(base)
}

#[test]
fn fuzz_control_protocol() {
    let secs: f64 = std::env::var("DIRCACHE_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let seed: u64 = std::env::var("DIRCACHE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let mut rng = StdRng::seed_from_u64(seed);
    let corpus = corpus();
    // Valid inputs decode.
    for c in &corpus {
        let mut r = c.as_slice();
        assert!(
            read_frame_bytes(&mut r, MAX_RESPONSE).is_ok_and(|b| b.is_some()),
            "corpus entry does not decode"
        );
    }
    // A declared length far beyond what arrives allocates nothing like it.
    let mut huge = ((MAX_REQUEST - 1) as u32).to_be_bytes().to_vec();
    huge.extend_from_slice(b"{\"op\":");
    let used = decode_all(&huge);
    assert!(
        used < 256 * 1024,
        "a 64 KiB declared frame with 6 bytes took {used} bytes"
    );
    let mut huge = ((MAX_RESPONSE - 1) as u32).to_be_bytes().to_vec();
    huge.extend_from_slice(b"{\"ok\":true");
    let used = decode_all(&huge);
    assert!(
        used < 256 * 1024,
        "a 4 MiB declared frame with 10 bytes took {used} bytes"
    );

    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut cases = 0u64;
    let mut worst = 0.0f64;
    while Instant::now() < deadline {
        let a = &corpus[rng.gen_range(0..corpus.len())];
        let b = &corpus[rng.gen_range(0..corpus.len())];
        let input = mutate(&mut rng, a, b);
        let used = decode_all(&input);
        // Bounded by the input: JSON expands a few times when decoded, never more.
        let limit = 64 * 1024 + 32 * input.len();
        assert!(
            used <= limit,
            "decoding {} bytes took {used} bytes: {:?}",
            input.len(),
            String::from_utf8_lossy(&input[..input.len().min(200)])
        );
        worst = worst.max(used as f64 / (input.len().max(1)) as f64);
        cases += 1;
    }
    eprintln!("fuzz: {cases} cases in {secs} s (seed {seed}), worst {worst:.1} bytes/byte");
    assert!(cases > 1000, "only {cases} cases ran");
}
