"""tests/helpers/groups.py: the tests that start real SGLang workers and those that re-patch the
SGLang env they import share one pytest-xdist unit, so one never runs beside the other."""

from __future__ import annotations

from tests.helpers.groups import worker_unit


def test_the_patch_tests_run_in_the_real_sglang_unit() -> None:
    real = worker_unit("tests/real_sglang/test_router_over_sglang.py::test_x")
    assert worker_unit("tests/patches/test_patches_cli.py::test_cli_on_the_sglang_env") == real
    assert worker_unit("tests/patches/test_sglang_probe.py::test_y[python]") == real


def test_other_tests_are_their_own_modules_units() -> None:
    assert worker_unit("tests/router/test_app.py::test_z") == "tests/router/test_app.py"
    assert worker_unit("tests/sim/test_admission.py::test_w") != worker_unit(
        "tests/real_sglang/test_pd.py::test_v"
    )
