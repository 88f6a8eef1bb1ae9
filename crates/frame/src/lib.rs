//! # dircache-frame
//!
//! Length-delimited frames: the one framing implementation of dircache's wire protocols
//! (the remote protocol in `dircache_remote`, and the FUSE daemon's control socket in
//! `dircache_search::proto`). Its own crate so that both use it without depending on each other.
//!
//! A frame is a 4-byte big-endian length `n`, then `n` bytes of payload. Every reader states
//! the largest payload it accepts; a longer declared length is refused before any of the
//! payload is read ([`FrameError::TooLarge`]). The payload buffer grows with the bytes that
//! actually arrive (at most [`CHUNK`] at a time), never with the declared length, so a peer
//! that announces 4 GiB and sends nothing costs 4 bytes of memory. A stream that ends inside a
//! frame is [`FrameError::Truncated`]; one that ends cleanly between frames is `Ok(None)`.

use std::io::{Read, Write};

/// The header: a big-endian `u32` payload length.
pub const HEADER: usize = 4;
/// Largest piece read at once (and by which the payload buffer grows).
pub const CHUNK: usize = 8 * 1024;

/// Errors of the framing layer.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {len} bytes is larger than the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("connection closed mid-frame")]
    Truncated,
}

impl FrameError {
    /// The errno this error reports to a caller.
    pub fn errno(&self) -> i32 {
        match self {
            FrameError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            FrameError::TooLarge { .. } => libc::EMSGSIZE,
            FrameError::Truncated => libc::EPROTO,
        }
    }
}

/// Read one frame's payload of at most `max` bytes; `Ok(None)` on a clean end of stream
/// before the frame starts.
pub fn read_frame<R: Read + ?Sized>(r: &mut R, max: usize) -> Result<Option<Vec<u8>>, FrameError> {
    let mut len = [0u8; HEADER];
    let mut got = 0;
    while got < HEADER {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let n = u32::from_be_bytes(len) as usize;
    if n > max {
        return Err(FrameError::TooLarge { len: n, max });
    }
    let mut body = Vec::with_capacity(n.min(CHUNK));
    let mut chunk = [0u8; CHUNK];
    while body.len() < n {
        let want = (n - body.len()).min(CHUNK);
        match r.read(&mut chunk[..want]) {
            Ok(0) => return Err(FrameError::Truncated),
            Ok(k) => body.extend_from_slice(&chunk[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(Some(body))
}

/// Write one frame with `payload` (at most `max` bytes, else [`FrameError::TooLarge`] and
/// nothing is written). Does not flush.
pub fn write_frame<W: Write + ?Sized>(
    w: &mut W,
    payload: &[u8],
    max: usize,
) -> Result<(), FrameError> {
    if payload.len() > max {
        return Err(FrameError::TooLarge {
            len: payload.len(),
            max,
        });
    }
    let len = u32::try_from(payload.len()).map_err(|_| FrameError::TooLarge {
        len: payload.len(),
        max,
    })?;
    w.write_all(&len.to_be_bytes())?;
    w.write_all(payload)?;
    Ok(())
}

/// A whole frame (header and payload) in one buffer, for writers that hand frames to another
/// thread. Same limit rule as [`write_frame`].
pub fn encode_frame(payload: &[u8], max: usize) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    write_frame(&mut out, payload, max)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_limits() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"hello", 16).unwrap();
        write_frame(&mut buf, b"", 16).unwrap();
        assert!(matches!(
            write_frame(&mut buf, &[0u8; 17], 16),
            Err(FrameError::TooLarge { len: 17, max: 16 })
        ));
        let mut r = &buf[..];
        assert_eq!(
            read_frame(&mut r, 16).unwrap().as_deref(),
            Some(&b"hello"[..])
        );
        assert_eq!(read_frame(&mut r, 16).unwrap().as_deref(), Some(&b""[..]));
        assert!(read_frame(&mut r, 16).unwrap().is_none());
        // A declared length over the limit is refused before the payload.
        let mut r = &[0u8, 0, 1, 0][..];
        assert!(matches!(
            read_frame(&mut r, 255),
            Err(FrameError::TooLarge { len: 256, .. })
        ));
        // Ends inside the header, inside the payload.
        assert!(matches!(
            read_frame(&mut &[0u8, 0][..], 16),
            Err(FrameError::Truncated)
        ));
        assert!(matches!(
            read_frame(&mut &[0u8, 0, 0, 5, 1][..], 16),
            Err(FrameError::Truncated)
        ));
    }
}
