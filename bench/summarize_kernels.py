#!/usr/bin/env python3
"""Markdown tables from kvant_bench_kernels JSON (--benchmark_format=json).

GEMM GFLOP/s is shown with its fraction of the same ISA's measured peak at the
same thread count (the peak/<isa>/t<n> entries: independent FMA or VDPBF16PS
chains, no memory traffic); m=1 rows also show the weight stream in GB/s and
its fraction of the best STREAM-style read bandwidth (read or read8) at the
same thread count. INT4 rows (gemm_q4) show the weight bytes they stream
(nibbles + BF16 group scales) against the same read bandwidth, and their
speed-up over the packed BF16 product of the same shape, m and threads.
Single-thread rows add the rate per CPU-second of the benchmark thread
(cpu_time instead of real time): on a shared machine that is the figure
least disturbed by other processes.
usage: bench/summarize_kernels.py bench/out/kernels.json
"""
import json
import sys


def main(path):
    doc = json.load(open(path))
    ctx = doc.get("context", {})
    # With --benchmark_repetitions the median aggregate stands for each benchmark.
    medians = [b for b in doc["benchmarks"] if b.get("aggregate_name") == "median"]
    rows = medians or [b for b in doc["benchmarks"] if b.get("run_type", "iteration") == "iteration"]
    for b in rows:
        b["name"] = b.get("run_name", b["name"])
    peak, stream, gemm, q4 = {}, {}, [], []
    for b in rows:
        parts = b["name"].split("/")
        if parts[0] == "peak":
            peak[(parts[1], parts[2])] = b["GFLOPS"] / 1e9 if b["GFLOPS"] > 1e6 else b["GFLOPS"]
        elif parts[0] == "stream":
            stream[(parts[1], parts[2])] = b["GBps"]
        elif parts[0] == "gemm":
            gemm.append((parts, b))
        elif parts[0] == "gemm_q4":
            q4.append((parts, b))
    g = lambda v: v / 1e9 if v > 1e6 else v  # counters may come back in units or in G
    busy = lambda b: b["real_time"] / b["cpu_time"]  # rate per CPU-second / real rate
    print(f"host: {ctx.get('host_name')}, {ctx.get('num_cpus')} CPUs @ {ctx.get('mhz_per_cpu')} MHz, "
          f"load average {ctx.get('load_avg')}, active ISA {ctx.get('kvant_isa')}\n")
    print("| peak (FMA/VDPBF16PS chains) | GFLOP/s |\n|---|---|")
    peak_cpu = {}
    for b in rows:
        parts = b["name"].split("/")
        if parts[0] == "peak" and parts[2] == "t1":
            peak_cpu[parts[1]] = g(b["GFLOPS"]) * busy(b)
    for (isa, t), v in sorted(peak.items()):
        extra = f" ({peak_cpu[isa]:.1f} per CPU-second)" if t == "t1" and isa in peak_cpu else ""
        print(f"| {isa} {t} | {v:.1f}{extra} |")
    print("\n| STREAM-style | GB/s |\n|---|---|")
    for (op, t), v in sorted(stream.items()):
        print(f"| {op} {t} | {g(v):.1f} |")
    print("\n| ISA | weights | shape (n x k) | m | threads | GFLOP/s | % of peak | weight GB/s | % of read BW "
          "| t1: GFLOP/s per CPU-s (% of peak per CPU-s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for parts, b in gemm:
        _, isa, kind, shape, m, t = parts[:6]
        gf = g(b["GFLOPS"])
        pk = peak.get((isa, t))
        bw = g(b["weight_GBps"])
        rd = max(stream.get(("read", t), 0), stream.get(("read8", t), 0)) or None
        mem = f"{bw:.1f} | {100 * bw / g(rd):.0f}%" if m == "m1" and rd else " | "
        pct = f"{100 * gf / pk:.0f}%" if pk else ""
        cpu = ""
        if t == "t1" and isa in peak_cpu:
            gc = gf * busy(b)
            cpu = f"{gc:.1f} ({100 * gc / peak_cpu[isa]:.0f}%)"
        print(f"| {isa} | {kind} | {shape} | {m[1:]} | {t[1:]} | {gf:.1f} | {pct} | {mem} | {cpu} |")
    if q4:
        # INT4 rows against the packed BF16 row of the same shape, m and threads
        # on the active table's ISA (time ratio), and against read bandwidth.
        bf = {(p[3], p[4], p[5]): b for p, b in gemm if p[2] == "packed" and p[1] == ctx.get("kvant_isa")}
        print("\n| INT4 kernel | group | shape (n x k) | m | threads | time us | GOP/s | weight GB/s | % of read BW "
              "| speed-up vs BF16 packed |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for parts, b in q4:
            _, var, grp, shape, m, t = parts[:6]
            bw = g(b["weight_GBps"])
            rd = max(stream.get(("read", t), 0), stream.get(("read8", t), 0)) or None
            pct = f"{100 * bw / g(rd):.0f}%" if rd else ""
            ref = bf.get((shape, m, t))
            sp = f"{ref['real_time'] / b['real_time']:.2f}x" if ref else ""
            print(f"| {var} | {grp[1:]} | {shape} | {m[1:]} | {t[1:]} | {b['real_time']:.1f} | "
                  f"{g(b['GFLOPS']):.1f} | {bw:.1f} | {pct} | {sp} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/out/kernels.json")
