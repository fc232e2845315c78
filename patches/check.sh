#!/usr/bin/env bash
# Check the SGLang patches against the released wheel: each applies cleanly on top of the
# ones before it, the touched files byte-compile, and the read-only tier walk answers right
# on a stand-in tree.
# Usage: patches/check.sh            (downloads sglang==0.5.23 from PyPI, 39 MB)
#        SGLANG_WHEEL=path.whl patches/check.sh
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
patches=("$here"/sglang-0.5.23-*.patch)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

wheel="${SGLANG_WHEEL:-}"
if [ -z "$wheel" ]; then
    python -m pip download --quiet --no-deps sglang==0.5.23 -d "$work/wheel"
    wheel="$(ls "$work"/wheel/sglang-0.5.23-*.whl)"
fi
echo "wheel: $(basename "$wheel")"

touched=$(grep -h '^+++ b/' "${patches[@]}" | sed 's|^+++ b/||' | sort -u)
site="$work/site"
mkdir -p "$site"
# The walk check also reads radix_cache.py (RadixKey), which the patch leaves alone.
python -m zipfile -e "$wheel" "$site" >/dev/null

for patch_file in "${patches[@]}"; do
    echo "patch: $(basename "$patch_file")"
    (cd "$site" && patch -p1 --dry-run < "$patch_file")
    (cd "$site" && patch -p1 < "$patch_file")
done
for f in $touched; do
    python -m py_compile "$site/$f"
    echo "py_compile ok: $f"
done
python "$here/check_walk.py" "$site"
echo "check.sh: all ok"
