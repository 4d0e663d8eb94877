#!/usr/bin/env python3
"""Builds the calibration texts of data/calib/ for `kvant quantize --method
awq|gptq --calib FILE [--calib FILE]`, each an evaluation set's non-scored
split as plain prose (never the test splits that evaluations score):
- arc_challenge_train.txt: every ARC-Challenge *train* question with its
  correct answer. Source: ../shared/data/arc_challenge/ARC-Challenge-Train.jsonl,
  checked against its SHA-256 before use. License: CC BY-SA 4.0 (AI2).
- mmlu_dev.txt, mmlu_val.txt: every MMLU *dev* question (the five few-shot
  exemplars per subject) and every *validation* question, each with its
  correct answer. Source: ../shared/data/mmlu/{dev,val}/*.csv, each checked
  against ../shared/data/SHA256SUMS. License: MIT (data/eval/mmlu/LICENSE).
See data/calib/README.md.
usage: scripts/make_calib_text.py [shared-data-dir]
"""
import csv
import hashlib
import io
import json
import pathlib
import sys

SRC_SHA256 = "e02837c53ee86f6d73c259f91c77725c5062ef4531130b7f473a9d9b01118a77"


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    data = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root.parent / "shared" / "data"
    src = data / "arc_challenge" / "ARC-Challenge-Train.jsonl"
    raw = src.read_bytes()
    if hashlib.sha256(raw).hexdigest() != SRC_SHA256:
        sys.exit(f"{src}: SHA-256 does not match {SRC_SHA256}")
    out = []
    for line in raw.decode("utf-8").splitlines():
        item = json.loads(line)
        q = item["question"]
        answer = next(c["text"] for c in q["choices"] if c["label"] == item["answerKey"])
        stem, answer = q["stem"].strip(), answer.strip().rstrip(".")
        # A question is followed by its answer as a sentence; an unfinished
        # stem ("... resulted from the") is completed by it.
        if stem.endswith("?"):
            out.append(f"{stem} {answer[:1].upper()}{answer[1:]}.\n")
        else:
            out.append(f"{stem} {answer}.\n")
    dst = root / "data" / "calib" / "arc_challenge_train.txt"
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("\n".join(out), encoding="utf-8")
    print(f"wrote {dst} ({len(out)} items, sha256 {hashlib.sha256(dst.read_bytes()).hexdigest()})")
    sums = {}
    for line in (data / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
        digest, name = line.split(maxsplit=1)
        sums[name.strip()] = digest
    mmlu_split(root, data, sums, "dev")
    mmlu_split(root, data, sums, "val")


def mmlu_split(root, data, sums, split):
    """Each question of an MMLU split followed by its answer, subject by subject."""
    out = []
    files = sorted((data / "mmlu" / split).glob(f"*_{split}.csv"))
    if len(files) != 57:
        sys.exit(f"expected 57 MMLU {split} files under {data / 'mmlu' / split}, found {len(files)}")
    for f in files:
        raw = f.read_bytes()
        if hashlib.sha256(raw).hexdigest() != sums.get(f"mmlu/{split}/{f.name}"):
            sys.exit(f"{f}: SHA-256 does not match {data / 'SHA256SUMS'}")
        subject = f.name[: -len(f"_{split}.csv")].replace("_", " ")
        # Line breaks inside a quoted field come as CR LF in some files: as LF.
        text = raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        for row in csv.reader(io.StringIO(text)):
            question, *choices, key = row
            answer = choices["ABCD".index(key.strip())].strip().rstrip(".")
            out.append(f"A question on {subject}: {question.strip()}\nThe answer: {answer}.\n")
    dst = root / "data" / "calib" / f"mmlu_{split}.txt"
    dst.write_text("\n".join(out), encoding="utf-8")
    print(f"wrote {dst} ({len(out)} items, sha256 {hashlib.sha256(dst.read_bytes()).hexdigest()})")


if __name__ == "__main__":
    main()
