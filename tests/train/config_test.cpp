// train/config: merging a user config onto a schema of defaults, KEY=VALUE
// overrides, and the errors for unknown keys and wrong types.
#include "train/config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/test_util.h"

namespace tandem::train {
namespace {

using test::error_of;

Json schema() {
  return Json::parse(R"({
    "model": {"type": "MnistNet"},
    "optimizer": {"type": "adadelta", "lr": 1.0, "weight_decay": 0.0},
    "train": {"epochs": 14, "max_keep_ckpts": 3},
    "ddp": {"find_unused_parameters": false, "comm_hook": "allreduce"},
    "work_dir": ""
  })");
}

TEST(Config, MergeKeepsDefaultsAndReplacesGivenKeys) {
  Json c = merge_config(schema(), Json::parse(R"({"optimizer": {"lr": 0.5}, "train": {"epochs": 2}})"), "test");
  EXPECT_EQ(c["optimizer"]["lr"].get<double>(), 0.5);
  EXPECT_EQ(c["optimizer"]["type"], "adadelta");
  EXPECT_EQ(c["train"]["epochs"].get<int64_t>(), 2);
  EXPECT_EQ(c["train"]["max_keep_ckpts"].get<int64_t>(), 3);
  EXPECT_EQ(c["model"]["type"], "MnistNet");
}

TEST(Config, IntegerIsAcceptedForAFloatKeyAndStoredAsFloat) {
  Json c = merge_config(schema(), Json::parse(R"({"optimizer": {"lr": 2}})"), "test");
  EXPECT_TRUE(c["optimizer"]["lr"].is_number_float());
  EXPECT_EQ(c["optimizer"]["lr"].get<double>(), 2.0);
}

TEST(Config, UnknownKeyNamesFullPathAndSuggests) {
  const std::string msg = error_of([] {
    merge_config(schema(), Json::parse(R"({"optimizer": {"lrr": 0.5}})"), "config 'x.json'");
  });
  EXPECT_HAS(msg, "config 'x.json'");
  EXPECT_HAS(msg, "unknown config key 'optimizer.lrr'");
  EXPECT_HAS(msg, "did you mean 'optimizer.lr'?");
}

TEST(Config, UnknownTopLevelKeyWithoutCloseMatchListsKnownKeys) {
  const std::string msg = error_of([] { merge_config(schema(), Json::parse(R"({"zzzzzzzz": 1})"), "test"); });
  EXPECT_HAS(msg, "unknown config key 'zzzzzzzz'");
  EXPECT_EQ(msg.find("did you mean"), std::string::npos) << msg;
  EXPECT_HAS(msg, "optimizer");
}

TEST(Config, WrongTypeNamesPathAndExpectedType) {
  std::string msg = error_of([] { merge_config(schema(), Json::parse(R"({"train": {"epochs": "ten"}})"), "t"); });
  EXPECT_HAS(msg, "'train.epochs' must be of type integer, got string \"ten\"");
  msg = error_of([] { merge_config(schema(), Json::parse(R"({"train": {"epochs": 1.5}})"), "t"); });
  EXPECT_HAS(msg, "'train.epochs' must be of type integer, got number 1.5");
  msg = error_of([] { merge_config(schema(), Json::parse(R"({"optimizer": {"lr": true}})"), "t"); });
  EXPECT_HAS(msg, "'optimizer.lr' must be a number, got boolean");
  msg = error_of([] { merge_config(schema(), Json::parse(R"({"ddp": 3})"), "t"); });
  EXPECT_HAS(msg, "'ddp' must be an object, got integer");
}

TEST(Config, OverridesParseJsonElseString) {
  Json c = schema();
  apply_override(c, "optimizer.lr=0.25");
  apply_override(c, "train.epochs=3");
  apply_override(c, "ddp.find_unused_parameters=true");
  apply_override(c, "ddp.comm_hook=fp16");
  apply_override(c, "work_dir=123");  // a string key takes the text as written
  apply_override(c, "optimizer.type=\"sgd\"");
  EXPECT_EQ(c["optimizer"]["lr"].get<double>(), 0.25);
  EXPECT_EQ(c["train"]["epochs"].get<int64_t>(), 3);
  EXPECT_TRUE(c["ddp"]["find_unused_parameters"].get<bool>());
  EXPECT_EQ(c["ddp"]["comm_hook"], "fp16");
  EXPECT_EQ(c["work_dir"], "123");
  EXPECT_EQ(c["optimizer"]["type"], "sgd");
}

TEST(Config, OverrideErrors) {
  Json c = schema();
  EXPECT_HAS(error_of([&] { apply_override(c, "optimizer.lr"); }), "expected KEY=VALUE");
  EXPECT_HAS(error_of([&] { apply_override(c, "optimizer.lt=1"); }), "did you mean 'optimizer.lr'?");
  EXPECT_HAS(error_of([&] { apply_override(c, "train.epochs=many"); }),
             "--cfg-options: config key 'train.epochs' must be of type integer, got string \"many\"");
  EXPECT_HAS(error_of([&] { apply_override(c, "work_dir.x=1"); }), "'work_dir' is not an object");
  EXPECT_EQ(c, schema()) << "a failed override changes nothing";
}

TEST(Config, FileErrorsNameTheFile) {
  test::TempDir tmp("config");
  std::ofstream(tmp / "bad.json") << "{\"train\": {\"epochs\": 2,}}";
  EXPECT_HAS(error_of([&] { load_config_file(tmp.file("bad.json")); }), "bad.json' is not valid JSON");
  EXPECT_HAS(error_of([&] { load_config_file(tmp.file("none.json")); }), "cannot read config file");
  std::ofstream(tmp / "ok.json") << "// comments are allowed\n{\"train\": {\"epochs\": 2}}";
  EXPECT_EQ(load_config_file(tmp.file("ok.json"))["train"]["epochs"].get<int>(), 2);
  EXPECT_HAS(error_of([&] { merge_config(schema(), Json::array({1}), "config 'a.json'"); }),
             "a config must be a JSON object");
}

TEST(Config, NameAndClosestKey) {
  EXPECT_EQ(config_name("configs/mnist_sgd.json"), "mnist_sgd");
  EXPECT_EQ(closest_key("bucket_cap", {"bucket_cap_mb", "comm_hook"}), "bucket_cap_mb");
  EXPECT_EQ(closest_key("qqq", {"bucket_cap_mb", "comm_hook"}), "");
}

// Found by fuzz_config (fuzz/corpus/config/regress_*): nlohmann's own exceptions escaped.
TEST(Config, HugeNumberAndInvalidUtf8AreTandemErrors) {
  test::TempDir dir;
  const std::string p = dir.file("huge.json");
  std::ofstream(p) << R"({"data": 388e7187})";
  EXPECT_HAS(error_of([&] { load_config_file(p); }), "not valid JSON");
  Json c = Json::parse(R"({"optim": {"lr": 1.0}})");
  EXPECT_HAS(error_of([&] { apply_override(c, "optim.lr=\xfe\xff"); }), "optim.lr");
}

}  // namespace
}  // namespace tandem::train
