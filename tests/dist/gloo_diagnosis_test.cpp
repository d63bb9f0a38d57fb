// Reading Gloo's failures (dist/group/gloo_diagnosis.h): every timeout message of the Gloo in use is
// recognised, and the errors that are no timeout are not; the peers an error names by address are
// mapped to ranks; after a timeout, the ranks that never reported failing are named.
#include "dist/group/gloo_diagnosis.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/test_util.h"
#include "dist/store/file_store.h"

namespace tandem::dist {
namespace {

using namespace gloo_diagnosis;

// Messages shaped as libgloo 0.0~git20220518 builds them (a "[file:line]" prefix, then the text its
// binary holds; the file names and line numbers here are illustrative), one per entry of
// kTimeoutMessages, in the same order.
const std::vector<std::string> kGlooTimeouts = {
    "[/build/gloo/gloo/transport/tcp/unbound_buffer.cc:84] Timed out waiting 5000ms for recv operation to "
    "complete",
    "[/build/gloo/gloo/transport/tcp/pair.cc:589] Application timeout caused pair closure",
    "[/build/gloo/gloo/transport/tcp/pair.cc:799] Connect timeout [127.0.0.1]:41235",
    "[/build/gloo/gloo/transport/tcp/pair.cc:575] Read timeout [127.0.0.1]:41235",
    "[/build/gloo/gloo/transport/tcp/pair.cc:575] Write timeout [127.0.0.1]:41235",
    "[/build/gloo/gloo/transport/tcp/pair.cc:575] Send timeout [127.0.0.1]:41235",
    "[/build/gloo/gloo/transport/tcp/pair.cc:1123] Timeout waiting for memory region from [127.0.0.1]:41235",
    "[/build/gloo/gloo/rendezvous/store.h:33] Wait timeout for key(s): [\"gloo/0/1\"]",
    "[/build/gloo/gloo/transport/tcp/pair.cc:598] Read error [127.0.0.1]:41235: Connection timed out",
};

TEST(GlooDiagnosis, EveryTimeoutMessageOfGlooIsATimeout) {
  ASSERT_EQ(kGlooTimeouts.size(), kTimeoutMessages.size());
  for (size_t i = 0; i < kGlooTimeouts.size(); ++i) {
    EXPECT_NE(kGlooTimeouts[i].find(kTimeoutMessages[i]), std::string::npos) << kGlooTimeouts[i];
    EXPECT_TRUE(is_timeout(kGlooTimeouts[i])) << kGlooTimeouts[i];
  }
  // The shared-memory all-reduce (dist/group/shm_allreduce.cpp) words its timeout as Gloo does.
  EXPECT_TRUE(is_timeout("Timed out waiting 5000ms for rank 1 (pid 4242) in the shared-memory all-reduce (it is "
                         "slower, stopped or stuck)"));
}

TEST(GlooDiagnosis, ErrorsThatAreNoTimeoutAreNot) {
  for (const std::string text :
       {"[/build/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:41235",
        "[/build/gloo/gloo/transport/tcp/pair.cc:598] Read error [127.0.0.1]:41235: Connection reset by peer",
        "[/build/gloo/gloo/transport/tcp/pair.cc:598] Write error [127.0.0.1]:41235: Broken pipe",
        "[enforce fail at /build/gloo/gloo/transport/tcp/buffer.cc:72] offset + length <= size_",
        "Invalid timeout", "", "timeout"})
    EXPECT_FALSE(is_timeout(text)) << text;
}

TEST(GlooDiagnosis, AdvertisedAddressesAreNamedAsRanks) {
  const std::vector<std::string> peers = {"", "[127.0.0.1]:41235", "[127.0.0.1]:4123", "[10.0.0.2]:5000"};
  EXPECT_EQ(name_peers("Connection closed by peer [127.0.0.1]:41235", 0, peers), " ([127.0.0.1]:41235 is rank 1)");
  // ":4123" is a prefix of ":41235": only the whole port matches.
  EXPECT_EQ(name_peers("Read error [127.0.0.1]:4123: Connection reset by peer", 0, peers),
            " ([127.0.0.1]:4123 is rank 2)");
  EXPECT_EQ(name_peers("Connection closed by peer [127.0.0.1]:41235 and [10.0.0.2]:5000", 0, peers),
            " ([127.0.0.1]:41235 is rank 1; also ranks 3)");
  EXPECT_EQ(name_peers("Connection closed by peer", 0, peers), "");
  EXPECT_EQ(name_peers("Timed out waiting 5000ms for recv operation to complete", 0, peers), "");
}

TEST(GlooDiagnosis, AnUnadvertisedAddressNamesThePeersOnItsHost) {
  // The peer's end of a connection it opened: an ephemeral port, only the host is known.
  const std::vector<std::string> peers = {"[10.0.0.1]:5000", "", "[10.0.0.2]:5001", "[10.0.0.2]:5002"};
  EXPECT_EQ(name_peers("Read error [10.0.0.1]:53122: Connection reset by peer", 1, peers),
            " ([10.0.0.1]:53122 is the connection to rank 0)");
  EXPECT_EQ(name_peers("Read error [10.0.0.2]:53122: Connection reset by peer", 1, peers),
            " ([10.0.0.2]:53122 is a connection to one of ranks 2, 3)");
  EXPECT_EQ(name_peers("Read error [10.0.0.9]:53122: Connection reset by peer", 1, peers), "");
}

TEST(GlooDiagnosis, TheRanksThatNeverReportedAreTheSilentOnes) {
  test::TempDir dir("gloo-diagnosis");
  FileStore store(dir.file("store"));
  // Rank 1 reported failing in collective 7; rank 2 never did.
  store.set_string("g/failed/7/1", "Timed out waiting");
  const std::string out = silent_peers(store, "g/", 7, 0, 3, "Timed out waiting", Millis(200));
  EXPECT_EQ(out, "; peer rank 2 never reached this collective or did not report failing in it (stopped, stuck in "
                 "other work, or gone)");
  EXPECT_EQ(store.get_string("g/failed/7/0"), "Timed out waiting");  // rank 0 reported for the others

  store.set_string("g/failed/8/1", "x");
  store.set_string("g/failed/8/2", "x");
  EXPECT_EQ(silent_peers(store, "g/", 8, 0, 3, "Timed out waiting", Millis(200)),
            "; every other rank reached this collective and timed out too (a network problem between the ranks?)");
  EXPECT_EQ(silent_peers(store, "g/", 9, 0, 3, "Timed out waiting", Millis(100)),
            "; peer ranks 1, 2 never reached this collective or did not report failing in it (stopped, stuck in "
            "other work, or gone)");
}

}  // namespace
}  // namespace tandem::dist
