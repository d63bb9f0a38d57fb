#!/usr/bin/env bash
# embed.sh: Tandem as an installed library, end to end. Configures and builds the engine (its own
# build dir; CUDA per $TANDEM_CUDA, default OFF; tests and benchmarks off), installs it into a
# temporary prefix, then checks the package the way a consumer meets it:
#   1. every installed header compiles alone with only -I<prefix>/include/tandem and Eigen, and none
#      pulls in a CUDA, cuDNN, cuBLAS, NCCL, Gloo, spdlog, fmt, nlohmann-json or zlib header (grep of
#      the preprocessed output's line markers);
#   2. libtandem.so exports no Gloo, spdlog, fmt, nlohmann-json or Eigen symbol;
#   3. examples/embed builds with find_package(Tandem) (CMAKE_PREFIX_PATH=prefix);
#   4. a one-file program builds with `pkg-config --cflags --libs tandem`, and runs;
#   5. the examples train with 2 ranks under the installed tandem-run (embed_ddp: DDP over Gloo;
#      embed_fsdp: FullyShardedDataParallel) and exit 0;
#   6. runner_example (its own model, DDP wrapper and hook through train::Runner; a resumed run equal
#      to a straight one) exits 0 alone and with 2 ranks under the installed tandem-run;
#   7. examples/transformer builds with find_package(Tandem) and its smoke setting (train_gpt --smoke:
#      30 steps of a small character GPT on Debian's fortunes) trains with 2 ranks and beats the
#      corpus's unigram entropy.
#   8. examples/resnet builds with find_package(Tandem), and its smoke setting (a ResNet-20-shaped
#      net, a few hundred Fashion-MNIST samples, 1 epoch, the Runner with DDP) trains with 2 ranks
#      under the installed tandem-run: the loss falls and it exits 0.
# Assumes scripts/setup.sh ran (compilers, cmake, ninja, Eigen, Gloo, spdlog ... installed).
# Any failure stops the script with a line saying which step failed; exit status non-zero.
# Environment: TANDEM_CUDA (OFF), EMBED_BUILD_DIR (<repo>/build-embed-ci), EMBED_REUSE_BUILD=1 (use
# EMBED_BUILD_DIR as already configured, e.g. the main build/, instead of configuring it), EMBED_PREFIX (a new temp
# dir, removed at exit unless EMBED_KEEP=1), JOBS (nproc), RESNET_DATA (Fashion-MNIST for step 7:
# /usr/share/datasets/fashion-mnist, which scripts/setup.sh installs).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${EMBED_BUILD_DIR:-$ROOT/build-embed-ci}
JOBS=${JOBS:-$(nproc)}
WORK=$(mktemp -d /tmp/tandem-embed.XXXXXX)
PREFIX=${EMBED_PREFIX:-$WORK/prefix}
cleanup() { if [[ "${EMBED_KEEP:-0}" != 1 ]]; then rm -rf "$WORK"; fi; }
trap cleanup EXIT
step() { echo; echo "=== embed.sh: $*"; }
fail() { echo "embed.sh: FAILED: $*" >&2; exit 1; }
trap 'echo "embed.sh: FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

step "0. docs/embedding.md quotes examples/embed as they are"
# Each "<!-- snippet: FILE [TAG] -->" is followed by a code block that must equal the lines between
# FILE's two "// [TAG]" markers, common indentation removed.
python3 - "$ROOT" <<'PY' || fail "docs/embedding.md is out of date with examples/embed"
import pathlib, re, sys
root = pathlib.Path(sys.argv[1])
doc = (root / "docs/embedding.md").read_text()
blocks = re.findall(r"<!-- snippet: (\S+) \[(\S+)\] -->\n```cpp\n(.*?)\n```", doc, re.S)
assert blocks, "no snippets found"
bad = 0
for path, tag, quoted in blocks:
    src = (root / path).read_text()
    m = re.search(r"^[ \t]*// \[%s\]\n(.*?)^[ \t]*// \[%s\]\n" % (re.escape(tag), re.escape(tag)), src, re.S | re.M)
    if not m:
        print(f"{path}: no region [{tag}]"); bad += 1; continue
    lines = m.group(1).rstrip("\n").split("\n")
    ind = min(len(l) - len(l.lstrip()) for l in lines if l.strip())
    if "\n".join(l[ind:] for l in lines) != quoted:
        print(f"docs/embedding.md: snippet {path} [{tag}] differs from the source"); bad += 1
print(f"{len(blocks)} snippets checked, {bad} out of date")
sys.exit(1 if bad else 0)
PY

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

if [[ "${EMBED_REUSE_BUILD:-0}" == 1 && -f "$BUILD/CMakeCache.txt" ]]; then
  step "build the engine in the existing $BUILD (configured elsewhere)"
else
  step "configure + build the engine in $BUILD (TANDEM_CUDA=${TANDEM_CUDA:-OFF})"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA="${TANDEM_CUDA:-OFF}" \
    -DTANDEM_BUILD_TESTS=OFF -DTANDEM_BUILD_BENCH=OFF -DTANDEM_INSTALL=ON "${launcher[@]}" >/dev/null
fi
cmake --build "$BUILD" -j "$JOBS"

step "install into $PREFIX"
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null
for f in lib/libtandem.so lib/cmake/Tandem/TandemConfig.cmake lib/cmake/Tandem/TandemConfigVersion.cmake \
         lib/pkgconfig/tandem.pc bin/tandem-run bin/tandem-mnist bin/tandem-train bin/tandem-test \
         include/tandem/core/tensor.h include/tandem/train/model.h include/tandem/train/models/zoo.h; do
  [[ -e "$PREFIX/$f" ]] || fail "not installed: $PREFIX/$f"
done

step "1. every installed header compiles alone; none includes a private dependency's headers"
INC=$PREFIX/include/tandem
EIGEN_CFLAGS=$(pkg-config --cflags eigen3)
mapfile -t headers < <(cd "$INC" && find . -name '*.h' | sed 's|^\./||' | sort)
(( ${#headers[@]} > 0 )) || fail "no headers under $INC"
check_header() {  # $1: header relative to $INC; prints a reason and returns 1 when it fails
  local h=$1 out
  cd "$EMPTY_DIR"  # an include "x.h" from stdin looks in the current directory first
  if ! out=$(printf '#include "%s"\n' "$h" | c++ -std=c++20 -fsyntax-only -Wall -Wextra -I"$INC" \
      $EIGEN_CFLAGS -x c++ - 2>&1); then
    printf 'header %s does not compile alone:\n%s\n' "$h" "$out"; return 1
  fi
  # The preprocessor's line markers name every file it read; any CUDA/NCCL/Gloo one is a leak.
  out=$(printf '#include "%s"\n' "$h" | c++ -std=c++20 -E -I"$INC" $EIGEN_CFLAGS -x c++ - |
      grep -E '^# [0-9]+ "[^"]*(cuda|cudnn|cublas|nccl|gloo|spdlog|/fmt/|nlohmann|zlib)[^"]*"' | grep -v "\"$INC/" | sort -u || true)
  if [[ -n "$out" ]]; then
    printf 'header %s includes private headers:\n%s\n' "$h" "$out"; return 1
  fi
}
export -f check_header
EMPTY_DIR=$WORK/empty
mkdir -p "$EMPTY_DIR"
export INC EIGEN_CFLAGS EMPTY_DIR
printf '%s\n' "${headers[@]}" | xargs -P "$JOBS" -I{} bash -c 'check_header "$@"' _ {} \
  || fail "header check (see above)"
echo "${#headers[@]} headers compile alone and include no CUDA/cuDNN/cuBLAS/NCCL/Gloo/spdlog/fmt/nlohmann/zlib header"

step "2. exported symbols"
SO=$PREFIX/lib/libtandem.so
nm -D --defined-only -C "$SO" > "$WORK/symbols.txt"
total=$(wc -l < "$WORK/symbols.txt")
api=$(grep -c 'tandem::' "$WORK/symbols.txt" || true)
# No Gloo, spdlog or fmt name anywhere in an exported symbol; no nlohmann or Eigen code either (a
# tandem:: function may take a nlohmann::json argument: train/config's, used by the apps).
cut -c20- "$WORK/symbols.txt" > "$WORK/names.txt"  # drop "<address> <type> "
leaked=$( (grep -E '(gloo|spdlog|fmt)::' "$WORK/names.txt";
           grep -E '^([^ (<]+ |(vtable|typeinfo|typeinfo name|guard variable|VTT) for )?(nlohmann|Eigen)' \
             "$WORK/names.txt") | sort -u || true)
[[ -z "$leaked" ]] || fail "libtandem.so exports private symbols:
$(head -20 <<< "$leaked")"
echo "libtandem.so: $total dynamic symbols defined, $api name tandem::;" \
  "none names gloo::, spdlog:: or fmt::, none is nlohmann or Eigen code"

step "3. examples/embed with find_package(Tandem)"
cmake -S "$ROOT/examples/embed" -B "$WORK/embed-build" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
cmake --build "$WORK/embed-build" -j "$JOBS"
"$WORK/embed-build/basics" || fail "examples/embed/basics"
"$WORK/embed-build/ops_tour" || fail "examples/embed/ops_tour"

step "4. a one-file program with pkg-config"
cat > "$WORK/pc_main.cpp" <<'CPP'
#include <cstdio>
#include "core/error.h"
#include "core/tensor.h"
#include "nn/functional.h"
int main() {
  using namespace tandem;
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::from_vector(std::vector<float>{5, 6, 7, 8}, {2, 2});
  const double s = F::sum(F::matmul(a, b)).item<double>();  // [[19 22] [43 50]] -> 134
  try {
    F::matmul(a, Tensor::ones({3, 3}));
    return 2;  // a shape error must throw tandem::Error across the library boundary
  } catch (const tandem::Error&) {
  }
  std::printf("sum(a @ b) = %g\n", s);
  return s == 134.0 ? 0 : 1;
}
CPP
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# shellcheck disable=SC2046
c++ -std=c++20 -O1 "$WORK/pc_main.cpp" -o "$WORK/pc_main" $(pkg-config --cflags --libs tandem) \
  -Wl,-rpath,"$PREFIX/lib"
"$WORK/pc_main" || fail "the pkg-config program"

step "5. examples/embed, 2 ranks under the installed tandem-run"
timeout 300 "$PREFIX/bin/tandem-run" --standalone --nproc-per-node 2 "$WORK/embed-build/embed_ddp" \
  || fail "embed_ddp with 2 ranks"
timeout 300 "$PREFIX/bin/tandem-run" --standalone --nproc-per-node 2 "$WORK/embed-build/embed_fsdp" \
  || fail "embed_fsdp with 2 ranks"

step "6. examples/embed/runner_example: alone, then 2 ranks under the installed tandem-run"
RUNNER_EXAMPLE_DIR="$WORK/runner-solo" timeout 300 "$WORK/embed-build/runner_example" \
  || fail "runner_example alone"
RUNNER_EXAMPLE_DIR="$WORK/runner-ddp" timeout 300 "$PREFIX/bin/tandem-run" --standalone --nproc-per-node 2 \
  "$WORK/embed-build/runner_example" || fail "runner_example with 2 ranks"

step "7. examples/transformer: build, then its smoke setting with 2 ranks under the installed tandem-run"
cmake -S "$ROOT/examples/transformer" -B "$WORK/gpt-build" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
cmake --build "$WORK/gpt-build" -j "$JOBS"
timeout 300 "$PREFIX/bin/tandem-run" --standalone --nproc-per-node 2 "$WORK/gpt-build/train_gpt" --smoke \
  || fail "examples/transformer train_gpt --smoke with 2 ranks"

step "8. examples/resnet with find_package(Tandem); its smoke setting with 2 ranks under the installed tandem-run"
cmake -S "$ROOT/examples/resnet" -B "$WORK/resnet-build" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
cmake --build "$WORK/resnet-build" -j "$JOBS"
RESNET_DATA=${RESNET_DATA:-/usr/share/datasets/fashion-mnist}
timeout 300 "$PREFIX/bin/tandem-run" --standalone --nproc-per-node 2 "$WORK/resnet-build/train_resnet" --smoke \
  --data-dir "$RESNET_DATA" --work-dir "$WORK/resnet-smoke" || fail "examples/resnet --smoke with 2 ranks"

echo
echo "embed.sh: OK (prefix $PREFIX)"
