#!/usr/bin/env python3
"""Fails when a binary holds SIMD instructions that its dispatch cannot vouch for.

Kernels for AVX2 and AVX-512 are compiled with their own ISA flags and reached
only after cpuid confirms the CPU runs them; everything else is built for the
x86-64-v2 baseline. An instruction of a higher ISA in the wrong place faults
with SIGILL on CPUs that lack it, which a machine that has it never shows. This
disassembles each binary and checks, function by function:
  - names that mention avx512 (the AVX-512 kernels): anything goes;
  - names that mention avx2 (the AVX2 kernels): no EVEX (AVX-512) encoding;
  - all other code: no VEX or EVEX encoding at all (no AVX of any kind).
Inline asm is covered as well, since the assembler chooses the encoding.
"""
import re
import subprocess
import sys

FUNC = re.compile(r"^[0-9a-f]+ <(.*)>:$")
# In 64-bit mode a first opcode byte of c4/c5 is always VEX and 62 always EVEX;
# only segment and address-size prefixes may come before them.
ENC = re.compile(r"^(?:(?:2e|36|3e|26|64|65|67) )*(c4|c5|62) ")


def scan(path):
    out = subprocess.run(["objdump", "-d", "-C", path],
                         check=True, capture_output=True, text=True).stdout
    bad = {}
    fn = None
    for line in out.splitlines():
        m = FUNC.match(line)
        if m:
            fn = m.group(1)
            continue
        parts = line.split("\t")
        if fn is None or len(parts) < 3 or not parts[2].strip():
            continue
        e = ENC.match(parts[1].strip())
        if not e:
            continue
        low = fn.lower()
        if "avx512" in low:
            continue
        if "avx2" in low and e.group(1) != "62":
            continue
        bad.setdefault(fn, []).append(parts[2].strip())
    return bad


def main(paths):
    failed = False
    for p in paths:
        bad = scan(p)
        for fn, insns in sorted(bad.items()):
            failed = True
            print(f"{p}: {fn}: {len(insns)} instruction(s) above its ISA, e.g. {insns[0]}")
        print(f"{p}: {'FAIL' if bad else 'ok'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
