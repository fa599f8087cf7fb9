#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs a command and samples its memory from /proc while it runs (Linux).

Every --interval seconds it reads /proc/PID/status (RssAnon, RssFile, VmHWM) of the command; every line the
command writes to stderr is stamped with the memory at that moment, so load stages (the lines fp4serve logs) can be
told apart. At the end it prints the peak RssAnon and RssFile seen, the final VmHWM (peak RSS as the kernel counts
it), the wall time and the command's user and system CPU time (less sensitive to a busy machine than wall time), in
GiB and seconds:

    python3 tools/measure_memory.py -- build/release/fp4serve generate -m DIR -c 4096 -t 2 -n 4 -p Hello

--cat FILES... first reads those files to /dev/null and reports how long that took (the warm-cache read time of a
checkpoint, to compare a load time with), then runs the command.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import threading
import time

FIELDS = ("RssAnon", "RssFile", "VmHWM", "VmRSS")


def read_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in FIELDS:
                    out[key] = int(value.split()[0]) * 1024  # kB → bytes
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def gib(b):
    return b / (1 << 30)


def cat_files(patterns):
    files = sorted(f for p in patterns for f in glob.glob(p))
    start = time.monotonic()
    total = 0
    for name in files:
        with open(name, "rb") as f:
            while True:
                chunk = f.read(1 << 24)
                if not chunk:
                    break
                total += len(chunk)
    return time.monotonic() - start, total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between samples (0.05)")
    ap.add_argument("--cat", nargs="*", default=[], help="files (globs) to read to /dev/null first, timed")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command given")
    summary = {}
    if args.cat:
        seconds, total = cat_files(args.cat)
        summary["cat_seconds"] = round(seconds, 3)
        summary["cat_gib"] = round(gib(total), 3)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    peak = {k: 0 for k in FIELDS}
    last = {}
    lock = threading.Lock()
    done = threading.Event()  # the main thread reaps the command (os.wait4, for its CPU time): no poll() here

    def sample():
        while not done.is_set():
            s = read_status(proc.pid)
            with lock:
                if s:
                    last.update(s)
                for k, v in s.items():
                    peak[k] = max(peak[k], v)
            time.sleep(args.interval)

    def stamp_stderr():
        for line in proc.stderr:
            s = read_status(proc.pid) or last
            t = time.monotonic() - start
            sys.stderr.write(f"[{t:7.2f} s anon {gib(s.get('RssAnon', 0)):6.2f} file {gib(s.get('RssFile', 0)):6.2f} "
                             f"GiB] {line}")

    sampler = threading.Thread(target=sample, daemon=True)
    stamper = threading.Thread(target=stamp_stderr, daemon=True)
    sampler.start()
    stamper.start()
    stdout = proc.stdout.read()  # stderr is the stamper's
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    proc.returncode = os.waitstatus_to_exitcode(status)
    stamper.join()
    wall = time.monotonic() - start
    sys.stdout.write(stdout)
    summary.update({
        "rc": proc.returncode,
        "wall_seconds": round(wall, 3),
        "cpu_user_seconds": round(usage.ru_utime, 3),
        "cpu_system_seconds": round(usage.ru_stime, 3),
        "peak_rss_anon_gib": round(gib(peak["RssAnon"]), 3),
        "peak_rss_file_gib": round(gib(peak["RssFile"]), 3),
        "vm_hwm_gib": round(gib(max(peak["VmHWM"], last.get("VmHWM", 0))), 3),
    })
    if args.json:
        print(json.dumps(summary))
    else:
        print("measure_memory: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
