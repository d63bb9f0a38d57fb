// MMEngine's Python configs in the literal style, read into the config tree (Json) without Python,
// and MMEngine's --cfg-options value syntax.
//
// Accepted: assignments `name = value` (each top-level name becomes a key), comments, blank lines,
// ';', line continuation (brackets and backslashes), docstrings. Values: integers (decimal, 0x, 0o,
// 0b, '_' between digits), floats (1e-3, .5, 1.), a sign before a number, strings ('..', "..",
// triple-quoted, r/u prefixes, adjacent strings joined, Python's escapes), True / False / None, lists,
// tuples (arrays; `(x,)`, and `a, b` without brackets), dict(k=v, ...) and {'k': v, ...}, trailing
// commas, and names assigned earlier in the file or in its bases (a deep copy of their value).
// MMEngine's {{ fileDirname }}, {{ fileBasename }}, {{ fileBasenameNoExtension }} and
// {{ fileExtname }} are replaced as MMEngine replaces them.
//
// Inheritance: `_base_ = 'x.py'` or a list of paths, relative to the file, loaded first whatever
// line assigns it (.py recursively, .json through load_config_with_bases). Bases may not set the
// same key (as MMEngine); the file's keys are then merged onto them with merge_inherited (dicts
// recursively; a dict with _delete_=True replaces the base's), and a dict over a base value that is
// not one is an error unless it has _delete_=True. `_base_` is not in the result.
//
// Everything else (import, calls other than dict(), arithmetic, comparisons, comprehensions,
// attribute access, subscripts, f-strings, lambda, other statements) is refused with one line:
// "<file>:<line>: <what> is not supported in a config (only literals, dict(), lists, tuples and
// names assigned earlier)"; an unknown name is "<file>:<line>: name 'x' is not defined". Errors are
// tandem::Error.
#pragma once

#include <string>

#include "train/config.h"

namespace tandem::train {

// The tree MMEngine's Config.fromfile gives for the .py file at `path` (rules above).
Json load_py_config(const std::string& path);

// A --cfg-options value read as MMEngine's DictAction reads it: quotes (' and ") stripped from both
// ends and spaces removed; "(..)" is a tuple and "[..]" a list (arrays), their elements split at
// commas outside brackets and read the same way, recursively; a bare "a,b" is a list; otherwise an
// integer (Python's int()), a float (float(): also inf, nan), true/false (any case), None, or the
// text itself. Brackets that do not balance around a comma are an error.
Json parse_cfg_option_value(const std::string& text);

}  // namespace tandem::train
