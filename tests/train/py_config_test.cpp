// train/py_config: MMEngine's literal-style .py configs (values, _base_ inheritance, the one-line
// refusals) and MMEngine's --cfg-options value syntax.
#include "train/py_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "common/test_util.h"

namespace tandem::train {
namespace {

using test::error_of;

const char* const kOnly =
    " is not supported in a config (only literals, "
    "dict(), lists, tuples and names assigned earlier)";

void write(const test::TempDir& tmp, const std::string& name, const std::string& text) {
  std::ofstream(tmp / name) << text;
}

// The message of the error loading `path`, without the " [source:line]" the error type appends.
std::string message(const std::string& path) {
  const std::string msg = error_of([&] { load_py_config(path); });
  return msg.substr(0, msg.rfind(" ["));
}

// The message for a file holding `text` (written as bad.py).
std::string refusal(const test::TempDir& tmp, const std::string& text) {
  write(tmp, "bad.py", text);
  return message(tmp.file("bad.py"));
}

void write_realistic(const test::TempDir& tmp) {
  write(tmp, "runtime.py", R"(# Runtime settings shared by the configs.
default_scope = 'mmengine'
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50),
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3),
)
env_cfg = dict(cudnn_benchmark=False, dist_cfg=dict(backend='nccl'))
log_level = 'INFO'
load_from = None
resume = False
)");
  write(tmp, "schedule.py", R"(base_lr = 0.01
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='SGD', lr=base_lr, momentum=0.9, weight_decay=0.0001))
param_scheduler = [dict(type='StepLR', by_epoch=True, step_size=1, gamma=0.7)]
train_cfg = dict(by_epoch=True, max_epochs=12, val_interval=1)
val_cfg = dict()
)");
  write(tmp, "adamw_iter.py", R"("""AdamW with warm-up, iteration based."""
_base_ = ['./runtime.py', 'schedule.py']

warmup_iters = 500
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='MultiStepLR', by_epoch=True, milestones=[8, 11], gamma=0.1),  # per epoch
]
train_cfg = dict(by_epoch=False, max_iters=1000, val_interval=100)  # merged onto the base's
custom_hooks = [dict(type='EMAHook', momentum=0.0002)]
default_hooks = dict(logger=dict(interval=10))
dataset = dict(type='MNIST', data_root='data/mnist')
train_dataloader = dict(batch_size=2, dataset=dataset, sampler=dict(type='DefaultSampler', shuffle=True))
val_dataloader = dict(batch_size=4, dataset=dataset, sampler=dict(type='DefaultSampler', shuffle=False))
auto_scale_lr = dict(enable=False, base_batch_size=16, lr=base_lr)
)");
}

TEST(PyConfig, RealisticConfigWithBasesGivesMMEnginesTree) {
  test::TempDir tmp("pyconfig");
  write_realistic(tmp);
  const Json c = load_py_config(tmp.file("adamw_iter.py"));
  const Json expected = Json::parse(R"({
    "default_scope": "mmengine",
    "default_hooks": {"timer": {"type": "IterTimerHook"}, "logger": {"type": "LoggerHook", "interval": 10},
                      "checkpoint": {"type": "CheckpointHook", "interval": 1, "max_keep_ckpts": 3}},
    "env_cfg": {"cudnn_benchmark": false, "dist_cfg": {"backend": "nccl"}},
    "log_level": "INFO", "load_from": null, "resume": false,
    "base_lr": 0.01,
    "optim_wrapper": {"type": "OptimWrapper",
                      "optimizer": {"type": "AdamW", "lr": 0.001, "betas": [0.9, 0.999], "weight_decay": 0.05}},
    "param_scheduler": [
      {"type": "LinearLR", "start_factor": 0.001, "by_epoch": false, "begin": 0, "end": 500},
      {"type": "MultiStepLR", "by_epoch": true, "milestones": [8, 11], "gamma": 0.1}],
    "train_cfg": {"by_epoch": false, "max_epochs": 12, "max_iters": 1000, "val_interval": 100},
    "val_cfg": {},
    "warmup_iters": 500,
    "custom_hooks": [{"type": "EMAHook", "momentum": 0.0002}],
    "dataset": {"type": "MNIST", "data_root": "data/mnist"},
    "train_dataloader": {"batch_size": 2, "dataset": {"type": "MNIST", "data_root": "data/mnist"},
                         "sampler": {"type": "DefaultSampler", "shuffle": true}},
    "val_dataloader": {"batch_size": 4, "dataset": {"type": "MNIST", "data_root": "data/mnist"},
                       "sampler": {"type": "DefaultSampler", "shuffle": false}},
    "auto_scale_lr": {"enable": false, "base_batch_size": 16, "lr": 0.01}
  })");
  EXPECT_EQ(c, expected) << c.dump(2);
  EXPECT_TRUE(c["train_cfg"]["max_iters"].is_number_integer());
  EXPECT_TRUE(c["optim_wrapper"]["optimizer"]["lr"].is_number_float());
  EXPECT_EQ(c["optim_wrapper"]["optimizer"]["lr"].get<double>(), 1e-3);
  EXPECT_FALSE(c.contains("_base_"));
  // The entry point every --config goes through reads .py files the same way.
  EXPECT_EQ(load_config_with_bases(tmp.file("adamw_iter.py")), expected);
}

TEST(PyConfig, LiteralValues) {
  test::TempDir tmp("pyconfig");
  const std::string body =
      R"(ints = [0, 7, -3, +4, 1_000, 0x1F, 0o17, 0b101, 0_0]
floats = [1e-3, .5, 1., -1.5e3, 2E+2, 1_0.5]
big = [9223372036854775807, 9223372036854775808, -9223372036854775808, 18446744073709551615]
strs = ['a', "b", 'it\'s', "q\"", '\n\t\\', '\x41\u00e9\101', r'\d+', 'keep\d', 'a' "b" 'c', u'u']
doc = """two
lines"""
consts = (True, False, None)
one = (1,)
paren = (1)
empty = ([], (), {}, dict())
nested = {'a': [(1, 2), [3]], "b": dict(c={'d': None},),}
bare = 1, 'x'
)";
  write(tmp, "v.py", body + "cont = 1 + \\\n    0\n");
  EXPECT_HAS(message(tmp.file("v.py")),
             "v.py:13: arithmetic");  // lines counted through the triple-quoted string
  write(tmp, "v.py", body + "a = 1; b = a  # ';' separates statements\nc = \\\n  2\n");
  const Json c = load_py_config(tmp.file("v.py"));
  EXPECT_EQ(c["ints"], Json::parse("[0, 7, -3, 4, 1000, 31, 15, 5, 0]"));
  EXPECT_EQ(c["floats"], Json::parse("[0.001, 0.5, 1.0, -1500.0, 200.0, 10.5]"));
  for (const Json& f : c["floats"]) EXPECT_TRUE(f.is_number_float()) << f;
  EXPECT_EQ(c["big"][0].get<int64_t>(), INT64_MAX);
  EXPECT_EQ(c["big"][1].get<uint64_t>(), uint64_t{1} << 63);
  EXPECT_EQ(c["big"][2].get<int64_t>(), INT64_MIN);
  EXPECT_EQ(c["big"][3].get<uint64_t>(), UINT64_MAX);
  EXPECT_EQ(c["strs"], Json({"a", "b", "it's", "q\"", "\n\t\\",
                             "A\xc3\xa9"
                             "A",
                             "\\d+", "keep\\d", "abc", "u"}));
  EXPECT_EQ(c["doc"], "two\nlines");
  EXPECT_EQ(c["consts"], Json::parse("[true, false, null]"));
  EXPECT_EQ(c["one"], Json::parse("[1]"));
  EXPECT_EQ(c["paren"], 1);
  EXPECT_EQ(c["empty"], Json::parse("[[], [], {}, {}]"));
  EXPECT_EQ(c["nested"], Json::parse(R"({"a": [[1, 2], [3]], "b": {"c": {"d": null}}})"));
  EXPECT_EQ(c["bare"], Json::parse(R"([1, "x"])"));
  EXPECT_EQ(c["a"], 1);
  EXPECT_EQ(c["b"], 1);
  EXPECT_EQ(c["c"], 2);
}

TEST(PyConfig, NamesAreTheLatestAssignmentBeforeTheUse) {
  test::TempDir tmp("pyconfig");
  write(tmp, "base.py", "lr = 0.1\nmodel = dict(type='Net', depth=18)\n");
  write(tmp, "child.py",
        "opt = dict(lr=lr)\nlr = 0.5\nopt2 = dict(lr=lr, model=model)\n_base_ "
        "= 'base.py'\n");
  const Json c = load_py_config(tmp.file("child.py"));
  EXPECT_EQ(c["opt"]["lr"], 0.1) << "a base's name, read before the file assigns its own";
  EXPECT_EQ(c["opt2"]["lr"], 0.5);
  EXPECT_EQ(c["opt2"]["model"], Json::parse(R"({"type": "Net", "depth": 18})"));
  EXPECT_EQ(c["lr"], 0.5);
}

TEST(PyConfig, DeleteReplacesAndJsonBasesAreRead) {
  test::TempDir tmp("pyconfig");
  write(tmp, "root.json", R"({"model": {"type": "Net", "depth": 18, "act": "relu"}, "epochs": 3})");
  write(tmp, "mid.json", R"({"_base_": "root.json", "model": {"depth": 34}})");
  write(tmp, "c.py",
        "_base_ = 'mid.json'\nmodel = dict(_delete_=True, "
        "type='Other')\nepochs = epochs\n");
  EXPECT_EQ(load_py_config(tmp.file("c.py")), Json::parse(R"({"model": {"type": "Other"}, "epochs": 3})"));
  write(tmp, "d.py", "_base_ = ('mid.json',)\nmodel = dict(act='gelu')\n");
  EXPECT_EQ(load_py_config(tmp.file("d.py"))["model"], Json::parse(R"({"type": "Net", "depth": 34, "act": "gelu"})"));
}

TEST(PyConfig, PredefinedFileVariables) {
  test::TempDir tmp("pyconfig");
  write(tmp, "exp1.py",
        "work_dir = '{{ fileDirname }}/work/{{fileBasenameNoExtension}}'\nname "
        "= '{{ fileBasename }}'"
        "\next = '{{fileExtname}}'\n");
  const Json c = load_py_config(tmp.file("exp1.py"));
  EXPECT_EQ(c["work_dir"], std::filesystem::absolute(tmp.path()).string() + "/work/exp1");
  EXPECT_EQ(c["name"], "exp1.py");
  EXPECT_EQ(c["ext"], ".py");
}

// Each {file text, message after "<file>"} pair: loading the text fails with that message + suffix.
void expect_messages(std::initializer_list<std::pair<const char*, std::string>> cases, const std::string& suffix) {
  test::TempDir tmp("pyconfig");
  for (const auto& [text, expected] : cases)
    EXPECT_EQ(refusal(tmp, text), tmp.file("bad.py") + expected + suffix) << text;
}

TEST(PyConfig, EachRefusalIsOneLineNamingFileAndLine) {
  expect_messages(
      {
          {"a = 1\nimport os\n", ":2: import"},
          {"from mmengine import Config\n", ":1: import"},
          {"x = range(3)\n", ":1: a function call (range(...))"},
          {"print(1)\n", ":1: a function call (print(...))"},
          {"x = dict(\n  a=1 + 2)\n", ":2: arithmetic"},
          {"lr = 0.1\nx = -lr\n", ":2: arithmetic"},
          {"x = 1 * 2\n", ":1: arithmetic"},
          {"x = [i for i in [1, 2]]\n", ":1: a comprehension"},
          {"x = {k: 1 for k in 'ab'}\n", ":1: a comprehension"},
          {"x = dict(a=1)\ny = x.a\n", ":2: attribute access"},
          {"x = 'a'.upper()\n", ":1: attribute access"},
          {"x = [1, 2][0]\n", ":1: subscripting"},
          {"a = 1\nx = f'{a}'\n", ":2: an f-string"},
          {"x = b'a'\n", ":1: a bytes literal"},
          {"f = lambda x: x\n", ":1: lambda"},
          {"def f():\n    return 1\n", ":1: a function definition"},
          {"class A:\n    pass\n", ":1: a class definition"},
          {"if True:\n    x = 1\n", ":1: the 'if' statement"},
          {"x = 1\ndel x\n", ":2: the 'del' statement"},
          {"x = 1 if True else 2\n", ":1: a conditional expression"},
          {"x = not True\n", ":1: a boolean operator"},
          {"x = True and False\n", ":1: a boolean operator"},
          {"x = 1 < 2\n", ":1: a comparison"},
          {"x = {1, 2}\n", ":1: a set"},
          {"x = {1: 2}\n", ":1: a dict key that is not a string"},
          {"x = dict(1)\n", ":1: dict() with a positional argument"},
          {"y = dict()\nx = dict(**y)\n", ":2: unpacking (**)"},
          {"x = [*[1]]\n", ":1: unpacking"},
          {"x = 1\nx += 1\n", ":2: augmented assignment (+=)"},
          {"a, b = 1, 2\n", ":1: assignment to anything but a name"},
          {"x = y = 1\n", ":1: chained assignment"},
          {"x: int = 1\n", ":1: an annotated assignment"},
          {"x = 2j\n", ":1: a complex number"},
          {"x = ...\n", ":1: Ellipsis (...)"},
          {"x = '{{ _base_.lr }}'\n", ":1: {{_base_.xxx}} (name the base's variable instead)"},
          {"\nx = '{{$DATA:data}}'\n", ":2: an environment variable ({{$NAME:default}})"},
      },
      kOnly);
}

TEST(PyConfig, SyntaxAndNameErrorsNameFileAndLine) {
  expect_messages(
      {
          {"a = 1\nb = foo\n", ":2: name 'foo' is not defined"},
          {"a = dict(x=[1,\n  undefined_name])\n", ":2: name 'undefined_name' is not defined"},
          {"x = dict(a=1,\n  b=(2, 3)\n", ":1: '(' was never closed"},
          {"x = 'abc\n", ":1: unterminated string"},
          {"x = '''abc\n", ":1: unterminated triple-quoted string"},
          {"x = 1)\n", ":1: unmatched ')'"},
          {"x = [1, 2)\n", ":1: closing ')' does not match opening '['"},
          {"x = 1\n  y = 2\n", ":2: unexpected indent"},
          {"x = 007\n",
           ":1: leading zeros in decimal integer literals are not "
           "permitted ('007')"},
          {"x = 1__0\n", ":1: invalid number '1__0'"},
          {"x = 18446744073709551616\n", ":1: integer 18446744073709551616 is too large for a config"},
          {"x = dict(a=1, a=2)\n", ":1: keyword argument repeated: a"},
          {"x = 1 2\n", ":1: invalid syntax at '2'"},
          {"x = [1 2]\n", ":1: invalid syntax (expected ']', got '2')"},
          {"x = $\n", ":1: unexpected character '$'"},
          {"x = 'caf\xff'\n", ":1: the file is not valid UTF-8"},
      },
      "");
  test::TempDir tmp("pyconfig");
  EXPECT_HAS(error_of([&] { load_py_config(tmp.file("none.py")); }), "cannot read config file");
}

TEST(PyConfig, BaseErrors) {
  test::TempDir tmp("pyconfig");
  const auto p = [&](const char* name) { return tmp.file(name); };
  write(tmp, "a.py", "x = 1\n_base_ = 'b.py'\n");
  write(tmp, "b.py", "_base_ = ['a.py']\n");
  EXPECT_EQ(message(p("a.py")), p("b.py") + ":1: _base_ 'a.py' inherits from itself: " + p("a.py") + " -> " +
                                    p("b.py") + " -> " + p("a.py"));
  write(tmp, "self.py", "_base_ = './self.py'\n");
  EXPECT_EQ(message(p("self.py")),
            p("self.py") + ":1: _base_ './self.py' inherits from itself: " + p("self.py") + " -> " + p("self.py"));
  write(tmp, "missing.py", "\n_base_ = 'nope.py'\n");
  EXPECT_EQ(message(p("missing.py")), p("missing.py") + ":2: _base_ 'nope.py' not found (" + p("nope.py") + ")");
  write(tmp, "one.py", "lr = 0.1\n");
  write(tmp, "two.py", "lr = 0.2\n");
  write(tmp, "dup.py", "_base_ = ['one.py', 'two.py']\n");
  EXPECT_EQ(message(p("dup.py")), p("dup.py") +
                                      ":1: _base_ files 'one.py' and 'two.py' both set "
                                      "'lr' (a key may come from one base only)");
  write(tmp, "sched.py",
        "param_scheduler = [dict(type='StepLR')]\nmodel = "
        "dict(backbone=dict(depth=50))\n");
  write(tmp, "over.py",
        "_base_ = 'sched.py'\nparam_scheduler = "
        "dict(type='CosineAnnealingLR')\n");
  EXPECT_EQ(message(p("over.py")), p("over.py") +
                                       ":2: 'param_scheduler' is a dict here but a list in a _base_ "
                                       "config; set _delete_=True in it to replace the base's value");
  write(tmp, "over.py",
        "_base_ = 'sched.py'\nparam_scheduler = dict(_delete_=True, "
        "type='CosineAnnealingLR')\n");
  EXPECT_EQ(load_py_config(p("over.py"))["param_scheduler"], Json::parse(R"({"type": "CosineAnnealingLR"})"));
  write(tmp, "deep.py",
        "_base_ = 'sched.py'\n\nmodel = "
        "dict(backbone=dict(depth=dict(_delete_=1)))\n");
  EXPECT_EQ(message(p("deep.py")), p("deep.py") + ":3: 'model.backbone.depth._delete_' must be True or False");
  write(tmp, "num.py", "_base_ = 3\n");
  EXPECT_EQ(message(p("num.py")), p("num.py") + ":1: _base_ must be a path or a list of paths");
  write(tmp, "yaml.py", "_base_ = 'x.yaml'\n");
  write(tmp, "x.yaml", "a: 1\n");
  EXPECT_EQ(message(p("yaml.py")), p("yaml.py") + ":1: _base_ 'x.yaml': only .py and .json configs can be read");
  write(tmp, "pkg.py", "_base_ = 'mmdet::_base_/default_runtime.py'\n");
  EXPECT_EQ(message(p("pkg.py")), p("pkg.py") +
                                      ":1: _base_ 'mmdet::_base_/default_runtime.py' names another "
                                      "package's config, which cannot be read here");
  write(tmp, "named.py", "x = 'a.py'\n_base_ = x\n");
  EXPECT_EQ(message(p("named.py")), p("named.py") + ":2: name 'x' is not defined");
}

TEST(PyConfig, CfgOptionValuesAsMMEnginesDictAction) {
  EXPECT_EQ(parse_cfg_option_value("True"), Json(true));
  EXPECT_EQ(parse_cfg_option_value("false"), Json(false));
  EXPECT_EQ(parse_cfg_option_value("FALSE"), Json(false));
  EXPECT_EQ(parse_cfg_option_value("None"), Json());
  EXPECT_EQ(parse_cfg_option_value("none"), Json("none"));
  EXPECT_EQ(parse_cfg_option_value("null"), Json("null"));
  const Json three = parse_cfg_option_value("3");
  EXPECT_TRUE(three.is_number_integer());
  EXPECT_EQ(three.get<int64_t>(), 3);
  EXPECT_EQ(parse_cfg_option_value("-3").get<int64_t>(), -3);
  EXPECT_EQ(parse_cfg_option_value("007").get<int64_t>(), 7);
  EXPECT_EQ(parse_cfg_option_value("1_000").get<int64_t>(), 1000);
  EXPECT_EQ(parse_cfg_option_value("1e-3").get<double>(), 0.001);
  EXPECT_TRUE(parse_cfg_option_value("1e-3").is_number_float());
  EXPECT_EQ(parse_cfg_option_value(".5").get<double>(), 0.5);
  EXPECT_EQ(parse_cfg_option_value("2.").get<double>(), 2.0);
  EXPECT_TRUE(std::isinf(parse_cfg_option_value("-inf").get<double>()));
  EXPECT_TRUE(std::isnan(parse_cfg_option_value("nan").get<double>()));
  EXPECT_EQ(parse_cfg_option_value("0x10"), Json("0x10"));
  EXPECT_EQ(parse_cfg_option_value("SGD"), Json("SGD"));
  EXPECT_EQ(parse_cfg_option_value(""), Json(""));
  EXPECT_EQ(parse_cfg_option_value("'abc'"), Json("abc"));
  EXPECT_EQ(parse_cfg_option_value("\"'1'\""), Json(1)) << "quotes are stripped, not a string marker";
  EXPECT_EQ(parse_cfg_option_value("a b"), Json("ab")) << "spaces are removed";
  EXPECT_EQ(parse_cfg_option_value("[1,2]"), Json::parse("[1, 2]"));
  EXPECT_EQ(parse_cfg_option_value("(0.9,0.999)"), Json::parse("[0.9, 0.999]"));
  EXPECT_EQ(parse_cfg_option_value("(0.9, 0.999)"), Json::parse("[0.9, 0.999]"));
  EXPECT_EQ(parse_cfg_option_value("[(1,2),(3,4)]"), Json::parse("[[1, 2], [3, 4]]"));
  EXPECT_EQ(parse_cfg_option_value("[1,[2,(3,None)],x,True]"), Json::parse(R"([1, [2, [3, null]], "x", true])"));
  EXPECT_EQ(parse_cfg_option_value("\"[a, 'b']\""), Json::parse(R"(["a", "b"])"));
  EXPECT_EQ(parse_cfg_option_value("a,b"), Json::parse(R"(["a", "b"])"));
  EXPECT_EQ(parse_cfg_option_value("1,"), Json::parse("[1]"));
  EXPECT_EQ(parse_cfg_option_value("[1,2,]"), Json::parse("[1, 2]"));
  EXPECT_EQ(parse_cfg_option_value("(1)"), Json::parse("[1]")) << "brackets always make a sequence";
  EXPECT_EQ(parse_cfg_option_value("[]"), Json::array());
  EXPECT_EQ(parse_cfg_option_value("()"), Json::array());
  EXPECT_EQ(parse_cfg_option_value("[,]"), Json::parse(R"([""])"));
  EXPECT_EQ(parse_cfg_option_value("[1"), Json("[1")) << "no comma: one value, taken as text";
  EXPECT_HAS(error_of([] { parse_cfg_option_value("[1,2"); }), "brackets do not balance in '[1,2'");
  EXPECT_HAS(error_of([] { parse_cfg_option_value("a(,)b"); }), "no comma outside brackets splits 'a(,)b'");
  EXPECT_HAS(error_of([] { parse_cfg_option_value("99999999999999999999"); }), "out of range");
}

TEST(PyConfig, OverridesReadMMEngineValuesWhereTheyAreNotJson) {
  const Json schema = Json::parse(
      R"({"optimizer": {"betas": [0.9, 0.999], "lr": 1.0, "nesterov": false},
                                      "milestones": [8, 11], "work_dir": ""})");
  Json c = schema;
  apply_override(c, "optimizer.betas=(0.8,0.99)");
  apply_override(c, "optimizer.nesterov=True");
  apply_override(c, "optimizer.lr=1e-2");
  apply_override(c, "milestones=5,7");
  apply_override(c, "work_dir=a,b");  // a string key still takes the text as written
  EXPECT_EQ(c["optimizer"]["betas"], Json::parse("[0.8, 0.99]"));
  EXPECT_EQ(c["optimizer"]["nesterov"], true);
  EXPECT_EQ(c["optimizer"]["lr"].get<double>(), 0.01);
  EXPECT_EQ(c["milestones"], Json::parse("[5, 7]"));
  EXPECT_EQ(c["work_dir"], "a,b");
  EXPECT_HAS(error_of([&] { apply_override(c, "optimizer.betas=[1,2"); }),
             "config key 'optimizer.betas' must be of type array, got string "
             "\"[1,2\"");
}

}  // namespace
}  // namespace tandem::train
