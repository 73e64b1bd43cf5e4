"""The PNG of `deferdump bench --plot`: step-time and wait_for_save distributions per mode."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from deferdump.tools.engine.steploop import Mode

COLORS = {Mode.NO_SAVE: "tab:gray", Mode.BLOCKING: "tab:red", Mode.DEFERRED: "tab:green"}


def plot_modes(runs: dict[Mode, Any], path: Path, *, title: str) -> Path:
    """Box plots with every step overlaid, per mode; matplotlib's non-interactive backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(Mode)
    step_ms = [[value * 1000.0 for value in runs[mode].series("step")] for mode in modes]
    wait_modes = [Mode.BLOCKING, Mode.DEFERRED]
    wait_ms = [[max(value * 1000.0, 1e-4) for value in runs[mode].series("wait_for_save")] for mode in wait_modes]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    _boxes(left, step_ms, [mode.value for mode in modes], [COLORS[mode] for mode in modes])
    left.set_ylabel("step time (ms)")
    left.set_title("step time per mode")
    _boxes(right, wait_ms, [mode.value for mode in wait_modes], [COLORS[mode] for mode in wait_modes])
    right.set_yscale("log")
    right.set_ylabel("time inside wait_for_save (ms, log)")
    right.set_title("wait_for_save per mode")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _boxes(axes: Any, data: list[list[float]], labels: list[str], colors: list[str]) -> None:
    axes.boxplot(data, showfliers=False)
    axes.set_xticks(range(1, len(labels) + 1), labels)
    for index, (values, color) in enumerate(zip(data, colors), start=1):
        offsets = [index + 0.18 * ((i * 0.618) % 1.0 - 0.5) for i in range(len(values))]
        axes.scatter(offsets, values, s=6, alpha=0.45, color=color)
    axes.grid(axis="y", alpha=0.3)
