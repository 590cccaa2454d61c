#!/usr/bin/env python3
"""benches/recovery_chart.py DIR: draws DIR/availability.png from DIR/availability.tsv (written by
benches/recovery.sh): per fault kind, the share of the measured nodes issuing in each 100 ms window
since the fault began, one line per fault length (as a multiple of the lease margin), solid for
faults begun right after a renewal, dashed right before one."""
import csv
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (the backend is chosen first)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: benches/recovery_chart.py DIR")
    folder = Path(sys.argv[1])
    with open(folder / "availability.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    series = defaultdict(lambda: defaultdict(list))
    for row in rows:
        # Files of the first version of the benchmark have no position.
        line = (float(row["ratio"]), row.get("position", "both"))
        series[row["kind"]][line].append((float(row["second"]), float(row["issuing"])))
    if not series:
        sys.exit(f"{folder}: no trial was recorded, so there is nothing to draw")
    kinds = list(series)
    figure, axes = plt.subplots(len(kinds), 1, figsize=(12, 2.6 * len(kinds)), squeeze=False)
    for axis, kind in zip(axes[:, 0], kinds):
        palette = plt.get_cmap("tab10")
        ratios = sorted({ratio for ratio, _ in series[kind]})
        for (ratio, position), points in sorted(series[kind].items()):
            style = "--" if position == "before a renewal" else "-"
            label = f"D = {ratio:g} m" + ("" if position == "both" else f", {position}")
            axis.plot([p[0] for p in points], [100 * p[1] for p in points], lw=0.9, ls=style,
                      color=palette(ratios.index(ratio) % 10), label=label)
        axis.set_title(kind, fontsize=10)
        axis.set_ylabel("issuing (%)")
        axis.set_ylim(-5, 105)
        axis.legend(fontsize=7, loc="lower right")
    axes[-1, 0].set_xlabel("seconds since the fault began")
    figure.tight_layout()
    figure.savefig(folder / "availability.png", dpi=90)


if __name__ == "__main__":
    main()
