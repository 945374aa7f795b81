"""The devices screen: this host's CPU and memory (psutil) and, where NVML finds GPUs, each GPU's memory,
utilisation, power and temperature, with short history sparklines. Without GPUs it says why and goes on."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static

from xtop.fmt import GIB, bar, sparkline
from xtop.screens.base import ModeBar, XtopScreen, set_content


class DevicesScreen(XtopScreen):
    mode_name = "devices"

    def compose(self) -> ComposeResult:
        yield ModeBar(self.mode_name)
        with VerticalScroll():
            yield Static(id="devices-host")
            yield Static(id="devices-gpus")
        yield Footer()

    def on_mount(self) -> None:
        self.update_view()

    def update_view(self) -> None:
        history = self.state.resources
        sample = history.latest
        host = self.query_one("#devices-host", Static)
        gpus = self.query_one("#devices-gpus", Static)
        if sample is None:
            set_content(host, Text(" sampling…", style="dim"))
            return
        spark = max(10, self.size.width - 60)
        table = Table(box=None, expand=True, header_style="bold", title="host", title_justify="left")
        table.add_column("", no_wrap=True)
        table.add_column("now", justify="right", no_wrap=True)
        table.add_column("", no_wrap=True)
        table.add_column("history", no_wrap=True, ratio=1)
        table.add_row(
            f"CPU ({sample.cpu_count} cores)", f"{sample.cpu_pct:5.1f}%", bar(sample.cpu_pct / 100, 20),
            Text(sparkline(history.cpu.values, spark, 0, 100), style="green"),
        )  # fmt: skip
        table.add_row(
            "memory", f"{sample.memory_used_bytes / GIB:.1f}/{sample.memory_total_bytes / GIB:.1f} GiB",
            bar(sample.memory_pct / 100, 20), Text(sparkline(history.memory.values, spark, 0, 100), style="cyan"),
        )  # fmt: skip
        if sample.per_cpu_pct and len(sample.per_cpu_pct) <= 64:
            cores = " ".join(f"{index}:{pct:3.0f}%" for index, pct in enumerate(sample.per_cpu_pct))
            table.add_row("per core", "", "", Text(cores, style="dim", overflow="fold"))
        set_content(host, table)
        if not sample.gpus:
            set_content(
                gpus, Text(f"\n GPUs: none ({sample.gpu_note}); the other screens work without them.", "yellow")
            )
            return
        gpu_table = Table(box=None, expand=True, header_style="bold", title="GPUs", title_justify="left")
        for name, justify in (("gpu", "right"), ("name", "left"), ("memory", "right"), ("util", "right"),
                              ("power", "right"), ("temp", "right")):  # fmt: skip
            gpu_table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        gpu_table.add_column("util / memory history", no_wrap=True, ratio=1)
        half = max(5, (spark - 20) // 2)
        for gpu in sample.gpus:
            gpu_table.add_row(
                str(gpu.index),
                gpu.name,
                f"{gpu.memory_used_bytes / GIB:.1f}/{gpu.memory_total_bytes / GIB:.1f} GiB",
                f"{gpu.utilization_pct:.0f}%",
                "-" if gpu.power_w is None else f"{gpu.power_w:.0f} W",
                "-" if gpu.temperature_c is None else f"{gpu.temperature_c:.0f}°C",
                Text.assemble(
                    (sparkline(history.gpu_util[gpu.index].values, half, 0, 100), "green"),
                    " ",
                    (sparkline(history.gpu_memory[gpu.index].values, half, 0, 100), "cyan"),
                ),
            )
        set_content(gpus, gpu_table)
