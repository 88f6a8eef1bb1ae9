import os, sys
root = sys.argv[1]
n = 0
# ~80k entries: 40 top dirs x 20 subdirs x (4 subsubdirs x 24 files + 2 files)
for a in range(40):
    for b in range(20):
        d = os.path.join(root, f"top{a:02d}", f"sub{b:02d}")
        for c in range(4):
            dd = os.path.join(d, f"leaf{c}")
            os.makedirs(dd, exist_ok=True)
            for f in range(24):
                with open(os.path.join(dd, f"file{f:02d}.c"), "w") as fh:
                    fh.write("x" * (f * 10))
        for f in range(2):
            open(os.path.join(d, f"README{f}"), "w").close()
print(sum(len(ds) + len(fs) for _, ds, fs in os.walk(root)))
