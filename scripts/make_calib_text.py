#!/usr/bin/env python3
"""Builds data/calib/arc_challenge_train.txt, the calibration text for
`kvant quantize --method awq`: every ARC-Challenge *train* question with its
correct answer, as plain prose (never the test splits that evaluations score).
Source: ../shared/data/arc_challenge/ARC-Challenge-Train.jsonl, checked
against its SHA-256 before use. License: CC BY-SA 4.0 (AI2), see
data/calib/README.md.
usage: scripts/make_calib_text.py [shared-data-dir]
"""
import hashlib
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


if __name__ == "__main__":
    main()
