"""Golden equality with SGLang 0.5.23's own code: the emulator's prompt ids for 1,000 generated
agent-shaped chat requests and 200 text prompts equal what SGLang's ChatCompletionRequest,
OpenAIServingChat (_validate_request, _process_messages) and TokenizerManager._tokenize_texts
compute in .venv-sglang (tests/emulator/sglang_prompts.py), for three workers: the bundled
tokenizer with its ChatML template, the same tokenizer with the Qwen3-Coder-style template given
as --chat-template, and the tiny model directory whose tokenizer_config carries that template. A
request SGLang refuses must be refused with the same status."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from smetric_router.emulator.chat import chat_prompt_ids
from smetric_router.emulator.errors import BadRequest, InternalError
from smetric_router.emulator.tokenizer import DEFAULT_TOKENIZER_DIR, load_tokenizer
from smetric_router.launch.kinds.sglang import CPU_SITE
from smetric_router.launch.tiny_model import TEMPLATE, ensure_tiny_model
from tests.emulator.conversations import conversations, text_prompts
from tests.sglang_env import REPO, run_sglang_script

pytestmark = pytest.mark.sglang

N_CHATS = 1000
N_TEXTS = 200
SEED = 9
SCRIPT = Path(__file__).with_name("sglang_prompts.py")


def _outcome(compute: Callable[[], list[int]]) -> dict[str, Any]:
    try:
        return {"ids": compute()}
    except BadRequest as exc:
        return {"status": 400, "error": str(exc)}
    except InternalError as exc:
        return {"status": 500, "error": str(exc)}


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("golden")
    workers = [
        {"name": "bundled ChatML", "tokenizer": str(DEFAULT_TOKENIZER_DIR), "chat_template": None},
        {
            "name": "--chat-template qwen3-coder-style",
            "tokenizer": str(DEFAULT_TOKENIZER_DIR),
            "chat_template": str(TEMPLATE),
        },
        {
            "name": "tiny model dir",
            "tokenizer": str(ensure_tiny_model(tmp / "tiny-qwen3")),
            "chat_template": None,
        },
    ]
    given = {
        "workers": workers,
        "chats": conversations(N_CHATS, SEED),
        "texts": text_prompts(N_TEXTS, SEED),
    }
    (tmp / "in.json").write_text(json.dumps(given), encoding="utf-8")
    env = {"SMETRIC_SGLANG_CPU": "1", "PYTHONPATH": os.pathsep.join((str(CPU_SITE), str(REPO)))}
    run_sglang_script(SCRIPT, str(tmp / "in.json"), str(tmp / "out.json"), env=env)
    given["sglang"] = json.loads((tmp / "out.json").read_text(encoding="utf-8"))
    return given


@pytest.mark.parametrize("index", [0, 1, 2], ids=["bundled", "chat-template", "model-dir"])
def test_chat_prompt_ids_equal_sglang(golden: dict[str, Any], index: int) -> None:
    worker = golden["workers"][index]
    tok = load_tokenizer(worker["tokenizer"], worker["chat_template"])
    expected = golden["sglang"][index]["chats"]
    mismatches = []
    for i, (body, want) in enumerate(zip(golden["chats"], expected, strict=True)):
        got = _outcome(partial(chat_prompt_ids, tok, json.loads(json.dumps(body))))
        same = got.get("ids") == want.get("ids") and got.get("status") == want.get("status")
        if not same:
            mismatches.append(f"#{i}: emulator {got} != sglang {want}\n  body: {json.dumps(body)}")
    rendered = sum("ids" in w for w in expected)
    assert rendered >= 0.85 * N_CHATS, f"only {rendered} requests rendered: the generator drifted"
    assert not mismatches, f"{len(mismatches)} of {N_CHATS}:\n" + "\n".join(mismatches[:5])


@pytest.mark.parametrize("index", [0, 2], ids=["bundled", "model-dir"])
def test_text_prompt_ids_equal_sglang(golden: dict[str, Any], index: int) -> None:
    worker = golden["workers"][index]
    tok = load_tokenizer(worker["tokenizer"], worker["chat_template"])
    got = [tok.encode_prompt(t) for t in golden["texts"]]
    assert got == golden["sglang"][index]["texts"]
