# Imported by every Python process started with this folder on PYTHONPATH, including the
# scheduler and detokenizer processes SGLang spawns; does nothing unless SMETRIC_SGLANG_CPU=1.
import os

if os.environ.get("SMETRIC_SGLANG_CPU") == "1":
    from smetric_router.sglang_cpu import install

    install()
