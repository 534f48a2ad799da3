#!/usr/bin/env python3
"""gpuguard health probe: proves that the host's ML stack computes on its GPUs, and how fast.

This script is run by the agent under whatever interpreter or container image the host's ML jobs use, so it
imports nothing from the agent: the standard library and PyTorch only, Python 3.8 or newer. It enumerates the
devices, then on every GPU (one process per GPU when there are several) runs a bf16 (or fp16) GEMM, checks its
numerics against an fp32 reference, times a device-memory copy, runs a few mixed-precision training steps and a
checkpoint save/load round trip; with several GPUs it also runs an all-reduce across them (NCCL/RCCL, gloo on CPU)
and checks the sum. It prints exactly one result line, ``GPUGUARD_PROBE_RESULT {json}``, and exits 0 whenever it
could print that line: failed checks are data for the agent to judge, not a crash.

``--device-memory-budget-bytes N`` (the agent passes it when another job uses the GPU): every step is sized to fit
in N bytes of device memory per GPU (smaller GEMM, copy and all-reduce, short timing loops; the checks themselves
unchanged in kind), the framework's allocator is capped at N, and the peak is reported as always.

Options for tests: ``--size small`` (tiny problems), ``--cpu-ranks N`` (N gloo processes when no GPU is visible),
``--throttle-fraction F`` (stretch every timed section so its figures drop by F), ``--slow-rank R:F`` and
``--fail-rank R`` (one slow or one failing rank).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback

PROBE_SCHEMA_VERSION = 1
RESULT_MARKER = "GPUGUARD_PROBE_RESULT "
# NVLink multicast (NVLS) can put a host's GPUs out of service for others; never let NCCL or PyTorch use it.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
GIB = 1 << 30
MIB = 1 << 20

SIZES = {
    # full: sized so each timed batch runs for milliseconds (well past launch overhead) and the data is many
    # times the L2 cache, yet the whole check stays within seconds. The GEMM runs in short bursts (3 warm-ups,
    # then 10 batches of 5, the best one counted): on an H200, 0.5 s of sustained GEMM first dropped it from boost to
    # its power-limited clock (680 instead of ~790 TFLOP/s), and then a throttled run's idle gaps let it recover part
    # of the drop.
    "full": {"gemm_n": 8192, "gemm_reps": 5, "gemm_batches": 10, "warmup_seconds": 0.0, "ref_n": 1024,
             "copy_bytes": 4 * GIB, "copy_reps": 10, "copy_batches": 5, "train_width": 512,
             "train_batch": 1024, "train_steps": 12, "allreduce_bytes": 256 * MIB, "allreduce_reps": 10,
             "allreduce_batches": 3},
    "small": {"gemm_n": 256, "gemm_reps": 4, "gemm_batches": 3, "warmup_seconds": 0.0, "ref_n": 128,
              "copy_bytes": 16 * MIB, "copy_reps": 4, "copy_batches": 3, "train_width": 128, "train_batch": 32,
              "train_steps": 6, "allreduce_bytes": 1 * MIB, "allreduce_reps": 3, "allreduce_batches": 2},
}
# Under a budget: device memory the training, reference and checkpoint steps may take (full and small widths).
STEP_RESERVE_BYTES = {"full": 160 * MIB, "small": 16 * MIB}
# A budget below this runs the small training/reference sizes too.
FULL_STEPS_MIN_BUDGET_BYTES = 768 * MIB
# The smallest sizes a budget can shrink the GEMM and copy to: below these the checks stop meaning anything.
MIN_GEMM_N = 256
MIN_COPY_BYTES = 1 * MIB
# bf16 inputs with fp32 accumulation land near 3e-3 relative error at these sizes; 2e-2 only fails real bugs.
REFERENCE_TOLERANCE = 2e-2


def parse_args(argv):
    parser = argparse.ArgumentParser(description="gpuguard accelerator health probe")
    parser.add_argument("--size", choices=sorted(SIZES) + ["auto"], default="auto",
                        help="problem sizes: full on a GPU, small on the CPU (auto)")
    parser.add_argument("--throttle-fraction", type=float, default=0.0,
                        help="stretch every timed section so its figures drop by this fraction (tests)")
    parser.add_argument("--slow-rank", default=None, metavar="RANK:FRACTION",
                        help="throttle one rank (GPU index) by FRACTION on top of --throttle-fraction (tests)")
    parser.add_argument("--fail-rank", type=int, default=None, metavar="RANK",
                        help="make one rank (GPU index) fail before the collective (tests)")
    parser.add_argument("--cpu-ranks", type=int, default=1,
                        help="when no GPU is visible, run this many gloo processes on the CPU (tests)")
    parser.add_argument("--rank-timeout-seconds", type=float, default=90.0,
                        help="with several ranks: stop and name the ranks still running after this long")
    parser.add_argument("--python-path", action="append", default=[], metavar="DIR",
                        help="put DIR first on sys.path (the agent starts this interpreter isolated, -I)")
    parser.add_argument("--max-gpus", type=int, default=None, help="use at most this many GPUs")
    parser.add_argument("--device-memory-budget-bytes", type=int, default=None, metavar="N",
                        help="fit every step in N bytes of device memory per GPU (another job uses the GPU)")
    args = parser.parse_args(argv)
    if not 0.0 <= args.throttle_fraction < 1.0:
        parser.error("--throttle-fraction must be in [0, 1)")
    if args.device_memory_budget_bytes is not None and args.device_memory_budget_bytes <= 0:
        parser.error("--device-memory-budget-bytes must be positive")
    return args


def fit_sizes(size, budget_bytes):
    """The sizes of ``size`` shrunk so that no step needs more than ``budget_bytes`` of device memory.

    Steps run one after another (the allocator's cache is emptied between them), so the peak is the largest step:
    the GEMM holds three n x n bf16 matrices, the copy two buffers, the all-reduce one; training, the reference and
    the checkpoint together stay within STEP_RESERVE_BYTES. The timing loops are the small ones: under a budget the
    GPU is someone else's and its figures are not judged, so the probe keeps its time there short.
    """
    sizes = dict(SIZES[size])
    sizes["device_memory_budget_bytes"] = budget_bytes
    if budget_bytes is None:
        return sizes
    small = SIZES["small"]
    for key in ("gemm_reps", "gemm_batches", "copy_reps", "copy_batches", "allreduce_reps", "allreduce_batches"):
        sizes[key] = min(sizes[key], small[key])
    steps = "full" if size == "full" and budget_bytes >= FULL_STEPS_MIN_BUDGET_BYTES else "small"
    if steps == "small":
        for key in ("ref_n", "train_width", "train_batch", "train_steps"):
            sizes[key] = small[key]
    room = max(0, budget_bytes - STEP_RESERVE_BYTES[steps]) * 0.9
    n = sizes["gemm_n"]
    while n > MIN_GEMM_N and 3 * n * n * 2 > room:
        n //= 2
    sizes["gemm_n"] = n
    sizes["copy_bytes"] = max(MIN_COPY_BYTES, min(sizes["copy_bytes"], int(room / 2) // MIB * MIB))
    sizes["allreduce_bytes"] = max(MIN_COPY_BYTES, min(sizes["allreduce_bytes"], int(room / 2) // MIB * MIB))
    return sizes


def finite_or_none(value):
    """JSON has no NaN or infinity: such a figure is reported as missing (and its check as failed)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def spread_fraction(values):
    """(max - min) / median of batch timings: how steady the figure was within this run."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid > 0 else None


def short_error(exc):
    """One line for a caught exception: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0][:300] if text else "")


class Clock(object):
    """Times batches of device work with the host clock around device synchronisation, optionally throttled.

    The throttle sleeps inside the timed window after the real work, so that the batch takes 1/(1-F) times as
    long and every figure derived from it drops by F: a deterministic, injectable slowdown for regression tests.
    """

    def __init__(self, sync, throttle_fraction):
        self.sync = sync
        self.throttle_fraction = throttle_fraction

    def batches(self, work, reps, batches):
        """Seconds of each batch of ``reps`` calls of ``work``."""
        times = []
        for _ in range(batches):
            self.sync()
            started = time.perf_counter()
            for _ in range(reps):
                work()
            self.sync()
            elapsed = time.perf_counter() - started
            if self.throttle_fraction > 0:
                time.sleep(elapsed * self.throttle_fraction / (1.0 - self.throttle_fraction))
                elapsed = time.perf_counter() - started
            times.append(elapsed)
        return times

    def warm_up(self, work, seconds, at_least=2):
        """Run ``work`` until ``seconds`` have passed (and at least ``at_least`` times): clocks up, caches filled."""
        self.sync()
        started = time.perf_counter()
        count = 0
        while count < at_least or time.perf_counter() - started < seconds:
            work()
            count += 1
            if count % 8 == 0:
                self.sync()
        self.sync()


# --- framework and devices -----------------------------------------------------------------------------------------

def import_framework():
    """(torch module or None, framework dict or None, skipped reason or None, import seconds)."""
    started = time.perf_counter()
    try:
        import torch  # noqa: F401 - the framework under test
    except ImportError as exc:
        return None, None, "no framework: %s" % short_error(exc), time.perf_counter() - started
    except Exception as exc:  # noqa: BLE001 - a broken install (missing libcudart, bad wheel) is a finding
        return None, {"name": "torch", "import_error": short_error(exc)}, None, time.perf_counter() - started
    seconds = time.perf_counter() - started
    version = getattr(torch, "version", None)
    hip = getattr(version, "hip", None)
    cuda = getattr(version, "cuda", None)
    build = "rocm" if hip else ("cuda" if cuda else "cpu")
    nccl = None
    try:
        if build != "cpu" and torch.cuda.is_available():
            raw = torch.cuda.nccl.version()
            nccl = ".".join(str(p) for p in raw) if isinstance(raw, tuple) else str(raw)
    except Exception:  # noqa: BLE001 - the NCCL version is a detail, never a reason to fail
        nccl = None
    framework = {"name": "torch", "version": str(torch.__version__), "build": build, "cuda": cuda, "hip": hip,
                 "nccl": nccl, "import_error": None}
    return torch, framework, None, seconds


def pci_address(props):
    domain = getattr(props, "pci_domain_id", None)
    bus = getattr(props, "pci_bus_id", None)
    device = getattr(props, "pci_device_id", None)
    if bus is None or device is None:
        return None
    return "%04x:%02x:%02x.0" % (int(domain or 0), int(bus), int(device))


def enumerate_devices(torch):
    """What the framework sees: the accelerator's device list, empty when it sees none."""
    if not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        devices.append({
            "index": index,
            "name": getattr(props, "name", None),
            "memory_total_bytes": int(getattr(props, "total_memory", 0)) or None,
            "uuid": str(uuid) if uuid is not None else None,
            "pci_bus_id": pci_address(props),
            "capability": "%s.%s" % (props.major, props.minor) if hasattr(props, "major") else None,
            "multiprocessors": getattr(props, "multi_processor_count", None),
            "gcn_arch": getattr(props, "gcnArchName", None),
        })
    return devices


# --- the per-device suite ------------------------------------------------------------------------------------------

def device_suite(torch, device, index, size, throttle_fraction, name):
    """Every per-device check on one device; each step records its own error so one failure hides nothing.

    ``size`` is a SIZES name or a dict of sizes (fit_sizes).
    """
    sizes = SIZES[size] if isinstance(size, str) else size
    started = time.perf_counter()
    on_gpu = device.type != "cpu"

    def sync():
        if on_gpu:
            torch.cuda.synchronize(device)

    clock = Clock(sync, throttle_fraction)
    if on_gpu:
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
        budget = sizes.get("device_memory_budget_bytes")
        if budget:
            # The allocator refuses (an out-of-memory error in that step) rather than take more than the budget.
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, float(budget) / total), device)
        # The reference check must compare against true fp32, and the GEMM figure must be what bf16 gives.
        torch.backends.cuda.matmul.allow_tf32 = False
    bf16 = (not on_gpu) or torch.cuda.is_bf16_supported()
    dtype = torch.bfloat16 if bf16 else torch.float16
    dtype_name = "bf16" if bf16 else "fp16"
    gpu = {"index": index, "device": str(device), "name": name, "gemm_dtype": dtype_name, "gemm_size": None,
           "gemm_bf16_tflops": None, "gemm_fp16_tflops": None, "gemm_batch_spread_fraction": None,
           "gemm_reference_rel_error": None, "gemm_reference_ok": None, "copy_bytes": None,
           "copy_bandwidth_gbps": None, "copy_batch_spread_fraction": None, "copy_verified": None,
           "train_steps": None, "train_first_step_seconds": None, "train_step_seconds": None,
           "train_loss_first": None, "train_loss_last": None, "train_ok": None, "checkpoint_bytes": None,
           "checkpoint_seconds": None, "checkpoint_ok": None, "device_memory_peak_bytes": None,
           "step_seconds": {}, "seconds": None, "errors": []}

    def step(label, fn):
        step_started = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - one broken step is a finding; the others still run
            gpu["errors"].append("%s: %s" % (label, short_error(exc)))
        finally:
            gpu["step_seconds"][label] = round(time.perf_counter() - step_started, 4)
            if on_gpu:
                torch.cuda.empty_cache()

    def gemm():
        n = sizes["gemm_n"]
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        c = torch.empty(n, n, device=device, dtype=dtype)

        def product():
            torch.matmul(a, b, out=c)

        clock.warm_up(product, sizes["warmup_seconds"], at_least=3)
        times = clock.batches(product, sizes["gemm_reps"], sizes["gemm_batches"])
        # The best batch, not the median: interference and clock dips only ever slow a batch down, so the
        # fastest one is the steadiest estimate of what the stack can do (and the throttle stretches it too).
        tflops = 2.0 * n ** 3 * sizes["gemm_reps"] / min(times) / 1e12
        gpu["gemm_size"] = n
        gpu["gemm_%s_tflops" % dtype_name] = finite_or_none(tflops)
        gpu["gemm_batch_spread_fraction"] = finite_or_none(spread_fraction(times))

    def reference():
        n = sizes["ref_n"]
        gen = torch.Generator().manual_seed(1234 + index)
        a = torch.randn(n, n, generator=gen).to(dtype)
        b = torch.randn(n, n, generator=gen).to(dtype)
        expected = torch.matmul(a.float(), b.float())
        got = torch.matmul(a.to(device), b.to(device)).float().cpu()
        rel = (torch.linalg.vector_norm(got - expected) / torch.linalg.vector_norm(expected)).item()
        gpu["gemm_reference_rel_error"] = finite_or_none(rel)
        gpu["gemm_reference_ok"] = bool(math.isfinite(rel) and rel < REFERENCE_TOLERANCE)

    def copy():
        nbytes = sizes["copy_bytes"]
        if on_gpu:
            total = torch.cuda.get_device_properties(device).total_memory
            nbytes = min(nbytes, total // 8)
        count = nbytes // 4
        src = torch.rand(count, device=device, dtype=torch.float32)
        dst = torch.full_like(src, float("nan"))

        def one_copy():
            dst.copy_(src)

        clock.warm_up(one_copy, 0.0, at_least=3)
        times = clock.batches(one_copy, sizes["copy_reps"], sizes["copy_batches"])
        moved = 2.0 * count * 4 * sizes["copy_reps"]  # bytes read plus bytes written
        gpu["copy_bytes"] = count * 4
        gpu["copy_bandwidth_gbps"] = finite_or_none(moved / statistics.median(times) / 1e9)
        gpu["copy_batch_spread_fraction"] = finite_or_none(spread_fraction(times))
        gpu["copy_verified"] = bool(torch.equal(dst, src))

    state = {}

    def train():
        width, batch = sizes["train_width"], sizes["train_batch"]
        torch.manual_seed(4321 + index)
        model = make_model(torch, width).to(device)
        optimizer = AdamW(torch, list(model.parameters()), lr=1e-3)
        # fp16 (a GPU without bf16): a dynamic loss scale as torch.amp.GradScaler keeps one; bf16 needs none.
        scale = 2.0 ** 16 if on_gpu and dtype == torch.float16 else None
        x = torch.randn(batch, width, device=device)
        y = torch.randn(batch, width, device=device)
        losses, step_times = [], []
        for _ in range(sizes["train_steps"]):
            sync()
            step_started = time.perf_counter()
            optimizer.zero_grad()
            with torch.autocast(device_type=device.type, dtype=dtype):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            if scale is not None:
                (loss * scale).backward()
                if optimizer.unscale_and_check(scale):
                    optimizer.step()
                else:  # inf/nan gradients: skip this step with a smaller scale, as GradScaler does
                    scale /= 2.0
            else:
                loss.backward()
                optimizer.step()
            losses.append(loss.item())  # .item() synchronises
            step_times.append(time.perf_counter() - step_started)
        steady = step_times[2:] or step_times
        gpu["train_steps"] = len(losses)
        gpu["train_first_step_seconds"] = finite_or_none(step_times[0])
        gpu["train_step_seconds"] = finite_or_none(statistics.median(steady))
        gpu["train_loss_first"] = finite_or_none(losses[0])
        gpu["train_loss_last"] = finite_or_none(losses[-1])
        gpu["train_ok"] = bool(all(math.isfinite(v) for v in losses) and losses[-1] < losses[0])
        state["model"], state["optimizer"] = model, optimizer

    def checkpoint():
        if "model" not in state:
            raise RuntimeError("no trained model to checkpoint (training step failed)")
        model, optimizer = state["model"], state["optimizer"]
        workdir = tempfile.mkdtemp(prefix="gpuguard-ckpt-")
        path = os.path.join(workdir, "checkpoint.pt")
        try:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
            gpu["checkpoint_bytes"] = os.path.getsize(path)
            try:
                loaded = torch.load(path, map_location=device, weights_only=True)
            except TypeError:  # PyTorch before 1.13 has no weights_only
                loaded = torch.load(path, map_location=device)
        finally:
            if os.path.exists(path):
                os.unlink(path)
            os.rmdir(workdir)
        clone = make_model(torch, sizes["train_width"]).to(device)
        clone.load_state_dict(loaded["model"])
        clone_optimizer = AdamW(torch, list(clone.parameters()), lr=1e-3)
        clone_optimizer.load_state_dict(loaded["optimizer"])
        same = all(torch.equal(p, q) for p, q in zip(model.state_dict().values(), clone.state_dict().values()))
        mine, theirs = optimizer.state_dict(), clone_optimizer.state_dict()
        for key in ("exp_avg", "exp_avg_sq"):
            if len(mine[key]) != len(theirs[key]) or not all(
                    torch.equal(a.cpu(), b.cpu()) for a, b in zip(mine[key], theirs[key])):
                same = False
        gpu["checkpoint_ok"] = bool(same and mine["step"] == theirs["step"] and mine["step"] > 0)

    for label, fn in (("gemm", gemm), ("reference", reference), ("copy", copy), ("train", train)):
        step(label, fn)
    checkpoint_started = time.perf_counter()
    step("checkpoint", checkpoint)
    gpu["checkpoint_seconds"] = round(time.perf_counter() - checkpoint_started, 4)
    state.clear()
    if on_gpu:
        gpu["device_memory_peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
    gpu["seconds"] = round(time.perf_counter() - started, 4)
    return gpu


class AdamW:
    """torch.optim.AdamW's update (decoupled weight decay, bias correction), written out.

    Not torch.optim: constructing its first optimizer in a process imports torch._dynamo (its methods are wrapped
    to disable compilation), 5.2 s on the H200 and most of the old training phase. The check is the same: a few
    mixed-precision steps must lower the loss, and the state must survive a checkpoint round trip.
    """

    def __init__(self, torch, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.torch = torch
        self.params = params
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.steps = 0
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def unscale_and_check(self, scale):
        """Divide the gradients by the loss scale; False when any of them is not finite (skip the step)."""
        with self.torch.no_grad():
            finite = True
            for p in self.params:
                if p.grad is not None:
                    p.grad.div_(scale)
                    finite = finite and bool(self.torch.isfinite(p.grad).all().item())
            return finite

    def step(self):
        beta1, beta2 = self.betas
        self.steps += 1
        correction1 = 1.0 - beta1 ** self.steps
        correction2_sqrt = math.sqrt(1.0 - beta2 ** self.steps)
        with self.torch.no_grad():
            for p, avg, avg_sq in zip(self.params, self.exp_avg, self.exp_avg_sq):
                if p.grad is None:
                    continue
                grad = p.grad
                p.mul_(1.0 - self.lr * self.weight_decay)
                avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                denom = (avg_sq.sqrt() / correction2_sqrt).add_(self.eps)
                p.addcdiv_(avg, denom, value=-self.lr / correction1)

    def state_dict(self):
        return {"step": self.steps, "exp_avg": list(self.exp_avg), "exp_avg_sq": list(self.exp_avg_sq)}

    def load_state_dict(self, state):
        if len(state["exp_avg"]) != len(self.params) or len(state["exp_avg_sq"]) != len(self.params):
            raise ValueError("optimizer state does not match the model's parameters")
        self.steps = int(state["step"])
        with self.torch.no_grad():
            for mine, saved in zip(self.exp_avg + self.exp_avg_sq, state["exp_avg"] + state["exp_avg_sq"]):
                mine.copy_(saved)


def make_model(torch, width):
    return torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                               torch.nn.Linear(4 * width, width))


# --- the collective ------------------------------------------------------------------------------------------------

def all_reduce_check(torch, dist, device, world, size, throttle_fraction):
    """A correct-sum check, then timed all-reduces; bus bandwidth as nccl-tests defines it."""
    sizes = SIZES[size] if isinstance(size, str) else size
    on_gpu = device.type != "cpu"

    def sync():
        if on_gpu:
            torch.cuda.synchronize(device)

    rank = dist.get_rank()
    count = sizes["allreduce_bytes"] // 4
    check = torch.full((count,), float(rank + 1), device=device, dtype=torch.float32)
    dist.all_reduce(check)
    expected = world * (world + 1) / 2.0
    sum_correct = bool(torch.all(check == expected).item())
    del check
    # 1/world in every rank sums to about 1, so the repeated in-place reductions never overflow.
    buf = torch.full((count,), 1.0 / world, device=device, dtype=torch.float32)
    clock = Clock(sync, throttle_fraction)
    clock.warm_up(lambda: dist.all_reduce(buf), 0.0, at_least=2)
    dist.barrier()
    times = clock.batches(lambda: dist.all_reduce(buf), sizes["allreduce_reps"], sizes["allreduce_batches"])
    per_op = statistics.median(times) / sizes["allreduce_reps"]
    nbytes = count * 4
    bus = nbytes * 2.0 * (world - 1) / world / per_op / 1e9
    return {"sum_correct": sum_correct, "bytes": nbytes, "bus_bandwidth_gbps": finite_or_none(bus)}


def rank_main(rank, world, workdir, options):
    """One process of the multi-process path: its device's suite, then the collective; writes rank-N.json."""
    for key, value in SAFE_ENV.items():
        os.environ[key] = value
    out = {"rank": rank, "gpu": None, "collective": None, "error": None}
    code = 0
    try:
        torch, _, _, _ = import_framework()
        import datetime

        import torch.distributed as dist

        on_gpu = options["on_gpu"]
        if on_gpu:
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
            name = torch.cuda.get_device_name(device)
        else:
            device = torch.device("cpu")
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
            name = "cpu"
        throttle = options["throttle_fraction"]
        slow = options.get("slow_rank")
        if slow is not None and slow[0] == rank:
            throttle = 1.0 - (1.0 - throttle) * (1.0 - slow[1])
        out["gpu"] = device_suite(torch, device, rank, options["size"], throttle, name)
        if options.get("fail_rank") == rank:
            raise RuntimeError("injected failure on rank %d" % rank)
        backend = "nccl" if on_gpu else "gloo"
        kwargs = {"backend": backend, "init_method": "file://" + os.path.join(workdir, "store"),
                  "rank": rank, "world_size": world,
                  "timeout": datetime.timedelta(seconds=options["rank_timeout_seconds"])}
        if on_gpu:
            try:
                dist.init_process_group(device_id=device, **kwargs)
            except TypeError:  # PyTorch before 2.3 has no device_id
                dist.init_process_group(**kwargs)
        else:
            dist.init_process_group(**kwargs)
        try:
            out["collective"] = all_reduce_check(torch, dist, device, world, options["size"], throttle)
            out["collective"]["backend"] = backend
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - whatever ends this rank must reach the parent as data
        out["error"] = short_error(exc)
        out["traceback"] = traceback.format_exc()[-2000:]
        code = 1
    tmp = os.path.join(workdir, "rank-%d.json.tmp" % rank)
    with open(tmp, "w") as handle:
        json.dump(out, handle)
    os.replace(tmp, os.path.join(workdir, "rank-%d.json" % rank))
    sys.stderr.flush()
    os._exit(code)


def run_ranks(world, options, timeout_seconds):
    """Spawn one process per rank, wait with a deadline, and report every rank by name: ok, failed, aborted, timeout.

    When one rank fails the collective can never complete, so the others are stopped after a short grace
    instead of waiting for the whole timeout.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    workdir = tempfile.mkdtemp(prefix="gpuguard-ranks-")
    procs = [ctx.Process(target=rank_main, args=(rank, world, workdir, options)) for rank in range(world)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout_seconds
    failed_at = None
    killed = {}
    while any(p.is_alive() for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p.exitcode not in (None, 0) for p in procs):
            failed_at = now
        if now > deadline or (failed_at is not None and now - failed_at > 3.0):
            reason = "timeout" if now > deadline and failed_at is None else "aborted"
            for rank, proc in enumerate(procs):
                if proc.is_alive():
                    proc.kill()
                    killed[rank] = reason
            break
        time.sleep(0.05)
    for proc in procs:
        proc.join(5)
    ranks = []
    for rank, proc in enumerate(procs):
        path = os.path.join(workdir, "rank-%d.json" % rank)
        data = None
        if os.path.exists(path):
            with open(path) as handle:
                data = json.load(handle)
            os.unlink(path)
        ranks.append((rank, proc.exitcode, killed.get(rank), data))
    for leftover in os.listdir(workdir):
        try:
            os.unlink(os.path.join(workdir, leftover))
        except OSError:
            pass
    try:
        os.rmdir(workdir)
    except OSError:
        pass
    return ranks


def gather(ranks, world, size):
    """(per-GPU figures, collective dict) from the ranks' reports; ``size`` a SIZES name or a dict of sizes."""
    size = SIZES[size] if isinstance(size, str) else size
    gpus, rank_rows, collectives = [], [], []
    for rank, exitcode, killed, data in ranks:
        if data and data.get("gpu"):
            gpus.append(data["gpu"])
        row = {"rank": rank, "status": "ok", "error": None, "bus_bandwidth_gbps": None}
        if killed is not None:
            row["status"] = killed
            row["error"] = "killed: %s" % ("no result within the rank timeout" if killed == "timeout"
                                           else "another rank failed")
        elif data is None:
            row["status"] = "failed"
            row["error"] = "exited %s without a result" % exitcode
        elif data.get("error") or exitcode != 0:
            row["status"] = "failed"
            row["error"] = data.get("error") or "exit %s" % exitcode
        elif data.get("collective"):
            row["bus_bandwidth_gbps"] = data["collective"]["bus_bandwidth_gbps"]
            collectives.append(data["collective"])
        rank_rows.append(row)
    all_ok = len(collectives) == world and all(r["status"] == "ok" for r in rank_rows)
    figures = [c["bus_bandwidth_gbps"] for c in collectives if c["bus_bandwidth_gbps"] is not None]
    collective = {
        "backend": collectives[0]["backend"] if collectives else None,
        "world_size": world,
        "bytes": collectives[0]["bytes"] if collectives else size["allreduce_bytes"],
        "sum_correct": all(c["sum_correct"] for c in collectives) if all_ok else None,
        # The slowest rank's view: a collective is as fast as its slowest member.
        "bus_bandwidth_gbps": min(figures) if all_ok and figures else None,
        "ranks": rank_rows,
    }
    return sorted(gpus, key=lambda g: g["index"]), collective


def parse_slow_rank(text):
    if text is None:
        return None
    rank, _, fraction = text.partition(":")
    return int(rank), float(fraction or "0.5")


def main(argv=None):
    wall_started = time.perf_counter()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # What PYTHONPATH did before the interpreter started isolated: before the framework is imported; the ranks get
    # this sys.path from multiprocessing's spawn.
    sys.path[:0] = [path for path in args.python_path if path not in sys.path]
    for key, value in SAFE_ENV.items():
        os.environ[key] = value
    result = {"probe_schema_version": PROBE_SCHEMA_VERSION, "python": platform.python_version(),
              "framework": None, "skipped_reason": None, "accelerator_available": False, "device_count": 0,
              "devices": [], "ran_on": None, "gpus": [], "collective": None, "phase_seconds": {},
              "throttle_fraction": args.throttle_fraction,
              "device_memory_budget_bytes": args.device_memory_budget_bytes, "uid": os.getuid(),
              "gid": os.getgid(), "groups": sorted(set(os.getgroups())), "errors": []}
    try:
        torch, framework, skipped, import_seconds = import_framework()
        result["framework"] = framework
        result["skipped_reason"] = skipped
        result["phase_seconds"]["import"] = round(import_seconds, 4)
        if torch is not None:
            run_workload(torch, args, result)
    except Exception as exc:  # noqa: BLE001 - the probe reports its own crash as data
        result["errors"].append("probe: %s" % short_error(exc))
        result["errors"].append(traceback.format_exc()[-2000:])
    result["phase_seconds"]["total"] = round(time.perf_counter() - wall_started, 4)
    sys.stdout.write(RESULT_MARKER + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


def run_workload(torch, args, result):
    started = time.perf_counter()
    devices = enumerate_devices(torch)
    result["phase_seconds"]["enumerate"] = round(time.perf_counter() - started, 4)
    result["accelerator_available"] = bool(devices)
    result["device_count"] = len(devices)
    result["devices"] = devices
    used = devices[:args.max_gpus] if args.max_gpus else devices
    on_gpu = bool(used)
    result["ran_on"] = "gpu" if on_gpu else "cpu"
    size = fit_sizes(args.size if args.size != "auto" else ("full" if on_gpu else "small"),
                     args.device_memory_budget_bytes)
    world = len(used) if on_gpu else max(1, args.cpu_ranks)
    slow = parse_slow_rank(args.slow_rank)
    started = time.perf_counter()
    if world == 1:
        throttle = args.throttle_fraction
        if slow is not None and slow[0] == 0:
            throttle = 1.0 - (1.0 - throttle) * (1.0 - slow[1])
        if on_gpu:
            device, name = torch.device("cuda", 0), used[0]["name"]
        else:
            device, name = torch.device("cpu"), "cpu"
        result["gpus"] = [device_suite(torch, device, 0, size, throttle, name)]
        if args.fail_rank == 0:
            result["gpus"][0]["errors"].append("injected failure on rank 0")
    else:
        options = {"on_gpu": on_gpu, "size": size, "throttle_fraction": args.throttle_fraction,
                   "slow_rank": slow, "fail_rank": args.fail_rank,
                   "rank_timeout_seconds": args.rank_timeout_seconds}
        ranks = run_ranks(world, options, args.rank_timeout_seconds)
        result["gpus"], result["collective"] = gather(ranks, world, size)
    result["phase_seconds"]["workload"] = round(time.perf_counter() - started, 4)


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    # The result is written and flushed, every rank joined, the checkpoint's directory removed: skip the interpreter's
    # teardown, as each rank does, which with the framework loaded took 0.4 s of a CPU-only run here (#17); the
    # driver frees the device memory when the process ends either way.
    os._exit(code)
