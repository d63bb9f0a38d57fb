// Rules of the CUDA backend's sources that the compiler cannot enforce, checked on the source tree
// (they hold whether or not this machine has a GPU or this build has CUDA):
//  - every kernel launch goes through tandem::cuda::launch (core/cuda/launch.cuh), which takes a
//    StreamGuard, so no launch runs without a guard for its device: no `<<<` anywhere else;
//  - core/ (the device layer, as PyTorch's c10/cuda) includes nothing from the layers above it;
//  - the cuBLAS loader opens only the major version the build compiled against;
//  - no device memset or copy runs on the legacy default stream (cudaMemset, cudaMemcpy...): the
//    compute stream is non-blocking, so nothing would order such a call with the kernels;
//  - every host synchronisation goes through core/cuda/context.cpp's counted wrappers
//    (cuda::host_sync_count sees them all): no cudaStreamSynchronize, cudaDeviceSynchronize,
//    cudaEventSynchronize or synchronous cudaMemcpy anywhere else.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
const fs::path kRoot = TANDEM_SOURCE_DIR;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<fs::path> sources_under(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".cu" || ext == ".cuh" || ext == ".cpp" || ext == ".h")) out.push_back(e.path());
  }
  return out;
}

TEST(CudaSourceRules, EveryKernelLaunchGoesThroughTheGuardedLauncher) {
  int files = 0;
  for (const std::string dir : {"core", "kernels", "dist", "nn", "optim", "train", "apps"}) {
    for (const fs::path& p : sources_under(dir)) {
      ++files;
      if (p == kRoot / "core/cuda/launch.cuh") continue;
      const std::string text = read(p);
      EXPECT_EQ(text.find("<<<"), std::string::npos)
          << fs::relative(p, kRoot).string()
          << " launches a kernel with <<<...>>>; use launch(StreamGuard, kernel, ...) from core/cuda/launch.cuh";
    }
  }
  EXPECT_GT(files, 50) << "the source tree was not found at " << kRoot;
  EXPECT_NE(read(kRoot / "core/cuda/launch.cuh").find("<<<"), std::string::npos);
}

TEST(CudaSourceRules, CoreIncludesNothingAboveIt) {
  const std::regex upward(R"re(#include\s+"(kernels|nn|optim|data|dist|train|apps)/)re");
  int files = 0;
  for (const fs::path& p : sources_under("core")) {
    ++files;
    const std::string text = read(p);
    std::smatch m;
    EXPECT_FALSE(std::regex_search(text, m, upward))
        << fs::relative(p, kRoot).string() << " includes " << m.str() << "...: core/ must not depend on the layers above it";
  }
  EXPECT_GT(files, 10);
}

// Every engine source (but `except`) whose text, comments removed when asked, matches `call`: one failure
// each, naming the file, the call and `fix`. Returns how many files were read.
int expect_no_call(const std::regex& call, const std::string& fix, const fs::path& except = {},
                   bool skip_comments = false) {
  int files = 0;
  for (const std::string dir : {"core", "kernels", "dist", "nn", "optim", "train", "apps"}) {
    for (const fs::path& p : sources_under(dir)) {
      ++files;
      if (p == except) continue;
      std::string text = read(p);
      if (skip_comments) text = std::regex_replace(text, std::regex("//[^\n]*"), "");
      std::smatch m;
      EXPECT_FALSE(std::regex_search(text, m, call)) << fs::relative(p, kRoot).string() << " calls " << m.str() << fix;
    }
  }
  return files;
}

TEST(CudaSourceRules, NoMemsetOrCopyOnTheLegacyDefaultStream) {
  // The synchronous-looking forms take no stream: they run on the legacy default stream.
  const std::regex legacy(R"re(\b(cudaMemset|cudaMemset[23]D|cudaMemcpy|cudaMemcpy2D|cudaMemcpyPeer)\s*\()re");
  EXPECT_GT(expect_no_call(legacy, "...: it runs on the legacy default stream, which the non-blocking compute "
                                   "stream does not wait for; use the Async form on compute_stream(device)"),
            50)
      << "the source tree was not found at " << kRoot;
}

TEST(CudaSourceRules, EveryHostSynchronisationIsCounted) {
  const std::regex blocking(R"re(\b(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cudaMemcpy)\s*\()re");
  EXPECT_GT(expect_no_call(blocking,
                           "...: block the host through cuda::stream_synchronize / device_synchronize "
                           "(core/cuda/context.h), which count it",
                           kRoot / "core/cuda/context.cpp", /*skip_comments=*/true),
            50);
  const std::string context = read(kRoot / "core/cuda/context.cpp");
  EXPECT_NE(context.find("cudaStreamSynchronize(stream)"), std::string::npos);
  EXPECT_NE(context.find("cudaDeviceSynchronize()"), std::string::npos);
}

TEST(CudaSourceRules, TheCublasLoaderOpensOnlyTheCompiledMajorVersion) {
  const std::string text = read(kRoot / "kernels/cuda/cublas_loader.cpp");
  ASSERT_FALSE(text.empty());
  EXPECT_NE(text.find("\"libcublas.so.\" TANDEM_CUBLAS_SOVERSION"), std::string::npos);
  EXPECT_EQ(text.find("\"libcublas.so\""), std::string::npos)
      << "an unversioned libcublas.so may be another major version than the headers compiled against";
}

}  // namespace
