"""A fake health probe (stdlib only) that prints what the real probe prints, in a chosen way of going wrong.

--mode pass       one GPU with figures --gemm/--copy, scaled down by --throttle-fraction and --scale
--mode cpu        a CPU-only framework build that ran on the CPU
--mode skip       no framework installed
--mode badcheck   a GPU whose GEMM disagrees with the fp32 reference
--mode garbage    prints something that is not a result
--mode crash      a traceback on stderr and exit 3
--mode hang       starts a grandchild (its pid into --pid-file) and both sleep forever
--limits-file P   also write its RLIMIT_CPU/NOFILE/CORE, as JSON
--mode hog        a grandchild that touches --hog-mib MiB of host memory and holds it (the memory limit's target)
--device-memory-budget-bytes N   reported back, and the GEMM/copy sizes shrink as the real probe's would
--env-file PATH   also write the environment it got, as JSON
--mode flood      prints --flood-mib MiB of noise on stdout and on stderr, then a valid result
--mode nested     a result line of 100,000 nested '['
--mode escapes    a valid result whose strings (and stderr) hold terminal escapes: ESC[2J, OSC 52, BEL, CR
--mode setsid     starts a grandchild in its own session (sleep 600, --token in its argv), then passes
--mode plant      a hostile run: plants usercustomize.py, sitecustomize.py and a .pth (each turning a later
                  "--mode skip" into "--mode pass") in its user site, its HOME and TMPDIR, then passes
--mode setsid-hog a grandchild in its own session touches --hog-mib MiB and holds it; passes after 60 s
--mode fill       writes --fill-mib files of 1 MiB into its HOME (errors ignored), holds on 3 s, then passes
--name NAME       the model name it claims for every GPU (default NVIDIA H200)
--hold-seconds S  waits S seconds before it prints its result (a run long enough for root's SMI readings)
--forge KIND      a result the host cannot have (the figures and names otherwise as --mode pass):
                  unlisted-index (figures for GPU 5 too), duplicate-index (GPU 0's row twice),
                  duplicate-uuid (every device with GPU 0's UUID), negative-time, zero-time (no time for done work),
                  duplicate-key (device_count 8 first, the real one last: json keeps the last), non-utf8 (a 0xff
                  byte in a string of the result line)
"""

import argparse
import json
import os
import site
import subprocess
import sys
import time

MARKER = "GPUGUARD_PROBE_RESULT "


def gpu(index, gemm, copy, ref_ok=True, name="NVIDIA H200"):
    return {"index": index, "device": "cuda:%d" % index, "name": name, "gemm_dtype": "bf16",
            "gemm_size": 8192, "gemm_bf16_tflops": gemm, "gemm_fp16_tflops": None,
            "gemm_batch_spread_fraction": 0.01, "gemm_reference_rel_error": 0.003 if ref_ok else 0.5,
            "gemm_reference_ok": ref_ok, "copy_bytes": 4 << 30, "copy_bandwidth_gbps": copy,
            "copy_batch_spread_fraction": 0.01, "copy_verified": True, "train_steps": 12,
            "train_first_step_seconds": 0.02, "train_step_seconds": 0.002, "train_loss_first": 1.0,
            "train_loss_last": 0.5, "train_ok": True, "checkpoint_bytes": 1000, "checkpoint_seconds": 0.01,
            "checkpoint_ok": True, "device_memory_peak_bytes": 8 << 30, "step_seconds": {"gemm": 0.02},
            "seconds": 0.05, "errors": []}


def result(args):
    throttle = 1.0 - args.throttle_fraction
    framework = {"name": "torch", "version": "2.11.0+cu130", "build": "cuda", "cuda": "13.0", "hip": None,
                 "nccl": "2.27.7", "import_error": None}
    devices = [{"index": i, "name": args.name, "memory_total_bytes": 150754820096,
                "uuid": "5a1b2c3d-0000-0000-0000-00000000000%d" % i, "pci_bus_id": "0000:00:%02x.0" % (6 + i),
                "capability": "9.0", "multiprocessors": 132, "gcn_arch": None} for i in range(args.gpus)]
    out = {"probe_schema_version": 1, "python": "3.12.3", "framework": framework, "skipped_reason": None,
           "accelerator_available": True, "device_count": args.gpus, "devices": devices, "ran_on": "gpu",
           "gpus": [], "collective": None, "phase_seconds": {"import": 0.01, "total": 0.02},
           "throttle_fraction": args.throttle_fraction,
           "device_memory_budget_bytes": args.device_memory_budget_bytes, "uid": os.getuid(), "gid": os.getgid(),
           "groups": sorted(set(os.getgroups())), "errors": []}
    if args.mode == "skip":
        out.update(framework=None, skipped_reason="no framework: ModuleNotFoundError: No module named 'torch'",
                   accelerator_available=False, device_count=0, devices=[], ran_on=None)
        return out
    if args.mode == "cpu":
        framework.update(version="2.13.0+cpu", build="cpu", cuda=None, nccl=None)
        cpu = gpu(0, 0.3, 15.0)
        cpu.update(device="cpu", name="cpu")
        out.update(accelerator_available=False, device_count=0, devices=[], ran_on="cpu", gpus=[cpu])
        return out
    out["gpus"] = [gpu(i, args.gemm * throttle * args.scale, args.copy * throttle * args.scale,
                       ref_ok=args.mode != "badcheck", name=args.name) for i in range(args.gpus)]
    if args.device_memory_budget_bytes:
        for g in out["gpus"]:
            g.update(gemm_size=2048, copy_bytes=args.device_memory_budget_bytes // 4,
                     device_memory_peak_bytes=args.device_memory_budget_bytes // 2)
    forge(out, args.forge)
    return out


FORGE = "import sys; sys.argv[:] = ['pass' if a == 'skip' else a for a in sys.argv]\n"


def plant():
    """What a hostile probe leaves for the next run: code that Python runs at start-up if it finds it."""
    places = {site.getusersitepackages(), os.environ.get("HOME", ""), os.environ.get("TMPDIR", "")}
    for place in sorted(p for p in places if p):
        try:
            os.makedirs(place, exist_ok=True)
            for name, text in (("usercustomize.py", FORGE), ("sitecustomize.py", FORGE),
                               ("gpuguard-forge.pth", FORGE.replace("\n", "") + "\n")):
                with open(os.path.join(place, name), "w") as handle:
                    handle.write(text)
        except OSError:
            continue
def forge(out, kind):
    """Make ``out`` a result the host cannot have (see --forge)."""
    if kind == "unlisted-index":
        extra = dict(out["gpus"][0], index=5, device="cuda:5")
        out["gpus"].append(extra)
    elif kind == "duplicate-index":
        out["gpus"].append(dict(out["gpus"][0]))
    elif kind == "duplicate-uuid":
        for device in out["devices"]:
            device["uuid"] = out["devices"][0]["uuid"]
    elif kind == "negative-time":
        out["gpus"][0]["seconds"] = -1.0
    elif kind == "zero-time":
        out["gpus"][0]["seconds"] = 0.0
        out["gpus"][0]["train_step_seconds"] = 0.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="pass")
    parser.add_argument("--gemm", type=float, default=750.0)
    parser.add_argument("--copy", type=float, default=4200.0)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--throttle-fraction", type=float, default=0.0)
    parser.add_argument("--pid-file")
    parser.add_argument("--env-file")
    parser.add_argument("--hog-mib", type=int, default=512)
    parser.add_argument("--limits-file")
    parser.add_argument("--device-memory-budget-bytes", type=int, default=None)
    parser.add_argument("--flood-mib", type=int, default=400)
    parser.add_argument("--token", default="gpuguard-fake-grandchild")
    parser.add_argument("--fill-mib", type=int, default=64)
    parser.add_argument("--name", default="NVIDIA H200")
    parser.add_argument("--forge", default=None)
    parser.add_argument("--hold-seconds", type=float, default=0.0)
    args, _ = parser.parse_known_args()
    if args.env_file:
        with open(args.env_file, "w") as handle:
            json.dump(dict(os.environ), handle)
    if args.limits_file:
        import resource

        time.sleep(0.3)  # the agent sets the limits from outside right after the start
        with open(args.limits_file, "w") as handle:
            json.dump({name: list(resource.getrlimit(getattr(resource, name)))
                       for name in ("RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_CORE")}, handle)
    if args.hold_seconds:
        time.sleep(args.hold_seconds)
    if args.mode == "plant":
        plant()
    if args.mode == "setsid-hog":
        code = "b = bytearray(%d << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nimport time; time.sleep(600)"
        subprocess.Popen([sys.executable, "-c", code % args.hog_mib], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(60)
    if args.mode == "fill":
        chunk = b"\1" * (1 << 20)
        for number in range(args.fill_mib):
            try:
                with open(os.path.join(os.environ.get("HOME", "."), "fill-%d" % number), "wb") as handle:
                    handle.write(chunk)
            except OSError:
                break
        time.sleep(3)
    if args.mode == "garbage":
        print("Warning: something framework-ish\n{not json at all")
        return 0
    if args.mode == "crash":
        sys.stderr.write("Traceback (most recent call last):\n  File \"probe.py\"\nRuntimeError: CUDA error: "
                         "an illegal memory access was encountered\n")
        return 3
    if args.mode == "hog":
        code = "b = bytearray(%d << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nimport time; time.sleep(600)"
        subprocess.Popen([sys.executable, "-c", code % args.hog_mib]).wait()
        return 0
    if args.mode == "hang":
        # The grandchild writes the pid its /proc says (in the supervisor's PID namespace, the namespace's own);
        # its command line holds the pid file's path, by which a test finds it on the host.
        code = ("import os, sys, time\nwith open(sys.argv[1], 'w') as f: f.write(os.readlink('/proc/self'))\n"
                "time.sleep(600)")
        subprocess.Popen([sys.executable, "-c", code, args.pid_file])
        time.sleep(600)
        return 0
    if args.mode == "flood":
        noise = (b"x" * 1023 + b"\n") * 1024
        for _ in range(args.flood_mib):
            os.write(1, noise)
            os.write(2, noise)
    if args.mode == "nested":
        print(MARKER + "[" * 100000)
        return 0
    out = result(args)
    if args.mode == "escapes":
        nasty = "\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\rok\x1b[0m"
        out["framework"]["version"] = "2.11.0" + nasty
        out["gpus"][0]["name"] = "H200" + nasty
        out["gpus"][0]["errors"] = ["bad" + nasty]
        sys.stderr.write("warning" + nasty + "\n")
    if args.mode == "setsid":
        # Its own session, and not holding the probe's pipes: nothing but the tree's end can reach it.
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", args.token], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print("UserWarning: noise a framework prints before the result")
    line = json.dumps(out)
    if args.forge == "duplicate-key":
        line = '{"device_count": 8, ' + line[1:]
    if args.forge == "non-utf8":
        sys.stdout.flush()
        head, tail = line.split('"python": "', 1)
        os.write(1, (MARKER + head + '"python": "').encode() + b"3.12\xff" + tail.encode()[len("3.12"):] + b"\n")
        return 0
    print(MARKER + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
