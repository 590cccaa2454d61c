"""What the benchmark scripts share: running SQL through psql on one of the local servers, and
naming the machine a run was made on."""

import os
import platform
import subprocess
import sys


def psql(program, port, sql):
    """Runs `sql` with the psql `program` on 127.0.0.1:`port` as postgres, unaligned and tuples only;
    returns the output's lines, empty ones included. A failure ends the benchmark with psql's words."""
    command = [program, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(port),
               "-U", "postgres", "-d", "postgres"]
    done = subprocess.run(command, input=sql, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"psql failed: {done.stderr.strip()}")
    return done.stdout.split("\n")


def machine():
    """The machine, as a report names it: cores, processor model and memory."""
    with open("/proc/cpuinfo") as cpuinfo:
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                     platform.machine())
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({model}), {memory_gib:.0f} GiB of memory"
