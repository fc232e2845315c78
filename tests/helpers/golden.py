"""Golden-equality scripts (tests/features/sglang_scripts) run once per test module: one process
in the CPU SGLang env checks every configuration, so SGLang's import is paid once, not per case.

SMETRIC_GOLDEN_EXAMPLES sets the generated requests per configuration. The scripts' hypothesis
seed is fixed, so every run checks the same requests: the default is what catches a regression
in a few seconds per configuration; a deeper search is a larger value (or another --seed).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.sglang_env import run_sglang_script_results

EXAMPLES = int(os.environ.get("SMETRIC_GOLDEN_EXAMPLES", "200"))


def golden_runs(script: Path, configs: Sequence[str]) -> dict[str, Any]:
    """Each configuration's result, from one run of `script` over all of them."""
    outs = run_sglang_script_results(
        script, *configs, "--examples", str(EXAMPLES), timeout=900 * len(configs)
    )
    by_config = {out["config"]: out for out in outs}
    assert list(by_config) == list(configs), f"{script.name} reported {list(by_config)}"
    return by_config
