//! A store never sends a write half done (docs/remote.md, "Write-back"): files written
//! through a remote mount (stand-in ssh, real FUSE, passthrough) while a thread of this
//! process spawns processes, whose execs close their copies of the descriptors: FLUSHes in
//! the middle of the writes. In a binary of its own: its spawns would send such FLUSHes to
//! every file the other tests of a shared binary hold open, and change their call counts.

#[path = "../../fuse/tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::Duration;

use common::can_mount;
use dircache_tests::remote::{eventually, random_bytes, RemoteMount as Mount};

/// Wait until the daemon's log shows no new call for 300 ms (as in remote_containers.rs).
fn quiet(t: &Mount) {
    eventually("no more calls from the setup", || {
        let n = t.calls("");
        std::thread::sleep(Duration::from_millis(300));
        t.calls("") == n
    });
}

/// A close of another copy of a writer's descriptor while its write is under way (here a
/// child process's exec, which closes the copy it inherited: the kernel sends a FLUSH for
/// it) stores the file as it is once the write is done, never half of it. The kernel's
/// write sets the container's times, then copies the data: a store that read the state in
/// between sent a torn file (an empty first `Store` of a new file, a second one after it:
/// the CI failure of `a_small_file_is_stored_back_in_one_call`, whose harness threads spawn
/// processes) and, for a write in place, recorded the new times with the old data, so the
/// writer's own close found nothing to store and the server never got the write. Files
/// created and written, then files overwritten in place, while a thread spawns processes:
/// one `Store` per file, and the server has every file's new bytes.
#[test]
fn a_close_during_a_write_stores_the_whole_write_once() {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    if !can_mount() {
        return;
    }
    const CREATED: usize = 200;
    const IN_PLACE: usize = 60;
    const BIG: usize = 1 << 20;
    let t = Mount::start("");
    std::fs::create_dir(t.s("obj")).unwrap();
    let old = random_bytes(BIG, 21);
    for i in 0..IN_PLACE {
        std::fs::write(t.s(&format!("obj/p{i}")), &old).unwrap();
    }
    eventually("the files show", || {
        (0..IN_PLACE).all(|i| {
            std::fs::metadata(t.m(&format!("obj/p{i}"))).is_ok_and(|m| m.len() == BIG as u64)
        })
    });
    quiet(&t);
    let stop = Arc::new(AtomicBool::new(false));
    let spawner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                Command::new("true").status().unwrap();
                n += 1;
            }
            n
        })
    };
    let stores = t.calls("Store {");
    let small = random_bytes(5000, 22);
    for i in 0..CREATED {
        let mut f = std::fs::File::create(t.m(&format!("obj/c{i}"))).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        f.write_all(&small).unwrap();
    }
    let new = random_bytes(BIG, 23);
    for i in 0..IN_PLACE {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(t.m(&format!("obj/p{i}")))
            .unwrap();
        std::thread::sleep(Duration::from_millis(2));
        f.write_all(&new).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let spawned = spawner.join().unwrap();
    quiet(&t);
    let torn: Vec<String> = (0..CREATED)
        .filter(|i| std::fs::read(t.s(&format!("obj/c{i}"))).unwrap() != small)
        .map(|i| format!("c{i}"))
        .chain(
            (0..IN_PLACE)
                .filter(|i| std::fs::read(t.s(&format!("obj/p{i}"))).unwrap() != new)
                .map(|i| format!("p{i}")),
        )
        .collect();
    assert!(
        torn.is_empty(),
        "files whose write the server does not have ({spawned} processes spawned): {torn:?}"
    );
    assert_eq!(
        t.calls("Store {") - stores,
        CREATED + IN_PLACE,
        "Store calls for {} files written once each ({spawned} processes spawned); the \
         stores of fewer bytes than written:\n{}",
        CREATED + IN_PLACE,
        t.log_text()
            .lines()
            .filter(|l| l.contains("container: stored")
                && !l.contains("stored 5000 bytes")
                && !l.contains(&format!("stored {BIG} bytes")))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
