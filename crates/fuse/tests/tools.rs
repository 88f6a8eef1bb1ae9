//! Real programs on the mount and on SRC (or on a native twin tree), compared.

mod common;
use common::*;

#[test]
fn find_du_ls_stat_match_src() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    make_tree(&t.src);
    for script in [
        "find . | sort",
        "find . -type f -name '*.txt' | sort",
        // -l: every link of a hard-linked file is counted, so `du -a` shows the same names
        // whichever link it meets first (listing order through the mount is cookie order,
        // not SRC's; see listings.rs). `du -s` still counts each inode once.
        "du -s --apparent-size .; du -al --apparent-size . | sort -k2",
        "ls -lR --time-style=+%s .",
        "find . -printf '%p %s %m %n %U %G %y %T@ %l\\n' | sort",
        "stat -c '%n %s %a %h %u %g %F %Y' a/f1.txt d d/link1 a/b/zero.bin",
        "cat a/f*.txt d/link1; cmp a/b/zero.bin /dev/zero 2>&1 | head -c 0; wc -c a/b/zero.bin",
        "readlink d/link1 d/dangling; test -e d/dangling || echo dangling-missing",
    ] {
        let native = sh_ok(&t.src, script);
        let fused = sh_ok(&t.mnt, script);
        assert_eq!(native, fused, "`{script}` differs");
        // Warm: a second time through the kernel caches.
        assert_eq!(native, sh_ok(&t.mnt, script), "`{script}` differs (warm)");
    }
    // Hard links share one inode number through the mount.
    let o = sh_ok(&t.mnt, "stat -c %i a/f2.txt d/hard2 | uniq | wc -l");
    assert_eq!(o.trim(), "1");
}

#[test]
fn git_workflow_matches_native_on_mount() {
    if !can_mount() {
        return;
    }
    git_workflow_matches_native(&TestMount::new());
}

#[test]
fn tar_cp_rm_roundtrip() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    make_tree(&t.src);
    let listing = "find . -printf '%p %s %m %y %l\\n' | sort";
    // tar c through the mount equals tar c of SRC (content and metadata listing).
    let a = sh_ok(
        &t.src,
        "tar cf - --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner . | md5sum",
    );
    let b = sh_ok(
        &t.mnt,
        "tar cf - --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner . | md5sum",
    );
    assert_eq!(a, b);
    // tar x into the mount, cp -r within it, compare with SRC's view; rm -r.
    let tarball = t.dir.path().join("t.tar");
    sh_ok(&t.src, &format!("tar cf {} a d pkg", tarball.display()));
    sh_ok(
        &t.mnt,
        &format!("mkdir x && cd x && tar xf {}", tarball.display()),
    );
    sh_ok(&t.mnt, "cp -r a a_copy && cp -a d d_copy");
    assert_eq!(
        sh_ok(&t.mnt, &format!("cd x && {listing}")),
        sh_ok(&t.src, &format!("cd x && {listing}"))
    );
    assert_eq!(sh_ok(&t.mnt, "diff -r a a_copy && echo same"), "same\n");
    assert_eq!(sh_ok(&t.src, "diff -r a a_copy && echo same"), "same\n");
    sh_ok(&t.mnt, "rm -r x a_copy d_copy");
    assert_eq!(sh_ok(&t.mnt, "ls"), sh_ok(&t.src, "ls"));
    assert!(!t.s("x").exists());
}

#[test]
fn make_c_project() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    let script = r#"set -e
mkdir proj && cd proj
cat > main.c <<'C'
#include <stdio.h>
#include "lib.h"
int main(void) { printf("%d\n", add(40, 2)); return 0; }
C
cat > lib.c <<'C'
#include "lib.h"
int add(int a, int b) { return a + b; }
C
echo 'int add(int a, int b);' > lib.h
printf 'prog: main.o lib.o\n\tcc -o prog main.o lib.o\n%%.o: %%.c lib.h\n\tcc -c $<\n' > Makefile
make -s
./prog
make -s && echo up-to-date
touch lib.h && sleep 0.01 && make -s && ./prog
"#;
    let out = sh_ok(&t.mnt, script);
    assert_eq!(out, "42\nup-to-date\n42\n");
}

#[test]
fn python_import_and_mkstemp_loop() {
    if !can_mount() {
        return;
    }
    let t = TestMount::new();
    make_tree(&t.src);
    let o = py(
        &t.mnt,
        "import pkg, pkg.sub; print(pkg.VALUE, pkg.sub.mod.X)",
        None,
    );
    assert_eq!(o, "42 1\n");
    let o = py(
        &t.mnt,
        "import tempfile, os\n\
         names = set()\n\
         for i in range(300):\n\
         \x20   fd, p = tempfile.mkstemp(dir='.')\n\
         \x20   os.write(fd, b'x' * i); os.close(fd)\n\
         \x20   assert os.stat(p).st_size == i\n\
         \x20   names.add(p)\n\
         \x20   if i % 2: os.unlink(p)\n\
         print(len(names), len([n for n in os.listdir('.') if n.startswith('tmp')]))",
        None,
    );
    assert_eq!(o, "300 150\n");
    assert_eq!(sh_ok(&t.src, "ls | grep -c '^tmp'").trim(), "150");
}
