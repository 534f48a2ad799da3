#!/usr/bin/env python3
"""gpuguard's workload shim: runs a team's registered workload and records, op by op, where its work ran.

The agent runs this script, not the workload, under the interpreter (or in the container image) the workload
names; the shim then runs the workload's module (``--module``, as ``python -m`` would) or script (``--script``) in
its own process, so that nothing the workload's authors write is needed for the evidence. Like the probe it imports
nothing from the agent: the standard library, and PyTorch when the workload has imported it. Python 3.8 or newer.

With ``--instrument ops`` (the default) and PyTorch present, every ATen operator the workload runs passes through a
``TorchDispatchMode`` that counts calls per operator and device type, and follows the data: a tensor copied from
the accelerator to the host is marked, and so is whatever the host computes from it. A host operator that reads
such data is CPU fallback: the work came from the GPU and was done on the CPU (a ``.cpu()`` round trip, an operator
the model moved off the device because the device lacked it). An operator that raised "not implemented" for the
accelerator is recorded as unsupported. Data movement and views are never counted as fallback.

The workload reports its own figures with one line on stdout, a JSON object with the key ``gpuguard_result``
mapping metric names to numbers (docs/health.md "Your workloads")::

    {"gpuguard_result": {"samples_per_second": 812.4, "loss": 0.031}}

After the workload returns (or raises, or calls ``sys.exit``) the shim prints one line of its own,
``GPUGUARD_WORKLOAD_REPORT {json}``, on the stdout the process started with, carrying the nonce the agent gave it
in ``GPUGUARD_WORKLOAD_NONCE`` (taken out of the environment before the workload starts). The report is the
workload process's own word: it names what ran where; root's SMI sampling, not this line, proves that the GPU
worked (agent/health/workload_judge.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import runpy
import sys
import time
import traceback
import weakref

REPORT_MARKER = "GPUGUARD_WORKLOAD_REPORT "
NONCE_ENV = "GPUGUARD_WORKLOAD_NONCE"
SHIM_SCHEMA_VERSION = 1
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# Distinct (operator, device) rows kept; a workload that runs more kinds of operators than this is marked truncated.
MAX_OP_ROWS = 2000
# Operators that move or re-describe data without computing on it: never CPU fallback, though they carry the mark.
MOVEMENT_OPS = frozenset([
    "aten::_to_copy", "aten::copy_", "aten::to", "aten::detach", "aten::detach_", "aten::alias", "aten::view",
    "aten::_unsafe_view", "aten::_reshape_alias", "aten::reshape", "aten::t", "aten::transpose", "aten::permute",
    "aten::expand", "aten::squeeze", "aten::unsqueeze", "aten::select", "aten::slice", "aten::as_strided",
    "aten::clone", "aten::contiguous", "aten::lift_fresh", "aten::empty_like", "aten::empty", "aten::empty_strided",
    "aten::new_empty", "aten::new_empty_strided", "aten::_local_scalar_dense", "aten::set_", "aten::resize_",
    "aten::_pin_memory", "aten::is_pinned", "aten::split", "aten::unbind", "aten::chunk", "aten::flatten",
])


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="workload_shim", description=__doc__.split("\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--module", help="the workload's module, run as `python -m MODULE` would run it")
    what.add_argument("--script", help="the workload's script, an absolute path")
    parser.add_argument("--instrument", choices=("ops", "none"), default="ops")
    # The device type the workload's GPU work runs on (ROCm's PyTorch calls it cuda too), and the host's.
    parser.add_argument("--accelerator", default="cuda")
    parser.add_argument("--host-device", default="cpu")
    parser.add_argument("--python-path", action="append", default=[])
    parser.add_argument("workload_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.workload_args and args.workload_args[0] == "--":
        args.workload_args = args.workload_args[1:]
    return args


def op_name(func):
    """``aten::mm`` for the OpOverload ``aten.mm.default``."""
    try:
        return func._schema.name
    except AttributeError:
        return str(func)


class OpRecorder(object):
    """Counts operators per device type and follows data from the accelerator to the host (the docstring above)."""

    def __init__(self, accelerator, host):
        self.accelerator = accelerator
        self.host = host
        self.calls = {}
        self.truncated = False
        self.fallback = {}
        self.unsupported = {}
        # id(tensor) -> a weak reference to it: tensors compare element by element, so no WeakSet.
        self._from_accelerator = {}

    def _count(self, table, key):
        if key in table:
            table[key] += 1
        elif len(table) < MAX_OP_ROWS:
            table[key] = 1
        else:
            self.truncated = True

    def observe(self, name, inputs, outputs):
        """One operator call: its flattened inputs and outputs (tensors among other values)."""
        in_devices = set()
        marked = False
        for value in inputs:
            device = getattr(value, "device", None)
            if device is None:
                continue
            in_devices.add(device.type)
            if not marked:
                held = self._from_accelerator.get(id(value))
                marked = held is not None and held() is value
        out_devices = set()
        for value in outputs:
            device = getattr(value, "device", None)
            if device is not None:
                out_devices.add(device.type)
        ran_on = sorted(in_devices | out_devices) or ["none"]
        for device in ran_on:
            self._count(self.calls, (name, device))
        crossed = self.accelerator in in_devices and self.host in out_devices
        if crossed or (marked and self.host in out_devices):
            for value in outputs:
                if getattr(value, "device", None) is not None and value.device.type == self.host:
                    self._mark(value)
        if marked and self.host in ran_on and self.accelerator not in ran_on and name not in MOVEMENT_OPS:
            self._count(self.fallback, name)

    def _mark(self, tensor):
        key = id(tensor)
        table = self._from_accelerator

        def forget(ref, key=key):
            if table.get(key) is ref:
                del table[key]

        table[key] = weakref.ref(tensor, forget)

    def not_implemented(self, name, inputs, error):
        devices = sorted({v.device.type for v in inputs if getattr(v, "device", None) is not None})
        if self.accelerator in devices and name not in self.unsupported and len(self.unsupported) < MAX_OP_ROWS:
            self.unsupported[name] = str(error).splitlines()[0][:300] if str(error) else type(error).__name__

    def report(self):
        return {
            "ops": [{"op": op, "device": device, "calls": n} for (op, device), n in sorted(self.calls.items())],
            "ops_truncated": self.truncated,
            "fallback_ops": [{"op": op, "calls": n} for op, n in sorted(self.fallback.items())],
            "unsupported_ops": [{"op": op, "error": e} for op, e in sorted(self.unsupported.items())],
        }


def dispatch_mode(torch, recorder):
    """A TorchDispatchMode that shows every operator to ``recorder`` (PyTorch's own hook for this, 2.0 and newer).

    It runs once per operator of the workload, so it stays small: operator names cached per overload, tensors
    picked out of the arguments one level deep (lists of tensors included) instead of a full pytree walk.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    tensor = torch.Tensor
    names = {}

    def tensors(values, out):
        for value in values:
            if isinstance(value, tensor):
                out.append(value)
            elif isinstance(value, (list, tuple)):
                out.extend(v for v in value if isinstance(v, tensor))
        return out

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = names.get(func)
            if name is None:
                name = names[func] = op_name(func)
            inputs = tensors(args, [])
            if kwargs:
                tensors(kwargs.values(), inputs)
            try:
                out = func(*args, **kwargs)
            except NotImplementedError as exc:
                recorder.not_implemented(name, inputs, exc)
                raise
            if isinstance(out, tensor):
                outputs = [out]
            elif isinstance(out, (list, tuple)):
                outputs = tensors(out, [])
            else:
                outputs = []
            recorder.observe(name, inputs, outputs)
            return out

    return Recording()


def torch_facts(torch, accelerator):
    """The framework's version and what it sees of the accelerator, after the workload ran."""
    facts = {"version": getattr(torch, "__version__", None), "hip": getattr(torch.version, "hip", None),
             "cuda": getattr(torch.version, "cuda", None), "device_count": 0, "peak_device_memory_bytes": None}
    try:
        if accelerator == "cuda" and torch.cuda.is_available():
            facts["device_count"] = torch.cuda.device_count()
            facts["peak_device_memory_bytes"] = max(
                torch.cuda.max_memory_allocated(i) for i in range(facts["device_count"]))
    except Exception as exc:  # noqa: BLE001 - a broken runtime is data
        facts["error"] = str(exc)[:300]
    return facts


class _Armed(object):
    """Installs the recording mode once the workload imports torch (a workload that never does runs untouched)."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.mode = None
        self.error = None

    def enter_if_loaded(self):
        torch = sys.modules.get("torch")
        if self.mode is not None or torch is None:
            return
        try:
            self.mode = dispatch_mode(torch, self.recorder)
            self.mode.__enter__()
        except Exception as exc:  # noqa: BLE001 - reported, the workload still runs
            self.mode = None
            self.error = "instrumentation not installed: %s" % exc


def main(argv=None):
    started = time.perf_counter()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    nonce = os.environ.pop(NONCE_ENV, "")
    out = os.fdopen(os.dup(1), "w")
    sys.path[:0] = [p for p in args.python_path if p not in sys.path]
    for key, value in SAFE_ENV.items():
        os.environ[key] = value
    recorder = OpRecorder(args.accelerator, args.host_device)
    armed = _Armed(recorder) if args.instrument == "ops" else None
    if armed is not None:
        # Import torch first when it is there, so that every operator of the workload, its first included, is seen.
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
        armed.enter_if_loaded()
    ended = {"kind": "returned", "code": 0, "error": None}
    target = args.module or args.script
    sys.argv = [target] + list(args.workload_args)
    try:
        if args.module:
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(args.script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        ended = {"kind": "system_exit", "code": code, "error": None if code == 0 else str(exc.code)[:300]}
    except BaseException as exc:  # noqa: BLE001 - the workload's crash is data for the agent
        ended = {"kind": "exception", "code": 1, "error": "%s: %s" % (type(exc).__name__, str(exc)[:300]),
                 "traceback": traceback.format_exc()[-2000:]}
    if armed is not None and armed.mode is not None:
        try:
            armed.mode.__exit__(None, None, None)
        except Exception:  # noqa: BLE001 - a workload that left other modes entered
            pass
    torch = sys.modules.get("torch")
    report = {"shim_schema_version": SHIM_SCHEMA_VERSION, "nonce": nonce, "python": platform.python_version(),
              "instrumented": armed is not None and armed.mode is not None,
              "instrument_error": armed.error if armed is not None else None,
              "torch": torch_facts(torch, args.accelerator) if torch is not None else None,
              "ended": ended, "wall_seconds": round(time.perf_counter() - started, 4)}
    if armed is not None and armed.mode is None and armed.error is None:
        report["instrument_error"] = "the workload never imported torch"
    report.update(recorder.report())
    sys.stdout.flush()
    out.write("\n" + REPORT_MARKER + json.dumps(report, sort_keys=True) + "\n")
    out.flush()
    return ended["code"]


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)
