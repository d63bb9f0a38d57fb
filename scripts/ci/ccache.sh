# Sourced by the CI stages that configure build trees of their own (sanitizers, isa, fuzz), after
# they set ROOT: `launcher` holds the CMake argument that compiles through ccache when it is
# installed (empty otherwise), with paths taken relative to ROOT so that clones share the cache.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
