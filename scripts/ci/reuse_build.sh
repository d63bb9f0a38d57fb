# Sourced by the CI stages that can run in a build dir another stage configured (isa.sh with
# ISA_BUILD_DIR, fuzz.sh with FUZZ_BUILD_DIR). reuse_build <script> <variable> <dir> <cache line>...:
# fails naming the variable unless <dir> is a configured build dir whose CMakeCache.txt holds every
# <cache line> exactly; else prints <dir>'s absolute path.
reuse_build() {
  local script=$1 var=$2 dir=$3 want
  shift 3
  if [[ ! -f "$dir/CMakeCache.txt" ]]; then
    echo "$script: $var=$dir is not a configured build dir (no CMakeCache.txt)" >&2
    return 1
  fi
  for want in "$@"; do
    if ! grep -qxF "$want" "$dir/CMakeCache.txt"; then
      echo "$script: $var=$dir: its CMakeCache.txt lacks $want" >&2
      return 1
    fi
  done
  (cd "$dir" && pwd)
}
