#!/usr/bin/env python3
"""The tree's shape rules, checked (ctest code_shape):
 - no file under src/ over 800 lines, except kernels (src/kernels/);
 - no function over 150 lines;
 - src/model/ has no kernels:: call, no kernels/ include and no OpenMP pragma;
 - src/model/ includes nothing from src/quant/, src/engine/ or above;
 - src/cli/ and src/eval/ include no kernels/ header;
 - src/cli/ and src/eval/ include none of model/model.h, model/loader.h or
   model/weights.h (they reach models through the engine layer's public
   API: engine/engine.h, engine/model_runner.h).
Functions are found by brace matching: a line that opens a brace at depth 0
or inside a namespace starts a body; lambdas and nested blocks count with the
function that holds them. Prints every violation; exit 1 if any."""
import os
import re
import sys

MAX_FILE, MAX_FUNC = 800, 150
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
bad = []


def strip(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
    return line.split("//")[0]


def functions(path, lines):
    depth, ns_depths, start, name = 0, set(), None, ""
    for i, raw in enumerate(lines):
        line = strip(raw)
        for ch in line:
            if ch == "{":
                if start is None and (depth == 0 or depth in ns_depths):
                    head = " ".join(strip(l) for l in lines[max(0, i - 3):i + 1])
                    if re.search(r"\b(namespace)\b[^;{]*\{?\s*$", head.split(";")[-1]):
                        ns_depths.add(depth + 1)
                    elif not re.search(r"\b(struct|class|enum|union)\b[^;()]*$", head.split(";")[-1]) \
                            and not re.search(r"=\s*\{?$", head.strip()):
                        start, name = i, raw.strip()[:80]
                depth += 1
            elif ch == "}":
                depth -= 1
                ns_depths.discard(depth + 1) if depth + 1 in ns_depths and start is None else None
                if start is not None and (depth == 0 or depth in ns_depths):
                    n = i - start + 1
                    if n > MAX_FUNC:
                        bad.append(f"{path}:{start + 1}: function of {n} lines (limit {MAX_FUNC}): {name}")
                    start = None


for dirpath, _, files in os.walk(root):
    for f in sorted(files):
        if not f.endswith((".h", ".cpp", ".cu", ".cuh")):
            continue
        path = os.path.join(dirpath, f)
        rel = os.path.relpath(path, os.path.join(root, ".."))
        lines = open(path, encoding="utf-8").read().split("\n")
        kernels = rel.startswith("src/kernels/")
        if not kernels and len(lines) > MAX_FILE:
            bad.append(f"{rel}: {len(lines)} lines (limit {MAX_FILE})")
        if not kernels:
            functions(rel, lines)
        text = "\n".join(strip(l) for l in lines)
        if rel.startswith("src/model/"):
            if re.search(r"kernels::|#\s*pragma\s+omp|include\s+\"kernels/", "\n".join(lines)):
                bad.append(f"{rel}: kernels or OpenMP under src/model/ (backend operations only)")
            for inc in re.findall(r'#include\s+"([a-z_]+)/', "\n".join(lines)):
                if inc in ("quant", "engine", "server", "eval", "cli", "kernels"):
                    bad.append(f"{rel}: includes {inc}/ (the model sits below it)")
        if rel.startswith(("src/cli/", "src/eval/")) and re.search(r'#include\s+"kernels/', "\n".join(lines)):
            bad.append(f"{rel}: includes a kernels/ header (use the engine or the backend)")
        if rel.startswith(("src/cli/", "src/eval/")):
            for inc in re.findall(r'#include\s+"(model/(?:model|loader|weights)\.h)"', "\n".join(lines)):
                bad.append(f"{rel}: includes {inc} (use engine/engine.h or engine/model_runner.h)")

for b in bad:
    print(b)
print(f"code shape: {len(bad)} violation(s)")
sys.exit(1 if bad else 0)
