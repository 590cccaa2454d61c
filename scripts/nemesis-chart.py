#!/usr/bin/env python3
"""scripts/nemesis-chart.py REPORT_DIR: draws REPORT_DIR/timeline.png from the fault schedule's
faults.tsv and timeline.tsv: one panel per node with its ids per second and its refused and
unavailable calls per second, under bands for the faults in force on the node and on the registry."""
import csv
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (the backend is chosen first)


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/nemesis-chart.py REPORT_DIR")
    folder = Path(sys.argv[1])
    faults = rows(folder / "faults.tsv")
    timeline = rows(folder / "timeline.tsv")
    nodes = sorted({row["node"] for row in timeline})
    if not nodes:
        sys.exit(f"{folder}: no call was recorded, so there is nothing to draw")
    kinds = sorted({fault["kind"] for fault in faults})
    palette = plt.get_cmap("tab20")
    colour = {kind: palette(index % 20) for index, kind in enumerate(kinds)}

    series = defaultdict(lambda: defaultdict(dict))
    for row in timeline:
        for column in ("ids", "refused", "unavailable"):
            series[row["node"]][column][int(row["second"])] = int(row[column])
    end = max(int(row["second"]) for row in timeline) + 1

    figure, axes = plt.subplots(len(nodes), 1, figsize=(16, 3.2 * len(nodes)), sharex=True,
                                squeeze=False)
    axes = axes[:, 0]
    for axis, node in zip(axes, nodes):
        for fault in faults:
            if fault["target"] not in (node, "registry"):
                continue
            start, stop = float(fault["start_s"]), float(fault["end_s"])
            # A restart has no length; a band of half a second shows it.
            axis.axvspan(start, max(stop, start + 0.5), color=colour[fault["kind"]], alpha=0.35, lw=0)
        seconds = range(end)
        ids = [series[node]["ids"].get(s, 0) for s in seconds]
        axis.plot(seconds, ids, color="black", lw=0.8, label="ids issued per second")
        axis.set_ylabel(f"{node}: ids/s")
        right = axis.twinx()
        for column, style in (("refused", "red"), ("unavailable", "darkorange")):
            values = [series[node][column].get(s, 0) for s in seconds]
            right.plot(seconds, values, color=style, lw=0.7, label=f"calls {column} per second")
        right.set_ylabel("calls/s")
        axis.set_xlim(0, end)
    axes[-1].set_xlabel("seconds from the start")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[kind], alpha=0.35) for kind in kinds]
    lines = [
        plt.Line2D([], [], color="black", lw=0.8),
        plt.Line2D([], [], color="red", lw=0.7),
        plt.Line2D([], [], color="darkorange", lw=0.7),
    ]
    labels = kinds + ["ids issued/s", "calls refused/s", "calls unavailable/s"]
    figure.legend(handles + lines, labels, loc="lower center", ncol=4, fontsize="small")
    title = (folder / "report.txt").read_text().splitlines()[0]
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.04 + 0.012 * (len(labels) // 4), 1, 0.97))
    figure.savefig(folder / "timeline.png", dpi=80)


if __name__ == "__main__":
    main()
