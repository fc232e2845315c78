"""SGLang 0.5.23's own ServerArgs parser, run in the CPU SGLang environment on launch_server
command lines (what follows ``python -m sglang.launch_server``): the launcher's and the Kubernetes
manifests' alike, so a renamed or misspelled flag fails where it is written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.sglang_env import REPO, RESULT_PREFIX, require_sglang_python

SCRIPT = REPO / "tests" / "launch" / "sglang_scripts" / "parse_server_args.py"


def parse_server_args(argvs: list[list[str]], script: Path = SCRIPT) -> list[dict[str, Any]]:
    """Per command line, {"error": ...} or a few parsed fields (see the script's FIELDS)."""
    python = require_sglang_python()
    proc = subprocess.run([str(python), str(script)], input=json.dumps(argvs), cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-3000:]
    out: list[dict[str, Any]] = json.loads(lines[-1][len(RESULT_PREFIX) :])
    return out
