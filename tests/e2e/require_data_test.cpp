// TANDEM_REQUIRE_DATA=1 turns every test that would skip for missing data into a failure naming the
// data, so CI (which sets it) can never pass by skipping the tests that train. Checked on a real
// test of this binary, pointed at a directory that does not exist.
#include <gtest/gtest.h>

#include <string>

#include "common/process.h"
#include "common/test_util.h"

namespace tandem::test {
namespace {

const std::string kE2eTests = TANDEM_BINARY_DIR "/tests/tandem_e2e_tests";

TEST(RequireData, MissingDataFailsNamingItInsteadOfSkipping) {
  TempDir dir("require-data");
  const std::string missing = (dir / "no-such-dir").string();
  const std::string filter = "--gtest_filter=PytorchParity.AdadeltaLossesMatchPytorch";

  const auto plain = dir / "plain.log";
  EXPECT_EQ(run_process({"/usr/bin/env", "-u", "TANDEM_REQUIRE_DATA", "TANDEM_FASHION_MNIST_DIR=" + missing,
                         kE2eTests, filter},
                        plain),
            0)
      << read_file(plain);
  EXPECT_NE(read_file(plain).find("[  SKIPPED ] PytorchParity.AdadeltaLossesMatchPytorch"), std::string::npos)
      << read_file(plain);

  const auto required = dir / "required.log";
  EXPECT_NE(run_process({"/usr/bin/env", "TANDEM_REQUIRE_DATA=1", "TANDEM_FASHION_MNIST_DIR=" + missing,
                         kE2eTests, filter},
                        required),
            0)
      << read_file(required);
  const std::string log = read_file(required);
  EXPECT_NE(log.find("TANDEM_REQUIRE_DATA=1 but this test needs the data set in " + missing +
                     " (train-images-idx3-ubyte[.gz] is missing): run scripts/setup.sh"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("SKIPPED"), std::string::npos) << log;
}

}  // namespace
}  // namespace tandem::test
