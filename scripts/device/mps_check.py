"""MPS on a real GPU: our control code starts NVIDIA's control daemon, two clients check they get the limits.

Run by scripts/device/mps_check.sh (which says how). What it does:
1. `plugin.mps.control.MpsControl` starts `nvidia-cuda-mps-control -d` for GPU 0 with the defaults a
   `sharing.mps` resource of 2 replicas gets (`plugin.mps.specs`: memory / 2 pinned, 50 % of the threads),
   in a private pipe and log directory (no other MPS daemon on the machine is touched; the GPU's compute
   mode is left as it is: MPS runs in DEFAULT mode too);
2. two clients run at once through it (this file with `--client`, CUDA driver API through ctypes: no
   toolkit needed): A with the env an Allocate answer gives a replica of 4 (25 %, memory / 4), B with no
   limit env (the daemon's defaults must bound it). Each reports the SMs its context may use
   (`cuCtxGetExecAffinity`), the total memory it is shown, and whether allocating past its limit fails;
3. `get_server_list` while they run (one MPS server), then `quit`.
`--offline` does steps 1 and 3 with the stand-in control program (tests/support/mps_standin) and no
client, so the script's own parts run where there is no GPU. The verdict is the last line; the JSON
report goes to --out.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def client() -> dict:
    """One MPS client: what its context is allowed (printed as JSON)."""
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise SystemExit(json.dumps({"error": f"{what} returned CUDA error {rc}"}))

    check(cuda.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
    sms = ctypes.c_int()
    check(cuda.cuDeviceGetAttribute(ctypes.byref(sms), 16, dev), "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)")

    class Affinity(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("sm_count", ctypes.c_uint)]

    aff = Affinity()
    rc = cuda.cuCtxGetExecAffinity(ctypes.byref(aff), 0)  # CU_EXEC_AFFINITY_TYPE_SM_COUNT
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    limit = os.environ.get("EXPECT_LIMIT_MIB")
    over = None
    if limit:
        ptr = ctypes.c_uint64()
        over = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t((int(limit) + 512) << 20))
        if over == 0:
            cuda.cuMemFree_v2(ptr)
    time.sleep(float(os.environ.get("HOLD_S", "3")))  # both clients at once: the daemon serves them together
    return {"device_sms": sms.value, "context_sms": aff.sm_count if rc == 0 else None, "affinity_rc": rc,
            "total_mib": total.value >> 20, "alloc_past_limit_rc": over}


def main() -> int:
    from plugin.mps.control import DaemonSpec, MpsControl, default_commands

    ap = argparse.ArgumentParser()
    ap.add_argument("--client", action="store_true")
    ap.add_argument("--offline", action="store_true")
    ap.add_argument("--out", default="/tmp/topo-mps-check")
    a = ap.parse_args()
    if a.client:
        print(json.dumps(client()))
        return 0
    os.makedirs(a.out, exist_ok=True)
    report: dict = {"mode": "offline" if a.offline else "real"}
    work = tempfile.mkdtemp(prefix="topo-mps-")
    if a.offline:
        binary, uuid, memory_mib = os.path.join(ROOT, "tests/support/mps_standin/nvidia-cuda-mps-control"), \
            "GPU-00000000-0000-0000-0000-000000000000", 81920
    else:
        binary = "nvidia-cuda-mps-control"
        line = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=uuid,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, check=True).stdout.strip()
        uuid, memory_mib = line.split(", ")[0], int(line.split(", ")[1])
    control = MpsControl(binary)
    spec = DaemonSpec(name="mps-check", pipe_dir=os.path.join(work, "pipe"), log_dir=os.path.join(work, "log"),
                      gpus=(uuid,), defaults=default_commands([(0, memory_mib // 2)], 50))
    report.update(gpu=uuid, memory_mib=memory_mib, defaults=list(spec.defaults))
    ok = True
    try:
        control.start(spec)
        control.configure(spec)
        report["ready_file"] = os.path.exists(spec.ready_file)
        report["get_default_active_thread_percentage"] = control.command(
            spec, "get_default_active_thread_percentage").strip()
        if not a.offline:
            base = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=spec.pipe_dir, CUDA_MPS_LOG_DIRECTORY=spec.log_dir,
                        CUDA_VISIBLE_DEVICES=uuid)
            quarter = memory_mib // 4
            env_a = dict(base, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25",
                         CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"0={quarter}M", EXPECT_LIMIT_MIB=str(quarter))
            env_b = dict(base, EXPECT_LIMIT_MIB=str(memory_mib // 2))
            procs = [subprocess.Popen([sys.executable, __file__, "--client"], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for e in (env_a, env_b)]
            time.sleep(1.5)
            report["servers_while_running"] = control.command(spec, "get_server_list").split()
            outs = [p.communicate(timeout=120) for p in procs]
            report["clients"] = {}
            for name, (out, err), limit, pct in zip("AB", outs, (quarter, memory_mib // 2), (25, 50)):
                got = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": err[-500:]}
                got["expected"] = {"limit_mib": limit, "thread_percentage": pct}
                report["clients"][name] = got
                sms_ok = got.get("context_sms") is not None and \
                    got["context_sms"] <= max(1, got["device_sms"] * pct // 100) + 2
                mem_ok = got.get("total_mib") is not None and got["total_mib"] <= limit + 64
                alloc_ok = got.get("alloc_past_limit_rc") not in (None, 0)
                got["verdict"] = {"sms": sms_ok, "memory_shown": mem_ok, "alloc_past_limit_refused": alloc_ok}
                ok = ok and sms_ok and alloc_ok
            ok = ok and len(report["servers_while_running"]) == 1
    except Exception as e:  # noqa: BLE001 (the report says what failed)
        report["error"] = f"{type(e).__name__}: {e}"
        ok = False
    finally:
        try:
            control.quit(spec)
            report["quit"] = not control.probe(spec)
        except Exception as e:  # noqa: BLE001
            report["quit_error"] = str(e)
        for name in ("control.log", "server.log", "standin.jsonl"):
            path = os.path.join(spec.log_dir, name)
            if os.path.exists(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    report.setdefault("logs", {})[name] = f.read()[-4000:]
    with open(os.path.join(a.out, "mps-check.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k != "logs"}, indent=1))
    print(f"mps_check: {'PASSED' if ok and report.get('ready_file') else 'FAILED'} ({report['mode']})")
    return 0 if ok and report.get("ready_file") else 1


if __name__ == "__main__":
    sys.exit(main())
