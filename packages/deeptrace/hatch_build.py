"""Build hook: compiles the collector's C hot path (src/deeptrace/collect/_hotpath.c) into the wheel.

The extension is optional. Without a C compiler (or with DEEPTRACE_NO_NATIVE=1) the build warns and the package
uses the pure-Python contexts (deeptrace/collect/contexts.py), which record the same trace at a higher cost per
span. An editable install (`uv sync`) builds it next to its source, where the editable package imports it from.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("src/deeptrace/collect/_hotpath.c")
PACKAGE_DIR = "deeptrace/collect"


class NativeHotPathHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if os.environ.get("DEEPTRACE_NO_NATIVE") == "1":
            self._warn("DEEPTRACE_NO_NATIVE=1: the pure-Python collector contexts are used")
            return
        source = Path(self.root) / SOURCE
        name = "_hotpath" + str(sysconfig.get_config_var("EXT_SUFFIX"))
        if version == "editable":
            target = source.with_name(name)
        else:
            self._scratch = Path(tempfile.mkdtemp(prefix="deeptrace-native-"))  # removed in finalize
            target = self._scratch / name
        if not self._compile(source, target):
            return
        if version != "editable":
            build_data["force_include"][str(target)] = f"{PACKAGE_DIR}/{name}"
        build_data["pure_python"] = False
        build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    def _compile(self, source: Path, target: Path) -> bool:
        compiler = shlex.split(os.environ.get("CC") or str(sysconfig.get_config_var("CC") or "cc"))
        if shutil.which(compiler[0]) is None:
            self._warn(f"no C compiler ({compiler[0]!r} not found): the pure-Python collector contexts are used")
            return False
        include = sysconfig.get_paths()["include"]
        command = [*compiler, "-O2", "-fPIC", "-shared", "-Wall", f"-I{include}", str(source), "-o", str(target)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            self._warn(f"compiling {source.name} failed, the pure-Python contexts are used:\n{result.stderr}")
            return False
        return True

    def _warn(self, message: str) -> None:
        print(f"deeptrace build: {message}", file=sys.stderr)
