#!/usr/bin/env bash
# scripts/gpu/libs.sh: finds the GPU libraries the bundle (scripts/gpu/bundle.sh) leaves to the GPU machine,
# cuDNN 9, cuBLAS 13 and NCCL 2, and prints the folders that hold them, joined by ':', for LD_LIBRARY_PATH.
# Where it looks, in this order (the first folder that holds a library wins):
#   1. GPU_CHECK_LIB_DIRS (folders joined by ':'), when set;
#   2. the CUDA toolkit: $CUDA_HOME (default /usr/local/cuda)/{lib64,lib,targets/x86_64-linux/lib}, then any
#      /usr/local/cuda-*/ the same way;
#   3. the NVIDIA Python wheels that PyTorch brings (nvidia-cudnn-cu13, nvidia-nccl-cu13, nvidia-cublas, ...):
#      <each folder of the namespace package `nvidia`>/*/lib, as seen by each python found
#      (GPU_CHECK_TORCH_PYTHON, python3 on PATH, /usr/bin/python3, /usr/local/bin/python3; PYTHONPATH counts);
#   4. the loader's cache (ldconfig -p).
# Output: stdout, the folders (one line, ':'-joined, each once); stderr, one line a library: where it was
# found and how, or what was searched. libcuda.so.1 (the driver) is reported, never required.
# Exit status: 0 when all are found, 1 naming each that is missing.
# Usage: LD_LIBRARY_PATH=$(bash scripts/gpu/libs.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
set -uo pipefail
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NEEDED=(libcudnn.so.9 libcublas.so.13 libcublasLt.so.13 libnccl.so.2)

candidates=()  # "how<TAB>folder"
add() { [[ -d "$2" ]] && candidates+=("$1	$2"); }
IFS=: read -r -a extra <<<"${GPU_CHECK_LIB_DIRS:-}"
for d in "${extra[@]}"; do [[ -n "$d" ]] && add GPU_CHECK_LIB_DIRS "$d"; done
for root in "$CUDA_HOME" /usr/local/cuda /usr/local/cuda-*; do
  for sub in lib64 lib targets/x86_64-linux/lib; do add "CUDA toolkit" "$root/$sub"; done
done
seen_py=" "
for py in ${GPU_CHECK_TORCH_PYTHON:-} python3 /usr/bin/python3 /usr/local/bin/python3; do
  py=$(command -v "$py" 2>/dev/null) || continue
  real=$(readlink -f "$py")
  [[ "$seen_py" == *" $real "* ]] && continue
  seen_py+="$real "
  while read -r pkg; do
    for d in "$pkg"/*/lib; do add "Python wheel ($py)" "$d"; done
  done < <(timeout 60 "$py" -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
done
if command -v ldconfig >/dev/null; then
  while read -r d; do add "ldconfig -p" "$d"; done < <(ldconfig -p 2>/dev/null |
    awk '$NF ~ /^\// {n = split($NF, p, "/"); d = ""; for (i = 2; i < n; i++) d = d "/" p[i]; print d}' | sort -u)
fi

dirs=()
missing=()
for lib in "${NEEDED[@]}" libcuda.so.1; do
  found=""
  for c in "${candidates[@]}"; do
    how=${c%%	*} d=${c#*	}
    if [[ -e "$d/$lib" ]]; then found=$d; break; fi
  done
  if [[ -n "$found" ]]; then
    echo "libs.sh: $lib in $found ($how)" >&2
    [[ " ${dirs[*]} " == *" $found "* ]] || dirs+=("$found")
  elif [[ "$lib" == libcuda.so.1 ]]; then
    echo "libs.sh: $lib (the driver) not found: no GPU driver on this machine" >&2
  else
    missing+=("$lib")
  fi
done
(IFS=:; echo "${dirs[*]}")
if ((${#missing[@]})); then
  echo "libs.sh: not found: ${missing[*]}; searched GPU_CHECK_LIB_DIRS, the CUDA toolkit ($CUDA_HOME and" \
    "/usr/local/cuda-*), the 'nvidia' Python wheels of ${seen_py# } and ldconfig -p. Set GPU_CHECK_LIB_DIRS to" \
    "the folders that hold them." >&2
  exit 1
fi
