"""``--plot``: bus bandwidth and time against size, one line per variant, a row per op.

matplotlib is an optional extra (``procgroup[bench]``); it is imported only here, with
the non-interactive Agg backend so plotting works on machines without a display. One
legend per row, outside the axes (to the right), so it never hides a line;
``--log-busbw`` puts bus bandwidth on a log axis.
"""

from __future__ import annotations

import math
from typing import Any

from procgroup.errors import InvalidArgumentError

from ._options import PLOT_HINT
from ._report import Record
from ._sweep import OPS, format_size


def write_plot(path: str, records: list[Record], meta: dict[str, Any]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise InvalidArgumentError(f"--plot needs matplotlib ({exc}): {PLOT_HINT}") from None
    ops = [op for op in OPS if any(r.op == op and r.status == "ok" for r in records)]
    if not ops:
        return
    log_busbw = bool(meta.get("log_busbw")) or "--log-busbw" in (meta.get("command") or ())
    fig, axes = plt.subplots(len(ops), 2, figsize=(14, 3.6 * len(ops) + 0.6), squeeze=False)
    colors = {v: f"C{i % 10}" for i, v in enumerate(meta["variants"])}  # one colour per variant throughout
    for row, op in enumerate(ops):
        ax_bw, ax_t = axes[row]
        for variant in meta["variants"]:
            pts = sorted((r.nbytes, r.busbw_gbps, r.time_us) for r in records
                         if r.op == op and r.variant == variant and r.status == "ok" and not math.isnan(r.time_us))
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ax_bw.plot(xs, [p[1] for p in pts], marker="o", label=variant, color=colors[variant])
            ax_t.plot(xs, [p[2] for p in pts], marker="o", label=variant, color=colors[variant])
        what = "one-way latency" if op == "pingpong" else "time"
        ax_bw.set(title=f"{op}: bus bandwidth", ylabel="busbw (GB/s)", yscale="log" if log_busbw else "linear")
        ax_t.set(title=f"{op}: {what} (median)", ylabel="time (us)", yscale="log")
        for ax in (ax_bw, ax_t):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("size (bytes)")
            ax.grid(True, which="both", alpha=0.3)
            ticks = sorted({r.nbytes for r in records if r.op == op})
            if 0 < len(ticks) <= 14:
                ax.set_xticks(ticks, [format_size(t) for t in ticks], rotation=45, fontsize=7)
        handles, labels = ax_t.get_legend_handles_labels()
        if handles:  # outside the lines: right of the row's time plot
            ax_t.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                        fontsize=8, frameon=False)
    fig.suptitle(f"procgroup-bench: {meta['world_size']} ranks, {meta['dtype']}, host {meta.get('host', '?')}")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
