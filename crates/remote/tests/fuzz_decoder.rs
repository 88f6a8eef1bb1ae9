//! Property tests of the decoder (bounded: a fixed number of cases, `PROPTEST_CASES` to change
//! it): random bytes and random mutations of valid frames go through the frame reader and the
//! message decoder; every input gives a value or a typed error, never a panic, and a frame's
//! declared length is never allocated up front. A live server fed random frames ends the
//! connection with an error and stays alive to the end.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use dircache_core::{Attr, DirEntry, FileType};
use dircache_remote::frame::{read_frame, write_frame, FrameError};
use dircache_remote::proto::{
    decode, encode, features, Bytes, ClientMsg, Hello, OpenHow, Reply, Request, ServerMsg,
    WireCred, MAX_CLIENT_FRAME, MAX_SERVER_FRAME,
};
use proptest::prelude::*;

fn valid_client_frames() -> Vec<Vec<u8>> {
    let cred = WireCred {
        uid: 1,
        gid: 2,
        groups: vec![3, 4],
    };
    let reqs = vec![
        Request::Walk {
            dir: b"a/b".to_vec(),
            names: vec![Bytes(b"c".to_vec()), Bytes(b"d".to_vec())],
        },
        Request::Readdir {
            path: b"x".to_vec(),
            plus: true,
        },
        Request::Write {
            handle: 9,
            offset: 1 << 40,
            data: vec![7; 300],
            append: false,
        },
        Request::Rename {
            old: b"a".to_vec(),
            new: b"b".to_vec(),
            mode: dircache_core::RenameMode::Exchange,
        },
        Request::OpenPlus {
            read: 1 << 20,
            upto: u64::MAX,
            how: OpenHow::Path {
                path: b"x".to_vec(),
                flags: 0,
                mode: 0,
                umask: 0,
            },
        },
    ];
    let mut out = vec![encode(&ClientMsg::Hello(Hello::new(features::ALL))).unwrap()];
    for (i, req) in reqs.into_iter().enumerate() {
        out.push(
            encode(&ClientMsg::Call {
                id: i as u64,
                cred: cred.clone(),
                req,
            })
            .unwrap(),
        );
    }
    // Hurries (no reply) for a call in flight and for one that never was.
    for call in [1, 999] {
        out.push(
            encode(&ClientMsg::Hurry {
                call,
                dir: b"a/b".to_vec(),
            })
            .unwrap(),
        );
    }
    out
}

fn valid_server_frames() -> Vec<Vec<u8>> {
    let e = DirEntry {
        name: b"n".to_vec(),
        kind: FileType::Regular,
        ino: 5,
        attr: Some(Attr::default()),
    };
    vec![
        encode(&ServerMsg::Hello(Hello::new(1))).unwrap(),
        encode(&ServerMsg::Reply {
            id: 3,
            last: false,
            body: Ok(Reply::Entries(vec![e.clone(), e])),
        })
        .unwrap(),
        encode(&ServerMsg::Reply {
            id: 4,
            last: true,
            body: Err(2),
        })
        .unwrap(),
        encode(&ServerMsg::Reply {
            id: 5,
            last: true,
            body: Ok(Reply::OpenedPlus {
                handle: 1,
                writable: false,
                attr: Attr::default(),
                data: Some(Bytes(vec![1, 2, 3])),
            }),
        })
        .unwrap(),
        encode(&ServerMsg::Callback(
            dircache_remote::proto::Callback::Entry(b"a/b".to_vec()),
        ))
        .unwrap(),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
    Length(u32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Truncate),
        any::<u32>().prop_map(Mutation::Length),
    ]
}

fn mutate(frame: &mut Vec<u8>, m: &Mutation) {
    let n = frame.len().max(1);
    match *m {
        Mutation::Flip(i, b) => {
            if !frame.is_empty() {
                frame[i % n] ^= b
            }
        }
        Mutation::Insert(i, b) => frame.insert(i % (frame.len() + 1), b),
        Mutation::Delete(i) => {
            if !frame.is_empty() {
                frame.remove(i % n);
            }
        }
        Mutation::Truncate(i) => frame.truncate(i % n),
        Mutation::Length(l) => {
            if frame.len() >= 4 {
                frame[..4].copy_from_slice(&l.to_be_bytes())
            }
        }
    }
}

/// Decode every frame of `wire` as `T`; the number of messages decoded. Errors are fine.
fn decode_all<T: serde::de::DeserializeOwned>(wire: &[u8], max: usize) -> usize {
    let mut r = wire;
    let mut n = 0;
    loop {
        match read_frame(&mut r, max) {
            Ok(Some(f)) => {
                assert!(f.len() <= max);
                if decode::<T>(&f).is_ok() {
                    n += 1;
                }
            }
            Ok(None) => return n,
            Err(FrameError::TooLarge { len, max: m }) => {
                assert!(len > m);
                return n;
            }
            Err(_) => return n,
        }
    }
}

fn framed(payloads: &[Vec<u8>]) -> Vec<u8> {
    let mut w = Vec::new();
    for p in payloads {
        write_frame(&mut w, p, usize::MAX).unwrap();
    }
    w
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        decode_all::<ClientMsg>(&bytes, MAX_CLIENT_FRAME);
        decode_all::<ServerMsg>(&bytes, MAX_SERVER_FRAME);
        let _ = decode::<ClientMsg>(&bytes);
        let _ = decode::<ServerMsg>(&bytes);
    }

    #[test]
    fn mutated_frames_never_panic(
        which in 0usize..16,
        muts in proptest::collection::vec(mutation(), 1..6),
    ) {
        let client = valid_client_frames();
        let server = valid_server_frames();
        let mut c = framed(&client);
        let mut s = framed(&server);
        // Unmutated, all decode.
        prop_assert_eq!(decode_all::<ClientMsg>(&c, MAX_CLIENT_FRAME), client.len());
        prop_assert_eq!(decode_all::<ServerMsg>(&s, MAX_SERVER_FRAME), server.len());
        for m in &muts {
            if which % 2 == 0 { mutate(&mut c, m) } else { mutate(&mut s, m) }
        }
        decode_all::<ClientMsg>(&c, MAX_CLIENT_FRAME);
        decode_all::<ServerMsg>(&s, MAX_SERVER_FRAME);
        // Payloads mutated inside intact frames reach the message decoder itself.
        let mut p = client[which % client.len()].clone();
        for m in &muts { mutate(&mut p, m) }
        let _ = decode::<ClientMsg>(&p);
        let mut p = server[which % server.len()].clone();
        for m in &muts { mutate(&mut p, m) }
        let _ = decode::<ServerMsg>(&p);
    }

    /// A declared length is never allocated: a header announcing up to 4 GiB followed by a few
    /// bytes yields a buffer no bigger than what came.
    #[test]
    fn declared_length_is_not_allocated(len in any::<u32>(), body in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut wire = len.to_be_bytes().to_vec();
        wire.extend_from_slice(&body);
        match read_frame(&mut &wire[..], usize::MAX) {
            Ok(Some(f)) => prop_assert!(f.len() == len as usize && f.len() <= body.len()),
            Ok(None) => prop_assert!(false, "a header was there"),
            Err(FrameError::Truncated) => prop_assert!((len as usize) > body.len()),
            Err(e) => prop_assert!(false, "{e}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A live server over a real directory: the handshake, then random (mutated) frames. It
    /// answers or ends the connection; it never panics and its thread always ends.
    #[test]
    fn live_server_survives_random_frames(muts in proptest::collection::vec(mutation(), 1..4), which in 1usize..5) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x"), b"x").unwrap();
        let backend: Arc<dyn dircache_core::Backend> =
            Arc::new(dircache_local::LocalBackend::new(dir.path()).unwrap());
        let (mut a, b) = UnixStream::pair().unwrap();
        let r = b.try_clone().unwrap();
        let t = std::thread::spawn(move || {
            dircache_remote::serve(backend, r, b, dircache_remote::ServerConfig::default())
        });
        let frames = valid_client_frames();
        let mut wire = framed(&frames[..1]);
        let mut rest = framed(&frames[which..which + 1]);
        for m in &muts { mutate(&mut rest, m) }
        wire.extend_from_slice(&rest);
        use std::io::Write;
        let _ = a.write_all(&wire);
        let _ = a.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        a.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
        let _ = a.read_to_end(&mut sink);
        let joined = t.join();
        prop_assert!(joined.is_ok(), "server panicked");
    }
}
