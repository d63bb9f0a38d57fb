#!/usr/bin/env python3
"""Helpers of scripts/gpu/check.sh (standard library only): reading the results of its commands and
writing its report.

Subcommands (each prints JSON on stdout unless said otherwise):
  record STEPS_JSONL --name N --status pass|fail|skipped --seconds S --command C [--note T] [--numbers JSON]
                      append one step to the steps file (prints nothing)
  (the readers below print {"error": ...} and exit 0 when their input is missing or unreadable)
  metrics FILE.jsonl [--skip-first-epoch]
                      key numbers of a tandem-mnist metrics file: epochs, samples_per_s (mean over the epoch
                      lines, the first dropped when asked and there are several), test_accuracy and test_loss
                      of the last eval line, last_train_loss, iterations
  junit FILE.xml      ctest's JUnit report: tests, failures, errors, skipped, names of the failed/skipped
  gtest-summary LOG [LOG ...]
                      a gtest run's log (or its shards' logs, added up): tests_run, passed, failed, skipped
                      (from the [==========] lines; tests_run null when a log has none)
  sanitizer LOG       compute-sanitizer's "ERROR SUMMARY: N errors" (errors: N, or null when absent)
  multi-gpu-tests DIR N
                      TEST(Suite, Name) of DIR/*.cpp whose body asks TANDEM_NEED_GPUS(k) with k > N, one
                      "Suite.Name" a line (plain text)
  allreduce FILE.json Google Benchmark JSON of allreduce_bench: per variant and size, median_us and busbw
  compare A_JSON B_JSON --key K --max-diff D
                      |A[K] - B[K]| against D: {"a":..,"b":..,"diff":..,"ok":..}; exit 1 when not ok
  events VIS_DATA_DIR TensorBoard event files (events.out.tfevents.*) against scalars.json beside them: per
                      tag the same (step, float32 value) pairs, read by TensorBoard's EventAccumulator when
                      the tensorboard package imports, else by this file (framing and both CRCs always
                      checked here): {"files", "reader", "tags", "scalar_points", "ok", "note"?, "error"?};
                      exit 1 when not ok
  report STEPS_JSONL --out DIR --meta META_JSON
                      DIR/results.json and DIR/results.md; prints the table; exit 1 when a step failed
"""
import argparse
import glob
import json
import math
import os
import re
import struct
import sys
import xml.etree.ElementTree as ET


def cmd_record(a):
    rec = {"name": a.name, "status": a.status, "seconds": round(float(a.seconds), 1), "command": a.command}
    if a.note:
        rec["note"] = a.note
    if a.numbers:
        try:
            rec["numbers"] = json.loads(a.numbers)
        except json.JSONDecodeError:
            rec["numbers"] = {"unparsed": a.numbers}
    with open(a.steps, "a") as f:
        f.write(json.dumps(rec) + "\n")
    return 0


def cmd_metrics(a):
    epochs, evals, trains = [], [], []
    try:
        with open(a.file) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                {"epoch": epochs, "eval": evals, "train": trains}.get(rec.get("type"), []).append(rec)
    except OSError as e:
        print(json.dumps({"error": str(e)}))
        return 0
    out = {"epochs": len(epochs), "iterations": len(trains)}
    timed = epochs[1:] if a.skip_first_epoch and len(epochs) > 1 else epochs
    if timed:
        out["samples_per_s"] = round(sum(e["samples_per_s"] for e in timed) / len(timed), 1)
        out["epoch_samples_per_s"] = [round(e["samples_per_s"], 1) for e in epochs]
    if evals:
        out["test_accuracy"] = evals[-1].get("test_accuracy")
        out["test_loss"] = evals[-1].get("test_loss")
    if trains:
        out["last_train_loss"] = trains[-1].get("loss")
        for k in ("buckets", "exposed_comm_ms"):
            if k in trains[-1]:
                out[k] = trains[-1][k]
    print(json.dumps(out))
    return 0


def cmd_junit(a):
    try:
        root = ET.parse(a.file).getroot()
    except (OSError, ET.ParseError) as e:
        print(json.dumps({"error": f"{a.file}: {e}"}))
        return 0
    cases = root.iter("testcase")
    failed, skipped, n = [], [], 0
    for c in cases:
        n += 1
        name = c.get("name")
        status = c.get("status", "")
        if c.find("failure") is not None or c.find("error") is not None or status == "fail":
            failed.append(name)
        elif c.find("skipped") is not None or status in ("notrun", "disabled"):
            skipped.append(name)
    print(json.dumps({"tests": n, "passed": n - len(failed) - len(skipped), "failed": len(failed),
                      "skipped": len(skipped), "failed_tests": failed[:30], "skipped_tests": skipped[:30]}))
    return 0


def read_text(path):
    try:
        return open(path, errors="replace").read()
    except OSError:
        return ""


def gtest_counts(text):
    out = {}
    m = re.findall(r"\[==========\] (\d+) tests? from \d+ test (?:suites?|cases?) ran", text)
    out["tests_run"] = int(m[-1]) if m else None
    m = re.findall(r"\[  PASSED  \] (\d+) tests?", text)
    out["passed"] = int(m[-1]) if m else 0
    m = re.findall(r"\[  SKIPPED \] (\d+) tests?, listed below", text)
    out["skipped"] = int(m[-1]) if m else 0
    m = re.findall(r"\[  FAILED  \] (\d+) tests?, listed below", text)
    out["failed"] = int(m[-1]) if m else 0
    out["failed_tests"] = sorted(set(re.findall(r"\[  FAILED  \] (\S+\.\S+)", text)))
    return out


def cmd_gtest_summary(a):
    """One log, or the logs of the shards of one run: the counts added up. tests_run is null when a log
    has no closing line (a shard that crashed or timed out)."""
    total = {"tests_run": 0, "passed": 0, "skipped": 0, "failed": 0, "failed_tests": []}
    for path in a.file:
        c = gtest_counts(read_text(path))
        if c["tests_run"] is None or total["tests_run"] is None:
            total["tests_run"] = None
        else:
            total["tests_run"] += c["tests_run"]
        for k in ("passed", "skipped", "failed"):
            total[k] += c[k]
        total["failed_tests"] += c["failed_tests"]
    total["failed_tests"] = sorted(set(total["failed_tests"]))[:30]
    if len(a.file) > 1:
        total["logs"] = len(a.file)
    print(json.dumps(total))
    return 0


def cmd_sanitizer(a):
    text = read_text(a.file)
    m = re.findall(r"ERROR SUMMARY: (\d+) errors?", text)
    kinds = {}
    for k in re.findall(r"========= (Invalid __\w+__ \w+|Race reported|\w[\w ]*? hazard detected|"
                        r"Program hit [\w ]+|Leaked \d+ bytes|Uninitialized __\w+__ memory read)", text):
        kinds[k] = kinds.get(k, 0) + 1
    print(json.dumps({"errors": int(m[-1]) if m else None, "kinds": dict(list(kinds.items())[:10])}))
    return 0


def cmd_multi_gpu_tests(a):
    names = []
    for path in sorted(glob.glob(os.path.join(a.dir, "*.cpp"))):
        src = open(path, errors="replace").read()
        starts = [(m.start(), f"{m.group(1)}.{m.group(2)}")
                  for m in re.finditer(r"^\s*TEST(?:_F)?\(\s*(\w+)\s*,\s*(\w+)\s*\)", src, re.M)]
        for i, (pos, name) in enumerate(starts):
            end = starts[i + 1][0] if i + 1 < len(starts) else len(src)
            needs = [int(k) for k in re.findall(r"TANDEM_NEED_GPUS\(\s*(\d+)\s*\)", src[pos:end])]
            if needs and max(needs) > a.n:
                names.append(name)
    if names:
        print("\n".join(names))
    return 0


def cmd_allreduce(a):
    try:
        data = json.load(open(a.file))
    except (OSError, json.JSONDecodeError) as e:
        print(json.dumps({"error": f"{a.file}: {e}"}))
        return 0
    rows = {}
    for b in data.get("benchmarks", []):
        name = b.get("name", "")
        m = re.match(r"(\w+)/(\d+)", name)
        if not m:
            continue
        size = int(m.group(2))
        label = f"{m.group(1)}/{size // 1024} KiB" if size < 1 << 20 else f"{m.group(1)}/{size >> 20} MiB"
        rows[label] = {"median_us": round(b.get("median_us", float("nan")), 1),
                       "busbw_median_GBps": round(b.get("busbw_median_GBps", float("nan")), 2)}
    print(json.dumps({"world_size": data.get("context", {}).get("world_size"), "sizes": rows}))
    return 0


def loads_or_empty(text):
    try:
        d = json.loads(text)
        return d if isinstance(d, dict) else {}
    except json.JSONDecodeError:
        return {}


def cmd_compare(a):
    va = loads_or_empty(a.a).get(a.key)
    vb = loads_or_empty(a.b).get(a.key)
    if not isinstance(va, (int, float)) or not isinstance(vb, (int, float)):
        print(json.dumps({"a": va, "b": vb, "diff": None, "ok": False, "max_diff": a.max_diff}))
        return 1
    d = abs(va - vb)
    ok = d <= a.max_diff and not math.isnan(d)
    print(json.dumps({"a": va, "b": vb, "diff": round(d, 5), "max_diff": a.max_diff, "ok": ok}))
    return 0 if ok else 1

_CRC32C_TABLE = []


def masked_crc32c(data):
    """TFRecord's masked CRC-32C (Castagnoli; reflected polynomial 0x82f63b78), table-driven."""
    if not _CRC32C_TABLE:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _CRC32C_TABLE.append(c)
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _pb_fields(buf):
    """(field, wire type, value) of one protobuf message: varints as int, fixed64/32 as bytes."""
    i = 0

    def varint():
        nonlocal i
        v, shift = 0, 0
        while True:
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return v

    while i < len(buf):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            yield field, wire, varint()
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            yield field, wire, buf[i:i + n]
            i += n
        elif wire == 2:
            n = varint()
            yield field, wire, buf[i:i + n]
            i += n
        else:
            raise ValueError(f"wire type {wire} at byte {i}")


def read_event_file(path):
    """Scalars of a TensorBoard event file, {tag: [(step, value), ...]}, and its file_version; both CRCs
    of every record checked (ValueError otherwise)."""
    data = open(path, "rb").read()
    scalars, version, i = {}, None, 0
    while i < len(data):
        if i + 12 > len(data):
            raise ValueError(f"{path}: record header cut at byte {i}")
        n = int.from_bytes(data[i:i + 8], "little")
        if masked_crc32c(data[i:i + 8]) != int.from_bytes(data[i + 8:i + 12], "little"):
            raise ValueError(f"{path}: length CRC mismatch at byte {i}")
        event = data[i + 12:i + 12 + n]
        if len(event) != n or masked_crc32c(event) != int.from_bytes(data[i + 12 + n:i + 16 + n], "little"):
            raise ValueError(f"{path}: data cut or data CRC mismatch at byte {i}")
        i += 16 + n
        step, values = 0, []
        for field, wire, v in _pb_fields(event):
            if field == 2 and wire == 0:
                step = v - (1 << 64) if v >= 1 << 63 else v
            elif field == 3 and wire == 2:
                version = version or v.decode()
            elif field == 5 and wire == 2:
                for _, _, value in _pb_fields(v):
                    f = {fld: x for fld, _, x in _pb_fields(value)}
                    values.append((f[1].decode(), struct.unpack("<f", f[2])[0]))
        for tag, value in values:
            scalars.setdefault(tag, []).append((step, value))
    return scalars, version


def cmd_events(a):
    """Every event file of a vis_data folder against its scalars.json: per tag, the same (step, value)
    pairs (values as float32), read by TensorBoard's EventAccumulator when importable, else here."""
    files = sorted(glob.glob(os.path.join(a.dir, "events.out.tfevents.*")))
    out = {"files": len(files)}
    try:
        want = {}
        with open(os.path.join(a.dir, "scalars.json")) as f:
            for line in f:
                rec = json.loads(line)
                for k, v in rec.items():
                    if k != "step" and isinstance(v, (int, float)):
                        want.setdefault(k, []).append((rec["step"], struct.unpack("<f", struct.pack("<f", v))[0]))
        if not files:
            raise ValueError(f"no events.out.tfevents.* in {a.dir}")
        try:
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        except Exception:  # not installed, or it does not import here
            EventAccumulator = None
        got = {}
        if EventAccumulator is not None:
            out["reader"] = "tensorboard EventAccumulator"
            acc = EventAccumulator(a.dir, size_guidance={"scalars": 0})
            acc.Reload()
            got = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
        else:
            out["reader"] = "check_util.py"
            out["note"] = "tensorboard not installed: event files not checked by TensorBoard's reader"
        for path in files:  # this reader checks the framing and CRCs in any case
            scalars, version = read_event_file(path)
            if version != "brain.Event:2":
                raise ValueError(f"{path}: file_version {version!r}, expected 'brain.Event:2'")
            if EventAccumulator is None:
                for tag, pairs in scalars.items():
                    got.setdefault(tag, []).extend(pairs)
        out["tags"] = sorted(got)
        out["scalar_points"] = sum(len(v) for v in got.values())
        bad = [t for t in sorted(set(want) | set(got)) if want.get(t) != got.get(t)]
        out["ok"] = not bad
        if bad:
            out["error"] = f"tags whose (step, value) pairs differ from scalars.json: {', '.join(bad)}"
    except (OSError, ValueError, KeyError, IndexError, json.JSONDecodeError, struct.error) as e:
        out.update(ok=False, error=str(e))
    print(json.dumps(out))
    return 0 if out["ok"] else 1


def fmt_numbers(nums, limit=6):
    if not nums:
        return ""
    parts = []
    for k, v in nums.items():
        if isinstance(v, (list, dict)):
            continue
        if isinstance(v, float):
            v = f"{v:.4g}"
        parts.append(f"{k}={v}")
        if len(parts) >= limit:
            break
    return ", ".join(parts)


def cmd_report(a):
    steps = []
    if os.path.exists(a.steps):
        with open(a.steps) as f:
            steps = [json.loads(l) for l in f if l.strip()]
    meta = json.loads(a.meta) if a.meta else {}
    counts = {s: sum(1 for x in steps if x["status"] == s) for s in ("pass", "fail", "skipped")}
    result = dict(meta, steps=steps, summary=dict(counts, ok=counts["fail"] == 0 and bool(steps)))
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    lines = [f"# GPU check {meta.get('started', '')}", ""]
    for k in ("host", "gpus", "cuda_arch", "driver", "nvcc", "commit", "dirty_files", "build_dir", "budget_s",
              "total_seconds"):
        if k in meta:
            lines.append(f"- {k}: {meta[k]}")
    lines += ["", f"**{counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped**", "",
              "| step | status | seconds | key numbers | note |", "|---|---|---:|---|---|"]
    for s in steps:
        note = (s.get("note") or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | "
                     f"{fmt_numbers(s.get('numbers')).replace('|', '/')} | {note} |")
    lines += ["", "## Commands", ""]
    for s in steps:
        lines.append(f"- `{s['name']}`: `{s['command']}`" if s.get("command") else f"- `{s['name']}`: -")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if result["summary"]["ok"] else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("steps")
    r.add_argument("--name", required=True)
    r.add_argument("--status", required=True, choices=["pass", "fail", "skipped"])
    r.add_argument("--seconds", default="0")
    r.add_argument("--command", default="")
    r.add_argument("--note", default="")
    r.add_argument("--numbers", default="")
    m = sub.add_parser("metrics")
    m.add_argument("file")
    m.add_argument("--skip-first-epoch", action="store_true")
    j = sub.add_parser("junit")
    j.add_argument("file")
    g = sub.add_parser("gtest-summary")
    g.add_argument("file", nargs="+")
    s = sub.add_parser("sanitizer")
    s.add_argument("file")
    mg = sub.add_parser("multi-gpu-tests")
    mg.add_argument("dir")
    mg.add_argument("n", type=int)
    ar = sub.add_parser("allreduce")
    ar.add_argument("file")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--key", required=True)
    c.add_argument("--max-diff", type=float, required=True)
    ev = sub.add_parser("events")
    ev.add_argument("dir")
    rp = sub.add_parser("report")
    rp.add_argument("steps")
    rp.add_argument("--out", required=True)
    rp.add_argument("--meta", default="")
    a = p.parse_args()
    return {"record": cmd_record, "metrics": cmd_metrics, "junit": cmd_junit, "gtest-summary": cmd_gtest_summary,
            "sanitizer": cmd_sanitizer, "multi-gpu-tests": cmd_multi_gpu_tests, "allreduce": cmd_allreduce,
            "compare": cmd_compare, "events": cmd_events, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
