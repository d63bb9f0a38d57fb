#!/usr/bin/env bash
# tests/gpu_bundle/stripped_env.sh: runs a command the way a bare GPU machine would see this one, so that the
# bundle (scripts/gpu/bundle.sh) can be tried here without a GPU.
# Usage (root): bash tests/gpu_bundle/stripped_env.sh CMD [ARGS...]
# Inside a private mount namespace (unshare --mount; nothing outside it changes):
#   - /usr/lib/x86_64-linux-gnu (and so /lib/x86_64-linux-gnu) holds only the glibc family, libstdc++ and
#     libgcc_s, plus what the base tools need (bash, coreutils, grep, sed, awk, tar, gzip, python3 with its
#     standard modules), as any GPU image has them;
#   - the libraries in /usr/lib itself (Gloo, ...) read as empty files, /etc/ld.so.cache is empty;
#   - the CUDA toolkit (/usr/local/cuda-*) and /usr/local/lib are empty;
#   - cuDNN 9, cuBLAS 13 and NCCL 2 exist only as PyTorch's NVIDIA wheels lay them out, in
#     $STRIPPED_SITE/nvidia/{cudnn,cu13,nccl}/lib, with PYTHONPATH=$STRIPPED_SITE so that `import nvidia`
#     finds them (what scripts/gpu/libs.sh looks for);
#   - no nvidia-smi, no libcuda.so.1: no driver, as on a machine without a GPU.
# The variables STRIPPED_SITE and STRIPPED_WHEEL_DIRS (the three lib folders, ':'-joined) are exported to CMD.
set -euo pipefail
if [[ "${STRIPPED_INSIDE:-0}" != 1 ]]; then
  [[ $(id -u) == 0 ]] || { echo "stripped_env.sh: needs root (a mount namespace)" >&2; exit 3; }
  # The staging folder is removed out here, once the namespace (and its bind mounts) is gone: a removal
  # inside it would reach through the bind mount into the real toolkit.
  STAGE=$(mktemp -d /tmp/stripped-env.XXXXXX)
  rc=0
  STRIPPED_INSIDE=1 STRIPPED_STAGE=$STAGE unshare --mount --propagation private bash "$0" "$@" || rc=$?
  rm -rf --one-file-system "$STAGE"
  exit "$rc"
fi
ARCHLIB=/usr/lib/x86_64-linux-gnu
CUDA_REAL=$(readlink -f /usr/local/cuda)
STAGE=$STRIPPED_STAGE
mkdir -p "$STAGE/syslib" "$STAGE/cuda-lib" "$STAGE/empty"

# The allowed system libraries, and the base tools' needs.
allowed=(ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 librt.so.1 libpthread.so.0 libutil.so.1 libresolv.so.2
         libanl.so.1 libstdc++.so.6 libgcc_s.so.1)
tools=(bash sh python3 awk mawk sed grep date timeout tar gzip mkdir cat head tail sort paste tr du find env nproc wc
       cut readlink dirname basename cp rm ls mktemp sleep uname id ln chmod touch stat xargs tee)
mapfile -t tool_paths < <(for t in "${tools[@]}"; do command -v "$t" || true; done; ls /usr/lib/python3*/lib-dynload/*.so)
mapfile -t tool_needs < <(for f in "${tool_paths[@]}"; do ldd "$(readlink -f "$f")" 2>/dev/null || true; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
for lib in "${allowed[@]}"; do [[ -e "$ARCHLIB/$lib" ]] && cp -L "$ARCHLIB/$lib" "$STAGE/syslib/"; done
for p in "${tool_needs[@]}"; do cp -L "$p" "$STAGE/syslib/$(basename "$p")"; done
[[ -n "${STRIPPED_DEBUG:-}" ]] && echo "stripped_env.sh: ${#tool_paths[@]} tools, ${#tool_needs[@]} needs, $(ls "$STAGE/syslib" | wc -l) libraries kept" >&2

# PyTorch's wheels, as folders of links into the toolkit's lib folder (bind-mounted before it is hidden).
mount --bind "$CUDA_REAL/lib64" "$STAGE/cuda-lib"
SITE=$STAGE/site
mkdir -p "$SITE/nvidia/cudnn/lib" "$SITE/nvidia/cu13/lib" "$SITE/nvidia/nccl/lib"
for f in "$STAGE"/cuda-lib/libcudnn*.so.9; do ln -s "$f" "$SITE/nvidia/cudnn/lib/"; done
for f in "$STAGE"/cuda-lib/libcublas.so.13 "$STAGE"/cuda-lib/libcublasLt.so.13; do ln -s "$f" "$SITE/nvidia/cu13/lib/"; done
ln -s "$STAGE/cuda-lib/libnccl.so.2" "$SITE/nvidia/nccl/lib/"

# Hide the rest. `mount` itself is loaded before its own libraries disappear.
touch "$STAGE/empty-file"
for f in /usr/lib/lib*.so*; do [[ -f "$f" && ! -L "$f" ]] && mount --bind "$STAGE/empty-file" "$f"; done
mount --bind "$STAGE/empty-file" /etc/ld.so.cache
for d in /usr/local/cuda-* /usr/local/lib; do [[ -d "$d" ]] && mount --bind "$STAGE/empty" "$d"; done
mount --bind "$STAGE/syslib" "$ARCHLIB"

export STRIPPED_SITE=$SITE STRIPPED_WHEEL_DIRS="$SITE/nvidia/cudnn/lib:$SITE/nvidia/cu13/lib:$SITE/nvidia/nccl/lib"
export PYTHONPATH=$SITE PATH=/usr/bin:/bin
unset LD_LIBRARY_PATH
exec "$@"
