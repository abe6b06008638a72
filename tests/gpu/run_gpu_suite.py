#!/usr/bin/env python3
"""The GPU check of the course, in one command (see docs/gpu.md):

    python tests/gpu/run_gpu_suite.py RESULTS_DIR            # everything (tens of minutes)
    python tests/gpu/run_gpu_suite.py RESULTS_DIR --quick    # bench --quick, fewer sizes and repeats

Stops at once, exit status 2, when torch sees no CUDA device. Otherwise, with ``MINIGPT_DEVICE=cuda``:

1. the whole pytest suite -- library tests and every course notebook through nbval (``pytest.log``,
   ``pytest.xml``);
2. ``python -m minigpt.bench --device cuda --json`` (with ``--peers`` when bench supports it and transformers
   is installed) (``bench.log``, ``bench.json``);
3. ``python -m minigpt.bench --device cuda --batch 1,2,...,64``: plain, chain and prompt lookup on B requests
   at once on the paged cache, each method's speed-up over plain per B (``batch.log``, ``batch.json``);
4. a memory-bound timing: random-weight GPT-2-shaped models (``minigpt.hardware.MODEL_SIZES``, up to
   ~307M parameters), one forward pass over 1..512 new tokens after a cached prefix, medians of interleaved
   repeats, next to the measured copy bandwidth and per-op overhead;

and writes ``gpu_results.json`` and ``gpu_results.md`` (device name, versions, outcomes, times, speedups) into
RESULTS_DIR. Every step runs even if an earlier one failed; the exit status is 1 if any failed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKENS_PER_PASS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def log(msg: str) -> None:
    print(f"[gpu-suite {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_logged(cmd: list[str], logfile: Path, env: dict, timeout: float) -> dict:
    """Run ``cmd`` from the repository root, output to the terminal and to ``logfile``; return rc and seconds."""
    log(f"$ {' '.join(cmd)}  (log: {logfile.name})")
    t0 = time.perf_counter()
    with open(logfile, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        watchdog = threading.Timer(timeout, proc.kill)  # the output loop below blocks, so time out from a thread
        watchdog.start()
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
        rc = proc.wait()
        timed_out = not watchdog.is_alive()
        watchdog.cancel()
        if timed_out:
            rc = 124
            f.write(f"\n[killed after {timeout:.0f} s]\n")
    return dict(cmd=" ".join(cmd), rc=rc, seconds=round(time.perf_counter() - t0, 1), log=logfile.name)


def pytest_summary(logfile: Path) -> str:
    """pytest's last "=== 12 passed, 1 skipped in 3.2s ===" line, without the equals signs."""
    lines = [ln.strip("= \n") for ln in logfile.read_text(errors="replace").splitlines()
             if re.search(r"\b(passed|failed|error|skipped|no tests ran)\b", ln) and " in " in ln]
    return lines[-1] if lines else "(no summary line)"


def bench_supports_peers(env: dict) -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    out = subprocess.run([sys.executable, "-m", "minigpt.bench", "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    return "--peers" in out.stdout


def forward_sweep(sizes: list[str], repeat: int, cached: int, device: str = "cuda",
                  bandwidth_bytes: int | None = None) -> dict:
    """Forward-pass time against tokens per pass for random-weight models of several sizes, fp32, batch 1.
    (``device``/``bandwidth_bytes`` exist so the function can be dry-run on a CPU with small sizes.)"""
    import torch
    from minigpt.hardware import (forward_time_sweep, measure_bandwidth, measure_call_overhead,
                                  measure_matmul_flops, model_of_size)
    dev = torch.device(device)
    out = dict(dtype="float32", cached_prefix=cached, repeats=repeat, tokens_per_pass=list(TOKENS_PER_PASS),
               allow_tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
               copy_bandwidth_GBps=measure_bandwidth(dev, n_bytes=bandwidth_bytes) / 1e9,
               matmul_fp32_TFLOPs=measure_matmul_flops(dev) / 1e12,
               op_overhead_us=measure_call_overhead(dev) * 1e6, models=[])
    log(f"copy bandwidth {out['copy_bandwidth_GBps']:.0f} GB/s, fp32 matmul {out['matmul_fp32_TFLOPs']:.1f} "
        f"TFLOP/s, {out['op_overhead_us']:.1f} us per tiny op")
    for name in sizes:
        model = model_of_size(name, dev)
        n_params = model.num_params()
        shapes = [(n, 1) for n in TOKENS_PER_PASS]
        runs = forward_time_sweep(model, shapes, cached=cached, repeat=repeat, warmup=2)
        med = {n: statistics.median(runs[(n, 1)]) for n in TOKENS_PER_PASS}
        t1 = med[1]
        rows = [dict(tokens=n, ms=med[n] * 1e3, ms_min=min(runs[(n, 1)]) * 1e3, ms_max=max(runs[(n, 1)]) * 1e3,
                     cost_vs_1_token=med[n] / t1, tokens_per_s=n / med[n]) for n in TOKENS_PER_PASS]
        weight_bytes = 4 * n_params
        flat = [1]  # the longest run of pass sizes, from 1 token up, that cost at most 25% more than one token
        for n in TOKENS_PER_PASS[1:]:
            if med[n] > 1.25 * t1:
                break
            flat.append(n)
        entry = dict(name=name, params=n_params, weight_MB=weight_bytes / 1e6, rows=rows,
                     weights_read_GBps_at_1_token=weight_bytes / t1 / 1e9,
                     max_tokens_within_25pct_of_1_token=max(flat))
        out["models"].append(entry)
        log(f"{name}: {n_params / 1e6:.1f}M params, 1 token {t1 * 1e3:.3f} ms, 512 tokens {med[512] * 1e3:.3f} ms "
            f"({med[512] / t1:.1f}x); up to {max(flat)} tokens cost within 25% of one")
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return out


def markdown(res: dict) -> str:
    d = res["device"]
    md = [f"# GPU suite results: {d['name']}", "",
          f"- {d['name']}, {d['memory_GiB']:.0f} GiB, compute capability {d['capability']}; torch {d['torch']}, "
          f"CUDA {d['cuda']}, Python {d['python']}; {res['date']}", ""]
    if "pytest" in res:
        p = res["pytest"]
        md += ["## pytest (library tests + course notebooks via nbval), MINIGPT_DEVICE=cuda", "",
               f"exit status {p['rc']} after {p['seconds']:.0f} s: {p['summary']}", ""]
    if "bench" in res:
        b = res["bench"]
        md += ["## python -m minigpt.bench --device cuda", "", f"exit status {b['rc']} after {b['seconds']:.0f} s", ""]
        if b.get("table"):
            md += ["```", b["table"], "```", ""]
    if "batch" in res:
        b = res["batch"]
        md += ["## python -m minigpt.bench --device cuda --batch (B requests at once, paged cache)", "",
               f"exit status {b['rc']} after {b['seconds']:.0f} s", ""]
        if b.get("table"):
            md += ["```", b["table"], "```", ""]
    if "sweep" in res:
        s = res["sweep"]
        md += ["## Forward pass time against tokens per pass (random weights, fp32, batch 1)", "",
               f"Cached prefix {s['cached_prefix']} tokens, median of {s['repeats']} interleaved repeats. Device: "
               f"copy bandwidth {s['copy_bandwidth_GBps']:.0f} GB/s, fp32 matmul {s['matmul_fp32_TFLOPs']:.1f} "
               f"TFLOP/s (TF32 matmul allowed: {s['allow_tf32_matmul']}), {s['op_overhead_us']:.1f} us per tiny op.",
               ""]
        names = [m["name"] for m in s["models"]]
        md += ["| tokens | " + " | ".join(f"{m['name']} ({m['params'] / 1e6:.1f}M) ms (x 1-token)"
                                          for m in s["models"]) + " |",
               "|---:|" + "---:|" * len(names)]
        for i, n in enumerate(s["tokens_per_pass"]):
            md.append(f"| {n} | " + " | ".join(f"{m['rows'][i]['ms']:.3f} ({m['rows'][i]['cost_vs_1_token']:.2f}x)"
                                               for m in s["models"]) + " |")
        md += [""] + [f"- {m['name']}: reading its {m['weight_MB']:.1f} MB of weights in the time of "
                      f"a 1-token pass means {m['weights_read_GBps_at_1_token']:.1f} GB/s; up to "
                      f"{m['max_tokens_within_25pct_of_1_token']} tokens per pass cost within 25% of one token."
                      for m in s["models"]]
    for k, v in res.get("errors", {}).items():
        md += ["", f"**{k} failed:** `{v}`"]
    return "\n".join(md) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="run_gpu_suite.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("results_dir", type=Path, help="folder for gpu_results.{json,md} and the logs (created)")
    ap.add_argument("--quick", action="store_true", help="bench --quick; sizes target,base; 5 repeats")
    ap.add_argument("--skip-tests", action="store_true", help="skip the pytest + notebooks run")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--skip-batch", action="store_true")
    ap.add_argument("--batch", default="1,2,4,8,16,32,64",
                    help="batch sizes of the batched race (bench --batch; default 1,2,4,8,16,32,64)")
    ap.add_argument("--sizes", default=None, help="model presets for the sweep (default target,small,base,large)")
    ap.add_argument("--cached", type=int, default=256, help="cached prefix of the timed passes (default 256)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds allowed for each of pytest and bench")
    args = ap.parse_args(argv)

    import torch
    if not torch.cuda.is_available():
        print(f"error: CUDA is not available (torch {torch.__version__}, built for CUDA {torch.version.cuda}): "
              f"this suite needs an NVIDIA GPU and a CUDA build of torch. Nothing was run.", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    out_dir = args.results_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MINIGPT_DEVICE": "cuda", "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    props = torch.cuda.get_device_properties(0)
    res = dict(date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), errors={}, device=dict(
        name=torch.cuda.get_device_name(0), memory_GiB=props.total_memory / 2**30,
        capability=f"{props.major}.{props.minor}", torch=torch.__version__, cuda=torch.version.cuda,
        python=platform.python_version()))
    log(f"{res['device']['name']}, torch {torch.__version__}, CUDA {torch.version.cuda}; results in {out_dir}")

    def save():
        (out_dir / "gpu_results.json").write_text(json.dumps(res, indent=2))
        (out_dir / "gpu_results.md").write_text(markdown(res))

    if not args.skip_tests:
        r = run_logged([sys.executable, "-m", "pytest", "-q", "-rfE", "--junitxml", str(out_dir / "pytest.xml")],
                       out_dir / "pytest.log", env, args.timeout)
        r["summary"] = pytest_summary(out_dir / "pytest.log")
        res["pytest"] = r
        if r["rc"] != 0:
            res["errors"]["pytest"] = r["summary"]
        save()
    if not args.skip_bench:
        bench_json = out_dir / "bench.json"
        cmd = [sys.executable, "-m", "minigpt.bench", "--device", "cuda", "--json", str(bench_json)]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--peers"] if bench_supports_peers(env) else []
        r = run_logged(cmd, out_dir / "bench.log", env, args.timeout)
        if bench_json.exists():
            r["records"] = json.loads(bench_json.read_text())
            from minigpt.bench import format_table
            try:
                r["table"] = format_table(r["records"])
            except Exception as e:  # the table is a convenience; the records are the result
                r["table"] = f"(format_table failed: {e})"
        res["bench"] = r
        if r["rc"] != 0:
            res["errors"]["bench"] = (f"exit status {r['rc']}, see bench.log (1 means some method's tokens "
                                      f"differ from plain greedy; 124 a timeout)")
        save()
    if not args.skip_batch:
        batch_json = out_dir / "batch.json"
        cmd = [sys.executable, "-m", "minigpt.bench", "--device", "cuda", "--batch", args.batch,
               "--json", str(batch_json)] + (["--quick"] if args.quick else [])
        r = run_logged(cmd, out_dir / "batch.log", env, args.timeout)
        if batch_json.exists():
            r["records"] = json.loads(batch_json.read_text())
            from minigpt.bench.batch import report_batch
            r["table"] = report_batch(r["records"])
        res["batch"] = r
        if r["rc"] != 0:
            res["errors"]["batch"] = f"exit status {r['rc']}, see batch.log (1: an output differed or a block leaked)"
        save()
    if not args.skip_sweep:
        sizes = args.sizes.split(",") if args.sizes else (["target", "base"] if args.quick else
                                                           ["target", "small", "base", "large"])
        try:
            res["sweep"] = forward_sweep(sizes, repeat=5 if args.quick else 9, cached=args.cached)
        except Exception as e:
            res["errors"]["sweep"] = f"{type(e).__name__}: {e}"
            log(f"sweep failed: {res['errors']['sweep']}")
        save()
    save()
    log(f"wrote {out_dir / 'gpu_results.md'} and gpu_results.json" +
        (f"; FAILED: {', '.join(res['errors'])}" if res["errors"] else "; all steps passed"))
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
